//! The worker's end of its SOCK_SEQPACKET socket: one frame per record, or several when
//! frames that need no answer go out with the next one ([`Channel::defer`]).

use nix::sys::socket::{recv, send, MsgFlags};
use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd};
use stsd_protocol::frames::{
    self, FromWorker, Job, Prime, ToWorker, MAX_FRAME_BYTES, MAX_JOB_BYTES,
};

/// What the supervisor asks a waiting worker to do.
pub enum Work {
    /// Run this job (apply its posture, bind it, run it).
    Job(Box<Job>),
    /// Get ready for a call of this template, then wait for its [`Work::Go`].
    Prime(Box<Prime>),
    /// Become the template of this prime's posture (see `template.rs`).
    Template(Box<Prime>),
    /// A primed worker's call.
    Go {
        call_id: u64,
        args_json: String,
        keep_alive: bool,
    },
}

pub struct Channel {
    fd: OwnedFd,
    /// One receive buffer for the worker's life (a job, fetch replies, a reused worker's
    /// Continue and next job), not a fresh 128 KiB per frame.
    buf: RefCell<Vec<u8>>,
    /// Frames that need no answer, encoded, waiting to go out with the next frame.
    deferred: RefCell<Vec<u8>>,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> Channel {
        Channel {
            fd,
            buf: RefCell::new(Vec::new()),
            deferred: RefCell::new(Vec::new()),
        }
    }

    /// The socket (a template sends its fork replies on it, with a descriptor attached).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Queues a frame that needs no answer (`Confined`, `Timings`) to go out in one record
    /// with the next frame sent. On its own it would wake the supervisor on this call's path
    /// for nothing, and the woken supervisor would take this CPU before the next frame.
    pub fn defer(&self, frame: &FromWorker) -> Result<(), String> {
        let bytes = frames::encode(frame).map_err(|e| e.to_string())?;
        self.deferred.borrow_mut().extend_from_slice(&bytes);
        Ok(())
    }

    /// Sends one frame, after the deferred ones: in the same record when they fit.
    pub fn send(&self, frame: &FromWorker) -> Result<(), String> {
        let bytes = frames::encode(frame).map_err(|e| e.to_string())?;
        let mut record = std::mem::take(&mut *self.deferred.borrow_mut());
        if record.is_empty() {
            return self.send_record(&bytes);
        }
        if record.len() + bytes.len() > MAX_FRAME_BYTES {
            self.send_record(&record)?;
            return self.send_record(&bytes);
        }
        record.extend_from_slice(&bytes);
        self.send_record(&record)
    }

    fn send_record(&self, bytes: &[u8]) -> Result<(), String> {
        send(self.fd.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL)
            .map_err(|e| format!("send: {e}"))?;
        Ok(())
    }

    /// The next thing to do: a job (reassembled from `JobPart`s when it came in pieces), a
    /// prime, or a primed call's go. Any other frame here is a confused supervisor: Err.
    pub fn recv_work(&self) -> Result<Work, String> {
        self.await_record()?;
        match self.recv()? {
            ToWorker::Job(job) => Ok(Work::Job(job)),
            ToWorker::Prime(p) => Ok(Work::Prime(p)),
            ToWorker::Template(p) => Ok(Work::Template(p)),
            ToWorker::Go {
                call_id,
                args_json,
                keep_alive,
            } => Ok(Work::Go {
                call_id,
                args_json,
                keep_alive,
            }),
            first @ ToWorker::JobPart { .. } => self.recv_job_parts(first).map(Work::Job),
            _ => Err("expected a job".into()),
        }
    }

    /// A job in pieces, from its first `JobPart` on.
    fn recv_job_parts(&self, first: ToWorker) -> Result<Box<Job>, String> {
        let mut parts: Vec<u8> = Vec::new();
        let mut next = Some(first);
        loop {
            let frame = match next.take() {
                Some(f) => f,
                None => self.recv()?,
            };
            match frame {
                ToWorker::JobPart { data, last } => {
                    if parts.len() + data.len() > MAX_JOB_BYTES {
                        return Err("a job over the size limit".into());
                    }
                    parts.extend_from_slice(&data);
                    if last {
                        return frames::decode_job(&parts)
                            .map(Box::new)
                            .map_err(|e| e.to_string());
                    }
                }
                _ => return Err("expected a job".into()),
            }
        }
    }

