//! The async driver of a call's exchange with its worker, on the runtime thread that holds the
//! request. A call whose worker is at hand then costs no hand-off to a blocking thread and
//! back: two thread wake-ups, each an interrupt to another CPU, which on a VM (no halt
//! polling) cost more than the worker's whole run of a small body.
//!
//! Used only where nothing in the call blocks: the worker is already made (no fork to wait
//! for) and the posture has no network (a fetch runs on a thread of its own; those calls take
//! the blocking driver, [`super::run_keeping`]). Every frame is checked by the same
//! [`Exchange`] as there.

use super::exchange::{Ending, Exchange};
use super::options::ExecOptions;
use super::outcome::{CallOutcome, Event};
use super::worker::{record_of, AwaitError, FrameReader, ReadyWorker, Record, Recv, READY_TIMEOUT};
use nix::errno::Errno;
use nix::sys::socket::{recv, send, MsgFlags};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use stsd_protocol::frames::{Job, NetworkGrant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Whether a call of `job` may run on the runtime thread (given a worker at hand).
pub fn usable(job: &Job) -> bool {
    job.sandbox.network != NetworkGrant::Brokered
}

/// A worker's socket, registered with the runtime for one call. Not owned: the worker keeps
/// it, and this registration must be dropped before the worker is let go (else a closed and
/// reused descriptor number could be deregistered).
struct Sock(RawFd);

impl AsRawFd for Sock {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The registration of a worker's socket: for reading, and for writing too only once a send
/// finds the socket full. With write interest from the start, the worker reading its job
/// (which frees room in the socket) woke this thread for nothing: two context switches a
/// call, on the worker's CPU.
struct Registered {
    raw: RawFd,
    /// None only if registering again for writing failed (every later wait says so).
    fd: Option<AsyncFd<Sock>>,
    writable: bool,
}

impl Registered {
    /// # Safety
    /// `raw` stays open until the registration is dropped.
    unsafe fn new(raw: RawFd) -> std::io::Result<Registered> {
        // SAFETY: the caller keeps `raw` open while this lives.
        let fd = unsafe { AsyncFd::register_with_interest(Sock(raw), Interest::READABLE)? };
        Ok(Registered {
            raw,
            fd: Some(fd),
            writable: false,
        })
    }

    fn get(&self) -> Result<&AsyncFd<Sock>, String> {
        self.fd
            .as_ref()
            .ok_or_else(|| "poll: the socket is not registered".to_string())
    }

    /// For writing too, from now on. A descriptor is registered once: the old registration
    /// goes first.
    fn widen(&mut self) -> Result<(), String> {
        if self.writable {
            return Ok(());
        }
        self.writable = true;
        drop(self.fd.take());
        let both = Interest::READABLE | Interest::WRITABLE;
        // SAFETY: the same socket as in `new`, under its contract.
        let fd = unsafe { AsyncFd::register_with_interest(Sock(self.raw), both) };
        self.fd = Some(fd.map_err(|e| format!("poll: {e}"))?);
        Ok(())
    }
}

/// Runs `job` on `w` like [`super::run_keeping`], awaiting the worker instead of blocking.
/// `Err(w)`: the socket could not be registered with the runtime; the worker is untouched,
/// for the blocking driver.
pub async fn run_keeping(
    mut w: ReadyWorker,
    job: &Job,
    opts: &ExecOptions,
    cancel: &AtomicBool,
    on_event: &mut (dyn FnMut(Event<'_>) + Send),
) -> Result<(CallOutcome, Option<ReadyWorker>), ReadyWorker> {
    let raw = w.socket().as_raw_fd();
    // SAFETY: `raw` is the socket `w` owns, open until `w` is dropped or let go; the
    // registration is dropped before either can happen (below, before `ex.end`), and every
    // return before that point returns `w` itself. (Every I/O on it is MSG_DONTWAIT, which
    // stands in for the non-blocking mode AsyncFd asks for.)
    let Ok(mut fd) = (unsafe { Registered::new(raw) }) else {
        return Err(w);
    };
    let mut ex = Exchange::begin(&mut w, job);
    on_event(Event::Started(w.pid()));
    let mut frames_in = FrameReader::new();
    let awaited = await_context(&mut w, &fd).await;
    let to_send = ex.frames_to_send(awaited);
    let deadline = ex.deadline(opts.kill_grace);
    for b in to_send {
        let sent = tokio::select! {
            r = send_async(&mut fd, &b) => r.map_err(Some),
            _ = tokio::time::sleep_until(deadline.into()) => Err(None),
        };
        match sent {
            Ok(()) => {}
            Err(Some(e)) => {
                ex.send_failed(e);
                break;
            }
            Err(None) => {
                ex.send_timed_out();
                break;
            }
        }
    }

    // Frames until the outcome, EOF, or the deadline.
    while ex.open() {
        if cancel.load(Ordering::Relaxed) {
            ex.cancelled = true;
            break;
        }
        let next = match frames_in.take_frame() {
            Some(r) => r,
            None => {
                // In slices, so that a cancellation is noticed within 50 ms.
                let slice = ex.slice_until(deadline);
                tokio::select! {
                    r = recv_async(&fd, frames_in.buf_mut()) => match r {
                        Record::Bytes(n) => {
                            frames_in.got_record(n);
                            continue;
                        }
                        Record::End(r) => r,
                    },
                    _ = tokio::time::sleep_until(slice.into()) => Recv::Timeout,
                }
            }
        };
        let frame = match next {
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
        if ex.on_frame(frame, on_event).is_some() {
            // `usable` keeps postures with network off this driver, and the exchange refuses
            // a fetch from any other: this is never reached.
            ex.protocol_error = Some("a fetch on a call without a broker".into());
        }
    }
    drop(fd); // deregistered before the worker (and its descriptor) may go
    let (kept, status) = match ex.end(w, frames_in.has_rest()) {
        Ending::Kept(w) => (Some(w), None),
        Ending::Released => (None, None),
        Ending::NeedsStatus(w) => (None, exit_status(w).await),
    };
    let out = ex.finish(status, frames_in.records);
    frames_in.give_back();
    Ok((out, kept))
}

/// Waits for a reused or primed worker to say its next context is made.
async fn await_context(w: &mut ReadyWorker, fd: &Registered) -> Result<(), AwaitError> {
    if w.is_context_made() {
        return Ok(());
    }
    let mut buf = [0u8; 256];
    let got = match tokio::time::timeout(READY_TIMEOUT, recv_async(fd, &mut buf)).await {
        Err(_) => Recv::Timeout,
        Ok(Record::End(r)) => r,
        Ok(Record::Bytes(n)) => match stsd_protocol::frames::decode(&buf[..n]) {
            Ok(f) => Recv::Frame(f),
            Err(e) => Recv::Broken(format!("worker sent an undecodable frame: {e}")),
        },
    };
    w.context_reply(got)
}

/// One record from the worker, into `buf`.
async fn recv_async(reg: &Registered, buf: &mut [u8]) -> Record {
    let fd = match reg.get() {
        Ok(fd) => fd,
        Err(e) => return Record::End(Recv::Broken(e)),
    };
    loop {
        let mut ready = match fd.readable().await {
            Ok(r) => r,
            Err(e) => return Record::End(Recv::Broken(format!("poll: {e}"))),
        };
        let cap = buf.len();
        let got = recv(
            fd.get_ref().0,
            buf,
            MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT,
        );
        if matches!(got, Err(Errno::EAGAIN)) {
            ready.clear_ready();
            continue;
        }
        if let Some(r) = record_of(got, cap) {
            return r;
        }
    }
}

/// Sends one record to the worker, waiting while its socket is full.
async fn send_async(reg: &mut Registered, bytes: &[u8]) -> Result<(), String> {
    let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
    loop {
        match send(reg.raw, bytes, flags) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    reg.widen()?;
    let fd = reg.get()?;
    loop {
        let mut ready = fd.writable().await.map_err(|e| format!("poll: {e}"))?;
        // A WouldBlock (EAGAIN) clears the readiness, so the next wait is a real one.
        match ready.try_io(|s| send(s.get_ref().0, bytes, flags).map_err(std::io::Error::from)) {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_would_block) => {}
        }
    }
}

/// What a worker whose call ended without an outcome died of: killed now if it still runs,
/// and reaped without blocking the runtime thread (its teardown may take milliseconds).
async fn exit_status(mut w: ReadyWorker) -> Option<std::process::ExitStatus> {
    match w.try_exit() {
        Ok(Some(s)) => return Some(s),
        Ok(None) => w.kill(),
        Err(_) => return None,
    }
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
        match w.try_exit() {
            Ok(Some(s)) => return Some(s),
            Ok(None) => {}
            Err(_) => return None,
        }
    }
    super::reap_later(w);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    /// Records sent past a full socket arrive whole and in order: the registration, readable
    /// only at first, is widened for writing when a send finds no room, and each wait for
    /// room is a real one (not a spin on a stale readiness).
    #[test]
    fn sends_past_a_full_socket_wait_for_room_and_arrive_in_order() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let records: Vec<Vec<u8>> = (0..24u8).map(|i| vec![i; 100 * 1024]).collect();
        let expect = records.clone();
        // The peer starts reading only once the sender must have found the socket full.
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let mut buf = vec![0u8; 200 * 1024];
            let mut got = Vec::new();
            while got.len() < 24 {
                let n = recv(theirs.as_raw_fd(), &mut buf, MsgFlags::empty())
                    .unwrap_or_else(|e| panic!("{e}"));
                got.push(buf[..n].to_vec());
            }
            got
        });
        let widened = rt.block_on(async {
            // SAFETY: `ours` outlives the registration (dropped at the end of this block).
            let mut reg =
                unsafe { Registered::new(ours.as_raw_fd()) }.unwrap_or_else(|e| panic!("{e}"));
            assert!(!reg.writable);
            for r in &records {
                send_async(&mut reg, r)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            reg.writable
        });
        assert!(widened, "2.4 MB never filled the socket");
        assert_eq!(reader.join().unwrap_or_else(|_| panic!("reader")), expect);
    }
}
