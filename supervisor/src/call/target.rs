//! What a call runs: one of stsd's own tools, or a wrapped upstream tool. Each step of the
//! pipeline that differs between them is a method here; the order of the steps is the
//! pipeline's (`super::run`), never a target's.

use super::door::{Door, Executor, Place};
use super::vocab::{mask_value, ToolReply};
use crate::approval::Requirement;
use crate::audit::{AuditRecord, CallMetrics, UpstreamAudit};
use crate::catalog::tool::PublishedTool;
use crate::exec::dispatch::{Dispatch, Take};
use crate::exec::{self, job};
use crate::gateway::Gateway;
use crate::gateway::WrappedTool;
use serde_json::{Map, Value};
use std::path::Path;
use std::sync::Arc;
use stsd_profiles::Config;
use stsd_protocol::envvar::{EnvSource, SecretSet};
use stsd_protocol::frames::LINE_TRUNCATED_MARK;
use stsd_protocol::Code;

pub enum Target<'a> {
    Own(&'a PublishedTool),
    Wrapped {
        gw: Arc<Gateway>,
        tool: Box<WrappedTool>,
    },
    /// A tool the serving doors know but do not serve (disabled, a draft, not verified, over
    /// an upstream's `max_risk`, flagged by the scan, shadowed): refused at the check with
    /// TOOL_WITHHELD and why, and audited like any other refusal.
    Withheld {
        name: String,
        why: String,
    },
}

/// A call that passed its check: what it will run with.
pub enum Checked {
    Own {
        prepared: Box<job::Prepared>,
        /// A Local Pass's scratch copy, removed when the call ends.
        scratch: Option<crate::scratch::Scratch>,
    },
    Wrapped {
        args: Map<String, Value>,
    },
}

