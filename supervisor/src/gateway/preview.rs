//! `stsd upstream check`: seed 001's connection risk preview as a command. The declared
//! upstreams are connected exactly as the daemon would (confined, through their proxies),
//! scored, scanned and looked up in the ledger; nothing is served, the ledger is not
//! written, and every upstream is stopped before the report is returned.

use super::front::{ledger_path, EventSink, Gateway};
use super::ledger::Ledger;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_profiles::Config;

/// `own`: the names of the tools the daemon serves beside the upstreams.
pub fn run(
    config: &Config,
    only: Option<&str>,
    own: &[String],
    wait: Duration,
) -> Result<Value, String> {
    let mut declared =
        super::sources::declared(config, &config.daemon.toolsets).map_err(|e| e.join("\n"))?;
    if let Some(id) = only {
        declared.retain(|u| u.id == id);
        if declared.is_empty() {
            return Err(format!("no upstream {id} is declared"));
        }
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the stsd binary: {e}"))?;
    let ledger = Arc::new(Ledger::open(ledger_path(config))?);
    // Declared before the runtime, so dropped after it: no session writes once it is restored.
    let _pipes = PipeErrorsNotSignals::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let (changed, _) = tokio::sync::broadcast::channel(4);
        let sink: EventSink = Arc::new(|_: &Value| {});
        let gw = Gateway::start(
            Arc::new(config.clone()),
            declared,
            &exe,
            ledger,
            changed,
            sink,
            false,
        )?;
        let deadline = Instant::now() + wait;
        while !gw.settled() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        gw.set_own(own.to_vec());
        let report = gw.report();
        gw.stop();
        Ok(report)
    })
}

/// A one-shot command has SIGPIPE at its default (it ends quietly under `| head`); while the
/// preview talks to upstreams, a write to one that died (a server that exits at once) must
/// be an EPIPE for its session, not the end of `stsd upstream check` (it was, now and then:
/// exit -13 instead of the report). Restores the disposition it found.
struct PipeErrorsNotSignals(libc::sighandler_t);

impl PipeErrorsNotSignals {
    fn new() -> PipeErrorsNotSignals {
        // SAFETY: `signal` only swaps the process's disposition for SIGPIPE; SIG_IGN has no
        // handler to run.
        PipeErrorsNotSignals(unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) })
    }
}

impl Drop for PipeErrorsNotSignals {
    fn drop(&mut self) {
        if self.0 != libc::SIG_ERR {
            // SAFETY: puts back the disposition `new` found (SIG_DFL or SIG_IGN).
            unsafe {
                libc::signal(libc::SIGPIPE, self.0);
            }
        }
    }
}
