//! One call's exchange with its worker, without I/O: what the worker is sent, what each frame
//! it sends back means, and how the call ends. Two drivers feed it: the blocking one
//! ([`super::run_keeping`], on a blocking thread) and the async one ([`super::inline`], on the
//! runtime thread that holds the request). Both check a worker's every frame the same way,
//! here: a compromised worker gets no more from one driver than from the other.

use super::outcome::PRE_CONFINEMENT_CODES;
use super::outcome::{death_cause, CallError, CallOutcome, CallTimings, CallValue, Event};
use super::worker::{encode_for, reap_later, AwaitError, ReadyWorker};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use stsd_protocol::frames::{self, FetchRequest, FromWorker, Job, NetworkGrant, ToWorker};
use stsd_protocol::Code;

/// The error codes a worker may report itself. Anything else (a worker claiming OVERLOADED or
/// APPROVAL_REJECTED, say) is a protocol violation.
const WORKER_CODES: &[Code] = &[
    Code::JsError,
    Code::Timeout,
    Code::StepLimit,
    Code::MemoryLimit,
    Code::OutputLimit,
    Code::InvalidInput,
    Code::HelperRuntime,
    Code::Security,
    Code::SandboxUnavailable,
    Code::WorkerCrashed,
];

pub(super) struct Exchange<'j> {
    job: &'j Job,
    t0: Instant,
    pub(super) out: CallOutcome,
    pub(super) settled: Option<Result<CallValue, CallError>>,
    pub(super) protocol_error: Option<String>,
    pub(super) killed_at_deadline: bool,
    pub(super) cancelled: bool,
    result_text: String,
    confined: bool,
    console_lines: u64,
    console_bytes: u64,
    went_primed: bool,
    was_warm: bool,
    awaited_us: u64,
    /// The worker runs on the driving thread's CPU (see [`Exchange::begin`]), until
    /// [`PINNED_FOR`] has passed.
    pinned: bool,
    /// Counted among the exchanges in flight (see [`IN_FLIGHT`]).
    _in_flight: InFlight,
    /// The job never reached the worker whole: it died before it was sent, or sending it
    /// failed (see [`CallOutcome::undelivered`]).
    undelivered: bool,
}

/// How long a lone call's worker stays on the CPU of the thread that drives its exchange: a
/// short call's whole exchange. A call still running then may run on any CPU, so that long
/// calls spread over the machine.
const PINNED_FOR: Duration = Duration::from_millis(2);

/// The longest wait for a worker's frame before the driver checks for a cancellation.
const SLICE: Duration = Duration::from_millis(50);

/// Exchanges in flight in this process: whether a call is a lone one (see
/// [`Exchange::begin`]).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One exchange counted in [`IN_FLIGHT`] while it lives.
struct InFlight;

impl InFlight {
    /// Counts one more; true when it is the only one.
    fn enter() -> (InFlight, bool) {
        (InFlight, IN_FLIGHT.fetch_add(1, Ordering::SeqCst) == 0)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if IN_FLIGHT.fetch_sub(1, Ordering::SeqCst) > 1 {
            super::placement::overlap_ended();
        }
    }
}

/// A fetch frame, for the driver: part of a request body, or the request.
pub(super) enum FetchStep {
    Body(Vec<u8>),
    Request(Box<FetchRequest>),
    /// Sign `data` with the withheld secret `placeholder` stands for.
    Hmac {
        hash: String,
        placeholder: String,
        data: Vec<u8>,
    },
}

/// What became of the worker once the exchange is over.
pub(super) enum Ending {
    /// Kept for another call (it was sent Continue).
    Kept(ReadyWorker),
    /// The outcome is known and the worker is not kept: the reaper ends it.
    Released,
    /// No outcome: the driver must end the worker and find its exit status (which says what
    /// happened), then call [`Exchange::finish`].
    NeedsStatus(ReadyWorker),
}

