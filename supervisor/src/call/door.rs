//! What differs between the doors a call comes in by, as parameters of the one pipeline:
//! who may be asked for approval, whether there is a rate, a fair queue and an operator
//! queue, how the tool runs (a daemon's pool, or one fresh worker), where its files are (the
//! configured base path, or a Local Pass's scratch copy), where the audit record goes.

use super::vocab::Caller;
use crate::admission::Admission;
use crate::approval::{Elicitor, Gate};
use crate::audit::AuditLog;
use crate::exec::pool::Pool;
use crate::exec::ExecOptions;
use crate::scratch::PassPlace;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use stsd_profiles::Config;
use stsd_protocol::frames::ConsoleLevel;

/// Where a call's console lines go (masked and cut already).
pub type ConsoleSink = Box<dyn FnMut(ConsoleLevel, String) + Send>;

/// How an own tool runs.
pub enum Executor<'a> {
    /// The daemon's pool (primed, parked or fresh workers), behind its fair admission;
    /// `reuse` calls a worker may serve; the options workers are made with.
    Pool {
        pool: &'a Arc<Pool>,
        reuse: u32,
        opts: ExecOptions,
    },
    /// One worker made for this call (`stsd run`, `stsd test`, the publish gate).
    OneShot(&'a ExecOptions),
}

/// Where a tool with file access works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Its configured base path (`[baseline]`, `sandboxOverrides.fsBasePath`).
    Configured,
    /// A Local Pass: a scratch copy of it, or in place when asked (see `crate::scratch`).
    LocalPass(PassPlace),
}

/// Where the call's one audit record goes.
pub enum Audit<'a> {
    /// The daemon's log (None: it has none).
    Log(Option<&'a AuditLog>),
    /// The log the config names, opened for this one record (`stsd run`, `stsd test`).
    Configured,
}

/// One call's door.
pub struct Door<'a> {
    pub config: Arc<Config>,
    pub caller: Caller,
    pub call_id: u64,
    pub gate: &'a Gate,
    /// Who can be asked when the elicit strategy applies (an MCP client, a terminal).
    pub elicitor: Option<&'a dyn Elicitor>,
    /// Whether an operator queue (the daemon's `stsd approvals`) exists; without one the
    /// operator strategy asks the elicitor, as `stsd run` and `stsd test` do at a terminal.
    pub operator_queue: bool,
    /// Set by the transport when the caller goes away.
    pub cancel: Arc<AtomicBool>,
    pub console: Option<ConsoleSink>,
    /// The per-principal call rate, where the door has one (the daemon's).
    pub rate: Option<&'a crate::rate::RateLimits>,
    /// `[[limits]]`: rates, concurrency and CPU quotas per principal and tool.
    pub quotas: Option<&'a crate::rate::Quotas>,
    /// The fair queue for pool slots, where the door has one (the daemon's).
    pub admission: Option<&'a Admission>,
    pub executor: Executor<'a>,
    pub place: Place,
    /// Where `${ENV}` placeholders are resolved (None: the config's `[baseline]` env).
    pub env: Option<&'a (dyn stsd_protocol::envvar::EnvSource + Sync)>,
    /// A test case's own deadline, below the posture's.
    pub timeout_ms: Option<u64>,
    pub audit: Audit<'a>,
    pub metrics: Option<&'a crate::metrics::Metrics>,
    /// Whether the daemon is cutting calls off at the end of its shutdown grace.
    pub cut: Option<&'a tokio_util::sync::CancellationToken>,
    /// Filled by an own tool's run: its worker's timings and whether console lines were
    /// dropped over the caps (for `stsd run --timings`).
    pub ran: Option<(crate::exec::CallTimings, bool)>,
    /// Who may call what: the serving doors' policy. None for `stsd run` and `stsd test`,
    /// which run the file they are named for the local user who names it.
    pub policy: Option<std::sync::Arc<crate::policy::Policy>>,
}

impl<'a> Door<'a> {
    /// A door for one call outside a daemon: no rate, no queue, no operator queue, one
    /// fresh worker, the audit log the config names.
    pub fn one_shot(
        config: Arc<Config>,
        gate: &'a Gate,
        opts: &'a ExecOptions,
        elicitor: Option<&'a dyn Elicitor>,
        transport: &'static str,
        place: Place,
    ) -> Door<'a> {
        Door {
            config,
            caller: Caller {
                peer_uid: Some(nix::unistd::Uid::effective().as_raw()),
                principal: None,
                transport,
                session: 0,
            },
            call_id: 1,
            gate,
            elicitor,
            operator_queue: false,
            cancel: Arc::new(AtomicBool::new(false)),
            console: None,
            rate: None,
            quotas: None,
            admission: None,
            executor: Executor::OneShot(opts),
            place,
            env: None,
            timeout_ms: None,
            audit: Audit::Configured,
            metrics: None,
            cut: None,
            ran: None,
            policy: None,
        }
    }
}
