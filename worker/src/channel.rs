//! The worker's end of its SOCK_SEQPACKET socket: one frame per record.

use nix::sys::socket::{recv, send, MsgFlags};
use std::os::fd::{AsRawFd, OwnedFd};
use stsd_protocol::frames::{self, FromWorker, ToWorker, MAX_FRAME_BYTES};

pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> Channel {
        Channel { fd }
    }

    /// Sends one frame. A failure means the supervisor is gone; the worker then has nothing
    /// left to do, so callers treat it as the end.
    pub fn send(&self, frame: &FromWorker) -> Result<(), String> {
        let bytes = frames::encode(frame).map_err(|e| e.to_string())?;
        send(self.fd.as_raw_fd(), &bytes, MsgFlags::MSG_NOSIGNAL)
            .map_err(|e| format!("send: {e}"))?;
        Ok(())
    }

    pub fn recv(&self) -> Result<ToWorker, String> {
        let mut buf = vec![0u8; MAX_FRAME_BYTES + 1];
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
