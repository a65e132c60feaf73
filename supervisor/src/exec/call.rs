//! One call, supervisor side: spawn, wait for Ready, send the job, read the streamed frames,
//! SIGKILL at the deadline plus a grace period, reap, and classify the outcome.

use super::exchange::{Ending, Exchange, FetchStep};
use super::spawn::{ChildProc, Spawned, Spawner};
use crate::egress::{self, Broker, HopRecord};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, send, MsgFlags};
use serde_json::Value;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_protocol::frames::{
    self, ConsoleLevel, FetchRequest, FromWorker, Job, Prime, ProbeOutcome, ToWorker,
    WorkerTimings, CHUNK_BYTES, MAX_FRAME_BYTES,
};
use stsd_protocol::Code;

/// How long a freshly exec'd worker may take to report Ready.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Makes workers (the zygote, or exec of the stsd binary held open since start).
    pub spawner: Arc<Spawner>,
    pub kill_grace: Duration,
    /// The user a worker switches to when the supervisor runs as root.
    pub uid: u32,
    pub gid: u32,
    /// Makes the requests of tools whose posture grants network.
    pub broker: Arc<Broker>,
    /// Reuse: how long a parked worker may wait for its next call.
    pub reuse_idle: Duration,
    /// Reuse: parked workers in all; `None`: the pool size.
    pub reuse_max_parked: Option<usize>,
    /// One-shot: pool workers are primed for the tools called lately (`[worker] prime`).
    pub prime: bool,
}

