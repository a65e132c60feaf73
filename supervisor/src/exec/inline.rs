//! The async driver of a call's exchange with its worker, on the runtime thread that holds the
//! request. A call whose worker is at hand then costs no hand-off to a blocking thread and
//! back: two thread wake-ups, each an interrupt to another CPU, which on a VM (no halt
//! polling) cost more than the worker's whole run of a small body.
//!
//! Used only where nothing in the call blocks: the worker is already made (no fork to wait
//! for) and the posture has no network (a fetch runs on a thread of its own; those calls take
//! the blocking driver, [`super::run_keeping`]). Every frame is checked by the same
//! [`Exchange`] as there.

use super::call::{
    record_of, AwaitError, CallOutcome, Event, ExecOptions, FrameReader, ReadyWorker, Record, Recv,
    READY_TIMEOUT,
};
use super::exchange::{Ending, Exchange};
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
    let interest = Interest::READABLE | Interest::WRITABLE;
    // SAFETY: `raw` is the socket `w` owns, open until `w` is dropped or let go; the
    // registration is dropped before either can happen (below, before `ex.end`), and every
    // return before that point returns `w` itself. (Every I/O on it is MSG_DONTWAIT, which
    // stands in for the non-blocking mode AsyncFd asks for.)
    let Ok(fd) = (unsafe { AsyncFd::register_with_interest(Sock(raw), interest) }) else {
        return Err(w);
    };
    let mut ex = Exchange::begin(&w, job);
    on_event(Event::Started(w.pid()));
    let mut frames_in = FrameReader::new();
    let awaited = await_context(&mut w, &fd).await;
    let to_send = ex.frames_to_send(awaited);
    let deadline = ex.deadline(opts.kill_grace);
    for b in to_send {
        let sent = tokio::select! {
            r = send_async(&fd, &b) => r.map_err(Some),
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
async fn await_context(w: &mut ReadyWorker, fd: &AsyncFd<Sock>) -> Result<(), AwaitError> {
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
async fn recv_async(fd: &AsyncFd<Sock>, buf: &mut [u8]) -> Record {
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
async fn send_async(fd: &AsyncFd<Sock>, bytes: &[u8]) -> Result<(), String> {
    loop {
        let mut ready = fd.writable().await.map_err(|e| format!("poll: {e}"))?;
        match send(
            fd.get_ref().0,
            bytes,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::EAGAIN) => ready.clear_ready(),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.to_string()),
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
