//! The supervisor's side of the zygote (see `stsd_worker::run_zygote` for the other side).
//!
//! One thread owns the zygote's life: it execs it, notices when it died (within a second
//! while idle, at once when asked for a worker) and replaces it, and replaces it with a
//! freshly exec'd one every `zygote_max_forks` forks so that workers do not share one
//! address-space layout forever. That successor is exec'd ahead, when a fifth of the live
//! zygote's budget is left, by the manager thread without its lock, and takes over at the
//! budget's last fork once it has said it is ready ([`ZYGOTE_READY`]): a zygote's start (some
//! 20 ms) used to be waited for by the forks, and so the calls, that came at the handover. A
//! live zygote is asked for a worker by the thread that wants one (the pool's refill thread,
//! or a call's), under the same lock: a hand-off to the manager thread and back cost two
//! wake-ups on another CPU per worker (one-shot p50 0.427 ->
//! 0.382 ms and 0.396 -> 0.360, `N=800 scripts/ab 6 1 stats-summary`, CPU per call the same).
//! The thread lives as long as the daemon: the
//! zygote's parent-death signal, and through `CLONE_PARENT` every forked worker's, fire when
//! the thread that started the zygote exits, so it must never be a short-lived one.
//!
//! Workers are the supervisor's children (not the zygote's), so a zygote that dies or is
//! replaced takes no worker, and no call in flight, with it.

use super::spawn::{seqpacket_pair, ChildProc, ExeFile, Spawned};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, send, ControlMessageOwned, MsgFlags};
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stsd_protocol::frames::{ForkReply, ZYGOTE_CODE_FD, ZYGOTE_CODE_OFFER, ZYGOTE_READY};

/// How long a new zygote may take to answer its first fork request (it includes its own
/// start). Later requests get `[worker] fork_timeout_ms`.
const FIRST_FORK_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle manager checks that its zygote is still alive.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

/// What the manager thread is asked for.
enum Request {
    /// A worker the caller could not get from the live zygote itself: where to send it, and
    /// whether a call is waiting for it (else it is for the pool, and the zygote forks as
    /// background work: see `os::priority`).
    Fork(mpsc::SyncSender<std::io::Result<Spawned>>, bool),
    /// Start the live zygote's successor, and reap the zygotes a handover retired.
    Tend,
}

/// How many forks before the live zygote's budget is spent its successor is started: a fifth
/// of the budget, at least one.
fn ahead(max_forks: u32) -> u32 {
    (max_forks / 5).max(1)
}

/// Zygotes that took over from a spent or dead one: a successor started ahead (`ahead`), or
/// one exec'd when it was needed (`cold`: the forks that came then waited for its start).
#[derive(Debug, Default, Clone, Copy)]
pub struct Handovers {
    pub ahead: u64,
    pub cold: u64,
}

/// What `stsd status` reads of the manager without its lock (held through a fork, and
/// through a zygote's whole start when a fork waits for one).
#[derive(Debug, Default)]
struct Shown {
    /// The ready successor's pid, 0 when there is none.
    next: AtomicU32,
    ahead: AtomicU64,
    cold: AtomicU64,
}

/// The zygote's scheduling policy (see `os::priority`): background while it forks for the
/// pool and at rest, normal while a call waits for a worker. One lock orders the changes and
/// names the zygote they apply to: a call's promotion never interleaves with a demotion it
/// would undo, and no change reaches a zygote that has been replaced (or its reused pid).
#[derive(Debug, Default)]
struct Policy(Mutex<PolicyState>);

#[derive(Debug, Default)]
struct PolicyState {
    /// The live zygote.
    zygote: Option<u32>,
    /// Calls waiting for a worker from the zygote right now.
    urgent_waiting: usize,
    /// The zygote runs under SCHED_IDLE now.
    background: bool,
    /// A background thread (the pool's refill thread) asking for a fork now, and whether a
    /// waiting call has put it at the normal policy.
    asker: Option<u32>,
    asker_promoted: bool,
}

