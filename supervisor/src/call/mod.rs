//! The one call pipeline. Every door a call comes in by (MCP on the socket, stdio and HTTP
//! through `Service::call`; `stsd run`; `stsd test` and the publish gate's Local Pass) runs
//! it through [`run`], and only the [`Door`] differs:
//!
//! arrive (the audit record opens) -> authorise (the policy) -> rate and limits -> check ->
//! approve ->
//! place -> admit -> execute -> mask -> audit (exactly one record) -> the reply.
//!
//! `vocab` is the call's vocabulary (caller, subject, reply, masking), a leaf that lower
//! layers import without importing the service; `target` holds what differs between an own
//! tool and a wrapped upstream tool; `door` what differs between entry points.

pub mod door;
pub mod item;
pub mod target;
pub mod vocab;

pub use door::{Audit, ConsoleSink, Door, Executor, Place};
pub use target::Target;
pub use vocab::{mask_value, CallFailure, Caller, Principal, PrincipalKind, Subject, ToolReply};

use crate::approval::{ApprovalRecord, Ask};
use crate::audit::{bounded_message, bounded_params, AuditError, AuditRecord};
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use stsd_profiles::approval::StrategyKind;
use stsd_profiles::baseline::AuditOnFailure;
use stsd_protocol::envvar::SecretSet;
use stsd_protocol::Code;

/// One call through the pipeline; the reply is masked and the call audited.
pub async fn run(door: &mut Door<'_>, target: Target<'_>, args: Map<String, Value>) -> ToolReply {
    let mut clock = Clock::start();
    let started = crate::store::now_ms();
    let config = door.config.clone();
    let own_env = crate::secrets::spec_env(&config);
    let env: &(dyn stsd_protocol::envvar::EnvSource + Sync) = match door.env {
        Some(e) => e,
        None => &own_env,
    };
    // Arrive: the record opens, its params masked with the secrets known so far.
    let (mut record, mut secrets) = target.arrive(door.call_id, &door.caller, &args, env);
    record.ts = started;
    trace_risk(&record);
    // Authorise: a call the policy forbids goes no further, before approval is ever asked.
    let authorised = clock.governed(|| authorise(door, &target, &mut record));
    if let Some(reply) = authorised {
        return finish(door, record, &secrets, &clock, reply);
    }
    // Rate: a principal past its calls a second goes no further.
    if let Some(rate) = door.rate {
        let who = door.caller.principal_key();
        if let Err(wait) = clock.governed(|| rate.admit(&who)) {
            let reply = ToolReply::limited(&rate.message(&who, wait), wait);
            return finish(door, record, &secrets, &clock, reply);
        }
    }
    // Limits: `[[limits]]` rates, concurrent calls and CPU quotas, per principal and tool;
    // held (concurrency) until the call ends.
    let held = match door.quotas {
        Some(q) => match clock.governed(|| q.admit(&door.caller.principal_key(), target.name())) {
            Ok(h) => Some(h),
            Err((wait, why)) => {
                return finish(
                    door,
                    record,
                    &secrets,
                    &clock,
                    ToolReply::limited(&why, wait),
                )
            }
        },
        None => None,
    };
    // Check: arguments against the schema before any worker or upstream is touched.
    let mut checked = match target.check(door.call_id, args, &config, env, door.timeout_ms) {
        Ok(c) => c,
        Err(reply) => return finish(door, record, &secrets, &clock, reply),
    };
    if let Some(s) = checked.secrets() {
        secrets = s.clone();
        record.params = mask_value(&record.params, &secrets);
    }
    // Approve: before any worker is taken or any slot is held.
    let approved = tracing::Instrument::instrument(
        approve(door, &target, &mut record),
        crate::telemetry::child("approval.wait"),
    );
    let g = Instant::now();
    let approved = approved.await;
    clock.governance += g.elapsed();
    if let Some(reply) = approved {
        return finish(door, record, &secrets, &clock, reply);
    }
    // Place: where an own tool's files are.
    if let Err(reply) = checked.place(door.place, &config) {
        return finish(door, record, &secrets, &clock, reply);
    }
    // Admit: running calls are bounded by the pool size, waiting ones by the queue limit
    // and per session; slots go round-robin across sessions. Own tools only (a wrapped
    // call holds no worker).
    let g = Instant::now();
    let admitted = match door.admission.filter(|_| target.is_own()) {
        Some(a) => Some(
            tracing::Instrument::instrument(
                a.acquire(door.caller.session),
                crate::telemetry::child("admission"),
            )
            .await,
        ),
        None => None,
    };
    clock.governance += g.elapsed();
    let _permit = match admitted {
        Some(admitted) => match admitted {
            Ok(p) => Some(p),
            Err(refused) => {
                let reply = ToolReply::error(Code::Overloaded, &refused.message());
                return finish(door, record, &secrets, &clock, reply);
            }
        },
        None => None,
    };
    if door.cancel.load(Ordering::Relaxed) {
        let reply = ToolReply::error(
            Code::Cancelled,
            "the caller went away before the call started",
        );
        return finish(door, record, &secrets, &clock, reply);
    }
    // Record: a call that must be recorded runs only while its record can be written.
    if let Some(reply) = clock.governed(|| unrecordable(door, &target)) {
        return finish(door, record, &secrets, &clock, reply);
    }
    // Execute.
    let run = crate::telemetry::child(if target.is_own() {
        "worker.run"
    } else {
        "upstream.call"
    });
    let reply =
        tracing::Instrument::instrument(target.execute(checked, door, &mut record, &secrets), run)
            .await;
    // The CPU the call cost counts against its quotas.
    if let (Some(h), Some(m)) = (&held, &record.metrics) {
        h.charge(m.cpu_us);
    }
    finish(door, record, &secrets, &clock, reply)
}

