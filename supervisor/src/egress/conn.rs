//! The broker's connections. ureq bounds reading a response by its deadline, but not the TLS
//! handshake or writing the request: a server that trickles one byte at a time could hold a
//! fetch (and with it the call) far past any timeout. Every hop therefore goes through this
//! connector, which puts a deadline under every read and write of the socket, TLS included.
//! Plain-http hops use it too (the broker hands ureq those URLs as https with this connector
//! doing no TLS), so no byte moves after the deadline on any hop.

use rustls::pki_types::ServerName;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;
use ureq::ReadWrite;

/// The raw socket with the deadline applied before each syscall.
#[derive(Debug)]
struct DeadlineIo {
    io: Box<dyn ReadWrite>,
    deadline: Instant,
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the fetch's deadline passed")
}

impl DeadlineIo {
    fn arm(&self, write: bool) -> io::Result<()> {
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
}

impl ureq::TlsConnector for Connector {
    fn connect(
        &self,
        dns_name: &str,
        io: Box<dyn ReadWrite>,
    ) -> Result<Box<dyn ReadWrite>, ureq::Error> {
        let mut io = DeadlineIo {
            io,
            deadline: self.deadline,
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
