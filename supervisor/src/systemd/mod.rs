//! Running under systemd, written directly against its two small protocols (no libsystemd):
//!
//! - sd_notify (`notify`): `READY=1` once the socket is bound and the catalog published,
//!   `RELOADING=1`/`READY=1` around a SIGHUP reload, `STOPPING=1` at shutdown, `WATCHDOG=1`
//!   every half `WATCHDOG_USEC`, `STATUS=` lines a person reads in `systemctl status`.
//! - socket activation (`listen_fds`): the listening socket systemd passed on fd 3, checked
//!   to be a listening AF_UNIX stream socket.
//!
//! [`Systemd::from_env`] takes (and removes) the variables in `main`, before any thread
//! starts, so neither a worker nor a child of an approval command ever sees them.

mod listen_fds;
mod notify;

pub use listen_fds::ListenFd;
pub use notify::Notifier;

use std::time::Duration;

/// What systemd handed this process.
#[derive(Debug, Default)]
pub struct Systemd {
    pub notifier: Option<Notifier>,
    pub listen: Option<ListenFd>,
    /// Send WATCHDOG=1 at least this often (half of WATCHDOG_USEC).
    pub watchdog: Option<Duration>,
    /// A LISTEN_FDS that could not be used, with why (reported once logging is up).
    pub problem: Option<String>,
}

impl Systemd {
    /// Reads NOTIFY_SOCKET, LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES and WATCHDOG_USEC/
    /// WATCHDOG_PID, and removes them from the environment. Changing the environment races
    /// with other threads reading it: call this in `main` before any thread exists.
    pub fn from_env() -> Systemd {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let me = std::process::id();
        let for_me = |pid: Option<String>| pid.is_none_or(|p| p.trim() == me.to_string());
        let notifier = var("NOTIFY_SOCKET").map(Notifier::new);
        let watchdog = var("WATCHDOG_USEC")
            .filter(|_| for_me(var("WATCHDOG_PID")))
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0)
            .map(|u| Duration::from_micros(u / 2));
        let (listen, problem) = match (var("LISTEN_PID"), var("LISTEN_FDS")) {
            (Some(pid), Some(n)) if pid.trim() == me.to_string() => {
                match listen_fds::take(&n, var("LISTEN_FDNAMES").as_deref()) {
                    Ok(fd) => (Some(fd), None),
                    Err(e) => (None, Some(e)),
                }
            }
            _ => (None, None),
        };
        for k in [
            "NOTIFY_SOCKET",
            "LISTEN_PID",
            "LISTEN_FDS",
            "LISTEN_FDNAMES",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
        ] {
            std::env::remove_var(k);
        }
        Systemd {
            notifier,
            listen,
            watchdog,
            problem,
        }
    }

    /// Sends `state` when there is a notify socket; errors are logged, never fatal.
    pub fn notify(&self, state: &str) {
        if let Some(n) = &self.notifier {
            if let Err(e) = n.send(state) {
                tracing::warn!(error = %e, "sd_notify failed");
            }
        }
    }
}
