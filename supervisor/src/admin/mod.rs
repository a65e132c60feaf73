//! The admin channel: JSON-RPC methods named `stsd/...` on the daemon's own socket, beside MCP.
//! Every method checks who is asking, as the transport established it: a uid (SO_PEERCRED)
//! on the socket, a principal (token or client certificate) on `POST /admin` over HTTP.
//! Reading needs `[daemon] admin_uids` (default: root and the `stsd-admin` group; the
//! daemon's own uid only when listed, see [`AdminSet`]) or
//! `[approval] operator_uids`; answering an approval needs `operator_uids`. HTTP principals
//! get the same rights from `[http] admin_principals` and `approver_principals`. The CLI verbs that talk to a
//! running daemon (`stsd approvals`, `stsd approve`, `stsd deny`) are thin clients of it
//! ([`client`]).
//!
//! | method | params | result |
//! |---|---|---|
//! | `stsd/status` | none | version, uptime, pool, queue, catalog counts, sandbox support |
//! | `stsd/metrics` | none | calls by tool and outcome, pool, in flight, waiting, approvals |
//! | `stsd/tools/list` | none | `{"tools": [{name, state, riskLevel, approval, ...}]}`, withheld ones too |
//! | `stsd/tools/show` | `{name}` | one tool: the list entry plus its spec and inputSchema |
//! | `stsd/approvals/list` | none | `{"pending": [{id, tool, arguments, prompt, peerUid, ageMs}], "expired": [{callId, tool, reason, ...}]}` |
//! | `stsd/approvals/decide` | `{id, approve: bool, reason?}` | `{"id": id, "approved": bool}` |
//! | `stsd/tools/test` | `{name}` | its test cases run now, in scratch: `{passed, failed, cases}` |
//! | `stsd/audit/list` | `{tool?, principal?, outcome?, limit?}` | `{"records": [...]}`, newest first |
//! | `stsd/upstream/preview` | `{upstream: <[[upstream]] entry>}` | its server risk from the configuration alone |
//! | `stsd/upstream/add`, `update` | `{upstream: <[[upstream]] entry>}` | `{id, upstream: <as listed>}` |
//! | `stsd/upstream/remove`, `restart` | `{id}` | `{id, removed}` / `{id, upstream}` |

pub mod client;

pub use crate::policy::{AdminSet, ADMIN_GROUP};

/// A warning for the banner when the uid this daemon runs as is an admin: whatever runs as
/// that uid (the agent host, for a per-user daemon) can then change the tools it calls.
pub fn own_uid_warning(admin_uids: &[u32]) -> Option<String> {
    let own = nix::unistd::Uid::effective().as_raw();
    (own != 0 && AdminSet::from_config(admin_uids).contains(own)).then(|| {
        format!(
            "WARN: uid {own} runs this daemon and is an admin ([daemon] admin_uids or the \
             {ADMIN_GROUP} group): any process of that uid, an agent host too, may add, \
             change and re-approve tools. See \"Deployment and trust\" in docs/src/security.md"
        )
    })
}

use crate::call::Subject;
use crate::service::Service;
use crate::transport::{AdminHandler, AdminReply};
use serde_json::{json, Value};
use std::sync::Arc;
use stsd_protocol::ToolName;

pub use codes::{GATE_FAILED, NOT_ALLOWED, NO_SUCH};

pub struct Admin {
    service: Arc<Service>,
    started: std::time::Instant,
    /// The managed catalog and the list-changed signal, when the daemon has them.
    managed: Option<(
        Arc<crate::managed::Managed>,
        tokio::sync::broadcast::Sender<()>,
    )>,
}

mod audit;
mod codes;
mod gateway;
mod secrets;

impl Admin {
    pub fn new(service: Arc<Service>) -> Arc<Admin> {
        Admin::with_catalog(service, None)
    }