/// The call's risk on its trace span (seed 001's `mcp.risk.*`, `mcp.upstream.*`,
/// `mcp.composition.*`): levels and names only, never an argument.
fn trace_risk(record: &AuditRecord) {
    use crate::telemetry::attribute;
    if !crate::telemetry::enabled() {
        return;
    }
    attribute("mcp.risk.level", record.risk_level.clone());
    if let Some(u) = &record.upstream {
        attribute("mcp.upstream.id", u.id.clone());
        attribute("mcp.upstream.tool", u.tool.clone());
        attribute("mcp.risk.server_level", u.server_risk.clone());
        attribute("mcp.risk.tool_level", u.tool_risk.clone());
        attribute("mcp.composition.level", record.risk_level.clone());
        if let Some(f) = &u.floor_trigger {
            attribute("mcp.risk.floor_trigger", f.clone());
        }
    }
}

/// The policy's answer for this call; None to go on. The caller learns only that it is not
/// permitted; the audit record names the policies that decided.
fn authorise(door: &Door<'_>, target: &Target<'_>, record: &mut AuditRecord) -> Option<ToolReply> {
    let policy = door.policy.as_ref()?;
    let attrs = target.policy_attrs()?;
    let who = crate::policy::Who::of_caller(&door.caller);
    let d = policy.decide(&who, crate::policy::Action::Call, Some(&attrs));
    if d.allowed {
        return None;
    }
    if !d.errors.is_empty() {
        tracing::warn!(principal = %who.id, tool = %attrs.name, errors = %d.errors.join("; "), "a policy failed to evaluate: the call is refused");
    }
    record.policy = Some(d.policies);
    Some(ToolReply::error(
        Code::Forbidden,
        &format!("{} may not call {}", who.id, attrs.name),
    ))
}