impl Target<'_> {
    pub fn is_own(&self) -> bool {
        matches!(self, Target::Own(_))
    }

    /// Whether the call can change the world beyond its reply: it needs approval, writes
    /// files, deletes, or reaches the network. A wrapped upstream tool may do anything.
    /// (`audit_on_failure = "auto"` refuses such a call when it cannot be recorded.)
    pub fn has_effects(&self) -> bool {
        match self {
            Target::Own(t) => {
                let caps = &t.resolved.tool_safety.capabilities;
                t.approval.required
                    || caps.file_write
                    || caps.destructive
                    || caps.network.mode != stsd_protocol::NetworkMode::Blocked
            }
            Target::Wrapped { .. } => true,
            Target::Withheld { .. } => false,
        }
    }

    /// The tool as policies see it; None for a withheld one (refused at the check anyway).
    pub fn policy_attrs(&self) -> Option<crate::policy::ToolAttrs> {
        match self {
            Target::Own(t) => Some(crate::policy::ToolAttrs::own(t)),
            Target::Wrapped { tool, .. } => Some(crate::policy::ToolAttrs::wrapped(tool)),
            Target::Withheld { .. } => None,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Target::Own(t) => &t.spec.name,
            Target::Wrapped { tool, .. } => &tool.alias,
            Target::Withheld { name, .. } => name,
        }
    }

    /// The audit record as the call arrives, and the secrets known before the arguments are
    /// checked (its params are masked with them from the start).
    pub fn arrive(
        &self,
        call_id: u64,
        caller: &super::vocab::Caller,
        args: &Map<String, Value>,
        env: &dyn EnvSource,
    ) -> (AuditRecord, SecretSet) {
        match self {
            Target::Own(t) => {
                let secrets = SecretSet::collect(
                    t.spec.static_variables.iter().map(|s| s.value.as_str()),
                    env,
                );
                let mut r = AuditRecord::arrived(
                    call_id,
                    caller,
                    t.tool_id.clone(),
                    t.spec.name.clone(),
                    t.resolved.risk.to_string(),
                    mask_value(&Value::Object(args.clone()), &secrets),
                );
                r.category = t.spec.category.clone();
                r.tool_safety = Some(t.tool_safety_json.clone());
                (r, secrets)
            }
            Target::Wrapped { gw, tool } => {
                let secrets = gw
                    .upstream(&tool.upstream)
                    .map(|u| u.masks())
                    .unwrap_or_default();
                let mut r = AuditRecord::arrived(
                    call_id,
                    caller,
                    tool.ledger_id.clone(),
                    tool.alias.clone(),
                    tool.composed.level.to_string(),
                    mask_value(&Value::Object(args.clone()), &secrets),
                );
                r.upstream = Some(UpstreamAudit {
                    id: tool.upstream.clone(),
                    tool: tool.tool.clone(),
                    server_risk: tool.server_risk.level.to_string(),
                    tool_risk: tool.tool_risk.level.to_string(),
                    floor_trigger: tool.composed.floor_trigger.map(|f| f.name().to_string()),
                    reached: false,
                });
                (r, secrets)
            }
            // Nothing of it runs, so no secret of its is known: its arguments are recorded
            // bounded, as every record's are.
            Target::Withheld { name, .. } => (
                AuditRecord::arrived(
                    call_id,
                    caller,
                    String::new(),
                    name.clone(),
                    String::new(),
                    Value::Object(args.clone()),
                ),
                SecretSet::default(),
            ),
        }
    }

    /// The arguments against the tool's schema, then (own tools) the job it will run.
    // A refusal is the rare path, answered once: boxing it would buy nothing.
    #[allow(clippy::result_large_err)]
    pub fn check(
        &self,
        call_id: u64,
        args: Map<String, Value>,
        config: &Config,
        env: &dyn EnvSource,
        timeout_ms: Option<u64>,
    ) -> Result<Checked, ToolReply> {
        match self {
            Target::Own(t) => {
                let args = job::check_arguments(&t.spec, &args).map_err(|d| {
                    let mut r = ToolReply::error(
                        Code::InvalidInput,
                        &format!("{} ({})", d.message, d.pointer),
                    );
                    r.pointer = Some(d.pointer.clone());
                    r
                })?;
                let mut prepared = job::prepare(call_id, &t.spec, &t.resolved, config, args, env)
                    .map_err(|d| ToolReply::error(d.code, &d.message))?;
                if let Some(ms) = timeout_ms {
                    prepared.job.limits.timeout_ms = ms.min(prepared.job.limits.timeout_ms);
                }
                Ok(Checked::Own {
                    prepared: Box::new(prepared),
                    scratch: None,
                })
            }
            Target::Wrapped { tool, .. } => {
                crate::gateway::check_against_input_schema(tool, &args)
                    .map_err(|e| ToolReply::error(Code::InvalidInput, &e))?;
                Ok(Checked::Wrapped { args })
            }
            Target::Withheld { name, why } => Err(ToolReply::error(
                Code::ToolWithheld,
                &format!("{name} is not served: {why}"),
            )),
        }
    }

    /// Whether the call needs approval first, and the spec's prompt template (None: nothing
    /// of it runs, so there is nothing to approve).
    pub fn approval(&self) -> Option<(&Requirement, Option<&str>)> {
        Some(match self {
            Target::Own(t) => (
                &t.approval,
                t.spec
                    .human_in_the_loop
                    .as_ref()
                    .and_then(|h| h.prompt_template.as_deref()),
            ),
            Target::Wrapped { tool, .. } => (&tool.approval, None),
            Target::Withheld { .. } => return None,
        })
    }

    /// Runs the checked call and answers (unmasked: the pipeline masks).
    pub async fn execute(
        &self,
        checked: Checked,
        door: &mut Door<'_>,
        record: &mut AuditRecord,
        secrets: &SecretSet,
    ) -> ToolReply {
        match (self, checked) {
            (Target::Own(t), Checked::Own { prepared, scratch }) => {
                let reply = run_own(t, prepared, door, record, secrets).await;
                drop(scratch);
                reply
            }
            // Boxed: an upstream call's future (its HTTP or stdio client inside) is many times
            // the size of an own tool's, and every call's future, moved whole at each await
            // that starts it and into its task, was as large as the largest branch.
            (Target::Wrapped { gw, tool }, Checked::Wrapped { args }) => {
                Box::pin(run_wrapped(gw, tool, args, door, record, secrets)).await
            }
            _ => ToolReply::error(Code::WorkerCrashed, "a call checked for another target"),
        }
    }
}

impl Checked {
    /// The secrets the job carries (own tools): the arguments' placeholders resolved.
    pub fn secrets(&self) -> Option<&SecretSet> {
        match self {
            Checked::Own { prepared, .. } => Some(&prepared.secrets),
            Checked::Wrapped { .. } => None,
        }
    }

    /// Where an own tool's files are: its configured base path, or a Local Pass's scratch
    /// copy of it.
    #[allow(clippy::result_large_err)]
    pub fn place(&mut self, place: Place, config: &Config) -> Result<(), ToolReply> {
        let Checked::Own { prepared, scratch } = self else {
            return Ok(());
        };
        match place {
            Place::Configured => {
                crate::workspace::prepare_base_path(&mut prepared.job.sandbox, config)
                    .map_err(|e| ToolReply::error(Code::SandboxUnavailable, &e))
            }
            Place::LocalPass(p) => {
                *scratch = Some(
                    crate::scratch::copy_base_path(&mut prepared.job.sandbox, config, p)
                        .map_err(|e| ToolReply::error(Code::SandboxUnavailable, &e))?,
                );
                Ok(())
            }
        }
    }
}

