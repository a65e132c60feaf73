//! stsd: runs Safe Tool Spec tools in sandboxed worker processes.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use stsd::{check, store};

mod cli_daemon;
mod cli_run;

/// Exit codes: 0 success, 1 the input is invalid (a spec, a tool call), 2 a usage error.
pub(crate) const EXIT_INVALID: u8 = 1;
pub(crate) const EXIT_USAGE: u8 = 2;

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
    #[command(flatten)]
    daemon: DaemonArgs,
    /// With no subcommand, stsd runs the daemon.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Args, Debug, Clone)]
struct DaemonArgs {
    /// Workers kept exec'd and waiting (default: the number of CPUs).
    #[arg(long, global = true)]
    pool: Option<usize>,
    /// The daemon's Unix socket (default: $XDG_RUNTIME_DIR/stsd.sock, /run/stsd/stsd.sock as root).
    #[arg(long, global = true, env = "STSD_SOCKET")]
    socket: Option<PathBuf>,
    /// Spec files or directories to serve (repeatable; default: the bundled catalog).
    #[arg(long = "catalog", global = true)]
    catalogs: Vec<PathBuf>,
    /// Let one worker serve up to K calls of the same tool, each in a fresh context
    /// (default 1: a fresh process per call).
    #[arg(long, global = true, default_value_t = 1)]
    worker_reuse: u32,
    /// Serve only the tools of this preset (from default-tool-presets.json).
    #[arg(long, global = true, value_name = "ID")]
    preset: Option<String>,
    /// A CJSON toolsets document (per-tool enabled / requiresApproval); repeatable.
    #[arg(long = "toolsets", global = true, value_name = "FILE")]
    toolsets: Vec<PathBuf>,
    /// Also serve MCP over Streamable HTTP on ADDR:PORT (see [http] in the config: TLS,
    /// tokens, client certificates, origins). The Unix socket is served either way.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
}

impl DaemonArgs {
    /// The daemon's socket: --socket, STSD_SOCKET, or the default.
    fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(stsd::paths::default_socket)
    }

    fn options(
        &self,
        mut config: stsd_profiles::Config,
    ) -> Result<stsd::daemon::DaemonOptions, String> {
        if let Some(p) = &self.preset {
            config.daemon.preset = Some(p.clone());
        }
        let worker_exe =
            std::env::current_exe().map_err(|e| format!("cannot find the stsd binary: {e}"))?;
        let sources = if self.catalogs.is_empty() {
            vec![stsd::service::Source::Bundled]
        } else {
            self.catalogs
                .iter()
                .cloned()
                .map(stsd::service::Source::Path)
                .collect()
        };
        if let Some(missing) = self.catalogs.iter().find(|p| !p.exists()) {
            return Err(format!("no such catalog: {}", missing.display()));
        }
        let pool = self.pool.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        });
        if pool == 0 || pool > 1024 {
            return Err("--pool must be between 1 and 1024".into());
        }
        Ok(stsd::daemon::DaemonOptions {
            config,
            pool,
            socket: self
                .socket
                .clone()
                .unwrap_or_else(stsd::paths::default_socket),
            sources,
            worker_exe,
            reuse: self.worker_reuse,
            toolsets: self.toolsets.clone(),
            listen: self.listen.clone(),
        })
    }
}

#[derive(Subcommand, Debug)]
enum ToolsCmd {
    /// Every tool, served and withheld (with why).
    List {
        #[arg(long)]
        json: bool,
    },
    /// One tool: its entry, description, inputSchema and toolSafety.
    Show { name: String },
    /// Publish a new tool: validate, resolve, Local Pass, test cases, then serve it.
    Add { file: PathBuf },
    /// Publish a new version of a managed tool through the same gate; the old one is kept.
    Update { name: String, file: PathBuf },
    /// Serve the previous version of a managed tool again.
    Rollback { name: String },
    /// Retire a managed tool (rollback brings it back).
    Rm { name: String },
    /// Serve a tool the operator disabled.
    Enable { name: String },
    /// Stop serving a tool (it stays in the catalog).
    Disable { name: String },
}

