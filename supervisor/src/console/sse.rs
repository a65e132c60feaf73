//! Server-sent events: for the Approvals page, an `approvals` event with the waiting calls
//! (as `stsd/approvals/list` gives them to this person) whenever who waits changes; for the
//! Audit page, an `audit` event with the records written since the page was made (as
//! `stsd/audit/list` gives them from the page's offset in the log, its filters applied:
//! each record once, whatever its time). A comment every 15 s keeps the connection open.
//!
//! A stream lives only as long as its session: it ends when the session ends (logged out,
//! idle, too old) or its token is no longer accepted, when the person may no longer read
//! it, or when the page goes. Each holds one of the console's few stream permits.

use super::reply::{Alive, Body};
use crate::call::{Principal, Subject};
use crate::transport::AdminHandler;
use bytes::Bytes;
use http::{header, HeaderValue, Response};
use http_body_util::BodyExt;
use hyper::body::Frame;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// How often a list is looked at, and how often the session is checked again.
const TICK: Duration = Duration::from_millis(250);
const RECHECK: Duration = Duration::from_secs(2);
const KEEPALIVE: Duration = Duration::from_secs(15);

/// A body fed by a channel: each message one chunk.
struct Channel(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b))))
    }
}

/// What a stream is for: one admin read, and what of its answer to send.
trait Feed: Send + 'static {
    fn method(&self) -> &'static str;
    fn params(&self) -> Value;
    /// The event to send for this answer, if any.
    fn event(&mut self, answer: &Value) -> Option<String>;
}

struct Approvals {
    last: Option<String>,
}

impl Feed for Approvals {
    fn method(&self) -> &'static str {
        "stsd/approvals/list"
    }
    fn params(&self) -> Value {
        json!({})
    }
    fn event(&mut self, answer: &Value) -> Option<String> {
        // The ages move every tick; the event is for a change in who waits.
        let ids: Vec<u64> = answer["pending"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["id"].as_u64())
            .collect();
        let key = format!("{ids:?}");
        if self.last.as_deref() == Some(key.as_str()) {
            return None;
        }
        self.last = Some(key);
        Some(format!("event: approvals\ndata: {}\n\n", answer["pending"]))
    }
}

struct Audit {
    filters: Value,
    after: u64,
}

impl Feed for Audit {
    fn method(&self) -> &'static str {
        "stsd/audit/list"
    }
    fn params(&self) -> Value {
        let mut p = self.filters.clone();
        p["after"] = json!(self.after);
        p
    }
    fn event(&mut self, answer: &Value) -> Option<String> {
        if let Some(end) = answer["end"].as_u64() {
            self.after = end;
        }
        let records = answer["records"].as_array().filter(|r| !r.is_empty())?;
        // The id is the log offset: a browser that reconnects sends it back (Last-Event-ID)
        // and the tail goes on from there, sending nothing twice.
        Some(format!(
            "id: {}\nevent: audit\ndata: {}\n\n",
            self.after,
            Value::from(records.clone())
        ))
    }
}

pub fn approvals(
    admin: Arc<dyn AdminHandler>,
    who: Principal,
    alive: Alive,
    permit: OwnedSemaphorePermit,
) -> Response<Body> {
    stream(admin, who, alive, permit, Approvals { last: None })
}

/// The Audit page's live tail from `after`, the log offset the page was made at.
pub fn audit(
    admin: Arc<dyn AdminHandler>,
    who: Principal,
    filters: Value,
    after: u64,
    alive: Alive,
    permit: OwnedSemaphorePermit,
) -> Response<Body> {
    stream(admin, who, alive, permit, Audit { filters, after })
}

fn stream(
    admin: Arc<dyn AdminHandler>,
    who: Principal,
    alive: Alive,
    permit: OwnedSemaphorePermit,
    mut feed: impl Feed,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let _permit = permit;
        let (mut quiet, mut checked) = (Instant::now(), Instant::now());
        loop {
            if checked.elapsed() >= RECHECK {
                if !alive().await {
                    return;
                }
                checked = Instant::now();
            }
            let answer = admin
                .handle(
                    Subject::Principal(who.clone()),
                    feed.method().into(),
                    feed.params(),
                )
                .await;
            let Ok(answer) = answer else { return };
            let message = match feed.event(&answer) {
                Some(m) => Some(m),
                None if quiet.elapsed() >= KEEPALIVE => Some(": keepalive\n\n".to_string()),
                None => None,
            };
            if let Some(m) = message {
                quiet = Instant::now();
                if tx.send(Bytes::from(m)).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = tx.closed() => return,
            }
        }
    });
    let mut r = Response::new(Channel(rx).boxed());
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
