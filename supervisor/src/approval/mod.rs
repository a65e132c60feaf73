//! The approval gate: whether a call needs a decision before it runs, and who decides.
//! `policy` computes each tool's effective requirement when the catalog is published;
//! `toolsets` reads the operator's CJSON toolsets documents (seed 003); [`Gate::decide`] is
//! the one entry point on the call path, consulted before any worker is taken, and it runs
//! the strategy the requirement names (seed 002): approve, reject, elicit (through an
//! [`Elicitor`] the transport hands in: no strategy knows a transport), operator (the queue in
//! `operator`, answered over the admin channel) or command.

pub mod command;
pub mod mcp;
pub mod operator;
pub mod policy;
pub mod terminal;
pub mod toolsets;

pub use policy::{mitigated, requirement, Requirement, Source, ToolFacts};

use serde_json::{json, Value};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use stsd_profiles::approval::{ApprovalConfig, StrategyKind};
use stsd_protocol::Code;

/// What a caller's side answered when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elicited {
    Accepted,
    Declined(String),
    /// The caller cannot be asked (no elicitation capability, no terminal): how to get
    /// approval instead.
    Unsupported(String),
    Failed(String),
}

/// How the caller's side can be asked, given by the transport (MCP elicitation, a terminal).
pub trait Elicitor: Send + Sync {
    /// Who answers, for the audit record (an MCP client's name, "terminal").
    fn who(&self) -> String;
    fn ask(&self, message: String) -> Pin<Box<dyn Future<Output = Elicited> + Send + '_>>;
}

/// One call asking for approval. Arguments are masked before they get here.
pub struct Ask<'a> {
    pub call_id: u64,
    pub tool: &'a str,
    pub arguments: &'a Value,
    pub prompt_template: Option<&'a str>,
    pub peer_uid: Option<u32>,
    /// The HTTP principal making the call, if any.
    pub principal: Option<&'a crate::call::vocab::Principal>,
    pub requirement: &'a Requirement,
}

pub use crate::audit::ApprovalRecord;

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// None: approved. Some: the code and message the caller gets instead of a run.
    pub refusal: Option<(Code, String)>,
    pub record: ApprovalRecord,
}

/// `{toolName}` and `{args}` rendered into the spec's promptTemplate (or a default).
pub fn render_prompt(template: Option<&str>, tool: &str, arguments: &Value) -> String {
    let args = serde_json::to_string(arguments).unwrap_or_default();
    let args: String = if args.chars().count() > 2000 {
        args.chars().take(2000).chain("…".chars()).collect()
    } else {
        args
    };
    template
        .unwrap_or("Allow '{toolName}' with {args}?")
        .replace("{toolName}", tool)
        .replace("{args}", &args)
}

pub struct Gate {
    /// Swapped whole on a config reload (SIGHUP); a decision in progress keeps the one it
    /// started with.
    cfg: std::sync::RwLock<std::sync::Arc<ApprovalConfig>>,
    queue: operator::Queue,
    /// The latest calls that expired because their daemon stopped while they waited (found
    /// at the next start, or by a replica), newest last: `stsd approvals` shows them beside
    /// the waiting ones, so an operator who comes back sees what was lost, not an empty list.
    expired: std::sync::Mutex<std::collections::VecDeque<serde_json::Value>>,
}

/// How many expired calls `stsd approvals` keeps showing (the audit log keeps them all).
const EXPIRED_SHOWN: usize = 100;

impl Gate {
    pub fn new(cfg: ApprovalConfig) -> Gate {
        Gate {
            queue: operator::Queue::new(cfg.max_pending),
            cfg: std::sync::RwLock::new(std::sync::Arc::new(cfg)),
            expired: Default::default(),
        }
    }

    pub fn config(&self) -> std::sync::Arc<ApprovalConfig> {
        self.cfg.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The `[approval]` section of a reloaded config (`max_pending` keeps its start value).
    pub fn set_config(&self, cfg: ApprovalConfig) {
        *self.cfg.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(cfg);
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.config().timeout_seconds)
    }

    /// Keeps the calls waiting for an operator in the state store (see `operator::Journal`).
    pub fn keep_waiting_in(&self, journal: operator::Journal) {
        self.queue.keep_in(journal);
    }

    /// Calls waiting for an operator (on a shared store, every replica's).
    pub fn pending(&self) -> Vec<operator::PendingView> {
        self.queue.list()
    }

    /// A call that expired because its daemon stopped while it waited (its view as
    /// `stsd approvals` showed it, with why and when).
    pub fn note_expired(&self, view: serde_json::Value) {
        let mut q = self.expired.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= EXPIRED_SHOWN {
            q.pop_front();
        }
        q.push_back(view);
    }

    /// The calls noted by [`Gate::note_expired`], oldest first.
    pub fn expired(&self) -> Vec<serde_json::Value> {
        let q = self.expired.lock().unwrap_or_else(|e| e.into_inner());
        q.iter().cloned().collect()
    }

    /// Another replica changed the store: decisions it made for calls waiting here are
    /// delivered.
    pub fn collect_decisions(&self) {
        self.queue.collect();
    }

    /// A replica's heartbeat: the calls left waiting by replicas gone for `stale_ms`.
    pub fn heartbeat(&self, stale_ms: i64) -> Vec<crate::state::Waiting> {
        self.queue.heartbeat(stale_ms)
    }

