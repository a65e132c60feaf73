//! Server-sent events: for the Approvals page, an `approvals` event with the waiting calls
//! (as `stsd/approvals/list` gives them to this person) whenever that list changes; for the
//! Audit page, an `audit` event with the records written since the page was made (as
//! `stsd/audit/list` gives them, its filters applied). A comment every 15 s keeps the
//! connection open. A stream ends when the person may no longer read it or the page goes.

use super::reply::Body;
use crate::call::Principal;
use crate::call::Subject;
use crate::transport::AdminHandler;
use bytes::Bytes;
use http::{header, HeaderValue, Response};
use http_body_util::BodyExt;
use hyper::body::Frame;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// How often the list is looked at.
const TICK: Duration = Duration::from_millis(250);
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

/// The Audit page's live tail: records newer than those the page showed (`since`: the
/// newest one's time, and how many it showed of that millisecond), oldest first, each once.
pub fn audit(
    admin: Arc<dyn AdminHandler>,
    who: Principal,
    mut filters: serde_json::Value,
    since: (i64, usize),
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    filters["limit"] = serde_json::json!(200);
    tokio::spawn(async move {
        // Records of the newest millisecond already sent (several can share one).
        let (mut newest, mut sent_at_newest) = since;
        let mut quiet = std::time::Instant::now();
        loop {
            let list = admin
                .handle(
                    Subject::Principal(who.clone()),
                    "stsd/audit/list".into(),
                    filters.clone(),
                )
                .await;
            let Ok(list) = list else { return };
            let mut fresh: Vec<serde_json::Value> = list["records"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["ts"].as_i64().is_some_and(|t| t >= newest))
                .cloned()
                .collect();
            fresh.reverse();
            let at_newest = fresh
                .iter()
                .filter(|r| r["ts"].as_i64() == Some(newest))
                .count();
            // Those at `newest` that were sent already are the first ones.
            let skip = sent_at_newest.min(at_newest);
            let new: Vec<serde_json::Value> = fresh.into_iter().skip(skip).collect();
            let message = if let Some(last) = new.last().and_then(|r| r["ts"].as_i64()) {
                let same = new
                    .iter()
                    .filter(|r| r["ts"].as_i64() == Some(last))
                    .count();
                sent_at_newest = if last == newest {
                    sent_at_newest + same
                } else {
                    same
                };
                newest = last;
                Some(format!(
                    "event: audit\ndata: {}\n\n",
                    serde_json::Value::from(new)
                ))
            } else if quiet.elapsed() >= KEEPALIVE {
                Some(": keepalive\n\n".to_string())
            } else {
                None
            };
            if let Some(m) = message {
                quiet = std::time::Instant::now();
                if tx.send(Bytes::from(m)).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK * 2) => {}
                _ = tx.closed() => return,
            }
        }
    });
    stream(rx)
}

fn stream(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = Response::new(Channel(rx).boxed());
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

pub fn approvals(admin: Arc<dyn AdminHandler>, who: Principal) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let mut last = String::new();
        let mut quiet = std::time::Instant::now();
        loop {
            let list = admin
                .handle(
                    Subject::Principal(who.clone()),
                    "stsd/approvals/list".into(),
                    serde_json::json!({}),
                )
                .await;
            let Ok(list) = list else { return };
            // The ages move every tick; the event is for a change in who waits.
            let ids: Vec<u64> = list["pending"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["id"].as_u64())
                .collect();
            let key = format!("{ids:?}");
            let message = if key != last {
                last = key;
                Some(format!("event: approvals\ndata: {}\n\n", list["pending"]))
            } else if quiet.elapsed() >= KEEPALIVE {
                Some(": keepalive\n\n".to_string())
            } else {
                None
            };
            if let Some(m) = message {
                quiet = std::time::Instant::now();
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
    stream(rx)
}
