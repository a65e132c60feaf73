//! A worker from the supervisor's side: made and waited for until Ready ([`spawn_ready`]),
//! its frames read ([`FrameReader`]), its job encoded ([`encode_for`]), its end reaped off
//! the call path ([`reap_later`]).

use super::options::ExecOptions;
use super::outcome::{CallError, PRE_CONFINEMENT_CODES};

use super::spawn::{ChildProc, Spawned};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, send, MsgFlags};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_protocol::frames::{self, FromWorker, Job, Prime, ToWorker, MAX_FRAME_BYTES};
use stsd_protocol::Code;

/// How long a freshly exec'd worker may take to report Ready.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(10);

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
    pub(super) fn next(&mut self, sock: &impl AsFd, until: Instant) -> Recv {
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

/// A worker that has been made and reported Ready: waiting for its one job.
pub struct ReadyWorker {
    proc: ChildProc,
    pub(super) socket: std::os::fd::OwnedFd,
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
    /// It gave its own outcome (a result or a JS error) and nothing after it: it waits for
    /// its kill, and the reaper may hold that kill (see [`reaper`]). A worker the supervisor
    /// stopped (a deadline, a cap it broke, a protocol error) is killed at once.
    pub(super) ended_on_its_own: bool,
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

    /// Makes a fresh worker the template of `prime`'s posture (`exec::template`): it applies
    /// the posture's rlimits and Landlock and says Ready again (within [`READY_TIMEOUT`]).
    /// From then on it only forks; it is never given a call.
    pub(super) fn make_template(&mut self, prime: &Prime) -> Result<(), String> {
        if self.served > 0 || self.making_context || self.primed.is_some() {
            return Err("only a fresh worker becomes a template".into());
        }
        let frame = frames::encode(&ToWorker::Template(Box::new(prime.clone())))
            .map_err(|e| format!("the template's prime does not fit one frame: {e}"))?;
        send(self.socket.as_raw_fd(), &frame, MsgFlags::MSG_NOSIGNAL)
            .map_err(|e| format!("cannot send the template's prime: {e}"))?;
        self.making_context = true;
        self.await_context().map_err(|e| match e {
            AwaitError::Refused(e) => e.message,
            AwaitError::Protocol(e) => e,
        })
    }

    /// A child just forked by a template of `prime` (`exec::template`): it confines and
    /// primes itself and says Ready when it has, as a fresh worker sent `prime` does. It runs
    /// at the normal policy (priming does, see [`ReadyWorker::prime`]).
    pub(super) fn template_child(s: Spawned, prime: Arc<Prime>, kept_away: bool) -> ReadyWorker {
        stsd_profiles::os::priority::foreground(s.proc.id());
        ReadyWorker {
            proc: s.proc,
            socket: s.socket,
            spawn_us: 0,
            spawn_cpu_us: s.maker_cpu_ns / 1000,
            served: 0,
            making_context: true,
            primed: Some(prime),
            kept_away,
            at_normal_policy: true,
            ended_on_its_own: false,
        }
    }

    /// A fresh worker primed with `want_bytecode`: waits (up to `wait`) for its Ready, and
    /// takes the bytecode it may send ahead of it (a body that did not compile, or too large,
    /// sends none). Only here is a worker's bytecode accepted: from a prime that asked, before
    /// any call has reached the worker (`exec::bodies`); anywhere else it is a protocol error.
    pub fn await_primed(&mut self, wait: Duration) -> Result<Option<frames::Bytecode>, String> {
        let asked = self.primed.as_ref().is_some_and(|p| p.want_bytecode);
        if self.served > 0 || !asked || !self.making_context {
            return Err("only a fresh worker primed for its bytecode hands it on".into());
        }
        let mut buf = vec![0u8; frames::MAX_FRAME_BYTES];
        let until = Instant::now() + wait;
        let (got, made) = match recv_until(&self.socket, until, &mut buf) {
            Recv::Frame(FromWorker::Bytecode(b)) => {
                (recv_until(&self.socket, until, &mut buf), Some(*b))
            }
            other => (other, None),
        };
        match self.context_reply(got) {
            Ok(()) => Ok(made),
            Err(AwaitError::Refused(e)) => Err(e.message),
            Err(AwaitError::Protocol(e)) => Err(e),
        }
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

#[cfg(test)]
impl ReadyWorker {
    /// A stand-in around any child process of this one, for tests of the pool's bookkeeping:
    /// it has a socket nobody answers on, and is killed and reaped when dropped, as a worker is.
    pub(crate) fn of_child(pid: u32) -> std::io::Result<ReadyWorker> {
        let (socket, _theirs) = super::spawn::seqpacket_pair()?;
        Ok(ReadyWorker {
            proc: ChildProc::from_pid(pid),
            socket,
            spawn_us: 0,
            spawn_cpu_us: 0,
            served: 0,
            making_context: false,
            primed: None,
            kept_away: false,
            at_normal_policy: false,
            ended_on_its_own: false,
        })
    }
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

/// Whether the pool's refill thread has work now (a worker to make or to prime): set by
/// `Pool::refill_loop`, read by the reaper.
static POOL_REFILLING: AtomicBool = AtomicBool::new(false);

/// The pool's refill thread says whether it has work (see [`reaper`]).
pub fn refill_busy(busy: bool) {
    POOL_REFILLING.store(busy, Ordering::Relaxed);
}

/// The reaper kills the finished workers it holds once this many are waiting, or once the
/// first has waited this long.
const HOLD_AT_MOST: usize = 4;
const HOLD_FOR: Duration = Duration::from_millis(20);

/// Whether the reaper goes on holding the kills of `held` finished workers, the oldest
/// held for `oldest`.
fn holds(refilling: bool, held: usize, oldest: Option<Duration>) -> bool {
    refilling && held < HOLD_AT_MOST && oldest.is_none_or(|d| d < HOLD_FOR)
}

/// Kills and reaps finished workers as background work (SCHED_IDLE, see `os::priority`):
/// on a small machine a teardown (unmapping all of a process's memory, freeing its seccomp
/// programs) otherwise lands on the CPU where the next call is about to run. A finished
/// worker waits for its kill, idle. When more than [`MAX_IDLE_BACKLOG`] wait, `reap_later`
/// puts this thread back to the normal policy until none does, so load never makes them
/// pile up. Reaping never blocks on one worker.
///
/// While the pool's refill thread has work, a finished worker's kill is held until
/// [`HOLD_AT_MOST`] are waiting or the first has waited [`HOLD_FOR`] (give or take this
/// loop's 2 ms poll): the refill's fork and priming, which the next call waits for, go before
/// the teardowns, and the teardowns come together rather than beside each fork
/// (docs/src/performance.md, "Kills held while the pool refills"). Only a worker that ended
/// on its own outcome (`ended_on_its_own`) is held, and only while this thread is background
/// work, so that the worker is too; any other is killed as it arrives.
fn reaper(rx: std::sync::mpsc::Receiver<ReadyWorker>) {
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    use stsd_profiles::os::priority;
    REAPER_TID.store(nix::unistd::gettid().as_raw() as u32, Ordering::SeqCst);
    let _placed = super::placement::background_thread();
    let mut dying: Vec<ReadyWorker> = Vec::new();
    // Finished workers whose kill is held, and since when.
    let mut held: Vec<(ReadyWorker, Instant)> = Vec::new();
    loop {
        if dying.is_empty()
            && held.is_empty()
            && !REAPER_IDLE.load(Ordering::SeqCst)
            && priority::can_restore()
        {
            priority::background(0);
            REAPER_IDLE.store(true, Ordering::SeqCst);
        }
        let next = if dying.is_empty() && held.is_empty() {
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
                let idle = REAPER_IDLE.load(Ordering::SeqCst);
                if idle {
                    priority::background(w.pid());
                }
                let _ = super::placement::with_background(w.pid());
                // Held only when it waits for its kill as background work.
                if idle && w.ended_on_its_own {
                    held.push((w, Instant::now()));
                } else {
                    w.proc.kill();
                    dying.push(w);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            // The daemon is ending: the rest are killed and reaped as they are dropped.
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let oldest = held.first().map(|(_, since)| since.elapsed());
        if !holds(POOL_REFILLING.load(Ordering::Relaxed), held.len(), oldest) {
            for (mut w, _) in held.drain(..) {
                w.proc.kill();
                dying.push(w);
            }
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
    // Whether the zygote (whose CPUs a forked worker inherits) was kept off a lone call's CPU,
    // asked before the fork and after it: calls that begin to overlap in between let the
    // zygote go, but not the worker it had just forked.
    let away_before = super::placement::keeping_away();
    let Spawned {
        proc,
        socket,
        maker_cpu_ns,
    } = opts.spawner.spawn(urgent).map_err(|e| {
        // The tool never ran: not a crash of it.
        CallError::new(
            Code::SandboxUnavailable,
            format!("cannot start a worker (the tool did not run): {e}"),
        )
    })?;
    let forked_us = t0.elapsed().as_micros() as u64;
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
        kept_away: away_before || super::placement::keeping_away(),
        at_normal_policy: false,
        ended_on_its_own: false,
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
            Code::SandboxUnavailable,
            format!("a worker did not start (the tool did not run): {p}"),
        ));
    }
    w.spawn_us = t0.elapsed().as_micros() as u64;
    // How long the fork took and the worker to say Ready (STSD_LOG=stsd::exec=trace).
    tracing::trace!(urgent, forked_us, spawn_us = w.spawn_us, "worker made");
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Kills are held only while the refill works, and never past either bound: a busy
    /// refill that never stops still lets every worker go within [`HOLD_FOR`] and never
    /// keeps more than [`HOLD_AT_MOST`] waiting.
    #[test]
    fn a_kill_is_held_only_while_the_pool_refills_and_within_its_bounds() {
        let short = Some(Duration::from_millis(1));
        assert!(holds(true, 0, None));
        assert!(holds(true, HOLD_AT_MOST - 1, short));
        assert!(!holds(false, 1, short), "an idle refill: killed at once");
        assert!(!holds(true, HOLD_AT_MOST, short), "as many as it may hold");
        assert!(!holds(true, 1, Some(HOLD_FOR)), "held long enough");
    }

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
