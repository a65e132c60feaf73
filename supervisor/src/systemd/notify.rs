//! sd_notify: one datagram of `KEY=VALUE` lines to the AF_UNIX socket named by NOTIFY_SOCKET
//! (a path, or `@name` for the abstract namespace).

use std::os::unix::net::UnixDatagram;

#[derive(Debug, Clone)]
pub struct Notifier {
    socket: String,
}

impl Notifier {
    pub fn new(socket: String) -> Notifier {
        Notifier { socket }
    }

    pub fn send(&self, state: &str) -> std::io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        let sent = match self.socket.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                sock.send_to_addr(state.as_bytes(), &addr)?
            }
            None => sock.send_to(state.as_bytes(), &self.socket)?,
        };
        if sent != state.len() {
            return Err(std::io::Error::other("short write to NOTIFY_SOCKET"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_arrives_as_one_datagram_on_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("stsd-notify-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        let n = Notifier::new(path.display().to_string());
        assert!(n.send("READY=1\nSTATUS=serving").is_ok());
        let mut buf = [0u8; 64];
        let k = rx.recv(&mut buf).unwrap_or(0);
        assert_eq!(&buf[..k], b"READY=1\nSTATUS=serving");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("stsd-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let rx = UnixDatagram::bind_addr(&addr).unwrap_or_else(|e| panic!("{e}"));
        assert!(Notifier::new(format!("@{name}")).send("STOPPING=1").is_ok());
        let k = rx.recv(&mut buf).unwrap_or(0);
        assert_eq!(&buf[..k], b"STOPPING=1");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