impl Policy {
    fn lock(&self) -> std::sync::MutexGuard<'_, PolicyState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call waits for a fork: the zygote runs at the normal policy until none does, and so
    /// does a background thread asking for a fork now. That thread holds the manager's lock
    /// until the zygote's answer reaches it, and as background work it waited for a CPU with
    /// the answer in hand while the call waited for the lock (urgent forks waited 0.3 ms for
    /// it at the 90th percentile at one call after another, up to 2.4 ms).
    fn begin_urgent(&self) {
        let mut s = self.lock();
        s.urgent_waiting += 1;
        if let (true, Some(pid)) = (s.background, s.zygote) {
            stsd_profiles::os::priority::foreground(pid);
            s.background = false;
        }
        Self::promote_asker(&mut s);
    }

    fn promote_asker(s: &mut PolicyState) {
        if let (Some(tid), false) = (s.asker, s.asker_promoted) {
            stsd_profiles::os::priority::foreground(tid);
            s.asker_promoted = true;
        }
    }

    /// A background thread begins to ask for a fork: true if it is now the one a waiting
    /// call promotes. Not a call's thread (one at the normal policy is left as it is), nor a
    /// second background thread while one is recorded (there is one, the refill thread).
    fn begin_background_ask(&self) -> bool {
        if !stsd_profiles::os::priority::is_background() {
            return false;
        }
        let mut s = self.lock();
        if s.asker.is_some() {
            return false;
        }
        s.asker = Some(nix::unistd::gettid().as_raw() as u32);
        s.asker_promoted = false;
        if s.urgent_waiting > 0 {
            Self::promote_asker(&mut s);
        }
        true
    }

    /// The recorded background thread has its answer: background work again if a call
    /// promoted it.
    fn end_background_ask(&self) {
        let mut s = self.lock();
        s.asker = None;
        if std::mem::take(&mut s.asker_promoted) {
            stsd_profiles::os::priority::background(0);
        }
    }

    /// The call has its worker; the last one waiting puts the zygote back in the background.
    fn end_urgent(&self) {
        let mut s = self.lock();
        s.urgent_waiting = s.urgent_waiting.saturating_sub(1);
        Self::settle(&mut s);
    }

    /// Before a fork for the pool: background, unless a call waits.
    fn background(&self) {
        Self::settle(&mut self.lock());
    }

    fn settle(s: &mut PolicyState) {
        if let (0, false, Some(pid)) = (s.urgent_waiting, s.background, s.zygote) {
            stsd_profiles::os::priority::background(pid);
            s.background = true;
        }
    }

    /// A new zygote, which starts at the normal policy (a call may be waiting for it).
    fn new_zygote(&self, pid: u32) {
        let mut s = self.lock();
        s.zygote = Some(pid);
        s.background = false;
    }

    /// The zygote is being retired: nothing is applied to its pid any more.
    fn zygote_gone(&self) {
        self.lock().zygote = None;
    }
}

/// A fork being asked for, urgent or not: its [`Policy`] bookkeeping, undone when dropped (a
/// panic included, so that no tid stays recorded for a thread that is gone).
struct Asking<'p> {
    policy: &'p Policy,
    urgent: bool,
    recorded: bool,
}