async fn run_own(
    t: &PublishedTool,
    prepared: Box<job::Prepared>,
    door: &mut Door<'_>,
    record: &mut AuditRecord,
    secrets: &SecretSet,
) -> ToolReply {
    let mask = secrets.clone();
    let mut console = door.console.take();
    let on_event = move |ev: exec::Event<'_>| {
        if let (exec::Event::Console(level, line), Some(c)) = (ev, console.as_mut()) {
            c(level, mask.mask_cut(line, LINE_TRUNCATED_MARK));
        }
    };
    let job = prepared.job;
    let sandbox = job.sandbox.clone();
    let outcome = match door.executor {
        Executor::Pool {
            pool,
            reuse,
            ref opts,
        } => {
            let opts = opts.clone();
            // Reuse: workers are parked under the tool's name and resolved posture.
            let key = crate::exec::pool::reuse_key(&t.spec.name, &job);
            // Priming moves work off the call path onto spare CPU; with calls queued for a
            // slot there is none to spare: primed workers are still used, no more asked for.
            let prime_more = door.admission.is_none_or(|a| a.waiting() == 0);
            // A tool that needs approval is not primed: none of its code may run before its
            // call is approved (a body that breaks out of its wrapper runs as it compiles).
            let prime = opts.prime && crate::exec::pool::primable(&job) && !t.approval.required;
            let take = if reuse > 1 {
                Take::Parked
            } else if prime {
                Take::Primed { more: prime_more }
            } else {
                Take::Plain
            };
            let dispatch = Dispatch {
                pool: pool.clone(),
                reuse,
                key,
                take,
            };
            dispatch.run(job, opts, door.cancel.clone(), on_event).await
        }
        Executor::OneShot(opts) => {
            let mut on_event = on_event;
            Ok(exec::run_job(&job, opts, &mut on_event))
        }
    };
    match outcome {
        Ok(out) => {
            door.ran = Some((out.timings, out.console_truncated));
            record.worker_pid = Some(out.worker_pid);
            record.egress = out.egress;
            record.metrics = Some(CallMetrics {
                wall_ms: 0,
                cpu_us: out.timings.worker.cpu_us,
                peak_rss_kib: out.peak_rss_kib.unwrap_or(0),
                spawn_cpu_us: out.timings.spawn_cpu_us,
                heap_bytes: out.timings.worker.heap_bytes,
                console_lines: out.console_lines,
                governance_us: 0,
            });
            match out.result {
                Ok(v) => ToolReply::success(&v, secrets),
                Err(e) => {
                    if matches!(
                        e.code,
                        Code::Timeout | Code::StepLimit | Code::MemoryLimit | Code::OutputLimit
                    ) {
                        record.limits_hit.push(e.code.to_string());
                    }
                    // A file refusal says which layer refused (the worker cannot tell).
                    // Only for a tool with file access: any code can throw the same text.
                    let fs_granted = sandbox.fs != stsd_protocol::frames::FsAccess::None;
                    let (code, message) = (e.code == Code::Security && fs_granted)
                        .then(|| {
                            crate::workspace::explain_denial(
                                &e.message,
                                Path::new(&sandbox.base_path),
                                sandbox.uid,
                                sandbox.gid,
                            )
                        })
                        .flatten()
                        .unwrap_or((e.code, e.message));
                    let mut r = ToolReply::error(code, &message);
                    r.stack = e.stack;
                    r
                }
            }
        }
        Err(e) => ToolReply::error(e.code, &e.message),
    }
}

async fn run_wrapped(
    gw: &Gateway,
    tool: &WrappedTool,
    args: Map<String, Value>,
    door: &mut Door<'_>,
    record: &mut AuditRecord,
    secrets: &SecretSet,
) -> ToolReply {
    let call_id = door.call_id;
    tracing::info!(
        target: "mcp.tool.start",
        call_id,
        upstream = %tool.upstream,
        tool = %tool.tool,
        alias = %tool.alias,
        risk = %tool.composed.level,
        "mcp.tool.start"
    );
    let started = std::time::Instant::now();
    if let Some(u) = record.upstream.as_mut() {
        u.reached = true;
    }
    let result = gw.call(tool, args, door.cancel.clone()).await;
    let ms = started.elapsed().as_millis() as u64;
    match result {
        Ok(r) => {
            tracing::info!(target: "mcp.tool.done", call_id, upstream = %tool.upstream, tool = %tool.tool, ms, is_error = r.is_error.unwrap_or(false), "mcp.tool.done");
            crate::gateway::reply_of(&r, secrets)
        }
        Err((code, message)) => {
            tracing::warn!(target: "mcp.tool.crash", call_id, upstream = %tool.upstream, tool = %tool.tool, ms, code = %code, error = %secrets.mask(&message), "mcp.tool.crash");
            if matches!(code, Code::Timeout | Code::OutputLimit) {
                record.limits_hit.push(code.to_string());
            }
            ToolReply::error(code, &message)
        }
    }
}
