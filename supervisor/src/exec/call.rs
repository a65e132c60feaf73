//! One call, supervisor side: spawn, wait for Ready, send the job, read the streamed frames,
//! SIGKILL at the deadline plus a grace period, reap, and classify the outcome.

use super::exchange::{Ending, Exchange, FetchStep};
use super::options::ExecOptions;
use super::outcome::{CallOutcome, CallTimings, Event};
use super::worker::{reap_later, spawn_ready, FrameReader, ReadyWorker, Recv};
use crate::egress::{self, Broker, HopRecord};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{send, MsgFlags};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_protocol::frames::{self, FetchRequest, Job, ToWorker, CHUNK_BYTES, MAX_FRAME_BYTES};
use stsd_protocol::Code;

/// Runs one job in a fresh worker. Never panics on anything the worker does.
pub fn run_job(job: &Job, opts: &ExecOptions, on_event: &mut dyn FnMut(Event<'_>)) -> CallOutcome {
    let t0 = Instant::now();
    match spawn_ready(opts, true) {
        Ok(w) => {
            let mut out = run_on(w, job, opts, None, on_event);
            out.timings.total_us = t0.elapsed().as_micros() as u64;
            out
        }
        Err(e) => CallOutcome {
            result: Err(e),
            worker_pid: 0,
            console_truncated: false,
            timings: CallTimings::default(),
            probe: None,
            egress: Vec::new(),
            peak_rss_kib: None,
            console_lines: 0,
            undelivered: false,
        },
    }
}

/// Runs one job on a ready worker, which is used up by it. `cancel`, when set by another
/// thread, kills the worker and ends the call (the caller went away).
pub fn run_on(
    w: ReadyWorker,
    job: &Job,
    opts: &ExecOptions,
    cancel: Option<&std::sync::atomic::AtomicBool>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> CallOutcome {
    let (out, kept) = run_keeping(w, job, opts, cancel, on_event);
    if let Some(w) = kept {
        reap_later(w);
    }
    out
}

/// Like [`run_on`], but when the job asked for `keep_alive` and ended cleanly (a result, or a
/// JS error), the worker comes back for another call of the same posture. Blocks this thread
/// for the whole call ([`super::inline`] is the async driver of the same exchange).
pub fn run_keeping(
    mut w: ReadyWorker,
    job: &Job,
    opts: &ExecOptions,
    cancel: Option<&std::sync::atomic::AtomicBool>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> (CallOutcome, Option<ReadyWorker>) {
    let mut ex = Exchange::begin(&mut w, job);
    on_event(Event::Started(w.pid()));
    let mut frames_in = FrameReader::new();
    let awaited = w.await_context();
    for b in ex.frames_to_send(awaited) {
        if let Err(e) = send(w.socket.as_raw_fd(), &b, MsgFlags::MSG_NOSIGNAL) {
            ex.send_failed(e);
            break;
        }
    }
    let deadline = ex.deadline(opts.kill_grace);
    let mut fetch = FetchState::default();
    let is_cancelled = || cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed));

    // Frames until the outcome, EOF, or the deadline.
    while ex.open() {
        // Checked before every frame too: a chatty worker never lets the receive time out.
        if is_cancelled() {
            ex.cancelled = true;
            break;
        }
        // Wait in slices so a cancellation is noticed within 50 ms.
        let slice = ex.slice_until(deadline);
        let frame = match frames_in.next(&w.socket, slice) {
            Recv::Frame(f) => f,
            Recv::Eof => break,
            Recv::Unread => {
                ex.closed_unread(frames_in.records);
                break;
            }
            Recv::Timeout if Instant::now() >= deadline => {
                ex.killed_at_deadline = true;
                break;
            }
            Recv::Timeout => {
                ex.slice_passed();
                continue;
            }
            Recv::Broken(e) => {
                ex.protocol_error = Some(e);
                break;
            }
        };
        match ex.on_frame(frame, on_event) {
            None => {}
            Some(FetchStep::Body(data)) => fetch.add_body(&data, &opts.broker),
            Some(FetchStep::Hmac {
                hash,
                placeholder,
                data,
            }) => {
                let (mac, error) =
                    match crate::egress::secrets::hmac(&job.withheld, &hash, &placeholder, &data) {
                        Ok(m) => (m, None),
                        Err(e) => (Vec::new(), Some(e)),
                    };
                if let Err(e) = send_until(&w.socket, &ToWorker::HmacDone { mac, error }, deadline)
                {
                    ex.protocol_error = Some(e);
                }
            }
            Some(FetchStep::Request(req)) => {
                let call_deadline = deadline.checked_sub(opts.kill_grace).unwrap_or(deadline);
                let reply = fetch.run(
                    *req,
                    job,
                    &opts.broker,
                    call_deadline,
                    cancel,
                    &mut ex.out.egress,
                );
                match reply {
                    None => {
                        ex.cancelled = true;
                        break;
                    }
                    Some(reply) => {
                        if let Err(e) = send_fetch_reply(&w.socket, reply, deadline) {
                            ex.protocol_error = Some(e);
                        }
                    }
                }
            }
        }
    }
    // Make sure the worker is gone, or keep it. (Its timings came ahead of the result, in the
    // same record.)
    let (kept, status) = match ex.end(w, frames_in.has_rest()) {
        Ending::Kept(w) => (Some(w), None),
        Ending::Released => (None, None),
        Ending::NeedsStatus(mut w) => (None, w.exit_status_now()),
    };
    let out = ex.finish(status, frames_in.records);
    frames_in.give_back();
    (out, kept)
}

/// Fetch bookkeeping for one call: the pending request body and the tool's policy. (The
/// broker counts requests, from the call's hop records.)
#[derive(Default)]
struct FetchState {
    body: Vec<u8>,
    body_over: bool,
    policy: Option<egress::Policy>,
}

impl FetchState {
    fn add_body(&mut self, data: &[u8], broker: &Broker) {
        if self.body.len() + data.len() > broker.config().max_request_body_bytes as usize {
            // Keep memory bounded; the request is refused when it arrives.
            self.body_over = true;
            self.body = Vec::new();
        } else if !self.body_over {
            self.body.extend_from_slice(data);
        }
    }

    /// Runs one fetch on its own thread while this one watches for the caller going away;
    /// None when it did. The fetch is then aborted: its connection is shut down, so the
    /// thread ends within milliseconds rather than at the request timeout.
    fn run(
        &mut self,
        req: FetchRequest,
        job: &Job,
        broker: &Arc<Broker>,
        deadline: Instant,
        cancel: Option<&std::sync::atomic::AtomicBool>,
        records: &mut Vec<HopRecord>,
    ) -> Option<Result<egress::Response, egress::Failure>> {
        let body = std::mem::take(&mut self.body);
        let over = std::mem::replace(&mut self.body_over, false);
        let policy = self
            .policy
            .get_or_insert_with(|| egress::Policy::from_tool_safety_json(&job.tool_safety_json));
        if over || body.len() as u64 != req.body_len {
            let limit = broker.config().max_request_body_bytes;
            return Some(Err(broker.refuse(
                policy,
                (&req.method, &req.url),
                "request-body-too-large",
                format!(
                    "the request body is over the {limit} byte limit, or not what was announced"
                ),
                records,
            )));
        }
        let request = egress::Request {
            method: req.method,
            url: req.url,
            headers: req.headers,
            body,
            start_index: req.start_index,
            max_length: req.max_length,
            withheld: job.withheld.clone(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (b, p, mut recs) = (broker.clone(), policy.clone(), records.clone());
        let abort = egress::Abort::new();
        let a = abort.clone();
        let spawned = std::thread::Builder::new()
            .name("stsd-fetch".into())
            .spawn(move || {
                let r = b.fetch_abortable(&p, request, deadline, &a, &mut recs);
                let _ = tx.send((r, recs));
            });
        if let Err(e) = spawned {
            return Some(Err(egress::Failure {
                code: Code::HelperRuntime,
                rule: "broker-busy",
                message: format!("[fetch] io: broker-busy: {e}"),
            }));
        }
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok((r, recs)) => {
                    *records = recs;
                    // A failure's text may carry the request's URL, secrets put back (the HTTP
                    // client names it in its errors): the code sees placeholders there too.
                    // (A response's echoes are masked by the broker, before it is sliced.)
                    return Some(r.map_err(|mut f| {
                        f.message = crate::egress::secrets::mask_text(&job.withheld, &f.message);
                        f
                    }));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
                        abort.abort();
                        return None;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Some(Err(egress::Failure {
                        code: Code::HelperRuntime,
                        rule: "broker-failed",
                        message:
                            "[fetch] io: broker-failed: the request thread ended without an answer"
                                .into(),
                    }));
                }
            }
        }
    }
}

/// Sends one frame without blocking past `until` (a worker that stops reading cannot hold
/// the supervisor).
fn send_until(sock: &impl AsFd, frame: &ToWorker, until: Instant) -> Result<(), String> {
    let bytes = frames::encode(frame).map_err(|e| e.to_string())?;
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(format!("a {} byte frame to the worker", bytes.len()));
    }
    loop {
        match send(
            sock.as_fd().as_raw_fd(),
            &bytes,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {
                let now = Instant::now();
                if now >= until {
                    return Err("the worker stopped reading its fetch answer".into());
                }
                let ms = (until - now).as_millis().min(1000) as i32;
                let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLOUT)];
                let _ = poll(
                    &mut fds,
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
                );
            }
            Err(e) => return Err(format!("send: {e}")),
        }
    }
}

