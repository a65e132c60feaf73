//! The command line. Each subcommand takes exactly the flags it uses: the daemon's flags
//! (`--pool`, `--catalog`...) belong to `stsd` itself (the daemon, written before any
//! subcommand: `stsd --pool 8`) and to `stsd mcp` (its embedded supervisor); `--socket`
//! belongs to the commands that talk to a daemon; `--config` to those that read a policy.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "stsd",
    version,
    about = "Run Safe Tool Spec tools in sandboxed worker processes",
    long_about = "Run Safe Tool Spec tools in sandboxed worker processes (QuickJS under Landlock \
                  and seccomp), served over MCP on a Unix socket. With no subcommand, stsd runs \
                  the daemon.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(flatten)]
    pub daemon: DaemonArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `--config FILE`; without it the lookup of `config_file` applies.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArg {
    /// Policy and daemon settings (TOML). Default: /etc/stsd/stsd.toml as root, else
    /// $XDG_CONFIG_HOME/stsd/stsd.toml (~/.config/stsd/stsd.toml), else built-in defaults.
    #[arg(long, env = "STSD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `--socket PATH` of a running daemon.
#[derive(Args, Debug, Clone, Default)]
pub struct SocketArg {
    /// The daemon's Unix socket (default: $XDG_RUNTIME_DIR/stsd.sock, /run/stsd/stsd.sock as
    /// root).
    #[arg(long, env = "STSD_SOCKET", value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
}

impl SocketArg {
    /// `--socket` / `STSD_SOCKET`, else `[daemon] socket` of the config file the daemon
    /// would read (`STSD_CONFIG`, else the default lookup), else the default path.
    pub fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .or_else(|| {
                let named = std::env::var_os("STSD_CONFIG")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from);
                stsd::config_file::ConfigSource::new(named)
                    .load()
                    .ok()
                    .and_then(|(c, _)| c.daemon.socket)
            })
            .unwrap_or_else(stsd::paths::default_socket)
    }
}

/// What the daemon serves and how (also `stsd mcp`'s embedded supervisor).
#[derive(Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// Workers made and waiting before calls arrive (default: the number of CPUs).
    #[arg(long)]
    pub pool: Option<usize>,
    /// Spec files or directories to serve (repeatable; default: the bundled catalog).
    #[arg(long = "catalog", value_name = "PATH")]
    pub catalogs: Vec<PathBuf>,
    /// Let one worker serve up to K calls of the same tool, each in a fresh context
    /// (default 1: a fresh process per call).
    #[arg(long, value_name = "K")]
    pub worker_reuse: Option<u32>,
    /// Serve only the tools of this preset (from default-tool-presets.json).
    #[arg(long, value_name = "ID")]
    pub preset: Option<String>,
    /// A CJSON toolsets document (per-tool enabled / requiresApproval); repeatable.
    #[arg(long = "toolsets", value_name = "FILE")]
    pub toolsets: Vec<PathBuf>,
}

impl ServeArgs {
    /// Whether any flag about what to serve was given (`stsd mcp` then serves itself).
    pub fn any(&self) -> bool {
        self.pool.is_some()
            || !self.catalogs.is_empty()
            || self.worker_reuse.is_some()
            || self.preset.is_some()
            || !self.toolsets.is_empty()
    }
}