    /// An operator's answer, from one the policy lets `approve` (the admin channel checks).
    pub fn answer(
        &self,
        id: u64,
        approved: bool,
        reason: String,
        by: &crate::call::vocab::Subject,
    ) -> Result<(), String> {
        self.queue.answer(
            id,
            operator::Answer {
                approved,
                reason,
                by: by.to_string(),
            },
        )
    }

    /// The decision for one call that needs approval. Never runs the tool; the caller does
    /// that only when `refusal` is None.
    pub async fn decide(&self, ask: Ask<'_>, elicitor: Option<&dyn Elicitor>) -> Decision {
        let req = ask.requirement;
        let t0 = Instant::now();
        let mut record = ApprovalRecord {
            strategy: req.strategy.as_str(),
            source: req.source.as_str(),
            approver: String::new(),
            decision: "approved",
            reason: None,
            wait_ms: 0,
            overrode_required: req.overrode_spec,
        };
        let prompt = render_prompt(ask.prompt_template, ask.tool, ask.arguments);
        let verdict: Result<(bool, String), (Code, String)> = match req.strategy {
            StrategyKind::Approve => {
                record.approver = "policy".into();
                Ok((true, String::new()))
            }
            StrategyKind::Reject => {
                record.approver = "policy".into();
                Ok((
                    false,
                    req.reason
                        .clone()
                        .unwrap_or_else(|| "the operator's policy refuses this tool".into()),
                ))
            }
            StrategyKind::Command => {
                record.approver = req.command.first().cloned().unwrap_or_default();
                let request = json!({
                    "callId": ask.call_id,
                    "tool": ask.tool,
                    "arguments": ask.arguments,
                    "prompt": prompt,
                    "peerUid": ask.peer_uid,
                    "principal": ask.principal.map(|p| &p.name),
                    "principalKind": ask.principal.map(|p| p.kind.as_str()),
                    "source": req.source.as_str(),
                });
                let limit = Duration::from_millis(self.config().command_timeout_ms);
                command::ask(&req.command, &request, limit)
                    .await
                    .map_err(|e| {
                        (
                            Code::ApprovalError,
                            format!("the approval command failed: {e}"),
                        )
                    })
            }
            StrategyKind::Operator => self.ask_operator(&ask, prompt, &mut record).await,
            StrategyKind::Elicit => match elicitor {
                None => Err((
                    Code::ApprovalRequired,
                    "this call needs approval and this caller cannot be asked".into(),
                )),
                Some(e) => {
                    record.approver = e.who();
                    match tokio::time::timeout(self.timeout(), e.ask(prompt)).await {
                        Err(_) => Err((Code::ApprovalTimeout, self.timeout_message())),
                        Ok(Elicited::Accepted) => Ok((true, String::new())),
                        Ok(Elicited::Declined(r)) => Ok((false, r)),
                        Ok(Elicited::Unsupported(how)) => Err((Code::ApprovalRequired, how)),
                        Ok(Elicited::Failed(why)) => Err((
                            Code::ApprovalError,
                            format!("asking the caller for approval failed: {why}"),
                        )),
                    }
                }
            },
        };
        record.wait_ms = t0.elapsed().as_millis() as u64;
        let refusal = match verdict {
            Ok((true, reason)) => {
                record.reason = (!reason.is_empty()).then_some(reason);
                None
            }
            Ok((false, reason)) => {
                let reason = if reason.is_empty() {
                    "declined".to_string()
                } else {
                    reason
                };
                record.decision = "rejected";
                record.reason = Some(reason.clone());
                Some((Code::ApprovalRejected, reason))
            }
            Err((code, message)) => {
                record.decision = match code {
                    Code::ApprovalTimeout => "timeout",
                    Code::ApprovalRequired => "required",
                    _ => "error",
                };
                record.reason = Some(message.clone());
                Some((code, message))
            }
        };
        Decision { refusal, record }
    }

    fn timeout_message(&self) -> String {
        format!(
            "no approval decision within {} s ([approval] timeout_seconds)",
            self.config().timeout_seconds
        )
    }

    async fn ask_operator(
        &self,
        ask: &Ask<'_>,
        prompt: String,
        record: &mut ApprovalRecord,
    ) -> Result<(bool, String), (Code, String)> {
        let view = operator::PendingView {
            id: ask.call_id,
            call_id: ask.call_id,
            tool: ask.tool.to_string(),
            arguments: ask.arguments.clone(),
            prompt,
            peer_uid: ask.peer_uid,
            principal: ask.principal.map(|p| p.name.clone()),
            principal_kind: ask.principal.map(|p| p.kind.as_str().to_string()),
            age_ms: 0,
        };
        let waiting = self
            .queue
            .enter(view)
            .map_err(|e| (Code::ApprovalError, e))?;
        tracing::info!(
            id = waiting.id(),
            call_id = ask.call_id,
            tool = ask.tool,
            "a call waits for an operator's approval (stsd approvals)"
        );
        let mut waiting = waiting;
        match tokio::time::timeout(self.timeout(), &mut waiting.rx).await {
            Err(_) => {
                record.approver = "operator".into();
                Err((Code::ApprovalTimeout, self.timeout_message()))
            }
            Ok(Err(_)) => Err((Code::ApprovalError, "the approval queue was closed".into())),
            Ok(Ok(a)) => {
                record.approver = format!("operator {}", a.by);
                Ok((a.approved, a.reason))
            }
        }
    }
}