/// The broker's answer as frames: head and body chunks, or the failure.
fn send_fetch_reply(
    sock: &impl AsFd,
    reply: Result<egress::Response, egress::Failure>,
    until: Instant,
) -> Result<(), String> {
    let resp = match reply {
        Ok(r) => r,
        Err(f) => {
            let frame = ToWorker::FetchFailed {
                code: f.code.as_str().into(),
                message: f.message,
            };
            return send_until(sock, &frame, until);
        }
    };
    let head = ToWorker::FetchHead(Box::new(resp.head));
    if frames::encode(&head).map_or(true, |b| b.len() > MAX_FRAME_BYTES) {
        let frame = ToWorker::FetchFailed {
            code: Code::HelperRuntime.as_str().into(),
            message:
                "[fetch] io: response-head-too-large: the response's URL and headers do not fit"
                    .into(),
        };
        return send_until(sock, &frame, until);
    }
    send_until(sock, &head, until)?;
    let mut chunks = resp.body.chunks(CHUNK_BYTES).peekable();
    if chunks.peek().is_none() {
        return send_until(
            sock,
            &ToWorker::FetchBody {
                data: Vec::new(),
                last: true,
            },
            until,
        );
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        send_until(
            sock,
            &ToWorker::FetchBody {
                data: c.to_vec(),
                last,
            },
            until,
        )?;
    }
    Ok(())
}
