//! One client session as an rmcp transport: bounded line reads, protocol errors answered here,
//! backpressure (no reading while the client leaves its replies unread, and a close when that
//! lasts), a cap on unanswered requests, and idle timeouts.

use super::admin::AdminHandler;
use super::framing::{self, Inbound};
use super::limits::Limits;
use super::outbox::Outbox;
use super::registry::Activity;
use rmcp::model::{ErrorCode, JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio_util::sync::CancellationToken;

pub struct SessionTransport<R> {
    read: BufReader<R>,
    line: LineBuf,
    out: Outbox,
    closed: CancellationToken,
    limits: Limits,
    activity: Arc<Activity>,
    /// Requests read and not yet answered.
    pending: HashSet<RequestId>,
    last_active: Instant,
    spoke: bool,
    /// Since when the outgoing queue has been over its bound.
    stalled_since: Option<Instant>,
    /// The admin channel and the peer's uid, when this session may reach it.
    admin: Option<(Arc<dyn AdminHandler>, u32)>,
    /// Admin requests in flight (bounded: a session cannot start unlimited tasks).
    admin_slots: Arc<tokio::sync::Semaphore>,
    /// The bridge declared this session MCP only: no admin request is served on it.
    mcp_only: bool,
}

/// Admin requests of one session running at once.
const ADMIN_IN_FLIGHT: usize = 8;

/// The line being read. Kept on the struct: `receive` is polled in rmcp's `select!` and may
/// be dropped mid-line; the next call resumes where it stopped.
#[derive(Default)]
struct LineBuf {
    bytes: Vec<u8>,
    /// An oversized line is being skipped up to its newline; its first bytes are kept in
    /// `bytes` so the request id can still be found for the error reply.
    discarding: bool,
    /// Total length of the line being skipped.
    skipped: usize,
}

enum LineRead {
    Line,
    /// The line was longer than the limit; how long it was.
    Oversized(usize),
    Eof,
}

/// Bytes of an oversized line kept to find its id.
const ID_SNIFF_BYTES: usize = 256;

async fn read_line<R: AsyncRead + Unpin>(
    read: &mut BufReader<R>,
    line: &mut LineBuf,
    max: usize,
) -> std::io::Result<LineRead> {
    loop {
        let available = read.fill_buf().await?;
        if available.is_empty() {
            return Ok(LineRead::Eof);
        }
        let newline = available.iter().position(|b| *b == b'\n');
        let take = newline.map_or(available.len(), |i| i + 1);
        if !line.discarding && line.bytes.len() + take > max {
            line.discarding = true;
            line.skipped = line.bytes.len();
            line.bytes.truncate(ID_SNIFF_BYTES);
        }
        if line.discarding {
            let room = ID_SNIFF_BYTES.saturating_sub(line.bytes.len());
            line.bytes.extend_from_slice(&available[..take.min(room)]);
            line.skipped += take;
        } else {
            line.bytes.extend_from_slice(&available[..take]);
        }
        read.consume(take);
        if newline.is_some() {
            return Ok(if line.discarding {
                LineRead::Oversized(line.skipped)
            } else {
                LineRead::Line
            });
        }
    }
}

/// The `"id"` of a request from the first bytes of its text, when it is a number or a plain
/// string there (it usually comes second, after `"jsonrpc"`).
fn sniff_id(prefix: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(prefix);
    let at = text.find("\"id\"")?;
    let rest = text[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        let end = s.find(['"', '\\'])?;
        return s[end..]
            .starts_with('"')
            .then(|| Value::String(s[..end].to_string()));
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse::<i64>().ok().map(Value::from)
}

impl<R: AsyncRead + Unpin + Send> SessionTransport<R> {
    pub fn new(
        read: R,
        out: Outbox,
        closed: CancellationToken,
        limits: Limits,
        activity: Arc<Activity>,
    ) -> Self {
        SessionTransport {
            // 8 KiB: an idle session holds this buffer for its life (64 KiB was half of an
            // idle connection's memory); a longer line is read in more calls, not cut.
            read: BufReader::with_capacity(8 * 1024, read),
            line: LineBuf::default(),
            out,
            closed,
            limits,
            activity,
            pending: HashSet::new(),
            last_active: Instant::now(),
            spoke: false,
            stalled_since: None,
            admin: None,
            admin_slots: Arc::new(tokio::sync::Semaphore::new(ADMIN_IN_FLIGHT)),
            mcp_only: false,
        }
    }

    /// Lets `stsd/...` requests of this session reach `admin`, as `uid`.
    pub fn with_admin(mut self, admin: Arc<dyn AdminHandler>, uid: u32) -> Self {
        self.admin = Some((admin, uid));
        self
    }

    /// Runs one admin request on its own task; its answer goes out through the outbox.
    /// Never awaits: `receive` may be dropped at any await, and the line is already read.
    fn admin(&mut self, id: Value, method: String, params: Value) {
        if self.mcp_only {
            self.reply(&framing::error_reply(
                Some(&id),
                ErrorCode::METHOD_NOT_FOUND,
                &format!(
                    "{method}: this session came through `stsd mcp`, which carries MCP only; \
                     an operator uses `stsd tools`, `stsd status` and the other admin commands"
                ),
            ));
            return;
        }
        let Some((admin, uid)) = self.admin.clone() else {
            self.reply(&framing::error_reply(
                Some(&id),
                ErrorCode::METHOD_NOT_FOUND,
                &format!("{method}: the admin channel is not served on this transport"),
            ));
            return;
        };
        let Ok(permit) = self.admin_slots.clone().try_acquire_owned() else {
            self.reply(&framing::error_reply(
                Some(&id),
                ErrorCode(-32000),
                &format!("{ADMIN_IN_FLIGHT} admin requests of this session are in flight already"),
            ));
            return;
        };
        let out = self.out.clone();
        tokio::spawn(async move {
            let reply = match admin
                .handle(crate::call::Subject::Uid(uid), method, params)
                .await
            {
                Ok(result) => serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Err((code, message)) => framing::error_reply(Some(&id), ErrorCode(code), &message),
            };
            if let Ok(bytes) = serde_json::to_vec(&reply) {
                let _ = out.push(bytes);
            }
            drop(permit);
        });
    }

    fn touch(&mut self) {
        self.last_active = Instant::now();
        self.activity.touch(self.pending.len(), self.spoke);
    }

    fn reply(&mut self, v: &Value) {
        if let Ok(bytes) = serde_json::to_vec(v) {
            let _ = self.out.push(bytes);
        }
    }

    /// When the session counts as idle, if it has nothing in flight.
    fn idle_deadline(&self) -> Option<Instant> {
        if !self.pending.is_empty() {
            return None;
        }
        let limit = if self.spoke {
            self.limits.idle_timeout?
        } else {
            self.limits.first_message_timeout?
        };
        Some(self.last_active + limit)
    }

    /// Waits while the client leaves its replies unread or has too many requests open.
    /// False when the session must close (it stayed stalled past the limit).
    async fn backpressure(&mut self) -> bool {
        loop {
            // A dead writer never drains: the session is over, do not wait on it.
            if self.closed.is_cancelled() {
                return false;
            }
            if self.out.queued() > self.limits.max_outbox_bytes {
                let since = *self.stalled_since.get_or_insert_with(Instant::now);
                let left = self.limits.stall_timeout.saturating_sub(since.elapsed());
                if left.is_zero() {
                    tracing::warn!(
                        queued_bytes = self.out.queued(),
                        "closing a session whose client has stopped reading its replies \
                         ([daemon] stall_timeout_seconds)"
                    );
                    return false;
                }
                tokio::select! {
                    _ = self.out.progress() => {}
                    _ = tokio::time::sleep(left.min(Duration::from_millis(100))) => {}
                }
                continue;
            }
            self.stalled_since = None;
            if self.pending.len() < self.limits.max_pending_requests {
                return true;
            }
            // Answers free the room; `receive` is re-polled after each one goes out.
            tokio::select! {
                _ = self.out.progress() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
}

impl<R: AsyncRead + Unpin + Send + 'static> Transport<RoleServer> for SessionTransport<R> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answered = match &item {
            JsonRpcMessage::Response(r) => Some(&r.id),
            JsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        if let Some(id) = answered {
            if self.pending.remove(id) {
                self.touch();
            }
        }
        let pushed = serde_json::to_vec(&item)
            .map_err(std::io::Error::other)
            .and_then(|b| self.out.push(b));
        std::future::ready(pushed)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            if self.closed.is_cancelled() || !self.backpressure().await {
                return None;
            }
            let deadline = self.idle_deadline();
            let read = tokio::select! {
                r = read_line(&mut self.read, &mut self.line, self.limits.max_request_bytes) => r,
                _ = self.closed.cancelled() => return None,
                _ = sleep_until(deadline) => {
                    tracing::info!(
                        spoke = self.spoke,
                        "closing an idle session ([daemon] idle_timeout_seconds)"
                    );
                    return None;
                }
            };
            let line = std::mem::take(&mut self.line);
            match read {
                Err(e) => {
                    tracing::debug!(error = %e, "reading from the client failed");
                    self.closed.cancel();
                    return None;
                }
                Ok(LineRead::Eof) => {
                    // The caller went away: its calls stop now, not after rmcp's drain window.
                    self.closed.cancel();
                    return None;
                }
                Ok(LineRead::Oversized(len)) => {
                    let id = sniff_id(&line.bytes);
                    let msg = format!(
                        "request of {len} bytes exceeds the limit of {} bytes \
                         ([daemon] max_request_bytes)",
                        self.limits.max_request_bytes
                    );
                    self.reply(&framing::error_reply(
                        id.as_ref(),
                        ErrorCode::INVALID_REQUEST,
                        &msg,
                    ));
                    self.touch();
                }
                Ok(LineRead::Line) => {
                    let text = line.bytes.strip_suffix(b"\n").unwrap_or(&line.bytes);
                    match framing::classify(text) {
                        Inbound::Message(m) => {
                            self.spoke = true;
                            self.touch();
                            if let JsonRpcMessage::Request(r) = m.as_ref() {
                                // An id already in flight is refused here, before rmcp sees
                                // it: JSON-RPC ids are unique among open requests, and a
                                // reused one escaped the bound on open requests (it counted
                                // once, while rmcp started a handler for each copy and
                                // dropped all but one answer, so the outbox never filled:
                                // 1.9 GB of handlers waiting to answer, issue 31 item 4).
                                if !self.pending.insert(r.id.clone()) {
                                    let id = serde_json::to_value(&r.id).ok();
                                    self.reply(&framing::error_reply(
                                        id.as_ref(),
                                        ErrorCode::INVALID_REQUEST,
                                        "a request with this id is still in flight: ids must \
                                         be unique among open requests",
                                    ));
                                    continue;
                                }
                            }
                            return Some(*m);
                        }
                        Inbound::KeepAlive => self.touch(),
                        Inbound::McpOnly => {
                            self.mcp_only = true;
                            self.touch();
                        }
                        Inbound::Admin { id, method, params } => {
                            self.spoke = true;
                            self.touch();
                            self.admin(id, method, params);
                        }
                        Inbound::Reject(v) => {
                            self.reply(&v);
                            self.touch();
                        }
                        Inbound::Nothing => {}
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // The writer is finished by the session's owner, which gives it a grace period.
        Ok(())
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_an_oversized_request_is_found_in_its_first_bytes() {
        assert_eq!(
            sniff_id(br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"#),
            Some(Value::from(42))
        );
        assert_eq!(
            sniff_id(br#"{"id" : "abc-1","jsonrpc":"2.0""#),
            Some(Value::from("abc-1"))
        );
        assert_eq!(
            sniff_id(br#"{"jsonrpc":"2.0","method":"x","params":{"#),
            None
        );
    }
}
