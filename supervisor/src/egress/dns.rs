//! Name resolution for the broker. The broker resolves each hop's host exactly once, checks
//! every address, and connects only to those addresses: nothing resolves the name again.
//! Tests substitute a scripted resolver to prove that.

use std::io;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

pub trait Dns: Send + Sync {
    /// Every address `host` resolves to, within `timeout`.
    fn lookup(&self, host: &str, timeout: Duration) -> io::Result<Vec<IpAddr>>;
}

/// The system resolver (getaddrinfo). getaddrinfo has no timeout of its own, so it runs on a
/// short-lived thread; a lookup that outlives `timeout` is abandoned (the thread ends when
/// getaddrinfo returns).
pub struct SystemDns;

impl Dns for SystemDns {
    fn lookup(&self, host: &str, timeout: Duration) -> io::Result<Vec<IpAddr>> {
        crate::accounts::builtin_sources(); // hosts: `files dns`, no module loaded
        let (tx, rx) = mpsc::channel();
        let name = host.to_string();
        std::thread::Builder::new()
            .name("stsd-dns".into())
            .spawn(move || {
                let r = (name.as_str(), 0u16)
                    .to_socket_addrs()
                    .map(|it| it.map(|sa| sa.ip()).collect::<Vec<_>>());
                let _ = tx.send(r);
            })?;
        let mut addrs = match rx.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer for {host} within {} ms", timeout.as_millis()),
                ))
            }
        };
        addrs.dedup();
        Ok(addrs)
    }
}
