//! The broker's connections. ureq bounds reading a response by its deadline, but not the TLS
//! handshake or writing the request: a server that trickles one byte at a time could hold a
//! fetch (and with it the call) far past any timeout. Every hop therefore goes through this
//! connector, which puts a deadline under every read and write of the socket, TLS included.
//! Plain-http hops use it too (the broker hands ureq those URLs as https with this connector
//! doing no TLS), so no byte moves after the deadline on any hop.
//!
//! Each hop's socket is also registered with the fetch's [`Abort`]: when the caller goes
//! away, the socket is shut down, which wakes a read or write blocked on it at once, and
//! every later read or write fails. The request thread then ends within milliseconds instead
//! of running on to the request timeout.

use rustls::pki_types::ServerName;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use ureq::ReadWrite;

/// A fetch's off switch, set when the caller goes away.
#[derive(Debug, Default)]
pub struct Abort {
    aborted: AtomicBool,
    /// A duplicate of the current hop's socket (the previous hop's is closed when the next
    /// one registers, and this one when the fetch ends and the handle is dropped).
    socket: Mutex<Option<TcpStream>>,
}

pub fn aborted() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the caller went away")
}

impl Abort {
    pub fn new() -> Arc<Abort> {
        Arc::new(Abort::default())
    }

    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Ends the fetch: its socket is shut down now, and any socket it opens later at once.
    pub fn abort(&self) {
        // The flag first: a hop registering after this sees it under the lock.
        self.aborted.store(true, Ordering::SeqCst);
        let sock = self.slot().take();
        if let Some(s) = sock {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<TcpStream>> {
        self.socket.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `s` abortable; fails (after shutting it down) when the fetch is already aborted.
    fn register(&self, s: &TcpStream) -> io::Result<()> {
        let dup = s.try_clone()?;
        let mut slot = self.slot();
        if self.is_aborted() {
            let _ = dup.shutdown(Shutdown::Both);
            return Err(aborted());
        }
        *slot = Some(dup);
        Ok(())
    }
}

/// The raw socket with the deadline applied before each syscall.
#[derive(Debug)]
struct DeadlineIo {
    io: Box<dyn ReadWrite>,
    deadline: Instant,
    abort: Arc<Abort>,
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the fetch's deadline passed")
}

impl DeadlineIo {
    fn arm(&self, write: bool) -> io::Result<()> {
        if self.abort.is_aborted() {
            return Err(aborted());
        }
        let now = Instant::now();
        if now >= self.deadline {
            return Err(timed_out());
        }
        if let Some(s) = self.io.socket() {
            let left = Some(self.deadline - now);
            if write {
                s.set_write_timeout(left)?;
            } else {
                s.set_read_timeout(left)?;
            }
        }
        Ok(())
    }
}

fn normalise(e: io::Error) -> io::Error {
    // SO_RCVTIMEO/SO_SNDTIMEO expiry reads as WouldBlock on Linux.
    if e.kind() == io::ErrorKind::WouldBlock {
        timed_out()
    } else {
        e
    }
}

impl Read for DeadlineIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm(false)?;
        self.io.read(buf).map_err(normalise)
    }
}

impl Write for DeadlineIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm(true)?;
        self.io.write(buf).map_err(normalise)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.arm(true)?;
        self.io.flush().map_err(normalise)
    }
}

impl ReadWrite for DeadlineIo {
    fn socket(&self) -> Option<&TcpStream> {
        self.io.socket()
    }
}

#[derive(Debug)]
struct Tls(rustls::StreamOwned<rustls::ClientConnection, DeadlineIo>);

impl Read for Tls {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Tls {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl ReadWrite for Tls {
    fn socket(&self) -> Option<&TcpStream> {
        self.0.sock.socket()
    }
}

/// One hop's connector: TLS with the broker's roots, or none for a plain-http hop.
pub struct Connector {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub deadline: Instant,
    pub abort: Arc<Abort>,
}

impl ureq::TlsConnector for Connector {
    fn connect(
        &self,
        dns_name: &str,
        io: Box<dyn ReadWrite>,
    ) -> Result<Box<dyn ReadWrite>, ureq::Error> {
        match io.socket() {
            Some(s) => self.abort.register(s)?,
            // ureq always hands over a TCP stream; without one there is nothing to abort.
            None => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, "not a TCP stream").into())
            }
        }
        let mut io = DeadlineIo {
            io,
            deadline: self.deadline,
            abort: self.abort.clone(),
        };
        let Some(config) = &self.tls else {
            return Ok(Box::new(io));
        };
        let name = dns_name.trim_start_matches('[').trim_end_matches(']');
        let sni = ServerName::try_from(name)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
            .to_owned();
        let mut conn = rustls::ClientConnection::new(config.clone(), sni)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut io)?;
        }
        Ok(Box::new(Tls(rustls::StreamOwned::new(conn, io))))
    }
}