    /// With the managed catalog, the `stsd/tools/...` write methods are served too.
    pub fn with_catalog(
        service: Arc<Service>,
        managed: Option<(
            Arc<crate::managed::Managed>,
            tokio::sync::broadcast::Sender<()>,
        )>,
    ) -> Arc<Admin> {
        Arc::new(Admin {
            service,
            started: std::time::Instant::now(),
            managed,
        })
    }

    /// The policy's `admin` (by default: `[daemon] admin_uids`, `[http] admin_principals`).
    fn is_admin(&self, who: &Subject) -> bool {
        self.service.permits(who, crate::policy::Action::Admin)
    }

    /// Ok for an admin; else the refusal that names what `who` may not do and the setting
    /// that would let it.
    fn admin_only(&self, who: &Subject, what: &str) -> Result<(), (i32, String)> {
        if self.is_admin(who) {
            Ok(())
        } else {
            Err((
                NOT_ALLOWED,
                format!("{who} may not {what} (it is not in {})", admin_list(who)),
            ))
        }
    }

    /// The policy's `read_audit` (by default: the admins and the operators).
    fn may_read(&self, who: &Subject) -> bool {
        self.service.permits(who, crate::policy::Action::ReadAudit)
    }

    fn tool_entry(t: &crate::service::PublishedTool) -> Value {
        let a = &t.approval;
        let caps = &t.resolved.tool_safety.capabilities;
        json!({
            // What the tool may do, in short (the resolved toolSafety is `stsd/tools/show`'s).
            "posture": {
                "network": caps.network.mode,
                "hosts": caps.network.hosts,
                "fileRead": caps.file_read,
                "fileWrite": caps.file_write,
            },
            "name": t.spec.name,
            "state": "ACTIVE",
            "riskLevel": t.resolved.risk.as_str(),
            "toolId": t.tool_id,
            "approval": {
                "required": a.required,
                "source": a.source.as_str(),
                "strategy": a.required.then(|| a.strategy.as_str()),
                "riskLevelWithApproval": a.required.then(|| crate::approval::mitigated(t.resolved.risk).as_str()),
            },
        })
    }

