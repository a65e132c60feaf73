//! stsd: runs Safe Tool Spec tools in sandboxed worker processes.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

use stsd::{check, store};

mod cli;
mod cli_catalog;
mod cli_client;
mod cli_daemon;
mod cli_gateway;
mod cli_login;
mod cli_man;
mod cli_new;
mod cli_run;
mod cli_secret;
mod cli_store;

/// Exit codes: 0 success, 1 the input is invalid (a spec, a tool call), 2 a usage error.
pub(crate) const EXIT_INVALID: u8 = 1;
pub(crate) const EXIT_USAGE: u8 = 2;

use cli::{
    Cli, Command, DaemonArgs, PolicyCmd, ServeArgs, StoreCmd, TokenCmd, ToolsCmd, UpstreamCmd,
};

/// The daemon's options from its flags and config.
fn daemon_options(
    serve: &ServeArgs,
    socket: Option<PathBuf>,
    listen: Option<String>,
    mut config: stsd_profiles::Config,
    config_source: stsd::config_file::ConfigSource,
    systemd: stsd::systemd::Systemd,
) -> Result<stsd::daemon::DaemonOptions, String> {
    if let Some(p) = &serve.preset {
        config.daemon.preset = Some(p.clone());
    }
    let worker_exe =
        std::env::current_exe().map_err(|e| format!("cannot find the stsd binary: {e}"))?;
    let sources = if serve.catalogs.is_empty() {
        vec![stsd::service::Source::Bundled]
    } else {
        serve
            .catalogs
            .iter()
            .cloned()
            .map(stsd::service::Source::Path)
            .collect()
    };
    if let Some(missing) = serve.catalogs.iter().find(|p| !p.exists()) {
        return Err(format!("no such catalog: {}", missing.display()));
    }
    let pool = serve.pool.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    if pool == 0 || pool > 1024 {
        return Err("--pool must be between 1 and 1024".into());
    }
    if let Some(p) = config.daemon.socket.as_ref().filter(|p| !p.is_absolute()) {
        return Err(format!(
            "[daemon] socket = {:?}: give an absolute path",
            p.display()
        ));
    }
    let socket = socket
        .or_else(|| config.daemon.socket.clone())
        .unwrap_or_else(stsd::paths::default_socket);
    Ok(stsd::daemon::DaemonOptions {
        config,
        pool,
        socket,
        sources,
        worker_exe,
        reuse: serve.worker_reuse.unwrap_or(1),
        toolsets: serve.toolsets.clone(),
        config_source,
        preset: serve.preset.clone(),
        systemd,
        listen,
    })
}

