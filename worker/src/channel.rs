//! The worker's end of its SOCK_SEQPACKET socket: one frame per record.

use nix::sys::socket::{recv, send, MsgFlags};
use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd};
use stsd_protocol::frames::{self, FromWorker, Job, ToWorker, MAX_FRAME_BYTES, MAX_JOB_BYTES};

pub struct Channel {
    fd: OwnedFd,
    /// One receive buffer for the worker's life (a job, fetch replies, a reused worker's
    /// Continue and next job), not a fresh 128 KiB per frame.
    buf: RefCell<Vec<u8>>,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> Channel {
        Channel {
            fd,
            buf: RefCell::new(Vec::new()),
        }
    }

    /// Sends one frame. A failure means the supervisor is gone; the worker then has nothing
    /// left to do, so callers treat it as the end.
    pub fn send(&self, frame: &FromWorker) -> Result<(), String> {
        let bytes = frames::encode(frame).map_err(|e| e.to_string())?;
        send(self.fd.as_raw_fd(), &bytes, MsgFlags::MSG_NOSIGNAL)
            .map_err(|e| format!("send: {e}"))?;
        Ok(())
    }

    /// The next job, reassembled from `JobPart`s when it came in pieces. Any other frame
    /// here is a confused supervisor: Err.
    pub fn recv_job(&self) -> Result<Box<Job>, String> {
        let mut parts: Vec<u8> = Vec::new();
        loop {
            match self.recv()? {
                ToWorker::Job(job) if parts.is_empty() => return Ok(job),
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
