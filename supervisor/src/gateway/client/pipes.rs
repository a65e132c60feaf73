//! The stdio upstream's pipes: a bounded line pump between the child's stdout and rmcp, the
//! stderr logger, and killing the child.
//!
//! rmcp's own reader bounds a line too, but it drops an oversized line and keeps reading, so
//! the call it answered would hang until its deadline. The pump instead ends the session at
//! the first line over the cap: the call fails with OUTPUT_LIMIT at once and the upstream is
//! restarted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Why the pump stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum PumpEnd {
    /// The child closed its stdout.
    Eof,
    /// A line grew past the cap; nothing of it beyond the cap was forwarded.
    Overflow,
    /// rmcp's side is gone (the session is being torn down).
    Closed,
    Io(String),
}

/// Copies `from` to `to`, ending with [`PumpEnd::Overflow`] at the first line longer than
/// `cap` bytes (not counting its newline). Memory stays at one read buffer: lines are
/// streamed, not collected. `read` counts the bytes taken from `from`.
pub async fn pump<R, W>(mut from: R, mut to: W, cap: usize, read: Arc<AtomicU64>) -> PumpEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    // Bytes of the current line seen so far.
    let mut line = 0usize;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) => return PumpEnd::Eof,
            Ok(n) => n,
            Err(e) => return PumpEnd::Io(e.to_string()),
        };
        read.fetch_add(n as u64, Ordering::Relaxed);
        let chunk = &buf[..n];
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if line + i > cap {
                return PumpEnd::Overflow;
            }
            line = 0;
            rest = &rest[i + 1..];
        }
        line += rest.len();
        if line > cap {
            return PumpEnd::Overflow;
        }
        if to.write_all(chunk).await.is_err() {
            return PumpEnd::Closed;
        }
    }
}

/// The longest stderr line logged; the rest of a longer line is dropped.
const STDERR_LINE: usize = 4096;

/// Logs the child's stderr line by line under the upstream's id: lines that look like an
/// error at warn, the rest at debug. Bounded: a line longer than 4 KiB is cut.
/// Every line is masked with the upstream's secrets first.
pub async fn log_stderr<R: AsyncRead + Unpin>(
    from: R,
    id: Arc<str>,
    secrets: stsd_protocol::envvar::SecretSet,
) {
    let mut reader = BufReader::new(from);
    let mut line = Vec::with_capacity(256);
    let mut cut = false;
    loop {
        let (used, end_of_line) = match reader.fill_buf().await {
            Ok([]) | Err(_) => {
                if !line.is_empty() {
                    emit(&id, &line, cut, &secrets);
                }
                return;
            }
            Ok(avail) => match avail.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    take(&mut line, &avail[..i], &mut cut);
                    (i + 1, true)
                }
                None => {
                    take(&mut line, avail, &mut cut);
                    (avail.len(), false)
                }
            },
        };
        reader.consume(used);
        if end_of_line {
            emit(&id, &line, cut, &secrets);
            line.clear();
            cut = false;
        }
    }
}

fn take(line: &mut Vec<u8>, bytes: &[u8], cut: &mut bool) {
    let room = STDERR_LINE.saturating_sub(line.len());
    line.extend_from_slice(&bytes[..bytes.len().min(room)]);
    *cut |= bytes.len() > room;
}

fn emit(id: &str, line: &[u8], cut: bool, secrets: &stsd_protocol::envvar::SecretSet) {
    let text = secrets.mask(&String::from_utf8_lossy(line));
    let text = text.trim_end();
    let more = if cut { " [cut]" } else { "" };
    let lower = text.to_ascii_lowercase();
    if [
        "error",
        "exception",
        "traceback",
        "fatal",
        "panic",
        "sandbox_unavailable",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        tracing::warn!(upstream = id, "upstream stderr: {text}{more}");
    } else {
        tracing::debug!(upstream = id, "upstream stderr: {text}{more}");
    }
}

/// Kills the child and, when the launcher made it a process-group leader, its whole group
/// (wrappers such as `npx` or `uv run` leave the real server as a grandchild).
pub fn kill(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        if nix::unistd::getpgid(Some(pid)).ok() == Some(pid) {
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    let _ = child.start_kill();
}

type SpawnJob = (
    tokio::process::Command,
    tokio::runtime::Handle,
    std::sync::mpsc::Sender<std::io::Result<tokio::process::Child>>,
);

/// Starts `cmd` from one thread kept for the daemon's life. The parent-death signal
/// `upstream-exec` arms follows the thread that forked the child, not the process, and a
/// runtime worker thread is not forever: one that lent itself to blocking work
/// (`block_in_place`, a store operation) may end as a blocking-pool thread after ten idle
/// seconds, and every upstream it forked got SIGKILL with it (both of a test's upstreams, in
/// the middle of a call). The keeper never retires.
pub fn spawn_kept(mut cmd: tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    static KEEPER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<SpawnJob>>> =
        std::sync::OnceLock::new();
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|e| std::io::Error::other(format!("no runtime: {e}")))?;
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnJob>();
        let started = std::thread::Builder::new()
            .name("stsd-upstream-spawn".into())
            .spawn(move || {
                while let Ok((mut cmd, handle, reply)) = rx.recv() {
                    let _in = handle.enter();
                    let _ = reply.send(cmd.spawn());
                }
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "the upstream spawner thread did not start");
        }
        std::sync::Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    let sent = keeper.lock().unwrap_or_else(|e| e.into_inner()).send((
        std::mem::replace(&mut cmd, tokio::process::Command::new("true")),
        handle,
        reply,
    ));
    if sent.is_err() {
        return Err(std::io::Error::other("the upstream spawner thread is gone"));
    }
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the upstream spawner thread is gone"))?
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    async fn run(input: &[u8], cap: usize) -> (PumpEnd, Vec<u8>) {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let input = input.to_vec();
        tokio::spawn(async move {
            tx.write_all(&input).await.unwrap();
        });
        let mut out = Vec::new();
        let end = pump(rx, &mut out, cap, Arc::default()).await;
        (end, out)
    }

    #[tokio::test]
    async fn pump_forwards_lines_up_to_the_cap() {
        let (end, out) = run(b"12345\n123\n", 5).await;
        assert_eq!(end, PumpEnd::Eof);
        assert_eq!(out, b"12345\n123\n");
    }

    #[tokio::test]
    async fn pump_stops_at_a_line_over_the_cap_without_forwarding_it() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 300_000));
        input.push(b'\n');
        let (end, out) = run(&input, 100_000).await;
        assert_eq!(end, PumpEnd::Overflow);
        // The good line went through; at most one read buffer of the long one did.
        assert!(out.starts_with(b"ok\n"));
        assert!(out.len() <= 100_000 + 3, "{}", out.len());
    }

    #[tokio::test]
    async fn pump_counts_a_line_split_across_reads() {
        // 5 + 5 bytes without a newline, in two writes: 10 > cap 8.
        let (mut tx, rx) = tokio::io::duplex(16);
        tokio::spawn(async move {
            tx.write_all(b"aaaaa").await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            tx.write_all(b"bbbbb\n").await.unwrap();
        });
        let mut out = Vec::new();
        assert_eq!(
            pump(rx, &mut out, 8, Arc::default()).await,
            PumpEnd::Overflow
        );
        assert_eq!(out, b"aaaaa");
    }
}