/// [`run`] from synchronous code: a blocking-pool thread of a runtime (the publish gate)
/// uses that runtime; anything else (a CLI command, a test) a runtime of its own. Never
/// from a runtime's worker thread.
pub fn run_blocking(
    door: &mut Door<'_>,
    target: Target<'_>,
    args: Map<String, Value>,
) -> ToolReply {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => h.block_on(run(door, target, args)),
        Err(_) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(run(door, target, args)),
            Err(e) => ToolReply::error(Code::SandboxUnavailable, &format!("no runtime: {e}")),
        },
    }
}

/// The refusal of a call that must be recorded (`[daemon] audit_on_failure`) while the audit
/// log's filesystem has no room for its record; None to go on.
fn unrecordable(door: &Door<'_>, target: &Target<'_>) -> Option<ToolReply> {
    let must = match door.config.daemon.audit_on_failure {
        AuditOnFailure::Serve => false,
        AuditOnFailure::Refuse => true,
        AuditOnFailure::Auto => target.has_effects(),
    };
    if !must {
        return None;
    }
    let room = match &door.audit {
        Audit::Log(Some(log)) => log.writable().inspect_err(|e| log.refused(e)),
        Audit::Log(None) => Ok(()),
        Audit::Configured => door
            .config
            .daemon
            .audit_log
            .as_deref()
            .map_or(Ok(()), crate::audit::free_room),
    };
    room.err().map(|e| {
        ToolReply::error(
            Code::AuditUnavailable,
            &format!("not run: its audit record could not be written: {e}"),
        )
    })
}

