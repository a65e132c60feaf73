//! `stsd upstream login ID`: the operator's one browser step for an OAuth upstream. The CLI
//! listens on a loopback port, asks the daemon to begin (discovery, registration, PKCE: the
//! daemon keeps the verifier), prints the address to open, catches the browser's redirect
//! and hands its URL back to the daemon, which exchanges the code and keeps the tokens. No
//! token passes through the CLI. Over SSH, forward the port (`--port`) to the browser's
//! machine.

use crate::EXIT_INVALID;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use stsd::admin::client;

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("stsd: {e}");
    ExitCode::from(EXIT_INVALID)
}

pub fn login(socket: &Path, id: &str, port: u16, wait: Duration) -> ExitCode {
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => return fail(format!("listening on 127.0.0.1:{port}: {e}")),
    };
    let port = match listener.local_addr() {
        Ok(a) => a.port(),
        Err(e) => return fail(e),
    };
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    let begun = client::call(
        socket,
        "stsd/upstream/login",
        json!({"id": id, "redirect_uri": redirect_uri}),
    );
    let url = match begun {
        Ok(v) => v["authorization_url"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        Err(e) => return fail(e),
    };
    println!("Open this address in a browser to sign in to upstream {id}:\n\n  {url}\n");
    println!(
        "Waiting for the browser to come back to {redirect_uri} (up to {} s)...",
        wait.as_secs()
    );
    let _ = std::io::stdout().flush();
    let state = url::Url::parse(&url).ok().and_then(|u| {
        u.query_pairs()
            .find(|(k, _)| k == "state")
            .map(|(_, v)| v.into_owned())
    });
    let path = match wait_for_callback(&listener, wait, state.as_deref()) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let callback_url = format!("http://127.0.0.1:{port}{path}");
    match client::call(
        socket,
        "stsd/upstream/login_finish",
        json!({"id": id, "callback_url": callback_url}),
    ) {
        Ok(v) => {
            print_signed_in(id, &v);
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn print_signed_in(id: &str, v: &Value) {
    let scopes: Vec<&str> = v["scopes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let state = v["upstream"]["state"].as_str().unwrap_or("-");
    let scopes = if scopes.is_empty() {
        "-".to_string()
    } else {
        scopes.join(" ")
    };
    println!("signed in to upstream {id} (scopes: {scopes}); it is {state}");
}

/// Accepts connections until one is a `GET /callback?...` carrying this login's `state`;
/// answers each, returns the callback's path and query. Anything else (another path, a
/// callback of another state: another local process, a page loading this port) gets an
/// error page and the wait goes on.
fn wait_for_callback(
    listener: &TcpListener,
    wait: Duration,
    state: Option<&str>,
) -> Result<String, String> {
    let deadline = Instant::now() + wait;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("the loopback listener: {e}"))?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Some(path) = answer(stream, state) {
                    return Ok(path);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "no browser came back within {} s; run the login again",
                        wait.as_secs()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("the loopback listener: {e}")),
        }
    }
}

/// Reads one request (its first line; the rest is not needed) and answers it. Some(path)
/// when it is the callback.
fn answer(stream: TcpStream, state: Option<&str>) -> Option<String> {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(std::io::Read::take(stream, MAX_LINE));
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?, parts.next()?);
    let came = url::Url::parse(&format!("http://127.0.0.1{target}"))
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "state")
                .map(|(_, v)| v.into_owned())
        });
    let callback = method == "GET"
        && target.starts_with("/callback?")
        && (state.is_none() || came.as_deref() == state);
    let (status, body) = if callback {
        let refused = target.contains("error=");
        let text = if refused {
            "stsd: the authorization server refused; see the terminal."
        } else {
            "stsd: signed in. You can close this tab and go back to the terminal."
        };
        ("200 OK", text)
    } else {
        ("400 Bad Request", "stsd: not this sign-in's callback.")
    };
    let html = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>stsd</title></head>\
         <body><p>{body}</p></body></html>"
    );
    let mut stream = reader.into_inner().into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n{html}",
        html.len()
    );
    let _ = stream.flush();
    callback.then(|| target.to_string())
}

/// A request line longer than this is not read further.
const MAX_LINE: u64 = 16 * 1024;