    fn status(&self) -> Value {
        let p = self.service.published();
        let sandbox = stsd_profiles::os::landlock::abi_version();
        let spawner = self.service.exec_options().spawner;
        let handovers = spawner.zygote_handovers();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptimeSeconds": self.started.elapsed().as_secs(),
            "pool": {
                "size": self.service.pool.target(),
                "ready": self.service.pool.ready_count(),
                "bytecodes": self.service.pool.bytecode_count(),
                "spawn": match spawner.mode() {
                    stsd_profiles::baseline::SpawnMode::Zygote => "zygote",
                    stsd_profiles::baseline::SpawnMode::Exec => "exec",
                },
                "zygotePid": spawner.zygote_pid(),
                "zygoteNext": spawner.zygote_successor_pid(),
                "zygoteHandovers": {"ahead": handovers.ahead, "cold": handovers.cold},
                "templates": self.service.pool.templates().into_iter()
                    .map(|(pid, forks)| json!({"pid": pid, "forks": forks}))
                    .collect::<Vec<_>>(),
            },
            "calls": {"inFlight": self.service.in_flight(), "waiting": self.service.waiting()},
            "catalog": {"served": p.tools.len(), "withheld": p.withheld.len()},
            "approvalsPending": self.service.gate.pending().len(),
            "gateway": self.service.gateway().map(|g| {
                let e = g.exposed();
                json!({
                    "upstreams": g.upstreams().len(),
                    "connected": g.upstreams().iter().filter(|u| u.conn.as_ref().is_some_and(|c|
                        c.state() == crate::gateway::ConnState::Ready)).count(),
                    "toolsServed": e.tools.len(),
                    "toolsWithheld": e.withheld.len(),
                })
            }),
            "sandbox": {"landlockAbi": sandbox, "seccomp": true},
        })
    }

    /// `stsd/tools/test`: a served tool's test cases (its `testCases`, else its params'
    /// `testValue`s) run now, each through the call pipeline in a fresh worker and a scratch
    /// copy of its base path, as the Local Pass runs them (admins only: it runs code). A tool
    /// served with approval required is refused: nobody answers for it here.
    async fn run_tests(&self, who: &Subject, params: &Value) -> Result<Value, (i32, String)> {
        self.admin_only(who, "run tests")?;
        let name = name_param(params)?;
        let tool = self
            .service
            .published()
            .get(name.as_str())
            .cloned()
            .ok_or((NO_SUCH, format!("no served tool named {name}")))?;
        // A tool served with approval required is not run unattended, whatever its spec alone
        // would say (an admin-published tool that writes is gated by default).
        if tool.approval.required {
            return Err((
                GATE_FAILED,
                format!(
                    "{name} needs approval to run, so its test cases are not run unattended \
                     here: run `stsd test --approve FILE` where you can answer for it"
                ),
            ));
        }
        let cases = crate::local_pass::cases_of(&tool).map_err(|e| (GATE_FAILED, e))?;
        let (config, opts) = (self.service.config(), self.service.exec_options());
        let results = tokio::task::spawn_blocking(move || {
            let env = crate::secrets::spec_env(&config);
            cases
                .iter()
                .map(|c| {
                    crate::local_pass::run_case(
                        &tool.spec,
                        &config,
                        &env,
                        &opts,
                        c,
                        crate::local_pass::PassPlace::Scratch,
                        None,
                    )
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| (GATE_FAILED, e.to_string()))?;
        let passed = results.iter().filter(|r| r.success).count();
        Ok(json!({"name": name.as_str(), "passed": passed,
                  "failed": results.len() - passed, "cases": results}))
    }

    /// `stsd/approvals/decide`: an operator's answer to a waiting call.
    fn decide(&self, who: &Subject, params: &Value) -> Result<Value, (i32, String)> {
        let id = params.get("id").and_then(Value::as_u64).ok_or((
            -32602,
            "params: {\"id\": <number>, \"approve\": <bool>, \"reason\": <string>}".into(),
        ))?;
        let approve = params.get("approve").and_then(Value::as_bool).ok_or((
            -32602,
            "params: \"approve\" must be true or false".to_string(),
        ))?;
        let reason = params
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .chars()
            .take(1024)
            .collect::<String>();
        let reason = if reason.is_empty() && !approve {
            "denied by the operator".to_string()
        } else {
            reason
        };
        if !self.service.permits(who, crate::policy::Action::Approve) {
            return Err((
                NOT_ALLOWED,
                format!(
                    "{who} may not answer approvals (the policy's approve: by default \
                     [approval] operator_uids or [http] approver_principals)"
                ),
            ));
        }
        self.service
            .gate
            .answer(id, approve, reason, who)
            .map_err(|e| (NO_SUCH, e))?;
        Ok(json!({"id": id, "approved": approve}))
    }

    /// What the audit's readers (admins and operators) may read: the audit log, and the
    /// connection risk preview (a computation, nothing connected).
    fn reads(&self, who: &Subject, method: &str, params: &Value) -> Result<Value, (i32, String)> {
        if !self.may_read(who) {
            return Err((NOT_ALLOWED, format!("{who} may not call {method}")));
        }
        match method {
            "stsd/audit/list" => audit::list(self.service.audit_path(), params),
            _ => gateway::preview(&self.service, params),
        }
    }

    fn call(&self, who: &Subject, method: &str, params: &Value) -> Result<Value, (i32, String)> {
        let admin_only = |what: &str| self.admin_only(who, what);
        // What the daemon serves and how it is doing: admins, and the daemon's own uid (which
        // can read the catalog files and the MCP tool list anyway). Changing anything is not.
        let observer_only = |what: &str| {
            let own = matches!(who, Subject::Uid(uid)
                if *uid == nix::unistd::Uid::effective().as_raw());
            if own || self.is_admin(who) {
                Ok(())
            } else {
                Err((
                    NOT_ALLOWED,
                    format!("{who} may not {what} (it is not in {})", admin_list(who)),
                ))
            }
        };
        match method {
            "stsd/status" => {
                observer_only("read the status")?;
                Ok(self.status())
            }
            "stsd/metrics" => {
                observer_only("read metrics")?;
                Ok(self.service.metrics.json(&self.service.gauges()))
            }
            "stsd/tools/list" => {
                observer_only("list tools")?;
                let p = self.service.published();
                let mut tools: Vec<Value> = p.tools.iter().map(Self::tool_entry).collect();
                tools.extend(gateway::tool_entries(&self.service));
                for (name, why) in &p.withheld {
                    tools.push(json!({"name": name, "state": "WITHHELD", "reason": why}));
                }
                Ok(json!({"tools": tools}))
            }
            "stsd/tools/show" => {
                observer_only("show tools")?;
                let name = params
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or((-32602, "params: {\"name\": <tool>}".to_string()))?;
                let p = self.service.published();
                match p.get(name) {
                    Some(t) => {
                        let mut v = Self::tool_entry(t);
                        v["inputSchema"] = Value::Object(t.input_schema());
                        v["description"] = json!(t.spec.description);
                        v["toolSafety"] =
                            serde_json::to_value(&t.resolved.tool_safety).unwrap_or(Value::Null);
                        Ok(v)
                    }
                    None => match p.withheld.iter().find(|(n, _)| n == name) {
                        Some((n, why)) => {
                            Ok(json!({"name": n, "state": "WITHHELD", "reason": why}))
                        }
                        None => Err((NO_SUCH, format!("no tool named {name}"))),
                    },
                }
            }
            "stsd/approvals/list" => {
                if !self.may_read(who) {
                    return Err((NOT_ALLOWED, format!("{who} may not list approvals")));
                }
                Ok(json!({
                    "pending": self.service.gate.pending(),
                    "expired": self.service.gate.expired(),
                }))
            }
            "stsd/approvals/decide" => self.decide(who, params),
            "stsd/audit/list" | "stsd/upstream/preview" => self.reads(who, method, params),
            m if m.starts_with("stsd/upstream/") || m.starts_with("stsd/ledger/") => {
                admin_only("govern upstreams and the ledger")?;
                self.gateway_method(m, params)
            }
            other => Err((-32601, format!("no admin method {other}"))),
        }
    }
}

impl AdminHandler for Admin {
    fn handle(&self, who: Subject, method: String, params: Value) -> AdminReply<'_> {
        Box::pin(async move {
            let r = if WRITES.contains(&method.as_str()) {
                self.write(&who, &method, &params).await
            } else if method == "stsd/tools/test" {
                self.run_tests(&who, &params).await
            } else if secrets::METHODS.contains(&method.as_str()) {
                self.secrets(&who, &method, &params).await
            } else if gateway::CHANGES.contains(&method.as_str()) {
                match self.admin_only(&who, "change upstreams") {
                    Ok(()) => gateway::change(&self.service, &method, &params).await,
                    Err(e) => Err(e),
                }
            } else {
                self.call(&who, &method, &params)
            };
            if let Err((code, why)) = &r {
                tracing::info!(who = %who, method, code, why, "admin request refused");
            }
            r
        })
    }
}

/// The start of the refusal of a tool that needs approval and was not answered for: the
/// CLI asks the operator and sends it again with `approve`.
pub const NEEDS_APPROVAL: &str = "NEEDS_APPROVAL";

/// The methods that change the managed catalog.
const WRITES: &[&str] = &[
    "stsd/tools/add",
    "stsd/tools/update",
    "stsd/tools/rollback",
    "stsd/tools/remove",
    "stsd/tools/enable",
    "stsd/tools/disable",
];

/// The setting that would grant `who` admin rights.
fn admin_list(who: &Subject) -> &'static str {
    match who {
        Subject::Uid(_) => "[daemon] admin_uids",
        Subject::Principal(_) => "[http] admin_principals",
    }
}