/// Resolves when `flag` is set (the caller went away).
pub(crate) async fn cancelled(flag: &AtomicBool) {
    while !flag.load(Ordering::Relaxed) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The approval gate: None to go on, else the refusal. The decision goes in the record.
async fn approve(
    door: &mut Door<'_>,
    target: &Target<'_>,
    record: &mut AuditRecord,
) -> Option<ToolReply> {
    let (req, template) = target.approval()?;
    if !req.required {
        if req.overrode_spec {
            record.approval = Some(ApprovalRecord {
                strategy: "none",
                source: req.source.as_str(),
                approver: "operator switch (allow_override_required)".into(),
                decision: "not-required",
                reason: Some("the spec's humanInTheLoop REQUIRED was lifted".into()),
                wait_ms: 0,
                overrode_required: true,
            });
        }
        return None;
    }
    let mut req = req.clone();
    // Without a daemon there is no operator queue: the operator is whoever is at the door
    // (a terminal), asked as elicit asks.
    if !door.operator_queue && req.strategy == StrategyKind::Operator {
        req.strategy = StrategyKind::Elicit;
    }
    // A caller that takes console lines is told what it waits for, and who can answer.
    if req.strategy == StrategyKind::Operator {
        if let Some(c) = door.console.as_mut() {
            let id = door.call_id;
            c(
                stsd_protocol::frames::ConsoleLevel::Info,
                format!(
                    "{} waits for an operator's approval: stsd approve {id} (or stsd deny {id})",
                    target.name()
                ),
            );
        }
    }
    let ask = Ask {
        call_id: door.call_id,
        tool: target.name(),
        arguments: &record.params,
        prompt_template: template,
        peer_uid: door.caller.peer_uid,
        principal: door.caller.principal.as_ref(),
        requirement: &req,
    };
    let decision = tokio::select! {
        d = door.gate.decide(ask, door.elicitor) => d,
        _ = cancelled(&door.cancel) => {
            return Some(ToolReply::error(
                Code::Cancelled,
                "the caller went away while the call waited for approval",
            ));
        }
    };
    record.approval = Some(decision.record);
    decision
        .refusal
        .map(|(code, message)| ToolReply::error(code, &message))
}

/// A call's time: since it arrived, and how much of it the pipeline's own governing steps
/// took (the policy decision, rate and limits, the approval lookup, admission, the audit
/// record's check and write), as `governanceUs` in the result's metrics. An approver's or
/// the queue's wait counts in it (at concurrency 1 with no approval asked, neither waits).
struct Clock {
    t0: Instant,
    governance: std::time::Duration,
}

impl Clock {
    fn start() -> Clock {
        Clock {
            t0: Instant::now(),
            governance: std::time::Duration::ZERO,
        }
    }

    fn governed<T>(&mut self, step: impl FnOnce() -> T) -> T {
        let g = Instant::now();
        let out = step();
        self.governance += g.elapsed();
        out
    }
}

/// Masks the reply, writes the audit record, then hands the reply back.
fn finish(
    door: &Door<'_>,
    mut record: AuditRecord,
    secrets: &SecretSet,
    clock: &Clock,
    mut reply: ToolReply,
) -> ToolReply {
    if door.cut.is_some_and(|c| c.is_cancelled()) && reply.code == Some(Code::Cancelled) {
        reply = ToolReply::error(
            Code::Cancelled,
            "cut off: the daemon stopped and the call outlived the shutdown grace period",
        );
    }
    crate::telemetry::attribute(
        "mcp.outcome",
        match reply.code {
            None => "OK".to_string(),
            Some(c) => c.to_string(),
        },
    );
    reply.text = secrets.mask(&reply.text);
    reply.structured = reply.structured.map(|v| mask_value(&v, secrets));
    reply.content = reply
        .content
        .map(|c| c.iter().map(|v| mask_value(v, secrets)).collect());
    reply.raw = reply.raw.map(|r| secrets.mask(&r));
    reply.stack = reply.stack.map(|s| secrets.mask(&s));
    record.elapsed_ms = clock.t0.elapsed().as_millis() as u64;
    if let Some(m) = &mut record.metrics {
        m.wall_ms = record.elapsed_ms;
        m.governance_us = clock.governance.as_micros() as u64;
    }
    for hop in &mut record.egress {
        // Masked in decoded form too: a secret sent through encodeURIComponent is
        // percent-encoded in the URL.
        let decoded = percent_encoding::percent_decode_str(&hop.url).decode_utf8_lossy();
        hop.url = secrets.mask(&decoded);
        if let Some(o) = &hop.host_override {
            hop.host_override = Some(secrets.mask(o));
        }
    }
    let d = &door.config.daemon;
    record.params = bounded_params(
        &record.params,
        d.audit_max_arg_bytes,
        d.audit_max_params_bytes,
    );
    if reply.is_error {
        record.outcome = "ERROR";
        record.error = Some(AuditError {
            code: reply.code.map(|c| c.to_string()).unwrap_or_default(),
            message: bounded_message(&reply.text, d.audit_max_arg_bytes),
        });
    } else {
        record.outcome = "OK";
    }
    let outcome = record
        .error
        .as_ref()
        .map(|e| e.code.as_str())
        .unwrap_or("OK");
    if let Some(m) = door.metrics {
        m.observe(&record.name, outcome, record.elapsed_ms);
    }
    // The record carries the governance before its own write; the reply's figure adds it.
    let g = Instant::now();
    match door.audit {
        Audit::Log(Some(log)) => {
            if let Err(e) = log.append(&record) {
                log.lost(&e);
            }
        }
        Audit::Log(None) => {}
        Audit::Configured => crate::audit::append_configured(&door.config, &record),
    }
    if let Some(m) = &record.metrics {
        let mut m = *m;
        m.governance_us += g.elapsed().as_micros() as u64;
        reply.metrics = Some(m);
    }
    // One INFO line per call: what an operator greps for. Arguments and results stay in
    // the audit log, never in the logs.
    tracing::info!(
        call_id = record.call_id,
        tool = %record.name,
        outcome,
        ms = record.elapsed_ms,
        transport = record.transport,
        principal = %door.caller.principal_key(),
        principal_kind = door.caller.principal.as_ref().map_or("uid", |p| p.kind.as_str()),
        "tool call"
    );
    reply
}