impl<'p> Asking<'p> {
    fn begin(policy: &'p Policy, urgent: bool) -> Asking<'p> {
        let recorded = if urgent {
            policy.begin_urgent();
            true
        } else {
            policy.begin_background_ask()
        };
        Asking {
            policy,
            urgent,
            recorded,
        }
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        match (self.urgent, self.recorded) {
            (true, _) => self.policy.end_urgent(),
            (false, true) => self.policy.end_background_ask(),
            (false, false) => {}
        }
    }
}

#[derive(Debug)]
pub struct Zygote {
    requests: Mutex<Option<mpsc::Sender<Request>>>,
    /// Set as the daemon stops: a successor still starting is not waited for.
    stopping: Arc<AtomicBool>,
    shown: Arc<Shown>,
    /// The live zygote and what makes the next one, shared with the manager thread: a caller
    /// asks a live zygote for a worker itself, and only a zygote to be (re)started goes
    /// through the thread.
    manager: Arc<Mutex<Manager>>,
    pid: Arc<Mutex<Option<u32>>>,
    policy: Arc<Policy>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Execs the binary the manager holds (its descriptor lives as long as the manager).
    exe_path: String,
}

impl Zygote {
    /// Starts the manager thread, which execs the first zygote at once.
    pub fn start(exe: ExeFile, cfg: &stsd_profiles::baseline::WorkerConfig) -> Zygote {
        let (tx, rx) = mpsc::channel::<Request>();
        let pid = Arc::new(Mutex::new(None));
        let policy = Arc::new(Policy::default());
        let stopping = Arc::new(AtomicBool::new(false));
        let shown = Arc::new(Shown::default());
        let exe_path = exe.exec_path();
        let m = Manager {
            exe,
            uid: cfg.uid,
            gid: cfg.gid,
            max_forks: cfg.zygote_max_forks.max(1),
            fork_timeout: Duration::from_millis(cfg.fork_timeout_ms.max(1)),
            huge_code: cfg.huge_code,
            live: None,
            pid: pid.clone(),
            policy: policy.clone(),
            code: None,
            next: None,
            tending: false,
            retired: Vec::new(),
            had_one: false,
            shown: shown.clone(),
        };
        let manager = Arc::new(Mutex::new(m));
        let shared = manager.clone();
        let stop = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("stsd-zygote".into())
            .spawn(move || Manager::run(&shared, rx, &stop));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the zygote thread");
                None
            }
        };
        Zygote {
            requests: Mutex::new(Some(tx)),
            stopping,
            shown,
            manager,
            pid,
            policy,
            thread: Mutex::new(thread),
            exe_path,
        }
    }

    pub fn exe_path(&self) -> String {
        self.exe_path.clone()
    }

    pub fn pid(&self) -> Option<u32> {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn manager(&self) -> std::sync::MutexGuard<'_, Manager> {
        self.manager.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live zygote's successor, when one has been started and said it is ready.
    pub fn successor_pid(&self) -> Option<u32> {
        Some(self.shown.next.load(Ordering::SeqCst)).filter(|&p| p != 0)
    }

    /// The handovers so far (see [`Handovers`]).
    pub fn handovers(&self) -> Handovers {
        Handovers {
            ahead: self.shown.ahead.load(Ordering::SeqCst),
            cold: self.shown.cold.load(Ordering::SeqCst),
        }
    }

    /// A new worker, forked by the zygote (replaced first if it has died). `urgent`: a call
    /// waits for it.
    pub fn fork(&self, urgent: bool) -> std::io::Result<Spawned> {
        // At once, if urgent: the zygote may be busy with a background fork this call must
        // not wait behind at background priority. Ended as the guard drops, even on unwind.
        let _asking = Asking::begin(&self.policy, urgent);
        self.ask(urgent)
    }

    fn ask(&self, urgent: bool) -> std::io::Result<Spawned> {
        // A live zygote within its fork budget is asked on this thread: two thread hand-offs
        // fewer per worker (the request to the manager thread and its answer back, each a
        // wake-up on another CPU). Anything else (no zygote yet, a dead one, a budget spent,
        // a failed exchange) goes to the manager thread, which alone execs zygotes: a
        // zygote's parent-death signal, and through CLONE_PARENT its workers', fire when the
        // thread that started it exits.
        let direct = {
            let mut m = self.manager();
            let direct = m.fork_direct(urgent);
            // Sent under the lock: a fork that finds the budget spent later, on another
            // thread, must queue behind it (the manager thread would otherwise take that
            // fork first, with no successor started yet).
            if m.take_tending() {
                self.request(Request::Tend);
            }
            direct
        };
        if let Some(r) = direct {
            return r;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.request(Request::Fork(tx, urgent)) {
            return Err(std::io::Error::other("the zygote thread is not running"));
        }
        rx.recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the zygote thread went away")))
    }

    /// Sends `r` to the manager thread; false when it is not running.
    fn request(&self, r: Request) -> bool {
        let sent = self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|q| q.send(r));
        matches!(sent, Some(Ok(())))
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Closing the request channel ends the thread, which kills and reaps the zygote (and
        // its successor, which it does not wait for any more).
        self.stopping.store(true, Ordering::SeqCst);
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

struct Live {
    proc: ChildProc,
    ctrl: OwnedFd,
    forks: u32,
    /// It said [`ZYGOTE_READY`]: its start is over.
    ready: bool,
}

struct Manager {
    exe: ExeFile,
    uid: u32,
    gid: u32,
    max_forks: u32,
    /// `[worker] fork_timeout_ms`: a running zygote that takes longer is hung (replaced).
    fork_timeout: Duration,
    /// `[worker] huge_code`: the zygote is asked for it (`--huge-code`).
    huge_code: bool,
    live: Option<Live>,
    pid: Arc<Mutex<Option<u32>>>,
    policy: Arc<Policy>,
    /// The code memfd a zygote offered (`ZYGOTE_CODE_OFFER`): stsd's code in huge pages, which
    /// each later zygote maps instead of making its own (held above fd 16, close-on-exec).
    code: Option<OwnedFd>,
    /// The live zygote's successor, exec'd ahead and ready (it said [`ZYGOTE_READY`]).
    next: Option<Live>,
    /// The manager thread has been asked to tend (start a successor, reap retired zygotes)
    /// and has not finished: no second request is sent meanwhile.
    tending: bool,
    /// Zygotes a handover retired on a caller's thread: their sockets are closed (they exit),
    /// and the manager thread reaps them.
    retired: Vec<ChildProc>,
    /// A zygote has been live before (the first start is no handover).
    had_one: bool,
    shown: Arc<Shown>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("zygote", &self.live.as_ref().map(|l| l.proc.id()))
            .field("forks", &self.live.as_ref().map(|l| l.forks))
            .finish_non_exhaustive()
    }
}

impl Manager {
    fn run(this: &Mutex<Manager>, rx: mpsc::Receiver<Request>, stopping: &AtomicBool) {
        let lock = || this.lock().unwrap_or_else(|e| e.into_inner());
        let _placed = super::placement::background_thread();
        lock().replace();
        loop {
            match rx.recv_timeout(LIVENESS_CHECK) {
                Ok(Request::Fork(reply, urgent)) => {
                    let r = lock().fork(urgent);
                    let _ = reply.send(r);
                }
                Ok(Request::Tend) => {}
                Err(RecvTimeoutError::Timeout) => {
                    let mut m = lock();
                    let dead = m.live.as_mut().is_none_or(|l| !l.proc.is_alive());
                    if dead {
                        tracing::warn!("the zygote died; starting a new one");
                        m.replace();
                    }
                    if let Some(mut n) = m.next.take_if(|n| !n.proc.is_alive()) {
                        tracing::warn!("the zygote's successor died before it took over");
                        m.shown.next.store(0, Ordering::SeqCst);
                        n.proc.kill_and_reap();
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // After every request, the thread's own forks included.
            Manager::tend(this, stopping);
        }
        let mut m = lock();
        m.retire();
        if let Some(mut n) = m.next.take() {
            m.shown.next.store(0, Ordering::SeqCst);
            n.proc.kill_and_reap();
        }
        m.retired.drain(..).for_each(|mut p| p.kill_and_reap());
    }

    /// Whether the manager thread has tending to do that nobody asked it for yet; if so, it
    /// counts as asked (the caller sends [`Request::Tend`]).
    fn take_tending(&mut self) -> bool {
        let wanted = !self.retired.is_empty() || self.successor_wanted();
        wanted && !std::mem::replace(&mut self.tending, true)
    }

    /// The live zygote has a fifth of its budget left, and no successor is ready.
    fn successor_wanted(&self) -> bool {
        let at = self.max_forks.saturating_sub(ahead(self.max_forks));
        self.next.is_none() && self.live.as_ref().is_some_and(|l| l.forks >= at)
    }

    /// On the manager thread (a zygote's parent-death signal follows the thread that exec'd
    /// it): reaps the zygotes handovers retired, and starts the live zygote's successor when
    /// one is wanted, without holding the lock while it starts.
    fn tend(this: &Mutex<Manager>, stopping: &AtomicBool) {
        let lock = || this.lock().unwrap_or_else(|e| e.into_inner());
        let (retired, command) = {
            let mut m = lock();
            // Cleared where the work is taken: what a caller asks for from now on is asked
            // again, and done by the next call of this (on this thread, so never twice at once).
            m.tending = false;
            let wanted = m.successor_wanted() && !stopping.load(Ordering::SeqCst);
            let command = wanted.then(|| m.zygote_command());
            (std::mem::take(&mut m.retired), command)
        };
        retired.into_iter().for_each(|mut p| p.kill_and_reap());
        if let Some(command) = command {
            // Its start runs at the manager thread's policy, the normal one: under SCHED_IDLE
            // it need not end while calls keep the CPUs busy, and a fork at the budget's end
            // waits for it.
            let started = command.and_then(spawn_zygote).and_then(|mut l| {
                stsd_profiles::os::priority::foreground(l.proc.id());
                match await_ready(&l, stopping) {
                    Ok(offered) => {
                        if let Some(code) = offered {
                            lock().code.get_or_insert(code);
                        }
                        l.ready = true;
                        Ok(l)
                    }
                    Err(e) => {
                        l.proc.kill_and_reap();
                        Err(e)
                    }
                }
            });
            match started {
                Ok(mut l) => {
                    let mut m = lock();
                    if m.next.is_none() && !stopping.load(Ordering::SeqCst) {
                        m.shown.next.store(l.proc.id(), Ordering::SeqCst);
                        m.next = Some(l);
                    } else {
                        l.proc.kill_and_reap();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot start the zygote's successor"),
            }
        }
    }

    /// The successor takes over from the live zygote, if one is ready and alive; the live one
    /// is retired without waiting for it (the manager thread reaps it).
    fn hand_over(&mut self) -> bool {
        let Some(mut next) = self.next.take() else {
            return false;
        };
        self.shown.next.store(0, Ordering::SeqCst);
        if !next.proc.is_alive() {
            next.proc.kill_and_reap();
            return false;
        }
        if let Some(old) = self.live.take() {
            self.policy.zygote_gone();
            super::placement::zygote_gone(old.proc.id());
            // Its socket closed, it exits of itself.
            drop(old.ctrl);
            self.retired.push(old.proc);
        }
        self.install(next);
        self.shown.ahead.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// `l` is the live zygote from now on.
    fn install(&mut self, l: Live) {
        self.set_pid(Some(l.proc.id()));
        self.policy.new_zygote(l.proc.id());
        super::placement::zygote_started(l.proc.id());
        self.had_one = true;
        self.live = Some(l);
    }

    /// One worker from the live zygote, on the calling thread; None when that would take a
    /// zygote started first (none yet, a dead one, its fork budget spent and no successor
    /// ready), or the exchange failed (the zygote is retired: the manager thread starts the
    /// next).
    fn fork_direct(&mut self, urgent: bool) -> Option<std::io::Result<Spawned>> {
        // A dead zygote is found by the exchange failing (its socket is closed).
        if self.live.as_ref()?.forks >= self.max_forks && !self.hand_over() {
            return None;
        }
        self.prioritise(urgent);
        let l = self.live.as_mut()?;
        l.forks += 1;
        let within = Budget::of(l, self.fork_timeout, urgent, &self.policy);
        match ask(l, &mut self.code, &within) {
            Ok(s) => Some(Ok(s)),
            Err(e) => {
                tracing::warn!(error = %e, "the zygote did not fork a worker; replacing it");
                self.retire();
                None
            }
        }
    }

    /// Kills and reaps the current zygote, if any.
    fn retire(&mut self) {
        self.policy.zygote_gone();
        if let Some(mut l) = self.live.take() {
            super::placement::zygote_gone(l.proc.id());
            drop(l.ctrl);
            l.proc.kill_and_reap();
        }
        self.set_pid(None);
    }

    fn set_pid(&self, pid: Option<u32>) {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
    }

    /// Hands over to the successor if one is ready; else retires the current zygote and
    /// execs a new one (it gets ready while nobody waits, or as the first fork waits).
    fn replace(&mut self) {
        if self.hand_over() {
            return;
        }
        self.retire();
        match self.zygote_command().and_then(spawn_zygote) {
            Ok(l) => {
                if self.had_one {
                    self.shown.cold.fetch_add(1, Ordering::SeqCst);
                }
                self.install(l);
            }
            Err(e) => tracing::error!(error = %e, "cannot start the zygote"),
        }
    }

    /// The command that execs a zygote, with its end of the control socket (kept open until
    /// it has been exec'd) and the supervisor's.
    fn zygote_command(&self) -> std::io::Result<ZygoteCommand> {
        let (ctrl, child_end) = seqpacket_pair()?;
        let mut cmd = self.exe.command("zygote", self.uid, self.gid, &child_end);
        if self.huge_code {
            cmd.arg("--huge-code");
        }
        // The zygote's own seccomp filter, which its workers narrow to their postures
        // (`os::zygote_filter`). Without it they install their whole programs.
        match stsd_profiles::os::zygote_filter::zygote_program_hex() {
            Ok(hex) => {
                cmd.arg("--seccomp").arg(hex);
            }
            Err(e) => {
                tracing::warn!(error = %e, "no zygote seccomp filter; each worker installs its whole program")
            }
        }
        // A dynamically linked build's shared libraries bind their symbols at start (stsd
        // itself is linked with BIND_NOW): once, here, instead of lazily in every forked
        // worker. The static executable (.cargo/config.toml) has none to bind.
        cmd.env("LD_BIND_NOW", "1");
        // A copy of its own (above fd 16, close-on-exec), which lives as long as the command:
        // the exec may happen after the manager's lock is let go.
        let code = self.code.as_ref().map(dup_high).transpose()?;
        if let Some(code) = &code {
            let raw = code.as_raw_fd();
            // SAFETY: dup2 only, between fork and exec; `raw` is above 16 (never fd 3, where
            // the control socket goes) and the new fd 4 is not close-on-exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(raw, ZYGOTE_CODE_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Ok(ZygoteCommand {
            cmd,
            ctrl,
            child_end,
            _code: code,
        })
    }

    /// The zygote's priority for the next fork: background work when it is for the pool, so
    /// that it yields to calls; the normal priority when a call waits for the worker.
    fn prioritise(&self, urgent: bool) {
        // An urgent fork's promotion was made by the calling thread (`Zygote::fork`), and a
        // zygote started since then starts at the normal policy. A zygote still starting is
        // not put in the background: every worker waits for its start, and on a machine whose
        // CPUs other work keeps busy a start under SCHED_IDLE did not end (a test waited 60 s
        // for the zygote to name itself beside two busy loops).
        if !urgent && self.live.as_ref().is_some_and(|l| l.ready) {
            self.policy.background();
        }
    }

    /// One worker. A zygote that is gone, or fails to answer, is replaced and asked once more.
    fn fork(&mut self, urgent: bool) -> std::io::Result<Spawned> {
        let mut last = None;
        for _ in 0..2 {
            if self.live.as_ref().is_none_or(|l| l.forks >= self.max_forks) {
                self.replace();
            }
            self.prioritise(urgent);
            let Some(l) = self.live.as_mut() else {
                continue;
            };
            l.forks += 1;
            let within = Budget::of(l, self.fork_timeout, urgent, &self.policy);
            match ask(l, &mut self.code, &within) {
                Ok(s) => return Ok(s),
                Err(e) => {
                    tracing::warn!(error = %e, "the zygote did not fork a worker; replacing it");
                    self.retire();
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no zygote could be started")))
    }
}

struct ZygoteCommand {
    cmd: std::process::Command,
    ctrl: OwnedFd,
    child_end: OwnedFd,
    /// The code memfd the command places on fd 4, kept open until the exec.
    _code: Option<OwnedFd>,
}

/// Execs a zygote (the calling thread is its parent as far as its parent-death signal goes:
/// the manager thread's).
fn spawn_zygote(z: ZygoteCommand) -> std::io::Result<Live> {
    let ZygoteCommand {
        mut cmd,
        ctrl,
        child_end,
        _code: code,
    } = z;
    let child = cmd.spawn()?;
    drop(child_end);
    drop(code);
    let proc = ChildProc::from_pid(child.id());
    drop(child);
    Ok(Live {
        proc,
        ctrl,
        forks: 0,
        ready: false,
    })
}

/// Waits for a zygote just exec'd to say it is ready ([`ZYGOTE_READY`]), within its first
/// answer's time and while the daemon is not stopping. Returns the code memfd it offered
/// first, if it made one.
fn await_ready(l: &Live, stopping: &AtomicBool) -> std::io::Result<Option<OwnedFd>> {
    let until = Instant::now() + FIRST_FORK_TIMEOUT;
    let mut offered = None;
    loop {
        if stopping.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the daemon is stopping"));
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the zygote did not say it was ready in time",
            ));
        }
        if !poll_record(&l.ctrl, left.min(Duration::from_millis(50)))? {
            continue;
        }
        let (buf, n, fds) = read_record(&l.ctrl)?;
        match &buf[..n] {
            b if b == ZYGOTE_READY => return Ok(offered),
            b if b == ZYGOTE_CODE_OFFER => offered = keep_offered(fds),
            [] => return Err(std::io::Error::other("the zygote exited")),
            _ => {
                return Err(std::io::Error::other(
                    "the zygote sent something else first",
                ))
            }
        }
    }
}

/// The code memfd a zygote offered, kept well above the fds a child's exec places (as
/// ExeFile is).
fn keep_offered(fds: Vec<OwnedFd>) -> Option<OwnedFd> {
    let [fd] = &fds[..] else {
        return None;
    };
    dup_high(fd).ok()
}

/// A close-on-exec copy of `fd` numbered 16 or above: never where a child's exec places its
/// descriptors (3 and 4).
fn dup_high(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the copy is owned at once.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 16) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fcntl just returned `raw`, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// How long a zygote may take to answer the fork request just counted. A new zygote's first
/// answer includes its start. After that, while a call waits for a worker, a zygote slower
/// than `[worker] fork_timeout_ms` is hung (stopped, or spinning); a fork for the pool alone
/// may take longer (it runs as background work, which a busy machine starves), until a call
/// starts waiting: the budget is read again as the answer is awaited.
struct Budget<'a> {
    asked: Instant,
    first: bool,
    running: Duration,
    urgent: bool,
    policy: &'a Policy,
}

impl Budget<'_> {
    fn of<'a>(l: &Live, running: Duration, urgent: bool, policy: &'a Policy) -> Budget<'a> {
        Budget {
            asked: Instant::now(),
            first: l.forks <= 1 && !l.ready,
            running,
            urgent,
            policy,
        }
    }

    /// The deadline as it stands now.
    fn until(&self) -> Instant {
        let within = if self.first {
            FIRST_FORK_TIMEOUT
        } else if self.urgent || self.policy.lock().urgent_waiting > 0 {
            self.running
        } else {
            FIRST_FORK_TIMEOUT
        };
        self.asked + within
    }
}

/// Asks `l`'s zygote for one worker and takes its socket, within `budget`. A code memfd the
/// zygote offered first (see `ZYGOTE_CODE_OFFER`) is kept in `code`.
fn ask(l: &mut Live, code: &mut Option<OwnedFd>, budget: &Budget<'_>) -> std::io::Result<Spawned> {
    send(l.ctrl.as_raw_fd(), b"F", MsgFlags::MSG_NOSIGNAL).map_err(std::io::Error::from)?;
    loop {
        let (buf, n, fds) = next_record(l, budget)?;
        if &buf[..n] == ZYGOTE_CODE_OFFER {
            // The first kept stays: a command being built may hold its number.
            if let Some(fd) = keep_offered(fds) {
                code.get_or_insert(fd);
            }
            continue;
        }
        // A zygote that was not started ahead says it is ready before its first answer.
        if &buf[..n] == ZYGOTE_READY {
            l.ready = true;
            continue;
        }
        return fork_reply(&buf[..n], fds);
    }
}

/// The next record from `l`'s zygote, with the descriptors it carried.
fn next_record(
    l: &Live,
    budget: &Budget<'_>,
) -> std::io::Result<([u8; ForkReply::BYTES + 1], usize, Vec<OwnedFd>)> {
    loop {
        // Polled in slices: a call that starts waiting shortens the budget.
        let left = budget
            .until()
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(50));
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the zygote did not answer in time",
            ));
        }
        if poll_record(&l.ctrl, left)? {
            break;
        }
    }
    read_record(&l.ctrl)
}

