//! stsd: runs Safe Tool Spec tools in sandboxed worker processes.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use stsd::{check, store};

/// Exit codes: 0 success, 1 the input is invalid (a spec, a tool call), 2 a usage error.
const EXIT_INVALID: u8 = 1;
const EXIT_USAGE: u8 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "stsd",
    version,
    about = "Run Safe Tool Spec tools in sandboxed worker processes"
)]
struct Cli {
    /// Baseline policy file (TOML); defaults equal the reference runtime's.
    #[arg(long, global = true, env = "STSD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate specs and show their state, risk level and resolved toolSafety.
    Check {
        /// Spec files (single spec, array or bundle) or directories of them.
        /// Defaults to the bundled catalog.
        paths: Vec<PathBuf>,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Leave warnings out of the text report (they still count in the summary).
        #[arg(long)]
        no_warnings: bool,
    },
    /// Print the Safe Tool Spec JSON Schema (2020-12).
    Schema,
}

/// The catalog of stsd's own example tools, next to the binary's sources.
fn bundled_catalog() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("catalog")
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STSD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let config = match &cli.config {
        Some(p) => match stsd_profiles::Config::load(p) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("stsd: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => stsd_profiles::Config::default(),
    };
    match cli.command {
        Command::Check {
            paths,
            json,
            no_warnings,
        } => {
            let paths = if paths.is_empty() {
                vec![bundled_catalog()]
            } else {
                paths
            };
            if let Some(missing) = paths.iter().find(|p| !p.exists()) {
                eprintln!("stsd: no such file or directory: {}", missing.display());
                return ExitCode::from(EXIT_USAGE);
            }
            let cat = store::Catalog::load(&paths);
            let report = check::build(&cat, &config, &stsd_protocol::envvar::ProcessEnv);
            let mut out = std::io::stdout().lock();
            let written = if json {
                check::print_json(&report, &mut out)
            } else {
                check::print_text(&report, !no_warnings, &mut out)
            };
            if let Err(e) = written {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    eprintln!("stsd: {e}");
                }
            }
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_INVALID)
            }
        }
        Command::Schema => {
            print!("{}", stsd_protocol::schema::SAFE_TOOL_SPEC_SCHEMA);
            ExitCode::SUCCESS
        }
    }
}