/// The daemon: `stsd [--config FILE] [--socket PATH] [--pool N] [--catalog PATH]...`.
#[derive(Args, Debug, Clone, Default)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The Unix socket to listen on (default: $XDG_RUNTIME_DIR/stsd.sock, /run/stsd/stsd.sock
    /// as root); ignored when systemd passes the socket (socket activation).
    #[arg(long, env = "STSD_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Also serve MCP over Streamable HTTP on ADDR:PORT (see [http] in the config: TLS,
    /// tokens, client certificates, origins). The Unix socket is served either way.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a fresh token for principal NAME: printed once, only its SHA-256 is kept, in the
    /// config's state store (every daemon on it accepts it within a second).
    Add {
        name: String,
        /// Append the digest to this tokens file instead (`[http] tokens_file`, e.g. for a
        /// Kubernetes Secret).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Remove every token of principal NAME from the state store (daemons stop accepting
    /// them within seconds).
    Rm {
        name: String,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// The principals with tokens in the state store, and how many each has.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArg,
    },
}

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Validate the config's policy (the default one and [policy] files, against the schema)
    /// and list every principal x tool decision for the served catalog, and every principal's
    /// admin, read_audit and approve. Exit 1 when the policy does not validate.
    Check {
        /// Spec files or directories (default: the bundled catalog).
        paths: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// The decision for one principal (`uid:N` or an HTTP principal's name) and one tool,
    /// and the policies that made it.
    Explain {
        principal: String,
        /// The tool (for list and call).
        tool: Option<String>,
        /// list, call, approve, admin or read_audit.
        #[arg(long, default_value = "call")]
        action: String,
        /// A spec file or directory to take the tool from (default: the bundled catalog).
        #[arg(long, value_name = "PATH")]
        catalog: Vec<PathBuf>,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Internal (scripts/bench): the cost of one decision with N policies in force.
    #[command(hide = true)]
    Bench {
        #[arg(long, default_value_t = 100)]
        policies: usize,
        #[arg(long, default_value_t = 20000)]
        rounds: usize,
    },
}

#[derive(Subcommand, Debug)]
pub enum ToolsCmd {
    /// Every tool, served and withheld (with why).
    List {
        #[arg(long)]
        json: bool,
    },
    /// One tool: its entry, description, inputSchema and toolSafety.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Publish a new tool: validate, resolve, Local Pass, test cases, then serve it.
    Add {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Publish a new version of a managed tool through the same gate; the old one is kept.
    Update {
        name: String,
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Serve the previous version of a managed tool again.
    Rollback {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Retire a managed tool (rollback brings it back).
    Rm {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Serve a tool the operator disabled.
    Enable {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop serving a tool (it stays in the catalog).
    Disable {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

impl ToolsCmd {
    /// `--json`: the daemon's answer as JSON instead of text.
    pub fn json(&self) -> bool {
        match self {
            ToolsCmd::List { json }
            | ToolsCmd::Show { json, .. }
            | ToolsCmd::Add { json, .. }
            | ToolsCmd::Update { json, .. }
            | ToolsCmd::Rollback { json, .. }
            | ToolsCmd::Rm { json, .. }
            | ToolsCmd::Enable { json, .. }
            | ToolsCmd::Disable { json, .. } => *json,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum UpstreamCmd {
    /// Connect to each declared upstream (confined, as the daemon would), score the server
    /// and its tools, scan them, look them up in the ledger, and print it all; nothing is
    /// served and the ledger is not changed (seed 001's connection risk preview). A server it
    /// cannot reach is scored from its configuration alone. Exit 0: all connected and nothing
    /// withheld; 1: an upstream did not get to serve; 2: a policy withholds a tool.
    Check {
        /// Only this upstream.
        id: Option<String>,
        #[arg(long)]
        json: bool,
        /// How long to wait for each upstream's tool list.
        #[arg(long, default_value_t = 30)]
        timeout_seconds: u64,
        /// The catalog the daemon serves beside them (default: the bundled one): rule R1 and
        /// the cross-server pattern read its tool names.
        #[arg(long, value_name = "PATH")]
        catalog: Vec<PathBuf>,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Add an upstream to the running daemon: connected, confined and scored before its tools
    /// are served, and kept in the state store (every replica on a shared one runs it). FILE
    /// is one `[[upstream]]` entry, TOML or JSON, or with --from-registry an MCP registry
    /// server.json. Prints the upstream as `upstream list` shows it.
    Add {
        file: PathBuf,
        /// FILE is an MCP registry server.json (its secrets become ${secret:NAME}).
        #[arg(long)]
        from_registry: bool,
        /// With --from-registry: the upstream's id (default: from the server's name).
        #[arg(long)]
        id: Option<String>,
        /// With --from-registry: use the server's remote rather than its package.
        #[arg(long)]
        remote: bool,
        /// Print the entry that would be added, as TOML, and add nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Replace an upstream added at run time with a new entry (FILE as for add): drained,
    /// stopped and set up again.
    Update {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Remove an upstream added at run time: its tools leave at once (clients are told), its
    /// calls in flight get [gateway] drain_seconds, then its processes are killed.
    Remove {
        id: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Restart any upstream: drained, its processes killed, connected again.
    Restart {
        id: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Sign in to an OAuth upstream (one with a url, auth = "oauth" and no Authorization
    /// header): prints an address to open in a browser and waits for the browser to come
    /// back to a loopback port; the daemon then keeps (mode 0600, in its state directory) and
    /// refreshes the tokens, and connects the upstream.
    Login {
        id: String,
        /// The loopback port the browser comes back to (0: any free one). Over SSH, pick one
        /// and forward it to the browser's machine.
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// How long to wait for the browser.
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// The running daemon's upstreams: connection state, scores, tools served and withheld.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
}

#[derive(Subcommand, Debug)]
pub enum ClientCmd {
    /// Write CLIENT's MCP config so that it starts `stsd mcp` (bridged to this daemon's
    /// socket), keeping everything the file holds. CLIENT: claude-desktop, claude-code,
    /// cursor, vscode, windsurf.
    Setup {
        client: String,
        /// Print the file it would write, and write nothing.
        #[arg(long)]
        print: bool,
        /// The client's config file (default: where that client keeps it).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// The server's name in the client.
        #[arg(long, default_value = "stsd")]
        name: String,
        #[command(flatten)]
        socket: SocketArg,
    },
}

#[derive(Subcommand, Debug)]
pub enum StoreCmd {
    /// Write the state store (managed tools, their history, the switches, the ledger) as one
    /// JSON document: a backup, or a move between backends (SQLite, PostgreSQL).
    Export {
        /// Where to write it (default: standard output).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Read a document `stsd store export` wrote into this config's store, which must hold no
    /// state yet (a new file, or a new database).
    Import {
        file: PathBuf,
        #[command(flatten)]
        config: ConfigArg,
    },
}

#[derive(Subcommand, Debug)]
pub enum SecretCmd {
    /// Store secret NAME. The value is read from standard input (typed without echo at a
    /// terminal), never from the command line, where other users' `ps` would see it.
    Set {
        name: String,
        /// A host the secret may be sent to (repeatable; a name or *.apex). Given, the
        /// secret is a tool's: a spec's ${NAME} or ${secret:NAME} resolves to it, and the
        /// egress broker puts it only into requests to these hosts. Without any, it is for
        /// upstreams and the store only (its hosts set before, if any, stay).
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
    },
    /// Delete secret NAME: tools that need it are withheld.
    Rm { name: String },
    /// The names of the secrets set (never their values) and where they live.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum CatalogCmd {
    /// Publish each spec of PATH (a file or a directory of them), or of a preset of the
    /// catalog (`--preset ID`, from its default-tool-presets.json), that passes its Local Pass
    /// and test cases in scratch. Tools that need approval are asked about first.
    Add {
        /// Spec files or directories (default with --preset: the daemon's bundled catalog).
        paths: Vec<PathBuf>,
        /// Only the tools of this preset (see `stsd catalog presets`).
        #[arg(long)]
        preset: Option<String>,
        /// Run the Local Pass of tools that need approval without asking (their file writes
        /// go to a scratch copy of their workspace; their network calls are real). Needs an
        /// approver's rights.
        #[arg(long)]
        approve_required: bool,
        #[arg(long)]
        json: bool,
    },
    /// The presets of a catalog (default: the bundled one).
    Presets {
        paths: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum LedgerCmd {
    /// Every fingerprint: id, state (ACTIVE, AWAITING_REREVIEW, REVOKED), when seen.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Approve an id's current content (a changed tool is served again).
    Approve { id: String },
    /// Revoke an id: withheld until approved again.
    Revoke { id: String },
}

#[derive(Subcommand, Debug)]
pub enum Command {
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
        #[command(flatten)]
        config: ConfigArg,
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
        #[command(flatten)]
        config: ConfigArg,
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
        /// Approve ahead every tool that needs approval (`humanInTheLoop: REQUIRED`, a rule);
        /// without it or --deny such a tool's pass asks at the terminal, and fails where
        /// there is none.
        #[arg(long, conflicts_with = "deny")]
        approve: bool,
        /// Deny ahead every tool that needs approval (its pass fails, nothing of it runs).
        #[arg(long)]
        deny: bool,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Write the served catalog as a CJSON toolsets document (seed 003), each tool with its
    /// argsSchema and approval requirement: a complete file to start --toolsets from.
    Export {
        /// Spec files or directories (default: what the running daemon serves, upstream tools
        /// included; the bundled catalog when no daemon answers).
        paths: Vec<PathBuf>,
        /// cjson: a CJSON toolsets document; mcp: tools/list entries; openai: function-calling
        /// tools with JSON Schema parameters.
        #[arg(long, value_parser = ["cjson", "mcp", "openai"], default_value = "cjson")]
        format: String,
        /// Every valid spec, drafts and specs missing variables included (not only ACTIVE).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        socket: SocketArg,
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
        /// Answer yes ahead when the tool asks this caller for approval (elicit strategy);
        /// without --approve or --deny the terminal is asked.
        #[arg(long, conflicts_with = "deny")]
        approve: bool,
        /// Answer no ahead when the tool asks this caller for approval.
        #[arg(long)]
        deny: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// The running daemon's health: version, uptime, pool, queue, catalog, sandbox support.
    Status {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// The running daemon's metrics: calls by tool and outcome, pool, queue, tools served
    /// (own and upstream), store, audit log. `--json` for the document.
    Metrics {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// The running daemon's tools: name, state, risk level, approval requirement.
    Tools {
        #[command(subcommand)]
        what: ToolsCmd,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// External MCP servers: `check` previews their scores without a daemon; `list` asks the
    /// running daemon.
    Upstream {
        #[command(subcommand)]
        what: UpstreamCmd,
    },
    /// Secrets of the running daemon: what a spec's ${NAME} or ${secret:NAME} (a secret set
    /// with --host) and an upstream's ${secret:NAME} resolve to. A tool reads it at every call
    /// (no restart); an upstream when it connects (stsd upstream restart ID).
    Secret {
        #[command(subcommand)]
        what: SecretCmd,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Publish the specs of a catalog that pass their Local Pass (run here, in scratch), and
    /// say why each other one did not.
    Catalog {
        #[command(subcommand)]
        what: CatalogCmd,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// The fingerprint ledger of the running daemon (upstream tools and stsd's own specs).
    Ledger {
        #[command(subcommand)]
        what: LedgerCmd,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Calls waiting for an operator's approval on the running daemon.
    Approvals {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Approve a waiting call (needs a uid in [approval] operator_uids).
    Approve {
        id: u64,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Deny a waiting call; the model sees the reason.
    Deny {
        id: u64,
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// MCP on stdio: bridges to the running daemon on --socket; with any of --config,
    /// --catalog, --pool, --worker-reuse, --preset, --toolsets (or when no daemon answers)
    /// serves itself with an embedded supervisor.
    Mcp {
        /// Policy for the embedded supervisor (TOML); giving it means serving embedded.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        serve: ServeArgs,
        /// While the client is quiet, tell the daemon every this many milliseconds that it is
        /// still there (so the session is not closed as idle).
        #[arg(long, default_value_t = stsd::daemon::BRIDGE_KEEPALIVE.as_millis() as u64, hide = true)]
        keepalive_ms: u64,
    },
    /// MCP clients: point one at this daemon.
    #[command(subcommand)]
    Client(ClientCmd),
    /// Bearer tokens for MCP over HTTP.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Who may call what: check the config's Cedar policy, or explain one decision.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// The state store: export it to JSON, or import such a document.
    #[command(subcommand)]
    Store(StoreCmd),
    /// Internal: write the man pages and shell completions into DIR (used by packaging).
    #[command(hide = true)]
    GenerateAssets {
        /// Created if missing; gets man/*.1 and completions/{stsd.bash,_stsd,stsd.fish}.
        dir: PathBuf,
    },
    /// Internal (scripts/bench): what substituting secrets at egress adds to one fetch.
    #[command(hide = true)]
    SecretsBench {
        #[arg(long, default_value_t = 20000)]
        rounds: usize,
    },
    /// Write a starting spec NAME.json: valid, its code commented, with a parameter and a test
    /// case; then `stsd check`, `stsd test --write` and `stsd tools add` it.
    New {
        name: String,
        /// A host the tool may fetch from (repeatable); its code starts with a fetch.
        #[arg(long, value_name = "HOST")]
        network: Vec<String>,
        /// The workspace: read, or write (and read).
        #[arg(long, value_name = "read|write")]
        fs: Option<String>,
        /// Where to write it (default NAME.json here; an existing file is never replaced).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Internal (scripts/bench): what a call's trace spans cost, off and (--on URL) on.
    #[command(hide = true)]
    TraceBench {
        #[arg(long, default_value_t = 20000)]
        rounds: usize,
        /// Export to this OTLP endpoint while measuring.
        #[arg(long)]
        on: Option<String>,
    },
    /// Internal: the sandboxed worker process (started by exec, never by hand).
    #[command(hide = true)]
    Worker,
    /// Internal: the zygote that forks workers (started by the daemon, never by hand).
    #[command(hide = true)]
    Zygote,
    /// Internal: confine this process to a stdio upstream's profile (JSON, see
    /// stsd_profiles::os::process), then exec PROGRAM with this environment. Exit 126 with
    /// SANDBOX_UNAVAILABLE on stderr when the profile cannot be applied.
    #[command(hide = true)]
    UpstreamExec {
        #[arg(long, value_name = "JSON")]
        profile: String,
        #[arg(value_name = "PROGRAM")]
        program: String,
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<String>,
    },
}

/// Man pages (one per visible subcommand, as `man stsd-call`) and completions for bash, zsh
/// and fish, generated from this very definition so they cannot drift from the binary.
pub fn generate_assets(dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    let mut written = Vec::new();
    let man = dir.join("man");
    let comp = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&comp)?;
    // The pages describe commands, not clap's `help` subcommands (`stsd help X` still works):
    // without them no page names a `stsd-tools-help(1)` that is not there.
    fn no_help(c: clap::Command) -> clap::Command {
        let names: Vec<String> = c
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        names.iter().fold(c.disable_help_subcommand(true), |c, n| {
            c.mut_subcommand(n, no_help)
        })
    }
    let mut cmd = no_help(Cli::command());
    cmd.build();
    crate::cli_man::pages(&cmd, "stsd".into(), None, &man, &mut written)?;
    for (shell, file) in [
        (Shell::Bash, "stsd.bash"),
        (Shell::Zsh, "_stsd"),
        (Shell::Fish, "stsd.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "stsd", &mut buf);
        let p = comp.join(file);
        std::fs::write(&p, buf)?;
        written.push(p);
    }
    Ok(written)
}
