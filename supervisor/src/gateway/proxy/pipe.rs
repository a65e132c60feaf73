//! Moving bytes between the upstream and the destination, counted, with an idle bound over
//! both directions together (a long download with a silent client is not idle).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// When a connection last moved a byte, in milliseconds since it started.
#[derive(Debug)]
pub struct Activity {
    base: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved for `idle`.
    pub async fn idle(&self, idle: Duration) {
        loop {
            let last = self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let until = last + idle;
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep_until(until.into()).await;
        }
    }
}

/// Copies from `r` to `w` until EOF (then half-closes `w`) or, with `limit`, until that many
/// bytes. `count` gets every byte written; `prefix` keeps the first bytes (the response status
/// line).
pub async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    limit: Option<u64>,
    count: &AtomicU64,
    activity: &Activity,
    mut prefix: Option<&mut Vec<u8>>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; 16 * 1024];
    let mut left = limit;
    loop {
        let want = match left {
            Some(0) => return Ok(()),
            Some(n) => buf.len().min(usize::try_from(n).unwrap_or(usize::MAX)),
            None => buf.len(),
        };
        let n = r.read(&mut buf[..want]).await?;
        if n == 0 {
            if left.is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the request body ended early",
                ));
            }
            let _ = w.shutdown().await;
            return Ok(());
        }
        activity.touch();
        w.write_all(&buf[..n]).await?;
        activity.touch();
        count.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(p) = prefix.as_deref_mut() {
            let room = 32usize.saturating_sub(p.len());
            p.extend_from_slice(&buf[..n.min(room)]);
        }
        if let Some(l) = left.as_mut() {
            *l -= n as u64;
        }
    }
}

/// Writes `bytes` to `w`, counted as moved.
pub async fn send<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    bytes: &[u8],
    count: &AtomicU64,
    activity: &Activity,
) -> io::Result<()> {
    w.write_all(bytes).await?;
    activity.touch();
    count.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// The status code of a response that starts with `HTTP/1.x NNN`.
pub fn status_of(prefix: &[u8]) -> Option<u16> {
    let rest = prefix.strip_prefix(b"HTTP/")?;
    let space = rest.iter().position(|&b| b == b' ')?;
    let code = rest.get(space + 1..space + 4)?;
    std::str::from_utf8(code)
        .ok()
        .filter(|c| c.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 404 Not"), Some(404));
        assert_eq!(status_of(b"HTTP/1.1 20"), None);
        assert_eq!(status_of(b"garbage"), None);
    }
}