impl<'j> Exchange<'j> {
    /// A call on `w` begins: it runs at the normal policy from now on (a worker is made, and
    /// a reused one makes its next context, as background work, see `os::priority`).
    pub(super) fn begin(w: &mut ReadyWorker, job: &'j Job) -> Exchange<'j> {
        use stsd_profiles::os::priority;
        if !std::mem::replace(&mut w.at_normal_policy, true) {
            priority::foreground(w.pid());
        }
        // The driver waits for each of the worker's frames: beside it, each wake-up between
        // the two is local, not an interrupt to another CPU (on this VM about 30 µs each way,
        // measured with a socket ping-pong: 67 µs a round trip across CPUs, 11 on one). See
        // `slice_passed` for calls that are not short.
        //
        // A worker kept for another call (reuse) makes its next context right after its call.
        // Pinned, then let go to any CPU, that work landed where the next call ran (reuse
        // p50 0.199 ms, against 0.146 never pinned); so it is pinned only for a lone call and
        // then kept away from that CPU (`end`): 0.128 ms against 0.214 never pinned (trivial,
        // `N=1000 scripts/ab 6 1000`). With calls in flight together, pinning reused workers
        // piled them onto the drivers' CPUs (3051 calls/s at c=8, 4961 never pinned): then
        // they are not pinned, and one kept away is let go to any CPU. One-shot workers too
        // (they were pinned for every call): `stats-summary` one-shot calls/s at c=8 1583 ->
        // 1655, CPU per call 1025 -> 1012 µs (medians of seven alternating rounds).
        let (in_flight, alone) = InFlight::enter();
        let lone = super::placement::alone_for_a_while(alone);
        if lone {
            super::placement::lone_call_here();
        } else {
            super::placement::calls_overlap();
        }
        let pinned = lone;
        if pinned {
            priority::beside_caller(w.pid());
            w.kept_away = false;
        } else if std::mem::take(&mut w.kept_away) {
            priority::anywhere(w.pid());
        }
        Exchange {
            job,
            t0: Instant::now(),
            out: CallOutcome {
                result: Err(CallError::new(Code::WorkerCrashed, "worker did not start")),
                worker_pid: w.pid(),
                console_truncated: false,
                timings: CallTimings {
                    spawn_us: w.spawn_us,
                    spawn_cpu_us: if w.served == 0 { w.spawn_cpu_us } else { 0 },
                    ..CallTimings::default()
                },
                probe: None,
                egress: Vec::new(),
                peak_rss_kib: None,
                console_lines: 0,
                undelivered: false,
            },
            settled: None,
            protocol_error: None,
            killed_at_deadline: false,
            cancelled: false,
            result_text: String::new(),
            confined: false,
            console_lines: 0,
            console_bytes: 0,
            went_primed: w.is_primed_for(job),
            was_warm: w.is_context_made(),
            awaited_us: 0,
            pinned,
            _in_flight: in_flight,
            undelivered: false,
        }
    }

    /// When the driver next stops waiting for a frame (to check for a cancellation, or to
    /// let a pinned worker go to any CPU), before `deadline`.
    pub(super) fn slice_until(&self, deadline: Instant) -> Instant {
        let step = if self.pinned { PINNED_FOR } else { SLICE };
        deadline.min(Instant::now() + step)
    }

    /// A slice passed with no frame: the call is not a short one, and its worker may run
    /// on any CPU from now on.
    pub(super) fn slice_passed(&mut self) {
        if std::mem::take(&mut self.pinned) {
            stsd_profiles::os::priority::anywhere(self.out.worker_pid);
        }
    }

    /// The worker's next context is made (or it could not be): the frames to send it, or
    /// nothing when the call is already settled.
    pub(super) fn frames_to_send(&mut self, awaited: Result<(), AwaitError>) -> Vec<Vec<u8>> {
        self.awaited_us = self.t0.elapsed().as_micros() as u64;
        match awaited.map(|()| encode_for(self.went_primed, self.job)) {
            // It died (or went wrong) making its next context: the job was never sent.
            Err(AwaitError::Protocol(e)) => {
                self.protocol_error = Some(e);
                self.undelivered = true;
            }
            Err(AwaitError::Refused(e)) => self.settled = Some(Err(e)),
            Ok(Ok(parts)) => return parts,
            // Larger than any request the daemon accepts: the caller's input, not the worker.
            Ok(Err(e)) => {
                self.settled = Some(Err(CallError::new(
                    Code::InvalidInput,
                    format!("the call is too large to run: {e}"),
                )))
            }
        }
        Vec::new()
    }

    /// The job could not be sent: the socket failed (the worker is gone). A worker runs
    /// nothing of a job it has not received whole (a job in parts is assembled first).
    pub(super) fn send_failed(&mut self, e: impl std::fmt::Display) {
        self.protocol_error = Some(format!("cannot send the job: {e}"));
        self.undelivered = true;
    }

    /// The worker's end closed with records of ours unread. When it had sent nothing since
    /// the job (`records`: what it sent in this call), what it left unread is the job, which
    /// it never ran (a job in parts is assembled before anything of it runs). After any
    /// frame, the unread record may be a later one (a fetch's reply): the job ran.
    pub(super) fn closed_unread(&mut self, records: u32) {
        if records == 0 {
            self.undelivered = true;
        }
    }

    /// The worker did not read its job until the call's deadline: the call's time is spent,
    /// so it is not tried again.
    pub(super) fn send_timed_out(&mut self) {
        self.protocol_error = Some("cannot send the job: the worker did not read it".into());
    }

    /// When the worker is killed: the call's timeout plus the grace period, from now.
    pub(super) fn deadline(&self, kill_grace: Duration) -> Instant {
        Instant::now() + Duration::from_millis(self.job.limits.timeout_ms) + kill_grace
    }

    /// Whether frames are still awaited.
    pub(super) fn open(&self) -> bool {
        self.settled.is_none() && self.protocol_error.is_none()
    }

    /// One frame from the worker. A fetch is handed back for the driver (a posture without
    /// network never gets that far: its fetch is a protocol error here).
    pub(super) fn on_frame(
        &mut self,
        frame: FromWorker,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Option<FetchStep> {
        let job = self.job;
        let is_output = matches!(
            frame,
            FromWorker::ResultUndefined
                | FromWorker::ResultChunk { .. }
                | FromWorker::Console { .. }
                | FromWorker::Probe { .. }
                | FromWorker::Fetch(_)
                | FromWorker::FetchBody { .. }
        );
        if is_output && !self.confined {
            self.protocol_error = Some("output before the sandbox was applied".into());
            return None;
        }
        match frame {
            FromWorker::Console { level, line } => {
                self.console_lines += 1;
                self.console_bytes += line.len() as u64;
                if self.console_lines > job.limits.max_console_lines
                    || self.console_bytes > job.limits.max_console_bytes
                {
                    self.out.console_truncated = true;
                    self.settled = Some(Err(CallError::new(
                        Code::OutputLimit,
                        "console output went over its caps (enforced by the supervisor)",
                    )));
                } else {
                    on_event(Event::Console(level, &line));
                }
            }
            FromWorker::ConsoleTruncated => self.out.console_truncated = true,
            FromWorker::Confined => self.confined = true,
            FromWorker::ResultUndefined => self.settled = Some(Ok(CallValue::Undefined)),
            FromWorker::ResultChunk { data, last } => {
                if (self.result_text.len() + data.len()) as u64 > job.limits.max_result_bytes {
                    self.settled = Some(Err(CallError::new(
                        Code::OutputLimit,
                        format!(
                            "the result is over the {} byte limit",
                            job.limits.max_result_bytes
                        ),
                    )));
                } else {
                    self.result_text.push_str(&data);
                    if last {
                        let text = std::mem::take(&mut self.result_text);
                        self.settled = Some(Ok(CallValue::Json(text)));
                    }
                }
            }
            FromWorker::Error {
                code,
                message,
                stack,
            } => match Code::parse(&code) {
                Some(c)
                    if WORKER_CODES.contains(&c)
                        && (self.confined || PRE_CONFINEMENT_CODES.contains(&c)) =>
                {
                    self.settled = Some(Err(CallError {
                        code: c,
                        message,
                        stack,
                    }));
                }
                _ => {
                    self.protocol_error = Some(format!(
                        "worker reported an error code it may not use: {code}"
                    ))
                }
            },
            FromWorker::Probe { outcome, .. } if job.attack.is_some() => {
                self.out.probe = Some(outcome);
                self.settled = Some(Ok(CallValue::Undefined));
            }
            FromWorker::Probe { .. } => {
                self.protocol_error = Some("probe frame outside attack mode".into())
            }
            FromWorker::FetchBody { .. } | FromWorker::Fetch(_) | FromWorker::Hmac { .. }
                if job.sandbox.network != NetworkGrant::Brokered =>
            {
                self.protocol_error =
                    Some("fetch from a worker whose posture has no network".into())
            }
            FromWorker::FetchBody { data } => return Some(FetchStep::Body(data)),
            FromWorker::Fetch(req) => return Some(FetchStep::Request(req)),
            FromWorker::Hmac {
                hash,
                placeholder,
                data,
            } => {
                return Some(FetchStep::Hmac {
                    hash,
                    placeholder,
                    data,
                })
            }
            FromWorker::Timings(t) => self.out.timings.worker = t,
            FromWorker::Ready { .. } => self.protocol_error = Some("second Ready frame".into()),
            // Taken only from a worker being primed, before any call reached it (see
            // `ReadyWorker::await_primed`): a call's worker may not hand anything on.
            FromWorker::Bytecode(_) => {
                self.protocol_error = Some("bytecode from a worker in a call".into())
            }
        }
        None
    }

    /// The frames are over: keeps the worker when the job asked for `keep_alive` and ended
    /// cleanly (a result, or a JS error) and the worker said nothing after its outcome
    /// (`frames_left`: it did; the result stands, but the worker is not fit for another).
    pub(super) fn end(&mut self, mut w: ReadyWorker, frames_left: bool) -> Ending {
        if self.out.timings.worker.max_rss_kib > 0 {
            self.out.peak_rss_kib = Some(self.out.timings.worker.max_rss_kib);
        }
        if self.settled.is_none() || self.protocol_error.is_some() || self.killed_at_deadline {
            return Ending::NeedsStatus(w);
        }
        let clean = matches!(&self.settled, Some(Ok(_)))
            || matches!(&self.settled, Some(Err(e)) if e.code == Code::JsError);
        let keep = self.job.keep_alive && clean && !frames_left && w.is_alive() && {
            // It makes its next context now, as background work, and says Ready when it has:
            // where the background runs, off this lone call's CPU (see `begin`).
            stsd_profiles::os::priority::background(w.pid());
            w.at_normal_policy = false;
            if self.pinned {
                w.kept_away = super::placement::with_background(w.pid());
            }
            frames::encode(&ToWorker::Continue).ok().is_some_and(|b| {
                nix::sys::socket::send(
                    std::os::fd::AsRawFd::as_raw_fd(w.socket()),
                    &b,
                    nix::sys::socket::MsgFlags::MSG_NOSIGNAL
                        | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
                )
                .is_ok()
            })
        };
        if keep {
            w.continued();
            Ending::Kept(w)
        } else {
            // The outcome is known; killing and reaping need not delay the reply.
            w.ended_on_its_own = clean && !frames_left;
            reap_later(w);
            Ending::Released
        }
    }

    /// The call's outcome. `status`: the worker's exit status when the exchange ended without
    /// an outcome (what it died of).
    pub(super) fn finish(
        mut self,
        status: Option<std::process::ExitStatus>,
        records: u32,
    ) -> CallOutcome {
        let mut out = self.out;
        out.console_lines = self.console_lines;
        out.timings.total_us = out.timings.spawn_us + self.t0.elapsed().as_micros() as u64;
        out.timings.records = records;
        out.undelivered = self.undelivered && self.settled.is_none() && !self.cancelled;
        // Where a call's time in its worker went (STSD_LOG=stsd::exec=trace): primed or not,
        // whether the worker was ready or the call waited for it to be, and the worker's phases.
        tracing::trace!(
            primed = self.went_primed,
            was_ready = self.was_warm,
            awaited_us = self.awaited_us,
            spawn_us = out.timings.spawn_us,
            exchange_us = self.t0.elapsed().as_micros() as u64,
            profile_us = out.timings.worker.profile_us,
            context_us = out.timings.worker.context_us,
            run_us = out.timings.worker.run_us,
            faults = ?out.timings.worker.faults,
            "worker exchange"
        );
        out.result = match (self.settled.take(), self.protocol_error.take()) {
            (Some(r), _) => r,
            (None, _) if self.cancelled => Err(CallError::new(
                Code::Cancelled,
                "the caller went away; the worker was killed",
            )),
            (None, Some(e)) => Err(CallError::new(
                Code::WorkerCrashed,
                format!("worker protocol error: {e}"),
            )),
            (None, None) if self.killed_at_deadline => Err(CallError::new(
                Code::Timeout,
                format!(
                    "execution timed out after {} ms (worker killed)",
                    self.job.limits.timeout_ms
                ),
            )),
            (None, None) => Err(death_cause(status)),
        };
        out
    }
}