    /// Waits until a record is there to read, without taking it. A worker killed while it
    /// waits for work (by an operator, or the OOM killer) then dies with its job unread even
    /// when the job arrived before the kill took effect: the kernel hands a queued record to
    /// a plain recv before it looks for a fatal signal, but this one only peeks. The
    /// supervisor is told the job was never read (ECONNRESET rather than EOF) and gives the
    /// call to another worker; a job taken, and then lost with its worker, could not be.
    fn await_record(&self) -> Result<(), String> {
        let mut one = [0u8; 1];
        loop {
            // SAFETY: a one-byte buffer we own; MSG_PEEK leaves the record in the queue.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    one.as_mut_ptr().cast(),
                    one.len(),
                    libc::MSG_PEEK,
                )
            };
            match r {
                0 => return Err("supervisor closed the socket".into()),
                r if r > 0 => return Ok(()),
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(format!("recv: {e}"));
                    }
                }
            }
        }
    }

    /// Whether a record (or the socket's end) is there to read within `ms` milliseconds (0:
    /// now), without taking it.
    pub fn has_record_within(&self, ms: i32) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        loop {
            // SAFETY: one pollfd we own.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
            if r >= 0 {
                return r > 0;
            }
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                // Nothing to wait with: say work is there, and let the receive find out.
                return true;
            }
        }
    }

    /// Waits until the supervisor closes the socket (or kills this process); anything it
    /// sends meanwhile is ignored.
    pub fn await_close(&self) {
        let mut buf = [0u8; 64];
        loop {
            match recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(n) if n > 0 => continue,
                _ => return,
            }
        }
    }

    pub fn recv(&self) -> Result<ToWorker, String> {
        let mut buf = self.buf.borrow_mut();
        // Capacity only, never zeroed: zeroing 128 KiB wrote 33 fresh pages in every worker
        // (a page fault each, about 80 µs of CPU per worker); the kernel writes just the
        // record's bytes, so a small job touches one page.
        buf.clear();
        buf.reserve_exact(MAX_FRAME_BYTES + 1);
        let room = buf.capacity();
        let n = loop {
            // MSG_TRUNC: SEQPACKET reports the record's real length, so an oversize one is
            // seen (the kernel writes at most `room` bytes).
            // SAFETY: the pointer and length are the vector's own allocation; recv writes
            // bytes only, at most `room` of them, and nothing reads them before set_len.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    room,
                    libc::MSG_TRUNC,
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("recv: {e}"));
            }
        };
        if n == 0 {
            return Err("supervisor closed the socket".into());
        }
        if n > MAX_FRAME_BYTES {
            return Err(format!("frame of {n} bytes is over the limit"));
        }
        // SAFETY: recv wrote these n bytes (n <= MAX_FRAME_BYTES < room).
        unsafe { buf.set_len(n) };
        frames::decode(&buf[..n]).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    fn pair() -> (Channel, OwnedFd) {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (Channel::new(a), b)
    }

    fn put(fd: &OwnedFd, bytes: &[u8]) {
        send(fd.as_raw_fd(), bytes, MsgFlags::empty()).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The receive buffer is reused without being zeroed: each record is read whole, a record
    /// over the limit is refused by its real length, and a short record after a long one is
    /// not read with the long one's leftover bytes.
    #[test]
    fn records_are_read_whole_and_bounded() {
        let (ch, peer) = pair();
        let cont = frames::encode(&ToWorker::Continue).unwrap_or_else(|e| panic!("{e}"));
        put(&peer, &cont);
        assert!(matches!(ch.recv(), Ok(ToWorker::Continue)));

        let big = vec![7u8; MAX_FRAME_BYTES + 1];
        put(&peer, &big);
        let err = ch.recv().err().unwrap_or_default();
        assert!(err.contains("over the limit"), "{err}");

        // A record of the largest size is read, and fails only to decode (it is not a frame).
        put(&peer, &big[..MAX_FRAME_BYTES]);
        let err = ch.recv().err().unwrap_or_default();
        assert!(!err.contains("over the limit") && !err.is_empty(), "{err}");

        put(&peer, &cont);
        assert!(matches!(ch.recv(), Ok(ToWorker::Continue)));

        drop(peer);
        let err = ch.recv().err().unwrap_or_default();
        assert!(err.contains("closed"), "{err}");
    }
}