/// Loads the config of a command that reads one; Err is the exit code of a usage error.
fn load_config(
    arg: Option<PathBuf>,
) -> Result<(stsd_profiles::Config, stsd::config_file::ConfigSource), ExitCode> {
    let source = stsd::config_file::ConfigSource::new(arg);
    match source.load() {
        Ok((c, _)) => Ok((c, source)),
        Err(e) => {
            eprintln!("stsd: {e}");
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// Runs `f` with the config a command reads, or ends with the usage error of one that does
/// not load.
/// `stsd store export|import`.
fn store_command(what: StoreCmd) -> ExitCode {
    let done = report;
    match what {
        StoreCmd::Export { out, config } => with_config(config.config, |c| {
            done(cli_store::export(c, out.as_deref()))
        }),
        StoreCmd::Import { file, config } => {
            with_config(config.config, |c| done(cli_store::import(c, &file)))
        }
    }
}

/// `stsd upstream ...`: the preview (no daemon), and the running daemon's upstreams.
fn upstream_command(what: UpstreamCmd) -> ExitCode {
    match what {
        UpstreamCmd::Check {
            id,
            json,
            timeout_seconds,
            catalog,
            config,
        } => with_config(config.config, |config| {
            cli_gateway::check(config, id.as_deref(), json, timeout_seconds, catalog)
        }),
        UpstreamCmd::List { json, socket } => cli_gateway::list(&socket.path(), json),
        UpstreamCmd::Add {
            file,
            from_registry,
            id,
            remote,
            dry_run,
            json,
            socket,
        } => cli_gateway::add(
            &socket.path(),
            &file,
            cli_gateway::AddFrom {
                registry: from_registry,
                id,
                remote,
                dry_run,
            },
            json,
        ),
        UpstreamCmd::Update { file, json, socket } => {
            cli_gateway::update(&socket.path(), &file, json)
        }
        UpstreamCmd::Remove { id, socket } => cli_gateway::remove(&socket.path(), &id),
        UpstreamCmd::Restart { id, json, socket } => {
            cli_gateway::restart(&socket.path(), &id, json)
        }
        UpstreamCmd::Login {
            id,
            port,
            timeout_seconds,
            socket,
        } => cli_login::login(
            &socket.path(),
            &id,
            port,
            std::time::Duration::from_secs(timeout_seconds),
        ),
    }
}

fn with_config(
    arg: Option<PathBuf>,
    f: impl FnOnce(&stsd_profiles::Config) -> ExitCode,
) -> ExitCode {
    match load_config(arg) {
        Ok((config, _)) => f(&config),
        Err(code) => code,
    }
}

impl From<ToolsCmd> for cli_daemon::ToolsWrite {
    fn from(c: ToolsCmd) -> Self {
        use cli_daemon::ToolsWrite as W;
        match c {
            ToolsCmd::Add { file, .. } => W::Add(file),
            ToolsCmd::Update { name, file, .. } => W::Update(name, file),
            ToolsCmd::Rollback { name, .. } => W::Rollback(name),
            ToolsCmd::Rm { name, .. } => W::Remove(name),
            ToolsCmd::Enable { name, .. } => W::Enable(name),
            ToolsCmd::Disable { name, .. } => W::Disable(name),
            ToolsCmd::List { .. } | ToolsCmd::Show { .. } => W::None,
        }
    }
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

/// `stsd upstream-exec`: returns only when the upstream could not be started confined.
fn upstream_exec() -> ExitCode {
    let code = match Cli::try_parse() {
        Ok(Cli {
            command:
                Some(Command::UpstreamExec {
                    profile,
                    program,
                    args,
                }),
            ..
        }) => stsd::gateway::exec_main(&profile, &program, &args),
        Ok(_) => {
            eprintln!(
                "SANDBOX_UNAVAILABLE: usage: stsd upstream-exec --profile JSON -- PROGRAM [ARGS..]"
            );
            stsd_profiles::os::process::EXIT_SANDBOX_UNAVAILABLE
        }
        Err(e) => {
            eprintln!("SANDBOX_UNAVAILABLE: {e}");
            stsd_profiles::os::process::EXIT_SANDBOX_UNAVAILABLE
        }
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// `stsd mcp`: the stdio bridge to a running daemon, or (given what to serve, or when no
/// daemon answers) an embedded supervisor on stdio.
fn mcp_command(
    config: Option<PathBuf>,
    socket: PathBuf,
    serve: ServeArgs,
    keepalive_ms: u64,
    systemd: stsd::systemd::Systemd,
) -> ExitCode {
    // Any flag about what to serve (or a config for it) means serving embedded: a
    // bridge would ignore them.
    let bridge = config.is_none() && !serve.any();
    let (config, source) = match load_config(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match daemon_options(&serve, Some(socket), None, config, source, systemd).and_then(|o| {
        stsd::daemon::run_stdio(
            o,
            bridge,
            std::time::Duration::from_millis(keepalive_ms.max(1)),
        )
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stsd: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// `stsd generate-assets DIR`: man pages and completions.
fn generate_assets_command(dir: &std::path::Path) -> ExitCode {
    match cli::generate_assets(dir) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stsd: {}: {e}", dir.display());
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// `stsd tools ...` on the running daemon.
fn tools_command(what: ToolsCmd, socket: &std::path::Path) -> ExitCode {
    match what {
        ToolsCmd::List { json } => cli_daemon::tools(socket, None, json),
        ToolsCmd::Show { name, json } => cli_daemon::tools(socket, Some(&name), json),
        other => {
            let json = other.json();
            cli_daemon::tools_write(socket, other.into(), json)
        }
    }
}

/// `stsd check`: the validation report, the syntax pass, the exit code.
fn check_command(
    paths: Vec<PathBuf>,
    json: bool,
    no_warnings: bool,
    config: Option<PathBuf>,
) -> ExitCode {
    let config = match load_config(config) {
        Ok((c, _)) => c,
        Err(code) => return code,
    };
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
    let mut report = check::build(&cat, &config, &stsd::secrets::spec_env(&config));
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

/// `stsd export`: the served catalog as CJSON toolsets, MCP tools/list or OpenAI tools.
fn export_command(
    paths: Vec<PathBuf>,
    format: &str,
    all: bool,
    config: Option<PathBuf>,
) -> ExitCode {
    let config = match load_config(config) {
        Ok((c, _)) => c,
        Err(code) => return code,
    };
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
    let drafts = published
        .withheld
        .iter()
        .filter(|(_, why)| why.starts_with("DRAFT"))
        .count();
    if drafts > 0 {
        eprintln!(
            "stsd: {} skipped (--all includes them)",
            stsd::plural::n(drafts, "draft")
        );
    }
    let schemas: Vec<serde_json::Value> = published
        .tools
        .iter()
        .map(|t| serde_json::Value::Object(t.input_schema()))
        .collect();
    let tools: Vec<_> = published
        .tools
        .iter()
        .zip(&schemas)
        .map(|(t, schema)| stsd::approval::toolsets::ExportTool {
            name: &t.spec.name,
            summary: &t.spec.description,
            args_schema: schema,
            enabled: true,
            requires_approval: t.approval.required,
        })
        .collect();
    let doc = match format {
        "mcp" => {
            serde_json::json!({"tools": published.tools.iter().map(stsd::listing::tool::tool_json).collect::<Vec<_>>()})
        }
        "openai" => serde_json::json!(published
            .tools
            .iter()
            .map(|t| serde_json::json!({
                "type": "function",
                "function": {
                    "name": t.spec.name,
                    "description": t.spec.description,
                    "parameters": t.input_schema(),
                }
            }))
            .collect::<Vec<_>>()),
        _ => stsd::approval::toolsets::export(&tools),
    };
    println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    ExitCode::SUCCESS
}

/// `stsd approvals`: the calls waiting for an operator.
fn approvals_command(json: bool, socket: &std::path::Path) -> ExitCode {
    match stsd::admin::client::call(socket, "stsd/approvals/list", serde_json::json!({})) {
        Ok(v) => {
            let pending = v["pending"].as_array().cloned().unwrap_or_default();
            if json {
                println!("{v}");
                return ExitCode::SUCCESS;
            }
            // What expired while no daemon held it (a restart, a replica gone): said first.
            for e in v["expired"].as_array().into_iter().flatten() {
                println!(
                    "EXPIRED call {}  {}: {}",
                    e["callId"],
                    e["tool"].as_str().unwrap_or_default(),
                    e["reason"].as_str().unwrap_or_default()
                );
            }
            if pending.is_empty() {
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

/// `stsd token add|rm|list`: bearer tokens for MCP over HTTP, in the state store.
fn token_command(what: TokenCmd) -> ExitCode {
    match what {
        TokenCmd::Add { name, file, config } => token_add(&name, file, config.config),
        TokenCmd::Rm { name, config } => {
            with_config(config.config, |c| report(cli_store::token_rm(c, &name)))
        }
        TokenCmd::List { json, config } => {
            with_config(config.config, |c| report(cli_store::token_list(c, json)))
        }
    }
}

/// `stsd token add`: a bearer token, into the state store (or a file).
fn token_add(name: &str, file: Option<PathBuf>, config: Option<PathBuf>) -> ExitCode {
    with_config(config, |config| {
        let made = match &file {
            Some(f) => stsd::http::auth::add_token(f, name).map(|t| (t, f.display().to_string())),
            None => stsd::state::Store::of_config(config).and_then(|s| {
                stsd::http::auth::add_token_to(&s, name)
                    .map(|t| (t, format!("the state store {}", s.path().display())))
            }),
        };
        match made {
            Ok((token, at)) => {
                println!("{token}");
                eprintln!(
                    "token for {name} added to {at} (only its SHA-256 is kept; this is the one time it is shown)"
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("stsd: {e}");
                ExitCode::from(EXIT_INVALID)
            }
        }
    })
}

/// The catalog a command reads: the paths given, else the bundled one.
fn sources_of(paths: Vec<PathBuf>) -> Vec<stsd::service::Source> {
    if paths.is_empty() {
        vec![stsd::service::Source::Bundled]
    } else {
        paths.into_iter().map(stsd::service::Source::Path).collect()
    }
}

/// `stsd policy check|explain`.
fn policy_command(what: PolicyCmd) -> ExitCode {
    use stsd::policy::{report, Action};
    let refused = |errors: Vec<String>| {
        for e in errors {
            eprintln!("stsd: policy: {e}");
        }
        ExitCode::from(EXIT_INVALID)
    };
    match what {
        PolicyCmd::Check {
            paths,
            json,
            config,
        } => with_config(config.config, |c| {
            match report::check(c, &sources_of(paths)) {
                Ok(v) if json => {
                    println!("{v}");
                    ExitCode::SUCCESS
                }
                Ok(v) => {
                    print!("{}", report::check_text(&v));
                    ExitCode::SUCCESS
                }
                Err(e) => refused(e),
            }
        }),
        PolicyCmd::Bench { policies, rounds } => match report::bench(policies, rounds) {
            Ok((p50, p99)) => {
                println!(
                    "{}",
                    serde_json::json!({"policies": policies, "p50Us": p50, "p99Us": p99})
                );
                ExitCode::SUCCESS
            }
            Err(e) => refused(vec![e]),
        },
        PolicyCmd::Explain {
            principal,
            tool,
            action,
            catalog,
            config,
        } => {
            let Some(action) = Action::parse(&action) else {
                eprintln!("stsd: --action is one of list, call, approve, admin, read_audit");
                return ExitCode::from(EXIT_USAGE);
            };
            with_config(config.config, |c| {
                match report::explain(c, &sources_of(catalog), &principal, action, tool.as_deref())
                {
                    Ok(text) => {
                        print!("{text}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => refused(e),
                }
            })
        }
    }
}

/// Ends a command that says what it did, or why it could not.
fn report(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stsd: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// The child roles stsd execs itself as (a worker, the zygote, a confined upstream), which
/// run before anything else of the CLI: None for every other command.
/// The roles here are also in `accounts::CHILD_ROLES` (its constructor leaves them alone).
fn child_role() -> Option<ExitCode> {
    match std::env::args_os().nth(1) {
        Some(a) if a == "worker" => {
            let code = stsd_worker::run();
            // SAFETY: _exit ends the worker; it has nothing to flush or tear down, and
            // skipping the runtime's teardown and the exit handlers saves each call CPU.
            unsafe { libc::_exit(code.clamp(0, 255)) }
        }
        Some(a) if a == "zygote" => {
            Some(ExitCode::from(stsd_worker::run_zygote().clamp(0, 255) as u8))
        }
        // Before systemd's variables are taken and logging starts: the upstream gets exactly
        // the environment this process was given, and it must stay single-threaded.
        Some(a) if a == "upstream-exec" => Some(upstream_exec()),
        _ => None,
    }
}

/// Logging and SIGPIPE for this process: `serves` for the daemon and the stdio server.
fn set_up_process(serves: bool) {
    // The daemon (and the stdio server) log one INFO line per call; one-shot commands only
    // warnings, so their own output stays readable.
    // (rmcp's own INFO lines, a few per connection, only at STSD_LOG=rmcp=info.)
    stsd::logs::init(if serves { "info,rmcp=warn" } else { "warn" });
    // The daemon and the bridge talk to clients that may go away at any moment: a write to a
    // closed socket or pipe must be an EPIPE error (a disconnect), never a fatal signal. Rust
    // starts every program with SIGPIPE ignored; keep it so for them. A one-shot CLI writing
    // to a closed pipe (`stsd check | head`) should end quietly, as any Unix tool does.
    if !serves {
        // SAFETY: setting a signal disposition to its default before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
}

/// `stsd` with no subcommand: the daemon.
fn serve_daemon(args: DaemonArgs, systemd: stsd::systemd::Systemd) -> ExitCode {
    let DaemonArgs {
        config,
        socket,
        serve,
        listen,
    } = args;
    let (config, source) = match load_config(config.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match daemon_options(&serve, socket, listen, config, source, systemd)
        .and_then(stsd::daemon::run)
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stsd: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// `stsd secrets-bench` (hidden; scripts/bench).
fn secrets_bench(rounds: usize) -> ExitCode {
    let (p50, p99) = stsd::egress::secrets::bench(rounds);
    println!("{}", serde_json::json!({"p50Us": p50, "p99Us": p99}));
    ExitCode::SUCCESS
}

/// `stsd client setup CLIENT`.
fn client_command(what: cli::ClientCmd) -> ExitCode {
    let cli::ClientCmd::Setup {
        client,
        print,
        file,
        name,
        socket,
    } = what;
    match cli_client::setup(&client, file, &name, &socket.path(), print) {
        Ok(said) => {
            print!("{said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stsd: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// `stsd new NAME`.
fn new_command(name: &str, reach: cli_new::Reach, out: Option<PathBuf>) -> ExitCode {
    let network = !reach.network.is_empty();
    match cli_new::run(name, &reach, out) {
        Ok(path) => {
            print!("{}", cli_new::next_steps(&path, network));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stsd: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// `stsd trace-bench` (hidden; scripts/bench).
fn trace_bench(rounds: usize, on: Option<&str>) -> ExitCode {
    match stsd::telemetry::bench::run(rounds, on) {
        Ok((p50, p99)) => {
            println!("{}", serde_json::json!({"p50Us": p50, "p99Us": p99}));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stsd: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// The commands that work on spec files (no daemon needed, `export` aside); Err gives any
/// other command back.
#[allow(clippy::result_large_err)] // once per process: the size costs nothing
fn spec_command(command: Command) -> Result<ExitCode, Command> {
    Ok(match command {
        Command::New {
            name,
            network,
            fs,
            out,
        } => new_command(&name, cli_new::Reach { network, fs }, out),
        Command::Check {
            paths,
            json,
            no_warnings,
            config,
        } => check_command(paths, json, no_warnings, config.config),
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
            config,
        } => with_config(config.config, |config| {
            cli_run::run(
                config,
                cli_run::RunArgs {
                    spec_path: &spec,
                    tool: tool.as_deref(),
                    arg_pairs: &args,
                    args_json: args_json.as_deref(),
                    json_out: json,
                    timings,
                    answer: (approve || deny).then_some(approve),
                },
            )
        }),
        Command::Test {
            paths,
            write,
            json,
            case,
            in_place,
            approve,
            deny,
            config,
        } => with_config(config.config, |config| {
            let test = cli_run::TestArgs {
                write,
                json_out: json,
                only_case: case,
                in_place,
                answer: (approve || deny).then_some(approve),
            };
            cli_run::test(config, &paths, test)
        }),
        Command::Export {
            paths,
            format,
            all,
            config,
            socket,
        } => {
            if paths.is_empty() && !all {
                if let Some(code) = cli_daemon::export_served(&socket.path(), &format) {
                    return Ok(code);
                }
            }
            export_command(paths, &format, all, config.config)
        }
        other => return Err(other),
    })
}

fn main() -> ExitCode {
    // The worker must not start a logging subscriber or touch anything before its sandbox:
    // dispatch it first.
    if let Some(code) = child_role() {
        return code;
    }
    // NSS pinned to glibc's built-in sources before any thread or lookup (see accounts.rs).
    stsd::accounts::builtin_sources();
    // systemd's variables are read and removed before any thread exists (see systemd/).
    let systemd = stsd::systemd::Systemd::from_env();
    let cli = Cli::parse();
    let serves = matches!(cli.command, None | Some(Command::Mcp { .. }));
    set_up_process(serves);
    // Whatever made cgroups (the daemon, `stsd run`, `stsd test`) removes its own directory
    // at the end.
    let _cgroups = stsd::cgroup::ReleaseAtExit;
    let Some(command) = cli.command else {
        return serve_daemon(cli.daemon, systemd);
    };
    let command = match spec_command(command) {
        Ok(code) => return code,
        Err(other) => other,
    };
    match command {
        Command::Mcp {
            config,
            socket,
            serve,
            keepalive_ms,
        } => mcp_command(config, socket.path(), serve, keepalive_ms, systemd),
        Command::GenerateAssets { dir } => generate_assets_command(&dir),
        Command::SecretsBench { rounds } => secrets_bench(rounds),
        Command::TraceBench { rounds, on } => trace_bench(rounds, on.as_deref()),
        Command::Call {
            tool,
            args,
            args_json,
            json,
            approve,
            deny,
            socket,
        } => cli_daemon::call(
            &socket.path(),
            &tool,
            &args,
            args_json.as_deref(),
            json,
            (approve || deny).then_some(approve),
        ),
        Command::Status { json, socket } => cli_daemon::status(&socket.path(), json),
        Command::Metrics { json, socket } => cli_daemon::metrics(&socket.path(), json),
        Command::Tools { what, socket } => tools_command(what, &socket.path()),
        Command::Upstream { what } => upstream_command(what),
        Command::Ledger { what, socket } => cli_gateway::ledger(&socket.path(), what),
        Command::Secret { what, socket } => cli_secret::run(&socket.path(), what),
        Command::Catalog { what, socket } => cli_catalog::run(&socket.path(), what),
        Command::Approvals { json, socket } => approvals_command(json, &socket.path()),
        Command::Approve { id, reason, socket } => decide(&socket.path(), id, true, &reason),
        Command::Deny { id, reason, socket } => decide(&socket.path(), id, false, &reason),
        Command::Token(what) => token_command(what),
        Command::Client(what) => client_command(what),
        Command::Policy(what) => policy_command(what),
        Command::Store(what) => store_command(what),
        // The worker, zygote and upstream-exec roles, dispatched before parsing; the spec
        // commands, handled above.
        _ => ExitCode::from(EXIT_USAGE),
    }
}