impl ExecOptions {
    /// Fails when the stsd binary cannot be opened or the egress configuration cannot be
    /// loaded (an unreadable CA file).
    pub fn new(worker_exe: PathBuf, config: &stsd_profiles::Config) -> Result<ExecOptions, String> {
        let group = crate::cgroup::for_pool(&config.cgroups)?;
        let spawner = Spawner::new(&worker_exe, &config.worker, group).map_err(|e| {
            format!(
                "cannot open the worker binary {}: {e}",
                worker_exe.display()
            )
        })?;
        Ok(ExecOptions {
            spawner: Arc::new(spawner),
            kill_grace: Duration::from_millis(config.worker.kill_grace_ms),
            uid: config.worker.uid,
            gid: config.worker.gid,
            broker: Arc::new(Broker::new(&config.egress)?),
            reuse_idle: Duration::from_secs(config.worker.reuse_idle_seconds),
            reuse_max_parked: config.worker.reuse_max_parked,
            prime: config.worker.prime,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallValue {
    Undefined,
    /// The result's JSON text, as the tool's `JSON.stringify` wrote it.
    Json(String),
}

impl CallValue {
    /// The result as a JSON value: `null` for undefined; a lone surrogate (half an emoji)
    /// stays in its strings as the text `\ud83d` (see `stsd_protocol::json::parse_js_json`).
    pub fn to_value(&self) -> Value {
        match self {
            CallValue::Undefined => Value::Null,
            CallValue::Json(t) => stsd_protocol::json::parse_js_json(t).unwrap_or(Value::Null),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub code: Code,
    pub message: String,
    pub stack: Option<String>,
}

impl CallError {
    pub fn new(code: Code, message: impl Into<String>) -> CallError {
        CallError {
            code,
            message: message.into(),
            stack: None,
        }
    }
}

/// Where the time of a call went, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTimings {
    /// spawn() until the worker's Ready frame (fork or exec, and the worker's start).
    pub spawn_us: u64,
    /// CPU time making the worker cost (0 for a reused worker), microseconds.
    pub spawn_cpu_us: u64,
    pub worker: WorkerTimings,
    /// spawn() until the worker was reaped.
    pub total_us: u64,
    /// Records the worker sent during the call: the times it woke the supervisor. A call
    /// that prints nothing takes one (its confinement, timings and result together).
    pub records: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    pub result: Result<CallValue, CallError>,
    pub worker_pid: u32,
    pub console_truncated: bool,
    pub timings: CallTimings,
    /// Attack mode only.
    pub probe: Option<ProbeOutcome>,
    /// Every fetch hop the broker made or refused for this call (for the audit record).
    pub egress: Vec<HopRecord>,
    /// The worker's peak resident set (KiB), as it reported in its Timings frame.
    pub peak_rss_kib: Option<u64>,
    /// Console lines the call wrote (those over the caps included).
    pub console_lines: u64,
    /// The job never reached the worker: it died before the job was sent (while parked, or
    /// making its next context, or being primed), or the send failed. Nothing of the call
    /// ran, so the call may go to another worker. (A worker that dies after its job was
    /// sent may have started it: that call is not repeated.)
    pub undelivered: bool,
}

/// Events streamed while a call runs.
pub enum Event<'a> {
    /// The worker process exists (its pid), before the job is sent.
    Started(u32),
    Console(ConsoleLevel, &'a str),
}

pub(super) enum Recv {
    Frame(FromWorker),
    Eof,
    /// The worker's end closed with records of ours it had not read: on a SEQPACKET socket
    /// the kernel reports ECONNRESET, instead of EOF, when the closing end's receive queue
    /// is not empty.
    Unread,
    Timeout,
    Broken(String),
}

/// Receives one frame before `until`: a record that holds exactly one (a worker's Ready).
/// `buf` is reused across calls (one allocation per call).
fn recv_until(sock: &impl AsFd, until: Instant, buf: &mut [u8]) -> Recv {
    match recv_record(sock, until, buf) {
        Record::Bytes(n) => match frames::decode(&buf[..n]) {
            Ok(f) => Recv::Frame(f),
            Err(e) => Recv::Broken(format!("worker sent an undecodable frame: {e}")),
        },
        Record::End(r) => r,
    }
}

pub(super) enum Record {
    /// A record of this many bytes is at the start of the buffer.
    Bytes(usize),
    /// EOF, a timeout, or a broken socket.
    End(Recv),
}

/// Receives one record before `until`.
fn recv_record(sock: &impl AsFd, until: Instant, buf: &mut [u8]) -> Record {
    loop {
        let now = Instant::now();
        if now >= until {
            return Record::End(Recv::Timeout);
        }
        let ms = (until - now).as_millis().min(i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) => return Record::End(Recv::Timeout),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Record::End(Recv::Broken(format!("poll: {e}"))),
        }
        let cap = buf.len();
        let got = recv(
            sock.as_fd().as_raw_fd(),
            buf,
            MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT,
        );
        match record_of(got, cap) {
            Some(r) => return r,
            None => continue,
        }
    }
}

/// What a non-blocking `recv` of one record (with MSG_TRUNC, into a buffer of `cap` bytes)
/// came to; None when there was nothing to read after all.
pub(super) fn record_of(r: nix::Result<usize>, cap: usize) -> Option<Record> {
    Some(match r {
        // SEQPACKET: 0 is EOF (a zero-length record reads the same; the worker never sends
        // one, and the death is then classified from the exit status).
        Ok(0) => Record::End(Recv::Eof),
        Ok(n) if n > MAX_FRAME_BYTES || n > cap => {
            Record::End(Recv::Broken(format!("worker sent a {n} byte frame")))
        }
        Ok(n) => Record::Bytes(n),
        Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => return None,
        Err(nix::errno::Errno::ECONNRESET) => Record::End(Recv::Unread),
        Err(e) => Record::End(Recv::Broken(format!("recv: {e}"))),
    })
}

/// A call's frames, in order. A record may hold several back to back: the worker sends the
/// frames that need no answer (`Confined`, `Timings`) with the next one, so that they cost no
/// wake-up of their own. Each is decoded and checked like a lone frame.
pub(super) struct FrameReader {
    buf: FrameBuf,
    at: usize,
    end: usize,
    pub(super) records: u32,
    /// Frames read from the current record.
    in_record: u32,
}

impl FrameReader {
    pub(super) fn new() -> FrameReader {
        FrameReader {
            buf: FrameBuf::take(),
            at: 0,
            end: 0,
            records: 0,
            in_record: 0,
        }
    }

    /// The next frame: the rest of the last record first, then a new record before `until`.
    fn next(&mut self, sock: &impl AsFd, until: Instant) -> Recv {
        if let Some(r) = self.take_frame() {
            return r;
        }
        match recv_record(sock, until, &mut self.buf) {
            Record::Bytes(n) => self.got_record(n),
            Record::End(r) => return r,
        }
        self.take_frame().unwrap_or(Recv::Eof)
    }

    /// The buffer a record is received into (one frame and a byte: a longer record is cut,
    /// and refused by [`record_of`]).
    pub(super) fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// A record of `n` bytes was received into the buffer.
    pub(super) fn got_record(&mut self, n: usize) {
        (self.at, self.end, self.in_record) = (0, n, 0);
        self.records = self.records.saturating_add(1);
    }

    /// The next frame of the record received last; None when it has no more.
    pub(super) fn take_frame(&mut self) -> Option<Recv> {
        if self.at >= self.end {
            return None;
        }
        // A well-behaved worker never packs more; a hostile one packing thousands of one-byte
        // frames would cost the supervisor a decode each for one cheap send.
        self.in_record += 1;
        if self.in_record > frames::MAX_FRAMES_PER_RECORD {
            self.at = self.end;
            return Some(Recv::Broken(format!(
                "worker sent a record of more than {} frames",
                frames::MAX_FRAMES_PER_RECORD
            )));
        }
        Some(match frames::decode_first(&self.buf[self.at..self.end]) {
            Ok((f, used)) => {
                self.at += used;
                Recv::Frame(f)
            }
            Err(e) => {
                self.at = self.end;
                Recv::Broken(format!("worker sent an undecodable frame: {e}"))
            }
        })
    }

    /// Frames are left in the last record (after the outcome, a worker has nothing to say).
    pub(super) fn has_rest(&self) -> bool {
        self.at < self.end
    }

    pub(super) fn give_back(self) {
        self.buf.give_back();
    }
}

/// Codes a worker may report before it is confined (it failed to confine itself, or refused
/// the job outright).
pub(super) const PRE_CONFINEMENT_CODES: &[Code] = &[Code::SandboxUnavailable, Code::InvalidInput];

/// A worker that has been made and reported Ready: waiting for its one job.
pub struct ReadyWorker {
    proc: ChildProc,
    socket: std::os::fd::OwnedFd,
    /// spawn() until Ready, in microseconds.
    pub spawn_us: u64,
    /// CPU time making this worker cost (its maker's share and its own until Ready), µs.
    pub spawn_cpu_us: u64,
    /// Calls this worker has served (reuse).
    pub served: u32,
    /// Reuse, or primed: the worker is making its next context and will say Ready when it
    /// has.
    making_context: bool,
    /// What the worker is primed (or priming) for: a call of that template is sent as a Go.
    primed: Option<Arc<Prime>>,
    /// It may not run on every CPU: kept away from a lone call's CPU after that call, or
    /// forked while the background was (`placement`), until its next call places it.
    pub(super) kept_away: bool,
    /// The supervisor put it at the normal policy (a priming) and nothing has put it back
    /// since: its call need not do it again (a syscall on the call's path).
    pub(super) at_normal_policy: bool,
}

impl ReadyWorker {
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// False when the process has died while idle (killed, crashed).
    pub fn is_alive(&mut self) -> bool {
        self.proc.is_alive()
    }

    /// Whether the worker is primed (or priming) for calls of `job`'s template.
    pub fn is_primed_for(&self, job: &Job) -> bool {
        self.primed
            .as_ref()
            .is_some_and(|p| p.job.same_template(job))
    }

    /// Whether the worker's next context is made, as far as the supervisor knows (it has
    /// said Ready since its last call, or never served one).
    pub fn is_context_made(&self) -> bool {
        !self.making_context
    }

    pub(super) fn socket(&self) -> &std::os::fd::OwnedFd {
        &self.socket
    }

    /// The worker was sent Continue: it served one more call and makes a plain context for
    /// the next (a reused worker is not primed; it was only when it came from the pool
    /// primed for its first call).
    pub(super) fn continued(&mut self) {
        self.served += 1;
        self.making_context = true;
        self.primed = None;
    }

    /// The exit status of a worker whose call ended without an outcome: what it died of, or
    /// (still alive) it is killed now. Blocks until it is reaped.
    pub(super) fn exit_status_now(&mut self) -> Option<std::process::ExitStatus> {
        match self.proc.try_wait() {
            Ok(Some(s)) => Some(s),
            Ok(None) => {
                self.proc.kill_and_reap();
                self.proc.try_wait().ok().flatten()
            }
            Err(_) => None,
        }
    }

    /// Whether the worker is primed (or priming) at all.
    pub fn is_primed(&self) -> bool {
        self.primed.is_some()
    }

    /// Reuse: whether the worker's next context is made (it said Ready again), without
    /// waiting. A worker that has not served a call is always ready.
    pub fn is_warm(&mut self) -> bool {
        if !self.making_context {
            return true;
        }
        let mut buf = [0u8; 256];
        if let Ok(n) = recv(
            self.socket.as_raw_fd(),
            &mut buf,
            MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT,
        ) {
            if n > 0
                && n <= buf.len()
                && matches!(frames::decode(&buf[..n]), Ok(FromWorker::Ready { .. }))
            {
                self.making_context = false;
                return true;
            }
            // Anything else from an idle worker: unfit; it is killed when dropped.
            self.proc.kill_and_reap();
        }
        false
    }

    /// Primes a fresh worker for calls of `prime`'s template, off the call path: it applies
    /// the posture, binds all but the arguments and compiles the body, then says Ready.
    pub fn prime(&mut self, prime: Arc<Prime>) -> Result<(), String> {
        if self.served > 0 || self.making_context || self.primed.is_some() {
            return Err("only a fresh worker is primed".into());
        }
        let frame = frames::encode(&ToWorker::Prime(Box::new((*prime).clone())))
            .map_err(|e| format!("the prime does not fit one frame: {e}"))?;
        // Priming runs at the normal policy: as background work it got the CPU so seldom
        // that, at one call after another, a third of the calls found no primed worker
        // ready (priming took 1-2 ms of wall time for 0.3 ms of CPU).
        stsd_profiles::os::priority::foreground(self.pid());
        self.at_normal_policy = true;
        send(self.socket.as_raw_fd(), &frame, MsgFlags::MSG_NOSIGNAL)
            .map_err(|e| format!("cannot send the prime: {e}"))?;
        self.making_context = true;
        self.primed = Some(prime);
        Ok(())
    }

    /// Reuse, or primed: waits for the Ready that says the next context is made. A worker
    /// that could not be primed says why (SANDBOX_UNAVAILABLE) instead.
    pub(super) fn await_context(&mut self) -> Result<(), AwaitError> {
        if !self.making_context {
            return Ok(());
        }
        let mut buf = [0u8; 256];
        let got = recv_until(&self.socket, Instant::now() + READY_TIMEOUT, &mut buf);
        self.context_reply(got)
    }

    /// What a worker making its next context said (or that it said nothing in time).
    pub(super) fn context_reply(&mut self, got: Recv) -> Result<(), AwaitError> {
        let err = |s: String| Err(AwaitError::Protocol(s));
        match got {
            Recv::Frame(FromWorker::Ready { .. }) => {
                self.making_context = false;
                Ok(())
            }
            Recv::Frame(FromWorker::Error { code, message, .. }) => match Code::parse(&code) {
                Some(c) if PRE_CONFINEMENT_CODES.contains(&c) => {
                    Err(AwaitError::Refused(CallError::new(c, message)))
                }
                _ => err(format!("expected Ready, got the error code {code}")),
            },
            Recv::Frame(other) => err(format!("expected Ready, got {other:?}")),
            Recv::Eof | Recv::Unread => {
                err("the worker exited while it made its next context".into())
            }
            Recv::Timeout => err("the worker did not make its next context in time".into()),
            Recv::Broken(e) => err(e),
        }
    }

    /// The worker's exit status, once it has exited (it is then reaped).
    pub(super) fn try_exit(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.proc.try_wait()
    }

    /// SIGKILL, without waiting for the process to be gone.
    pub(super) fn kill(&mut self) {
        self.proc.kill();
    }
}

/// Why a worker making its context cannot take the call.
pub(super) enum AwaitError {
    /// It refused before confinement (its priming failed): the call's answer.
    Refused(CallError),
    /// Anything else: a protocol error.
    Protocol(String),
}

impl Drop for ReadyWorker {
    fn drop(&mut self) {
        // An unused worker is killed and reaped: no zombie outlives its handle.
        self.proc.kill_and_reap();
    }
}

/// A receive buffer for worker frames, kept per thread: calls run on a few long-lived
/// threads, and a 128 KiB zeroed allocation per call is pure waste.
struct FrameBuf(Vec<u8>);

thread_local! {
    static FRAME_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

impl FrameBuf {
    fn take() -> FrameBuf {
        let mut b = FRAME_BUF.take();
        b.resize(MAX_FRAME_BYTES + 1, 0);
        FrameBuf(b)
    }

    fn give_back(self) {
        FRAME_BUF.set(self.0);
    }
}

impl std::ops::Deref for FrameBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for FrameBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// Finished (or unwanted) workers are killed and reaped here, off the reply path: a kill is
/// quick, but waiting for the process to be gone means waiting for its teardown.
pub fn reap_later(w: ReadyWorker) {
    use std::sync::mpsc::{channel, Sender};
    use std::sync::{Mutex, OnceLock};
    static REAPER: OnceLock<Mutex<Sender<ReadyWorker>>> = OnceLock::new();
    let tx = REAPER.get_or_init(|| {
        let (tx, rx) = channel::<ReadyWorker>();
        let _ = std::thread::Builder::new()
            .name("stsd-reaper".into())
            .spawn(move || reaper(rx));
        Mutex::new(tx)
    });
    let tx = tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let backlog = REAPER_BACKLOG.fetch_add(1, Ordering::SeqCst) + 1;
    if let Err(back) = tx.send(w) {
        REAPER_BACKLOG.fetch_sub(1, Ordering::SeqCst);
        drop(back.0); // no reaper thread: reap inline
        return;
    }
    // Under sustained load there is no idle time: the reaper must keep up anyway.
    if backlog > MAX_IDLE_BACKLOG && REAPER_IDLE.swap(false, Ordering::SeqCst) {
        stsd_profiles::os::priority::foreground(REAPER_TID.load(Ordering::SeqCst));
    }
}

/// Workers handed to the reaper and not yet reaped.
static REAPER_BACKLOG: AtomicUsize = AtomicUsize::new(0);
/// The reaper's thread id, and whether it runs as background work now.
static REAPER_TID: AtomicU32 = AtomicU32::new(0);
static REAPER_IDLE: AtomicBool = AtomicBool::new(false);
/// Finished workers that may wait for idle time to be killed and torn down; past that the
/// reaper runs at the normal policy until it has caught up.
const MAX_IDLE_BACKLOG: usize = 8;

/// Kills and reaps finished workers as background work (SCHED_IDLE, see `os::priority`):
/// on a small machine a teardown (unmapping all of a process's memory, freeing its seccomp
/// programs) otherwise lands on the CPU where the next call is about to run. A finished
/// worker waits for its kill, idle. When more than [`MAX_IDLE_BACKLOG`] wait, `reap_later`
/// puts this thread back to the normal policy until none does, so load never makes them
/// pile up. Reaping never blocks on one worker.
fn reaper(rx: std::sync::mpsc::Receiver<ReadyWorker>) {
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    use stsd_profiles::os::priority;
    // SAFETY: gettid has no preconditions.
    REAPER_TID.store(unsafe { libc::gettid() } as u32, Ordering::SeqCst);
    let _placed = super::placement::background_thread();
    let mut dying: Vec<ReadyWorker> = Vec::new();
    loop {
        if dying.is_empty() && !REAPER_IDLE.load(Ordering::SeqCst) && priority::can_restore() {
            priority::background(0);
            REAPER_IDLE.store(true, Ordering::SeqCst);
        }
        let next = if dying.is_empty() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            match rx.try_recv() {
                Ok(w) => Ok(w),
                Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => rx.recv_timeout(Duration::from_millis(2)),
            }
        };
        match next {
            Ok(mut w) => {
                // The teardown inherits this thread's standing.
                if REAPER_IDLE.load(Ordering::SeqCst) {
                    priority::background(w.pid());
                }
                let _ = super::placement::with_background(w.pid());
                w.proc.kill();
                dying.push(w);
            }
            Err(RecvTimeoutError::Timeout) => {}
            // The daemon is ending: the rest are killed and reaped as they are dropped.
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let before = dying.len();
        // A reaped worker is dropped (its Drop finds nothing left to kill).
        dying.retain_mut(ReadyWorker::is_alive);
        REAPER_BACKLOG.fetch_sub(before - dying.len(), Ordering::SeqCst);
    }
}

/// Makes a worker and waits for its Ready frame. `urgent`: a call waits for it (else it is
/// for the pool, made as background work: see `os::priority`).
pub fn spawn_ready(opts: &ExecOptions, urgent: bool) -> Result<ReadyWorker, CallError> {
    let t0 = Instant::now();
    let Spawned {
        proc,
        socket,
        maker_cpu_ns,
    } = opts
        .spawner
        .spawn(urgent)
        .map_err(|e| CallError::new(Code::WorkerCrashed, format!("cannot start a worker: {e}")))?;
    // A worker for the pool waits as background work, whatever the zygote's standing was
    // when it forked (a call's urgent fork may have been under way).
    if !urgent {
        stsd_profiles::os::priority::background(proc.id());
    }
    // From here on, dropping `w` kills and reaps the process.
    let mut w = ReadyWorker {
        proc,
        socket,
        spawn_us: 0,
        spawn_cpu_us: maker_cpu_ns / 1000,
        served: 0,
        making_context: false,
        primed: None,
        kept_away: super::placement::keeping_away(),
        at_normal_policy: false,
    };
    let mut buf = [0u8; 256];
    let problem = match recv_until(&w.socket, t0 + READY_TIMEOUT, &mut buf) {
        Recv::Frame(FromWorker::Ready { cpu_us, .. }) => {
            w.spawn_cpu_us += cpu_us;
            None
        }
        Recv::Frame(other) => Some(format!("expected Ready, got {other:?}")),
        Recv::Eof | Recv::Unread => Some("worker exited before it was ready".into()),
        Recv::Timeout => Some("worker did not become ready in time".into()),
        Recv::Broken(e) => Some(e),
    };
    if let Some(p) = problem {
        return Err(CallError::new(
            Code::WorkerCrashed,
            format!("worker protocol error: {p}"),
        ));
    }
    w.spawn_us = t0.elapsed().as_micros() as u64;
    Ok(w)
}

/// The frames that give `job` to a worker: a Go when the worker is primed for the job's
/// template (`primed_for_it`) and the arguments fit one frame; else the whole job. (The pool
/// gives a primed worker only calls of its template, with arguments that fit; a primed worker
/// sent anything but a Go exits, and the call fails as WORKER_CRASHED.)
pub(super) fn encode_for(
    primed_for_it: bool,
    job: &Job,
) -> Result<Vec<Vec<u8>>, frames::FrameError> {
    if primed_for_it {
        let go = ToWorker::Go {
            call_id: job.call_id,
            args_json: job.args_json.clone(),
            keep_alive: job.keep_alive,
        };
        if let Ok(b) = frames::encode(&go) {
            return Ok(vec![b]);
        }
    }
    frames::encode_job(job)
}

/// Runs one job in a fresh worker. Never panics on anything the worker does.
pub fn run_job(job: &Job, opts: &ExecOptions, on_event: &mut dyn FnMut(Event<'_>)) -> CallOutcome {
    let t0 = Instant::now();
    match spawn_ready(opts, true) {
        Ok(w) => {
            let mut out = run_on(w, job, opts, None, on_event);
            out.timings.total_us = t0.elapsed().as_micros() as u64;
            out
        }
        Err(e) => CallOutcome {
            result: Err(e),
            worker_pid: 0,
            console_truncated: false,
            timings: CallTimings::default(),
            probe: None,
            egress: Vec::new(),
            peak_rss_kib: None,
            console_lines: 0,
            undelivered: false,
        },
    }
}

/// Runs one job on a ready worker, which is used up by it. `cancel`, when set by another
/// thread, kills the worker and ends the call (the caller went away).
pub fn run_on(
    w: ReadyWorker,
    job: &Job,
    opts: &ExecOptions,
    cancel: Option<&std::sync::atomic::AtomicBool>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> CallOutcome {
    let (out, kept) = run_keeping(w, job, opts, cancel, on_event);
    if let Some(w) = kept {
        reap_later(w);
    }
    out
}

/// Like [`run_on`], but when the job asked for `keep_alive` and ended cleanly (a result, or a
/// JS error), the worker comes back for another call of the same posture. Blocks this thread
/// for the whole call ([`super::inline`] is the async driver of the same exchange).
pub fn run_keeping(
    mut w: ReadyWorker,
    job: &Job,
    opts: &ExecOptions,
    cancel: Option<&std::sync::atomic::AtomicBool>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> (CallOutcome, Option<ReadyWorker>) {
    let mut ex = Exchange::begin(&mut w, job);
    on_event(Event::Started(w.pid()));
    let mut frames_in = FrameReader::new();
    let awaited = w.await_context();
    for b in ex.frames_to_send(awaited) {
        if let Err(e) = send(w.socket.as_raw_fd(), &b, MsgFlags::MSG_NOSIGNAL) {
            ex.send_failed(e);
            break;
        }
    }
    let deadline = ex.deadline(opts.kill_grace);
    let mut fetch = FetchState::default();
    let is_cancelled = || cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed));

    // Frames until the outcome, EOF, or the deadline.
    while ex.open() {
        // Checked before every frame too: a chatty worker never lets the receive time out.
        if is_cancelled() {
            ex.cancelled = true;
            break;
        }
        // Wait in slices so a cancellation is noticed within 50 ms.
        let slice = ex.slice_until(deadline);
        let frame = match frames_in.next(&w.socket, slice) {
            Recv::Frame(f) => f,
            Recv::Eof => break,
            Recv::Unread => {
                ex.closed_unread(frames_in.records);
                break;
            }
            Recv::Timeout if Instant::now() >= deadline => {
                ex.killed_at_deadline = true;
                break;
            }
            Recv::Timeout => {
                ex.slice_passed();
                continue;
            }
            Recv::Broken(e) => {
                ex.protocol_error = Some(e);
                break;
            }
        };
        match ex.on_frame(frame, on_event) {
            None => {}
            Some(FetchStep::Body(data)) => fetch.add_body(&data, &opts.broker),
            Some(FetchStep::Request(req)) => {
                let call_deadline = deadline.checked_sub(opts.kill_grace).unwrap_or(deadline);
                let reply = fetch.run(
                    *req,
                    job,
                    &opts.broker,
                    call_deadline,
                    cancel,
                    &mut ex.out.egress,
                );
                match reply {
                    None => {
                        ex.cancelled = true;
                        break;
                    }
                    Some(reply) => {
                        if let Err(e) = send_fetch_reply(&w.socket, reply, deadline) {
                            ex.protocol_error = Some(e);
                        }
                    }
                }
            }
        }
    }
    // Make sure the worker is gone, or keep it. (Its timings came ahead of the result, in the
    // same record.)
    let (kept, status) = match ex.end(w, frames_in.has_rest()) {
        Ending::Kept(w) => (Some(w), None),
        Ending::Released => (None, None),
        Ending::NeedsStatus(mut w) => (None, w.exit_status_now()),
    };
    let out = ex.finish(status, frames_in.records);
    frames_in.give_back();
    (out, kept)
}

/// Fetch bookkeeping for one call: the pending request body and the tool's policy. (The
/// broker counts requests, from the call's hop records.)
#[derive(Default)]
struct FetchState {
    body: Vec<u8>,
    body_over: bool,
    policy: Option<egress::Policy>,
}

impl FetchState {
    fn add_body(&mut self, data: &[u8], broker: &Broker) {
        if self.body.len() + data.len() > broker.config().max_request_body_bytes as usize {
            // Keep memory bounded; the request is refused when it arrives.
            self.body_over = true;
            self.body = Vec::new();
        } else if !self.body_over {
            self.body.extend_from_slice(data);
        }
    }

    /// Runs one fetch on its own thread while this one watches for the caller going away;
    /// None when it did. The fetch is then aborted: its connection is shut down, so the
    /// thread ends within milliseconds rather than at the request timeout.
    fn run(
        &mut self,
        req: FetchRequest,
        job: &Job,
        broker: &Arc<Broker>,
        deadline: Instant,
        cancel: Option<&std::sync::atomic::AtomicBool>,
        records: &mut Vec<HopRecord>,
    ) -> Option<Result<egress::Response, egress::Failure>> {
        let body = std::mem::take(&mut self.body);
        let over = std::mem::replace(&mut self.body_over, false);
        let policy = self
            .policy
            .get_or_insert_with(|| egress::Policy::from_tool_safety_json(&job.tool_safety_json));
        if over || body.len() as u64 != req.body_len {
            let limit = broker.config().max_request_body_bytes;
            return Some(Err(broker.refuse(
                policy,
                (&req.method, &req.url),
                "request-body-too-large",
                format!(
                    "the request body is over the {limit} byte limit, or not what was announced"
                ),
                records,
            )));
        }
        let request = egress::Request {
            method: req.method,
            url: req.url,
            headers: req.headers,
            body,
            start_index: req.start_index,
            max_length: req.max_length,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (b, p, mut recs) = (broker.clone(), policy.clone(), records.clone());
        let abort = egress::Abort::new();
        let a = abort.clone();
        let spawned = std::thread::Builder::new()
            .name("stsd-fetch".into())
            .spawn(move || {
                let r = b.fetch_abortable(&p, request, deadline, &a, &mut recs);
                let _ = tx.send((r, recs));
            });
        if let Err(e) = spawned {
            return Some(Err(egress::Failure {
                code: Code::HelperRuntime,
                rule: "broker-busy",
                message: format!("[fetch] io: broker-busy: {e}"),
            }));
        }
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok((r, recs)) => {
                    *records = recs;
                    return Some(r);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
                        abort.abort();
                        return None;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Some(Err(egress::Failure {
                        code: Code::HelperRuntime,
                        rule: "broker-failed",
                        message:
                            "[fetch] io: broker-failed: the request thread ended without an answer"
                                .into(),
                    }));
                }
            }
        }
    }
}

/// Sends one frame without blocking past `until` (a worker that stops reading cannot hold
/// the supervisor).
fn send_until(sock: &impl AsFd, frame: &ToWorker, until: Instant) -> Result<(), String> {
    let bytes = frames::encode(frame).map_err(|e| e.to_string())?;
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(format!("a {} byte frame to the worker", bytes.len()));
    }
    loop {
        match send(
            sock.as_fd().as_raw_fd(),
            &bytes,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {
                let now = Instant::now();
                if now >= until {
                    return Err("the worker stopped reading its fetch answer".into());
                }
                let ms = (until - now).as_millis().min(1000) as i32;
                let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLOUT)];
                let _ = poll(
                    &mut fds,
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
                );
            }
            Err(e) => return Err(format!("send: {e}")),
        }
    }
}

/// The broker's answer as frames: head and body chunks, or the failure.
fn send_fetch_reply(
    sock: &impl AsFd,
    reply: Result<egress::Response, egress::Failure>,
    until: Instant,
) -> Result<(), String> {
    let resp = match reply {
        Ok(r) => r,
        Err(f) => {
            let frame = ToWorker::FetchFailed {
                code: f.code.as_str().into(),
                message: f.message,
            };
            return send_until(sock, &frame, until);
        }
    };
    let head = ToWorker::FetchHead(Box::new(resp.head));
    if frames::encode(&head).map_or(true, |b| b.len() > MAX_FRAME_BYTES) {
        let frame = ToWorker::FetchFailed {
            code: Code::HelperRuntime.as_str().into(),
            message:
                "[fetch] io: response-head-too-large: the response's URL and headers do not fit"
                    .into(),
        };
        return send_until(sock, &frame, until);
    }
    send_until(sock, &head, until)?;
    let mut chunks = resp.body.chunks(CHUNK_BYTES).peekable();
    if chunks.peek().is_none() {
        return send_until(
            sock,
            &ToWorker::FetchBody {
                data: Vec::new(),
                last: true,
            },
            until,
        );
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        send_until(
            sock,
            &ToWorker::FetchBody {
                data: c.to_vec(),
                last,
            },
            until,
        )?;
    }
    Ok(())
}

pub(super) fn death_cause(status: Option<std::process::ExitStatus>) -> CallError {
    match status {
        Some(s) if s.signal() == Some(libc::SIGSYS) => CallError::new(
            Code::SandboxViolation,
            "the worker made a system call its sandbox forbids and was killed (SIGSYS)",
        ),
        Some(s) if s.signal() == Some(libc::SIGXCPU) => CallError::new(
            Code::Timeout,
            "the worker used up its CPU-time limit (SIGXCPU)",
        ),
        Some(s) => CallError::new(
            Code::WorkerCrashed,
            format!("the worker died mid-call ({s})"),
        ),
        None => CallError::new(Code::WorkerCrashed, "the worker died mid-call"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(frames: &[FromWorker]) -> Vec<u8> {
        frames
            .iter()
            .flat_map(|f| frames::encode(f).unwrap_or_default())
            .collect()
    }

    /// A record's frames come out in order, whole; a record of more frames than a worker
    /// ever packs is refused after the allowed ones, and nothing is left to read after it.
    #[test]
    fn a_record_yields_its_frames_in_order_up_to_the_bound() {
        let Ok((ours, theirs)) = super::super::spawn::seqpacket_pair() else {
            panic!("socketpair");
        };
        let until = || Instant::now() + Duration::from_secs(5);
        let three = record(&[
            FromWorker::Confined,
            FromWorker::ConsoleTruncated,
            FromWorker::ResultUndefined,
        ]);
        let four = record(&std::array::from_fn::<_, 4, _>(|_| FromWorker::Confined));
        for r in [&three, &four] {
            let sent = send(theirs.as_raw_fd(), r, MsgFlags::MSG_NOSIGNAL);
            assert!(sent.is_ok(), "{sent:?}");
        }
        let mut reader = FrameReader::new();
        for want in [
            FromWorker::Confined,
            FromWorker::ConsoleTruncated,
            FromWorker::ResultUndefined,
        ] {
            match reader.next(&ours, until()) {
                Recv::Frame(f) => assert_eq!(f, want),
                _ => panic!("expected {want:?}"),
            }
        }
        assert!(!reader.has_rest());
        for _ in 0..3 {
            assert!(matches!(
                reader.next(&ours, until()),
                Recv::Frame(FromWorker::Confined)
            ));
        }
        match reader.next(&ours, until()) {
            Recv::Broken(e) => assert!(e.contains("more than 3 frames"), "{e}"),
            _ => panic!("a fourth frame in one record was read"),
        }
        assert!(!reader.has_rest());
        assert_eq!(reader.records, 2);
        drop(theirs);
        assert!(matches!(reader.next(&ours, until()), Recv::Eof));
        reader.give_back();
    }
}

#[cfg(test)]
mod unread_tests {
    use super::*;

    /// What tells the supervisor that a worker died before it read its job: the kernel
    /// reports a SEQPACKET end closed with our records unread as ECONNRESET, and one closed
    /// after reading them as EOF. (A call retried on the first would run twice on the second.)
    #[test]
    fn a_peer_that_closes_with_our_record_unread_is_told_from_one_that_read_it() {
        let until = || Instant::now() + Duration::from_secs(5);
        for read_first in [false, true] {
            let Ok((ours, theirs)) = super::super::spawn::seqpacket_pair() else {
                panic!("socketpair");
            };
            send(ours.as_raw_fd(), b"the job", MsgFlags::MSG_NOSIGNAL)
                .unwrap_or_else(|e| panic!("send: {e}"));
            if read_first {
                let mut b = [0u8; 16];
                let n = recv(theirs.as_raw_fd(), &mut b, MsgFlags::empty())
                    .unwrap_or_else(|e| panic!("recv: {e}"));
                assert_eq!(&b[..n], b"the job");
            }
            drop(theirs);
            let mut reader = FrameReader::new();
            let got = reader.next(&ours, until());
            match (read_first, got) {
                (false, Recv::Unread) | (true, Recv::Eof) => {}
                (_, other) => panic!(
                    "read first: {read_first}: got {}",
                    match other {
                        Recv::Eof => "EOF",
                        Recv::Unread => "unread",
                        Recv::Frame(_) => "a frame",
                        Recv::Timeout => "a timeout",
                        Recv::Broken(_) => "broken",
                    }
                ),
            }
            reader.give_back();
        }
    }
}
