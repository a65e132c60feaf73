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
        match self.recv()? {
            ToWorker::Job(job) => Ok(Work::Job(job)),
            ToWorker::Prime(p) => Ok(Work::Prime(p)),
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
        if buf.is_empty() {
            buf.resize(MAX_FRAME_BYTES + 1, 0);
        }
        // MSG_TRUNC: SEQPACKET reports the record's real length, so an oversize one is seen.
        let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_TRUNC)
            .map_err(|e| format!("recv: {e}"))?;
        if n == 0 {
            return Err("supervisor closed the socket".into());
        }
        if n > MAX_FRAME_BYTES {
            return Err(format!("frame of {n} bytes is over the limit"));
        }
        frames::decode(&buf[..n]).map_err(|e| e.to_string())
    }
}