impl From<ToolsCmd> for cli_daemon::ToolsWrite {
    fn from(c: ToolsCmd) -> Self {
        use cli_daemon::ToolsWrite as W;
        match c {
            ToolsCmd::Add { file } => W::Add(file),
            ToolsCmd::Update { name, file } => W::Update(name, file),
            ToolsCmd::Rollback { name } => W::Rollback(name),
            ToolsCmd::Rm { name } => W::Remove(name),
            ToolsCmd::Enable { name } => W::Enable(name),
            ToolsCmd::Disable { name } => W::Disable(name),
            ToolsCmd::List { .. } | ToolsCmd::Show { .. } => W::None,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate specs and show their state, risk level and resolved toolSafety.
    Check {
        /// Spec files (single spec, array or bundle) or directories of them.
        /// Defaults to the bundled catalog (compiled into stsd).
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
    /// Run one call of a tool in a sandboxed worker.
    Run {
        /// A spec file (a single spec, or an array/bundle with --tool).
        spec: PathBuf,
        /// The tool to run when the file holds several.
        #[arg(long)]
        tool: Option<String>,
        /// An argument as NAME=VALUE, parsed to the param's declared type.
        #[arg(long = "arg", value_name = "NAME=VALUE")]
        args: Vec<String>,
        /// All arguments as one JSON object (--arg values override); `@FILE` reads it from a
        /// file and `@-` from stdin (for arguments too large for a command line).
        #[arg(long)]
        args_json: Option<String>,
        /// Print the outcome as one JSON object.
        #[arg(long)]
        json: bool,
        /// Print where the time went (spawn, profile, context, body) to stderr.
        #[arg(long)]
        timings: bool,
        /// Approve ahead a tool that needs approval (instead of asking at the terminal).
        #[arg(long, conflicts_with = "deny")]
        approve: bool,
        /// Deny ahead a tool that needs approval.
        #[arg(long)]
        deny: bool,
    },
    /// Run the Local Pass and the testCases of specs; --write persists draft:false for those
    /// that pass.
    Test {
        paths: Vec<PathBuf>,
        #[arg(long)]
        write: bool,
        /// One JSON document (seed 004's shape: results[] and a summary).
        #[arg(long)]
        json: bool,
        /// Run only test case N (0-based) of each spec, not the Local Pass.
        #[arg(long = "case", value_name = "N")]
        case: Option<usize>,
        /// Run file tools against their real base path (the workspace), not a scratch copy:
        /// write and delete tools then change files there.
        #[arg(long = "in-place")]
        in_place: bool,
    },
    /// Write the served catalog as a CJSON toolsets document (seed 003), each tool with its
    /// argsSchema and approval requirement: a complete file to start --toolsets from.
    Export {
        /// Spec files or directories (default: the bundled catalog).
        paths: Vec<PathBuf>,
        /// cjson: a CJSON toolsets document; mcp: tools/list entries; openai: function-calling
        /// tools with JSON Schema parameters.
        #[arg(long, value_parser = ["cjson", "mcp", "openai"], default_value = "cjson")]
        format: String,
        /// Every valid spec, drafts and specs missing variables included (not only ACTIVE).
        #[arg(long)]
        all: bool,
    },
    /// Call a tool on the running daemon (MCP over its socket); exit codes as `stsd run`.
    Call {
        tool: String,
        /// An argument as NAME=VALUE, typed by the tool's inputSchema.
        #[arg(long = "arg", value_name = "NAME=VALUE")]
        args: Vec<String>,
        /// All arguments as one JSON object (--arg values override); `@FILE` or `@-` as for
        /// `stsd run`.
        #[arg(long)]
        args_json: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The running daemon's health: version, uptime, pool, queue, catalog, sandbox support.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The running daemon's metrics as JSON (calls by tool and outcome, pool, queue).
    Metrics,
    /// The running daemon's tools: name, state, risk level, approval requirement.
    Tools {
        #[command(subcommand)]
        what: ToolsCmd,
    },
    /// Calls waiting for an operator's approval on the running daemon.
    Approvals {
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting call (needs a uid in [approval] operator_uids).
    Approve {
        id: u64,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Deny a waiting call; the model sees the reason.
    Deny {
        id: u64,
        #[arg(long)]
        reason: String,
    },
    /// MCP on stdio: bridges to a running daemon, or serves the catalog itself.
    Mcp {
        /// While the client is quiet, tell the daemon every this many milliseconds that it is
        /// still there (so the session is not closed as idle).
        #[arg(long, default_value_t = stsd::daemon::BRIDGE_KEEPALIVE.as_millis() as u64, hide = true)]
        keepalive_ms: u64,
    },
    /// Bearer tokens for MCP over HTTP.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Internal: the sandboxed worker process (started by exec, never by hand).
    #[command(hide = true)]
    Worker,
    /// Internal: the zygote that forks workers (started by the daemon, never by hand).
    #[command(hide = true)]
    Zygote,
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Make a fresh token for principal NAME: printed once, only its SHA-256 is written.
    Add {
        name: String,
        /// The tokens file (default: [http] tokens_file from the config).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

/// `stsd approve` / `stsd deny`: one admin request to the running daemon.
fn decide(socket: &std::path::Path, id: u64, approve: bool, reason: &str) -> ExitCode {
    let params = serde_json::json!({"id": id, "approve": approve, "reason": reason});
    match stsd::admin::client::call(socket, "stsd/approvals/decide", params) {
        Ok(_) => {
            println!("call {id} {}", if approve { "approved" } else { "denied" });
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stsd: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

fn main() -> ExitCode {
    // The worker must not start a logging subscriber or touch anything before its sandbox:
    // dispatch it first.
    match std::env::args_os().nth(1) {
        Some(a) if a == "worker" => {
            let code = stsd_worker::run();
            // SAFETY: _exit ends the worker; it has nothing to flush or tear down, and
            // skipping the runtime's teardown and the exit handlers saves each call CPU.
            unsafe { libc::_exit(code.clamp(0, 255)) }
        }
        Some(a) if a == "zygote" => {
            return ExitCode::from(stsd_worker::run_zygote().clamp(0, 255) as u8)
        }
        _ => {}
    }
    // The HTTP client logs the URLs and headers it sends, which carry a tool's resolved
    // secrets; stsd's own lines are masked, a library's are not, so it is kept silent
    // whatever STSD_LOG asks (the audit record names every hop, masked).
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("STSD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    for quiet in ["ureq=off", "rustls=warn"] {
        if let Ok(d) = quiet.parse() {
            filter = filter.add_directive(d);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // The daemon and the bridge talk to clients that may go away at any moment: a write to a
    // closed socket or pipe must be an EPIPE error (a disconnect), never a fatal signal. Rust
    // starts every program with SIGPIPE ignored; keep it so for them. A one-shot CLI writing
    // to a closed pipe (`stsd check | head`) should end quietly, as any Unix tool does.
    if !matches!(cli.command, None | Some(Command::Mcp { .. })) {
        // SAFETY: setting a signal disposition to its default before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
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
    let Some(command) = cli.command else {
        return match cli.daemon.options(config).and_then(stsd::daemon::run) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stsd: {e}");
                ExitCode::from(EXIT_INVALID)
            }
        };
    };
    match command {
        Command::Mcp { keepalive_ms } => match cli.daemon.options(config).and_then(|o| {
            stsd::daemon::run_stdio(o, std::time::Duration::from_millis(keepalive_ms.max(1)))
        }) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stsd: {e}");
                ExitCode::from(EXIT_INVALID)
            }
        },
        Command::Check {
            paths,
            json,
            no_warnings,
        } => {
            if let Some(missing) = paths.iter().find(|p| !p.exists()) {
                eprintln!("stsd: no such file or directory: {}", missing.display());
                return ExitCode::from(EXIT_USAGE);
            }
            let extra = if paths.is_empty() {
                stsd::bundled::examples().into_iter().collect()
            } else {
                Vec::new()
            };
            let cat = store::Catalog::load_with(&paths, extra);
            let mut report = check::build(&cat, &config, &config.baseline.env());
            match std::env::current_exe()
                .map_err(|e| e.to_string())
                .and_then(|exe| stsd::exec::ExecOptions::new(exe, &config))
            {
                Ok(opts) => check::syntax_pass(&mut report, &cat, &config, &opts),
                Err(e) => eprintln!("stsd: the syntax check did not run: {e}"),
            }
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
        Command::Run {
            spec,
            tool,
            args,
            args_json,
            json,
            timings,
            approve,
            deny,
        } => cli_run::run(
            &config,
            cli_run::RunArgs {
                spec_path: &spec,
                tool: tool.as_deref(),
                arg_pairs: &args,
                args_json: args_json.as_deref(),
                json_out: json,
                timings,
                answer: (approve || deny).then_some(approve),
            },
        ),
        Command::Test {
            paths,
            write,
            json,
            case,
            in_place,
        } => cli_run::test(&config, &paths, write, json, case, in_place),
        Command::Call {
            tool,
            args,
            args_json,
            json,
        } => cli_daemon::call(
            &cli.daemon.socket_path(),
            &tool,
            &args,
            args_json.as_deref(),
            json,
        ),
        Command::Status { json } => cli_daemon::status(&cli.daemon.socket_path(), json),
        Command::Metrics => cli_daemon::metrics(&cli.daemon.socket_path()),
        Command::Tools { what } => match what {
            ToolsCmd::List { json } => cli_daemon::tools(&cli.daemon.socket_path(), None, json),
            ToolsCmd::Show { name } => {
                cli_daemon::tools(&cli.daemon.socket_path(), Some(&name), true)
            }
            other => cli_daemon::tools_write(&cli.daemon.socket_path(), other.into()),
        },
        Command::Export { paths, format, all } => {
            let sources = if paths.is_empty() {
                vec![stsd::service::Source::Bundled]
            } else {
                paths.into_iter().map(stsd::service::Source::Path).collect()
            };
            let published = if all {
                stsd::service::publish_any_state(&sources, &config)
            } else {
                stsd::service::publish(&sources, &config)
            };
            let tools: Vec<_> = published
                .tools
                .iter()
                .map(|t| stsd::approval::toolsets::ExportTool {
                    name: &t.spec.name,
                    summary: &t.spec.description,
                    args_schema: &t.input_schema,
                    enabled: true,
                    requires_approval: t.approval.required,
                })
                .collect();
            let doc = match format.as_str() {
                "mcp" => {
                    serde_json::json!({"tools": published.tools.iter().map(stsd::mcp::tool_json).collect::<Vec<_>>()})
                }
                "openai" => serde_json::json!(published
                    .tools
                    .iter()
                    .map(|t| serde_json::json!({
                        "type": "function",
                        "function": {
                            "name": t.spec.name,
                            "description": t.spec.description,
                            "parameters": t.input_schema,
                        }
                    }))
                    .collect::<Vec<_>>()),
                _ => stsd::approval::toolsets::export(&tools),
            };
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Command::Approvals { json } => {
            let socket = cli.daemon.socket_path();
            match stsd::admin::client::call(&socket, "stsd/approvals/list", serde_json::json!({})) {
                Ok(v) => {
                    let pending = v["pending"].as_array().cloned().unwrap_or_default();
                    if json {
                        println!("{v}");
                    } else if pending.is_empty() {
                        println!("no call is waiting for approval");
                    } else {
                        for p in pending {
                            println!(
                                "{}  {}  uid {}  waiting {} s\n    arguments: {}\n    {}",
                                p["id"],
                                p["tool"].as_str().unwrap_or_default(),
                                p["peerUid"],
                                p["ageMs"].as_u64().unwrap_or(0) / 1000,
                                p["arguments"],
                                p["prompt"].as_str().unwrap_or_default()
                            );
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("stsd: {e}");
                    ExitCode::from(EXIT_INVALID)
                }
            }
        }
        Command::Approve { id, reason } => decide(&cli.daemon.socket_path(), id, true, &reason),
        Command::Deny { id, reason } => decide(&cli.daemon.socket_path(), id, false, &reason),
        Command::Token(TokenCmd::Add { name, file }) => {
            let Some(file) = file.or(config.http.tokens_file.clone()) else {
                eprintln!("stsd: no tokens file: give --file or set [http] tokens_file");
                return ExitCode::from(EXIT_USAGE);
            };
            match stsd::http::auth::add_token(&file, &name) {
                Ok(token) => {
                    println!("{token}");
                    eprintln!(
                        "token for {name} added to {} (only its SHA-256 is kept; this is the one time it is shown)",
                        file.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("stsd: {e}");
                    ExitCode::from(EXIT_INVALID)
                }
            }
        }
        Command::Worker | Command::Zygote => ExitCode::from(EXIT_USAGE),
    }
}
