//! What a call comes to: its value or classified error, its timings, the events it streams,
//! and how a worker's death is classified.

use crate::egress::HopRecord;
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use stsd_protocol::frames::{ConsoleLevel, ProbeOutcome, WorkerTimings};
use stsd_protocol::Code;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallValue {
    Undefined,
    /// The result's JSON text, as the tool's `JSON.stringify` wrote it.
    Json(String),
}

impl CallValue {
    /// The result as a JSON value: `null` for undefined; a lone surrogate (half an emoji)
    /// stays in its strings as the text `\ud83d` (see `stsd_protocol::json::parse_js_json`).
    pub fn to_value(&self) -> Value {
        match self {
            CallValue::Undefined => Value::Null,
            CallValue::Json(t) => stsd_protocol::json::parse_js_json(t).unwrap_or(Value::Null),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub code: Code,
    pub message: String,
    pub stack: Option<String>,
}

impl CallError {
    pub fn new(code: Code, message: impl Into<String>) -> CallError {
        CallError {
            code,
            message: message.into(),
            stack: None,
        }
    }
}

/// Where the time of a call went, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTimings {
    /// spawn() until the worker's Ready frame (fork or exec, and the worker's start).
    pub spawn_us: u64,
    /// CPU time making the worker cost (0 for a reused worker), microseconds.
    pub spawn_cpu_us: u64,
    pub worker: WorkerTimings,
    /// spawn() until the worker was reaped.
    pub total_us: u64,
    /// Records the worker sent during the call: the times it woke the supervisor. A call
    /// that prints nothing takes one (its confinement, timings and result together).
    pub records: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    pub result: Result<CallValue, CallError>,
    pub worker_pid: u32,
    pub console_truncated: bool,
    pub timings: CallTimings,
    /// Attack mode only.
    pub probe: Option<ProbeOutcome>,
    /// Every fetch hop the broker made or refused for this call (for the audit record).
    pub egress: Vec<HopRecord>,
    /// The worker's peak resident set (KiB), as it reported in its Timings frame.
    pub peak_rss_kib: Option<u64>,
    /// Console lines the call wrote (those over the caps included).
    pub console_lines: u64,
    /// The job never reached the worker: it died before the job was sent (while parked, or
    /// making its next context, or being primed), or the send failed. Nothing of the call
    /// ran, so the call may go to another worker. (A worker that dies after its job was
    /// sent may have started it: that call is not repeated.)
    pub undelivered: bool,
}

/// Events streamed while a call runs.
pub enum Event<'a> {
    /// The worker process exists (its pid), before the job is sent.
    Started(u32),
    Console(ConsoleLevel, &'a str),
}

/// Codes a worker may report before it is confined (it failed to confine itself, or refused
/// the job outright).
pub(super) const PRE_CONFINEMENT_CODES: &[Code] = &[Code::SandboxUnavailable, Code::InvalidInput];

pub(super) fn death_cause(status: Option<std::process::ExitStatus>) -> CallError {
    match status {
        Some(s) if s.signal() == Some(libc::SIGSYS) => CallError::new(
            Code::SandboxViolation,
            "the worker made a system call its sandbox forbids and was killed (SIGSYS)",
        ),
        Some(s) if s.signal() == Some(libc::SIGXCPU) => CallError::new(
            Code::Timeout,
            "the worker used up its CPU-time limit (SIGXCPU)",
        ),
        Some(s) => CallError::new(
            Code::WorkerCrashed,
            format!("the worker died mid-call ({s})"),
        ),
        None => CallError::new(Code::WorkerCrashed, "the worker died mid-call"),
    }
}