/// The `name` parameter, checked against the tool-name grammar: every name a client sends is,
/// before anything is looked up or a file is named after it.
fn name_param(params: &Value) -> Result<ToolName, (i32, String)> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or((-32602, "params: {\"name\": <tool>}".to_string()))?;
    checked_name(name)
}

fn checked_name(name: &str) -> Result<ToolName, (i32, String)> {
    ToolName::parse(name).map_err(|e| (-32602, e.to_string()))
}

impl Admin {
    /// One of the gateway's methods (upstreams, the ledger); a ledger decision re-publishes
    /// at once (own specs and upstream tools alike) and tells clients.
    fn gateway_method(&self, method: &str, params: &Value) -> Result<Value, (i32, String)> {
        let republish = || match &self.managed {
            Some((_, changed)) => self.republish(changed),
            None => self.service.reload().map(|_| ()).map_err(|e| {
                (
                    GATE_FAILED,
                    format!("the catalog did not reload: {}", e.join("; ")),
                )
            }),
        };
        gateway::call(&self.service, method, params, &republish)
    }

    /// `stsd/secrets/*` (admins only): the change, then a re-publish, and the tools that
    /// name the secret as they stand after it. File writes, fsyncs and the re-publish (which
    /// reads every secret a spec names) run off the async threads.
    async fn secrets(
        &self,
        who: &Subject,
        method: &str,
        params: &Value,
    ) -> Result<Value, (i32, String)> {
        self.admin_only(who, "read or change secrets")?;
        let service = self.service.clone();
        let changed = self.managed.as_ref().map(|(_, c)| c.clone());
        let (method, params) = (method.to_string(), params.clone());
        tokio::task::spawn_blocking(move || {
            let mut reply = secrets::call(&service.config(), &method, &params)?;
            if secrets::changes(&method) {
                // The change is made: a re-publish that fails says so beside it, not as the
                // failure of a change that happened.
                match service.reload() {
                    Ok(true) => {
                        if let Some(c) = &changed {
                            let _ = c.send(());
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        reply["republishFailed"] =
                            json!(format!("the catalog did not reload: {}", e.join("; ")));
                    }
                }
                let name = reply["name"].as_str().unwrap_or_default().to_string();
                reply["tools"] = secrets::tools_using(&service.published(), &name);
            }
            Ok(reply)
        })
        .await
        .map_err(|e| (GATE_FAILED, format!("the secrets request failed: {e}")))?
    }

    /// Whether a tool named `name` is served, or withheld for anything but being a draft (a
    /// draft of that name, as every spec of the reference catalog is, may be published over:
    /// drafts may share a name, §4.2).
    fn served_or_kept(&self, name: &str) -> bool {
        let p = self.service.published();
        p.get(name).is_some()
            || p.withheld
                .iter()
                .any(|(n, why)| n == name && !why.starts_with("DRAFT"))
    }

    /// Whether the catalog holds a spec named `name` (served or withheld).
    fn known(&self, name: &str) -> bool {
        let p = self.service.published();
        p.get(name).is_some() || p.withheld.iter().any(|(n, _)| n == name)
    }

    /// The publish gate for a new version: valid, resolvable, its Local Pass and every test
    /// case pass under its own posture. Ok(the document as it will be stored).
    async fn gate(&self, spec: &Value, answered: Option<String>) -> Result<Value, (i32, String)> {
        let refused = |why: String| (GATE_FAILED, why);
        let bytes = serde_json::to_vec(spec).map_err(|e| refused(e.to_string()))?;
        let file =
            crate::store::SpecFile::parse(std::path::Path::new("submitted.json"), &bytes, true)
                .map_err(|d| refused(d.to_string()))?
                .ok_or_else(|| refused("not a spec document".into()))?;
        let cat = crate::store::Catalog::load_with(&[], vec![file]);
        let (config, opts) = (self.service.config(), self.service.exec_options());
        let report = tokio::task::spawn_blocking(move || {
            let Some(e) = cat.entries.first() else {
                return Err("the document holds no spec".to_string());
            };
            let errors: Vec<String> = e.validated.errors().map(|d| d.to_string()).collect();
            if !errors.is_empty() {
                return Err(format!("invalid: {}", errors.join("; ")));
            }
            if let Some(spec) = e.validated.spec.as_ref() {
                let resolved = stsd_profiles::resolve(spec, &config).map_err(|d| d.to_string())?;
                if let Some(p) = crate::exec::job::syntax_check(spec, &resolved, &config, &opts) {
                    return Err(format!(
                        "the code does not parse: {} (line {}, column {})",
                        p.message, p.line, p.column
                    ));
                }
            }
            let env = crate::secrets::spec_env(&config);
            // A tool that needs approval passes with the stamp `stsd test --approve` put in its
            // file, or with an approver's answer given ahead (`answered`); else it is refused.
            let spec = e.validated.spec.as_ref().ok_or("invalid spec")?;
            let resolved = stsd_profiles::resolve(spec, &config).map_err(|d| d.to_string())?;
            let gated =
                crate::service::PublishedTool::of_spec(spec, e.tool_id.clone(), resolved, &config)
                    .approval
                    .required;
            let doc = crate::local_pass::document(&cat, e)
                .cloned()
                .unwrap_or(Value::Null);
            if spec.description.trim().chars().count() < crate::lint::MIN_DESCRIPTION_CHARS {
                return Err(format!(
                    "the description needs at least {} characters: the model chooses tools by it",
                    crate::lint::MIN_DESCRIPTION_CHARS
                ));
            }
            if gated && crate::local_pass::verified(&doc) {
                return Ok(doc);
            }
            if gated && answered.is_none() {
                return Err(format!(
                    "{NEEDS_APPROVAL}: {} needs approval to run, so its Local Pass cannot run \
                     unattended here: answer for it (`stsd catalog add FILE` asks, or pass \
                     --approve-required), or run `stsd test --write --approve FILE` and publish \
                     the file it stamps",
                    spec.name
                ));
            }
            // An approver answered for it ahead: its file writes go to scratch; its network
            // calls are real.
            let said_yes = answered.map(|who| crate::approval::terminal::AnsweredAhead { who });
            let approver: crate::local_pass::Approver<'_> = said_yes
                .as_ref()
                .map(|a| a as &dyn crate::approval::Elicitor);
            let pass = crate::local_pass::run_entry(
                &cat,
                e,
                &config,
                &env,
                &opts,
                crate::local_pass::PassPlace::Scratch,
                approver,
            );
            if let Err(d) = &pass.outcome {
                return Err(format!("Local Pass: {d}"));
            }
            let cases = crate::local_pass::test_cases(&doc).map_err(|d| d.to_string())?;
            for case in &cases {
                let r = crate::local_pass::run_case(
                    spec,
                    &config,
                    &env,
                    &opts,
                    case,
                    crate::local_pass::PassPlace::Scratch,
                    approver,
                );
                if !r.success {
                    return Err(format!(
                        "test case {:?}: {}",
                        r.name,
                        r.reason.unwrap_or_default()
                    ));
                }
            }
            Ok(doc)
        })
        .await
        .map_err(|e| refused(format!("the gate failed: {e}")))?;
        let mut doc = report.map_err(refused)?;
        if let Some(o) = doc.as_object_mut() {
            crate::local_pass::stamp(o, crate::store::now_ms());
        }
        Ok(doc)
    }

    /// Re-publishes after an operator published `name` through this channel: its new
    /// content is what the operator approved, so the fingerprint ledger takes it.
    fn republish_accepting(
        &self,
        changed: &tokio::sync::broadcast::Sender<()>,
        name: &str,
    ) -> Result<(), (i32, String)> {
        self.republish(changed)?;
        self.service.accept_own(name);
        self.republish(changed)
    }

    /// Re-publishes after a change and tells subscribed clients.
    pub(crate) fn republish(
        &self,
        changed: &tokio::sync::broadcast::Sender<()>,
    ) -> Result<(), (i32, String)> {
        match self.service.reload() {
            Ok(true) => {
                let _ = changed.send(());
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err((
                GATE_FAILED,
                format!("the catalog did not reload: {}", e.join("; ")),
            )),
        }
    }

    async fn write(
        &self,
        who: &Subject,
        method: &str,
        params: &Value,
    ) -> Result<Value, (i32, String)> {
        self.admin_only(who, "change tools")?;
        let Some((managed, changed)) = &self.managed else {
            return Err((-32601, "this daemon has no managed catalog".into()));
        };
        match method {
            "stsd/tools/add" | "stsd/tools/update" => {
                let spec = params
                    .get("spec")
                    .filter(|v| v.is_object())
                    .ok_or((-32602, "params: {\"spec\": <a spec document>}".to_string()))?;
                let name =
                    checked_name(spec.get("name").and_then(Value::as_str).unwrap_or_default())?;
                if method == "stsd/tools/add"
                    && (self.served_or_kept(name.as_str()) || managed.has(&name))
                {
                    return Err((
                        GATE_FAILED,
                        format!("a tool named {name} exists already (use update)"),
                    ));
                }
                if method == "stsd/tools/update" {
                    let target = match params.get("name") {
                        Some(_) => name_param(params)?,
                        None => name.clone(),
                    };
                    if !managed.has(&target) || target != name {
                        return Err((
                            NO_SUCH,
                            format!(
                                "{target} is not a managed tool of that name (add it first; a \
                                 rename is an add and a remove)"
                            ),
                        ));
                    }
                }
                // Answering for a tool that needs approval is an approver's right, not only an
                // admin's: its Local Pass reaches the real network with real secrets.
                let approve = params.get("approve").and_then(Value::as_bool) == Some(true);
                if approve && !self.service.permits(who, crate::policy::Action::Approve) {
                    return Err((
                        NOT_ALLOWED,
                        format!(
                            "{who} may not answer for a tool that needs approval (not an \
                             approver: [approval] operator_uids, [http] approver_principals)"
                        ),
                    ));
                }
                let answered = approve.then(|| who.to_string());
                let doc = self.gate(spec, answered).await?;
                // The document and the ledger's approval of it: one transaction, so a kill
                // at any point leaves the old version served or the new one, never the new
                // one withheld for re-review.
                let bytes = serde_json::to_vec(&doc).map_err(|e| (GATE_FAILED, e.to_string()))?;
                let approval = self.service.own_approval(&bytes);
                let row = approval
                    .as_ref()
                    .map(|(id, entry)| crate::state::LedgerRow { id, entry });
                managed
                    .install(&name, &doc, row)
                    .map_err(|e| (GATE_FAILED, e))?;
                // The old layout left the tool withheld for re-review when killed here.
                crate::state::crash_point("admin-installed");
                if let Some((id, entry)) = &approval {
                    self.service.adopt_approval(id, entry);
                }
                self.republish_accepting(changed, name.as_str())?;
                Ok(json!({"name": name.as_str(), "published": true}))
            }
            "stsd/tools/rollback" => {
                let name = name_param(params)?;
                let mut approval = None;
                managed
                    .rollback(&name, |doc| {
                        approval = self.service.own_approval(doc);
                        approval.clone()
                    })
                    .map_err(|e| (NO_SUCH, e))?;
                if let Some((id, entry)) = &approval {
                    self.service.adopt_approval(id, entry);
                }
                self.republish_accepting(changed, name.as_str())?;
                Ok(json!({"name": name.as_str(), "rolledBack": true}))
            }
            "stsd/tools/remove" => {
                let name = name_param(params)?;
                managed.remove(&name).map_err(|e| (NO_SUCH, e))?;
                self.republish(changed)?;
                Ok(json!({"name": name.as_str(), "removed": true}))
            }
            _ => {
                let name = name_param(params)?;
                if !self.known(name.as_str()) {
                    return Err((NO_SUCH, format!("no tool named {name}")));
                }
                let enable = method == "stsd/tools/enable";
                managed
                    .set_enabled(&name, enable)
                    .map_err(|e| (GATE_FAILED, e))?;
                self.republish(changed)?;
                Ok(json!({"name": name.as_str(), "enabled": enable}))
            }
        }
    }
}
