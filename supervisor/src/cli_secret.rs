//! `stsd secret set|rm|list`: a thin client of the running daemon's `stsd/secrets/*`. The
//! value comes from standard input (no echo at a terminal), never argv.

use crate::cli::SecretCmd;
use crate::EXIT_INVALID;
use serde_json::{json, Value};
use std::io::{IsTerminal, Read};
use std::path::Path;
use std::process::ExitCode;
use stsd::admin::client;

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("stsd: {e}");
    ExitCode::from(EXIT_INVALID)
}

pub fn run(socket: &Path, what: SecretCmd) -> ExitCode {
    let (method, params) = match &what {
        SecretCmd::Set { name, hosts } => {
            if let Err(e) = stsd::secrets::check_name(name) {
                return fail(e);
            }
            if let Some(e) = hosts
                .iter()
                .find_map(|h| stsd::secrets::check_host(h).err())
            {
                return fail(e);
            }
            let value = match read_value(name) {
                Ok(v) => v,
                Err(e) => return fail(e),
            };
            let hosts = (!hosts.is_empty()).then_some(hosts);
            (
                "stsd/secrets/set",
                json!({"name": name, "value": value, "hosts": hosts}),
            )
        }
        SecretCmd::Rm { name } => ("stsd/secrets/remove", json!({"name": name})),
        SecretCmd::List { .. } => ("stsd/secrets/list", json!({})),
    };
    let v = match client::call(socket, method, params) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    match what {
        SecretCmd::List { json: true } => println!("{v}"),
        SecretCmd::List { json: false } => {
            let names: Vec<&str> = v["secrets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            println!(
                "{} in {}",
                stsd::plural::n(names.len(), "secret"),
                v["dir"].as_str().unwrap_or("-")
            );
            for n in names {
                match v["hosts"][n].as_array() {
                    Some(h) => println!(
                        "  {n}  for tools, sent to: {}",
                        h.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None => println!("  {n}  for upstreams and the store only"),
                }
            }
        }
        SecretCmd::Set { name, .. } => {
            match v["hosts"].as_array() {
                Some(h) => println!(
                    "secret {name} set for tools, sent only to {}: the next call reads it",
                    h.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => println!(
                    "secret {name} set for upstreams and the store (not for tools: --host \
                     HOST makes it one)"
                ),
            }
            print_tools(&v["tools"]);
            if let Some(why) = v["republishFailed"].as_str() {
                eprintln!("stsd: {why}");
            }
        }
        SecretCmd::Rm { name } => {
            println!("secret {name} removed");
            print_tools(&v["tools"]);
        }
    }
    ExitCode::SUCCESS
}

fn print_tools(t: &Value) {
    let served: Vec<&str> = t["served"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !served.is_empty() {
        println!("  served, using it: {}", served.join(", "));
    }
    for w in t["withheld"].as_array().into_iter().flatten() {
        println!(
            "  withheld: {}: {}",
            w["name"].as_str().unwrap_or("-"),
            w["why"].as_str().unwrap_or("-")
        );
    }
}

/// The value: typed at a terminal with echo off, else all of standard input (a pipe or a
/// file), the final newline dropped.
fn read_value(name: &str) -> Result<String, String> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        let mut v = String::new();
        stdin
            .lock()
            .take(stsd::secrets::MAX_VALUE_BYTES as u64 + 1)
            .read_to_string(&mut v)
            .map_err(|e| format!("standard input: {e}"))?;
        return Ok(v.trim_end_matches(['\n', '\r']).to_string());
    }
    use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
    eprint!("value of {name} (not shown): ");
    let saved = tcgetattr(&stdin).map_err(|e| format!("the terminal: {e}"))?;
    let mut quiet = saved.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    tcsetattr(&stdin, SetArg::TCSANOW, &quiet).map_err(|e| format!("the terminal: {e}"))?;
    let mut line = String::new();
    let read = stdin.read_line(&mut line);
    let _ = tcsetattr(&stdin, SetArg::TCSANOW, &saved);
    eprintln!();
    read.map_err(|e| format!("standard input: {e}"))?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}