/// Whether a record from a zygote (or a template) on `ctrl` is waiting, after up to `within`.
pub(super) fn poll_record(ctrl: &OwnedFd, within: Duration) -> std::io::Result<bool> {
    let ms = within.as_millis().min(i32::MAX as u128) as i32;
    let mut fds = [PollFd::new(ctrl.as_fd(), PollFlags::POLLIN)];
    match poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// The record waiting from a zygote (or a template) on `ctrl`, with the descriptors it
/// carried.
pub(super) fn read_record(
    ctrl: &OwnedFd,
) -> std::io::Result<([u8; ForkReply::BYTES + 1], usize, Vec<OwnedFd>)> {
    let mut buf = [0u8; ForkReply::BYTES + 1];
    let mut cmsg = nix::cmsg_space!([RawFd; 2]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            ctrl.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
        )
        .map_err(std::io::Error::from)?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in msg.cmsgs().map_err(std::io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors in this process for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, fds)
    };
    Ok((buf, n, fds))
}

/// A fork request's answer: the new worker, or why there is none.
pub(super) fn fork_reply(buf: &[u8], fds: Vec<OwnedFd>) -> std::io::Result<Spawned> {
    let n = buf.len();
    if n == 0 {
        return Err(std::io::Error::other("the zygote exited"));
    }
    let reply = ForkReply::decode(buf)
        .ok_or_else(|| std::io::Error::other("the zygote sent a malformed reply"))?;
    if reply.errno != 0 {
        return Err(std::io::Error::from_raw_os_error(reply.errno as i32));
    }
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(socket), None) if reply.pid != 0 => {
            let mut proc = ChildProc::from_pid(reply.pid);
            // Only our own child is ever waited for or signalled (CLONE_PARENT makes it one).
            if let Err(e) = proc.try_wait() {
                return Err(std::io::Error::other(format!(
                    "the zygote named pid {} that is not a child of the supervisor: {e}",
                    reply.pid
                )));
            }
            Ok(Spawned {
                proc,
                socket,
                maker_cpu_ns: reply.cpu_ns,
            })
        }
        _ => Err(std::io::Error::other(
            "the zygote's reply did not carry exactly one socket",
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{Asking, Policy};
    use std::sync::mpsc;

    fn policy_of(tid: u32) -> i32 {
        // SAFETY: sched_getscheduler reads the policy of a thread of this process.
        unsafe { libc::sched_getscheduler(tid as libc::pid_t) }
    }

    /// A call that waits for a fork puts the background thread asking for one (which holds
    /// the zygote's lock until its answer reaches it) at the normal policy, and that thread
    /// is background work again once it has its answer.
    #[test]
    fn a_waiting_call_promotes_the_background_thread_asking_for_a_fork() {
        if !stsd_profiles::os::priority::can_restore() {
            eprintln!("skipped: this process cannot put a thread back to the normal policy");
            return;
        }
        let policy = std::sync::Arc::new(Policy::default());
        let (asking_tx, asking_rx) = mpsc::channel::<u32>();
        let (answer_tx, answer_rx) = mpsc::channel::<()>();
        let asker = {
            let policy = policy.clone();
            std::thread::spawn(move || {
                stsd_profiles::os::priority::background(0);
                let asking = Asking::begin(&policy, false);
                // A second background thread asking meanwhile is not recorded.
                let second = std::thread::scope(|t| {
                    t.spawn(|| {
                        stsd_profiles::os::priority::background(0);
                        Asking::begin(&policy, false).recorded
                    })
                    .join()
                    .unwrap()
                });
                assert!(!second);
                asking_tx
                    .send(nix::unistd::gettid().as_raw() as u32)
                    .unwrap();
                answer_rx.recv().unwrap();
                drop(asking);
                policy_of(0)
            })
        };
        let tid = asking_rx.recv().unwrap();
        assert_eq!(policy_of(tid), libc::SCHED_IDLE);
        let call = Asking::begin(&policy, true);
        assert_eq!(
            policy_of(tid),
            libc::SCHED_OTHER,
            "promoted while the call waits"
        );
        drop(call);
        answer_tx.send(()).unwrap();
        assert_eq!(
            asker.join().unwrap(),
            libc::SCHED_IDLE,
            "background again after"
        );

        // A thread at the normal policy asking for a fork is left as it is.
        let policy2 = policy.clone();
        let normal = std::thread::spawn(move || {
            let asking = Asking::begin(&policy2, false);
            assert!(!asking.recorded);
            drop(Asking::begin(&policy2, true));
            drop(asking);
            policy_of(0)
        });
        assert_eq!(normal.join().unwrap(), libc::SCHED_OTHER);
    }
}
