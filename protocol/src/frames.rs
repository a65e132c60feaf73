//! Supervisor <-> worker frames. One frame is one SOCK_SEQPACKET record, bincode-encoded.
//!
//! JSON values travel as JSON text (`*_json: String`): bincode cannot decode self-describing
//! types such as `serde_json::Value`, and the worker hands the text straight to QuickJS's own
//! JSON parser anyway.

use serde::{Deserialize, Serialize};

/// Largest frame either side accepts. Anything bigger is split into chunks by the sender
/// (see [`FromWorker::ResultChunk`]); a peer that sends a bigger record is broken or hostile.
pub const MAX_FRAME_BYTES: usize = 128 * 1024;
/// Result and console payloads are cut into chunks of at most this size.
pub const CHUNK_BYTES: usize = 60 * 1024;

/// The largest job (code, arguments, static variables) the worker accepts, in pieces. Above
/// the daemon's own request limit (16 MiB by default), so any request it accepts fits.
pub const MAX_JOB_BYTES: usize = 64 * 1024 * 1024;

/// What the worker appends to a console line it cut at its length limit; the supervisor
/// masks any start of a secret left just before it.
pub const LINE_TRUNCATED_MARK: &str = " …[line truncated]";

/// What the OS profile grants on the base path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsAccess {
    None,
    ReadOnly,
    WriteOnly,
    ReadWrite,
}

impl FsAccess {
    pub fn from_flags(read: bool, write: bool) -> FsAccess {
        match (read, write) {
            (false, false) => FsAccess::None,
            (true, false) => FsAccess::ReadOnly,
            (false, true) => FsAccess::WriteOnly,
            (true, true) => FsAccess::ReadWrite,
        }
    }

    pub fn can_read(self) -> bool {
        matches!(self, FsAccess::ReadOnly | FsAccess::ReadWrite)
    }

    pub fn can_write(self) -> bool {
        matches!(self, FsAccess::WriteOnly | FsAccess::ReadWrite)
    }
}

/// The OS-level part of a posture: everything the worker needs to confine itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub fs: FsAccess,
    /// Absolute path; the only place Landlock lets the worker touch (when `fs` is not None).
    pub base_path: String,
    /// Switch to this uid/gid when the worker starts as root.
    pub uid: u32,
    pub gid: u32,
    pub network: NetworkGrant,
}

/// Network grant as the worker sees it. The worker never holds a socket in any mode; a grant
/// only means `fetch` is installed and brokered by the supervisor (network egress issue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NetworkGrant {
    Blocked,
    Brokered,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLimits {
    pub timeout_ms: u64,
    pub max_steps: u64,
    pub memory_bytes: u64,
    pub stack_bytes: u64,
    pub max_result_bytes: u64,
    pub max_console_lines: u64,
    pub max_console_bytes: u64,
    /// Bytes a write posture may write in one call (safety.fs writes and copies).
    pub max_write_bytes: u64,
    /// Files and directories a write posture may create in one call.
    pub max_files: u64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            timeout_ms: 30_000,
            max_steps: 5_000_000,
            memory_bytes: 128 * 1024 * 1024,
            stack_bytes: 1024 * 1024,
            max_result_bytes: 1024 * 1024,
            max_console_lines: 1000,
            max_console_bytes: 256 * 1024,
            max_write_bytes: 64 * 1024 * 1024,
            max_files: 1000,
        }
    }
}

/// A posture's seccomp programs, compiled once by the supervisor: BPF instructions packed as
/// `code << 48 | jt << 40 | jf << 32 | k`. The allowlist names the worker's own pid (tgkill)
/// through a placeholder the worker patches before applying it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompBpf {
    pub enosys: Vec<u64>,
    pub allow: Vec<u64>,
    /// What a worker forked from a zygote whose own filter is installed stacks on it instead:
    /// the zygote's filter narrowed to this posture (`os::zygote_filter`), pid placeholder
    /// included. Empty: the worker installs `enosys` and `allow` merged, as an exec'd one does.
    pub narrowing: Vec<u64>,
}

/// The largest [`Bytecode`] (source and bytes) a worker hands on: a quarter of a frame. The
/// supervisor keeps it only if a prime carrying it still fits one (`exec::bodies`).
pub const MAX_BYTECODE_BYTES: usize = MAX_FRAME_BYTES / 4;

/// A tool body's bytecode, written by a worker primed for the tool before any call reached it
/// (see [`Prime::want_bytecode`]), and given to the tool's later workers so that they load it
/// instead of parsing the body again. It only ever goes to workers of the key it was made
/// under (the tool's name and whole posture), and a worker loads it only for the very source
/// it was written from.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bytecode {
    /// The wrapped body ([`Job::wrapped_body`]) it was compiled from.
    pub source: String,
    /// What `JS_WriteObject` wrote (`JS_WRITE_OBJ_BYTECODE`).
    pub bytes: Vec<u8>,
}

/// The lengths, not the bytes (a frame in an error message stays short).
impl std::fmt::Debug for Bytecode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bytecode")
            .field("source_len", &self.source.len())
            .field("bytes_len", &self.bytes.len())
            .finish()
    }
}

/// One call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub call_id: u64,
    /// The spec's JavaScript body.
    pub code: String,
    /// JSON object: argument name -> typed value (already checked against the params).
    pub args_json: String,
    /// JSON object: static variable name -> resolved value.
    pub statics_json: String,
    /// Every declared param and static name; those with no value are bound to `undefined`.
    pub declared: Vec<String>,
    /// The resolved toolSafety block, JSON text (for the record and for helper gating).
    pub tool_safety_json: String,
    pub sandbox: SandboxSpec,
    /// The seccomp programs for `sandbox.fs`; a job without them is refused.
    pub seccomp: SeccompBpf,
    pub limits: JobLimits,
    /// Test builds only (the `attack` feature): a raw-syscall probe run after the profile
    /// is applied instead of the body. Release workers refuse a job that carries one.
    pub attack: Option<String>,
    /// After this job, wait for another of the same posture (worker reuse) instead of exiting.
    /// Each job still gets a fresh QuickJS runtime and context.
    pub keep_alive: bool,
    /// Compile the body and stop (a syntax check for `stsd check`): nothing of it runs.
    pub compile_only: bool,
    /// Calls the worker may serve in all (reuse; 1 without). Read once, when the worker is
    /// confined: its hard CPU limit covers that many calls' budgets.
    pub reuse_calls: u32,
    /// The body's bytecode, when the tool's primed workers made it (see [`Bytecode`]).
    pub bytecode: Option<Bytecode>,
    /// The secrets whose placeholders `statics_json` carries, with their values: the
    /// supervisor's broker substitutes them at egress. Never serialized, so never sent to a
    /// worker (a decoded job has none).
    #[serde(skip)]
    pub withheld: crate::envvar::WithheldSet,
}

impl Job {
    /// What precedes the body on the first line of the function the worker wraps it in:
    /// declared names with no value are `var`-declared there (so they read as `undefined`);
    /// supplied ones are globals. Shared by the worker and by the supervisor, which maps a
    /// syntax error's column on line 1 back to the body.
    pub fn wrapper_prefix(&self) -> String {
        self.wrapper_prefix_with(&json_keys(&self.args_json))
    }

    /// [`Job::wrapper_prefix`] as it would be with these argument names supplied (a primed
    /// worker compiles the body before the call's arguments exist; see [`ToWorker::Prime`]).
    pub fn wrapper_prefix_with(&self, args: &[String]) -> String {
        let mut supplied = args.to_vec();
        supplied.extend(json_keys(&self.statics_json));
        let missing: Vec<&str> = self
            .declared
            .iter()
            .map(String::as_str)
            .filter(|n| crate::validate::is_js_identifier(n) && !supplied.iter().any(|s| s == n))
            .collect();
        if missing.is_empty() {
            "(async function () { ".to_string()
        } else {
            format!("(async function () {{var {}; ", missing.join(", "))
        }
    }

    /// The source a worker compiles: the body inside the wrapper that `prefix` opens.
    pub fn wrapped_body(&self, prefix: &str) -> String {
        format!("{prefix}{}\n}})", self.code)
    }

    /// The names of the arguments this call supplied.
    pub fn arg_names(&self) -> Vec<String> {
        json_keys(&self.args_json)
    }

    /// Whether `other` is this job but for the call's own parts (its id, its arguments, and
    /// what the supervisor decides per call): a worker primed with one may run the other.
    pub fn same_template(&self, other: &Job) -> bool {
        self.code == other.code
            && self.statics_json == other.statics_json
            && self.declared == other.declared
            && self.tool_safety_json == other.tool_safety_json
            && self.sandbox == other.sandbox
            && self.seccomp == other.seccomp
            && self.limits == other.limits
            // The pool primes no test probe (`exec::pool::primable`); the escape suite
            // primes one to run it in a template's child.
            && self.attack == other.attack
            && !self.compile_only
            && !other.compile_only
    }

    /// This job without the call's arguments: what a worker is primed with.
    pub fn template(&self) -> Job {
        Job {
            call_id: 0,
            code: self.code.clone(),
            args_json: "{}".into(),
            statics_json: self.statics_json.clone(),
            declared: self.declared.clone(),
            tool_safety_json: self.tool_safety_json.clone(),
            sandbox: self.sandbox.clone(),
            seccomp: self.seccomp.clone(),
            limits: self.limits.clone(),
            attack: None,
            keep_alive: false,
            compile_only: false,
            reuse_calls: self.reuse_calls,
            bytecode: None,
            withheld: self.withheld.clone(),
        }
    }
}

/// The keys of a JSON object's text (none when it is not one).
fn json_keys(json: &str) -> Vec<String> {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// A worker primed for a tool before its call: confined to the tool's posture, its globals
/// bound and its body compiled, all but the call's arguments (see [`ToWorker::Prime`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prime {
    /// The job without arguments ([`Job::template`]).
    pub job: Job,
    /// The argument names the body is compiled for (every declared param): a call that
    /// supplies others has its body compiled again, on the call path.
    pub expect_args: Vec<String>,
    /// Send the body's bytecode ([`FromWorker::Bytecode`]) before Ready, when it was compiled
    /// from its source here (the supervisor asks until it has it; `job.bytecode` then carries it).
    pub want_bytecode: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToWorker {
    Job(Box<Job>),
    /// A job too large for one frame (large arguments), in pieces: the bincode of the `Job`,
    /// cut into [`CHUNK_BYTES`] parts; `last` closes it. At most [`MAX_JOB_BYTES`] in all.
    JobPart {
        data: Vec<u8>,
        last: bool,
    },
    /// The broker's answer to [`FromWorker::Fetch`]: the head, then the (sliced) body in
    /// [`ToWorker::FetchBody`] chunks, the last one marked.
    FetchHead(Box<FetchHead>),
    FetchBody {
        data: Vec<u8>,
        last: bool,
    },
    /// The request was refused or failed; `code` is a stable error code (SECURITY for a
    /// guard refusal, HELPER_RUNTIME for I/O, INVALID_INPUT for a bad request).
    FetchFailed {
        code: String,
        message: String,
    },
    /// The answer to [`FromWorker::Hmac`]: the MAC, or why there is none.
    HmacDone {
        mac: Vec<u8>,
        error: Option<String>,
    },
    /// Reuse: the supervisor has the call's outcome and keeps the worker; it makes its next
    /// context now (not before: the reply would wait behind it on a busy CPU) and says Ready.
    Continue,
    /// Sent to a fresh worker before its call is known: it applies the posture, binds
    /// everything but the arguments and compiles the body, then says Ready and waits for
    /// [`ToWorker::Go`]. One frame (a template too large for one is not primed).
    Prime(Box<Prime>),
    /// The call a primed worker was primed for: its id and arguments (one frame; a call with
    /// larger arguments goes to a worker that is not primed). Its time starts now.
    Go {
        call_id: u64,
        args_json: String,
        keep_alive: bool,
    },
    /// Sent to a fresh worker instead of a job: it becomes the template of this prime's
    /// posture. It applies the posture's rlimits and Landlock (not `RLIMIT_NPROC` and not the
    /// seccomp narrowing: it must still fork), says Ready, and from then on answers each
    /// [`ToWorker::Fork`] as the zygote answers a fork request. It never runs or parses tool
    /// code; each child it forks stacks the narrowing, forbids new processes, primes itself
    /// with this prime and says Ready (see `worker/src/template.rs`).
    Template(Box<Prime>),
    /// To a template: fork one primed child. The answer is a [`ForkReply`] record (not a
    /// frame) carrying the supervisor's end of the child's socket.
    Fork,
}

/// A tool's `fetch`, as the worker forwards it to the supervisor's broker. A body, when
/// present, went ahead in [`FromWorker::FetchBody`] chunks (`body_len` bytes in all).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    pub url: String,
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub body_len: u64,
    /// Slice of the response body's bytes the tool wants back (reference semantics).
    pub start_index: u64,
    pub max_length: Option<u64>,
}

/// The response's head, as the tool sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchHead {
    pub status: u16,
    pub status_text: String,
    /// The final URL, after redirects.
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// Bytes of body that follow (after slicing).
    pub body_len: u64,
    pub truncated: bool,
    pub next_start_index: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsoleLevel {
    Log,
    Info,
    Warn,
    Error,
    Debug,
}

impl ConsoleLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            ConsoleLevel::Log => "log",
            ConsoleLevel::Info => "info",
            ConsoleLevel::Warn => "warn",
            ConsoleLevel::Error => "error",
            ConsoleLevel::Debug => "debug",
        }
    }
}

/// Where the time of one call went inside the worker, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerTimings {
    pub profile_us: u64,
    pub context_us: u64,
    pub run_us: u64,
    /// The worker's peak resident set so far (getrusage ru_maxrss), KiB.
    pub max_rss_kib: u64,
    /// CPU time (user + system) the call took in the worker, microseconds.
    pub cpu_us: u64,
    /// Bytes the QuickJS heap held when the body ended (JS_ComputeMemoryUsage malloc_size).
    pub heap_bytes: u64,
    /// Page faults (minor, getrusage ru_minflt) while applying the posture, binding the
    /// context and running the body: what a fresh worker pays for its first touches.
    pub faults: [u64; 3],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromWorker {
    /// Sent once when the worker is made, before any job: it is alive and waiting.
    Ready {
        pid: u32,
        /// CPU time this process used to get here (getrusage; a forked worker counts from
        /// the fork, an exec'd one from its own fork and exec), microseconds.
        cpu_us: u64,
    },
    /// The OS profile is in force. Sent once per call, just before the first frame that
    /// follows confinement (console, result, error, fetch), so it costs no wake-up of its own.
    Confined,
    Console {
        level: ConsoleLevel,
        line: String,
    },
    /// Console output went over its caps; later lines are dropped.
    ConsoleTruncated,
    /// A piece of the result's JSON text; `last` closes it.
    ResultChunk {
        data: String,
        last: bool,
    },
    /// The body finished with `undefined` (or `null`).
    ResultUndefined,
    /// The call failed inside the worker, classified (`code` is a stable error code).
    Error {
        code: String,
        message: String,
        stack: Option<String>,
    },
    Timings(WorkerTimings),
    /// A primed worker's compiled body, before its Ready, when the prime asked for it.
    Bytecode(Box<Bytecode>),
    /// A piece of the next fetch's request body.
    FetchBody {
        data: Vec<u8>,
    },
    /// A tool called `fetch`; the worker waits for the broker's answer.
    Fetch(Box<FetchRequest>),
    /// `crypto.subtle.sign` with a key imported from a withheld secret's placeholder: the
    /// supervisor, which holds the value, computes the HMAC ([`ToWorker::HmacDone`]).
    Hmac {
        hash: String,
        placeholder: String,
        data: Vec<u8>,
    },
    /// Attack mode only: a probe's outcome when the process survived it.
    Probe {
        name: String,
        outcome: ProbeOutcome,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeOutcome {
    /// The operation failed with this errno.
    Denied { errno: i32 },
    /// The operation succeeded: the sandbox did not hold.
    Allowed { detail: String },
    /// The probe could not be set up (for example a missing fixture).
    Skipped { why: String },
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("frame decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES} byte limit")]
    TooLarge(usize),
    #[error("trailing bytes after a frame")]
    Trailing,
}

pub fn encode<T: Serialize>(frame: &T) -> Result<Vec<u8>, FrameError> {
    let bytes = bincode::serde::encode_to_vec(frame, config())?;
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(bytes.len()));
    }
    Ok(bytes)
}

pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, FrameError> {
    let (frame, used) = decode_first(bytes)?;
    if used != bytes.len() {
        return Err(FrameError::Trailing);
    }
    Ok(frame)
}

/// The most frames one record from a worker may hold: the two it defers (`Confined`,
/// `Timings`) and the frame they go out with.
pub const MAX_FRAMES_PER_RECORD: u32 = 3;

/// Decodes the first frame of a record that may hold several back to back (a worker sends a
/// frame that needs no answer together with the next one, so it costs no wake-up of its
/// own); returns the frame and the bytes it took. Each frame is bounded like a lone one.
pub fn decode_first<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<(T, usize), FrameError> {
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(bytes.len()));
    }
    let (frame, used) = bincode::serde::decode_from_slice(bytes, config())?;
    if used == 0 {
        return Err(FrameError::Trailing);
    }
    Ok((frame, used))
}

fn job_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_JOB_BYTES>()
}

/// A job as the frames that carry it: one `Job` frame when it fits, else `JobPart`s.
pub fn encode_job(job: &Job) -> Result<Vec<Vec<u8>>, FrameError> {
    let whole = ToWorker::Job(Box::new(job.clone()));
    match encode(&whole) {
        Ok(b) => return Ok(vec![b]),
        Err(FrameError::TooLarge(_)) | Err(FrameError::Encode(_)) => {}
        Err(e) => return Err(e),
    }
    let bytes = bincode::serde::encode_to_vec(job, job_config())?;
    if bytes.len() > MAX_JOB_BYTES {
        return Err(FrameError::TooLarge(bytes.len()));
    }
    let mut out = Vec::new();
    let mut parts = bytes.chunks(CHUNK_BYTES).peekable();
    while let Some(p) = parts.next() {
        out.push(encode(&ToWorker::JobPart {
            data: p.to_vec(),
            last: parts.peek().is_none(),
        })?);
    }
    Ok(out)
}

/// Reads a job from its reassembled `JobPart` bytes.
pub fn decode_job(bytes: &[u8]) -> Result<Job, FrameError> {
    if bytes.len() > MAX_JOB_BYTES {
        return Err(FrameError::TooLarge(bytes.len()));
    }
    let (job, used) = bincode::serde::decode_from_slice(bytes, job_config())?;
    if used != bytes.len() {
        return Err(FrameError::Trailing);
    }
    Ok(job)
}

/// Cuts a message to at most `max` bytes on a character boundary, saying how long it was:
/// what a worker sends must fit a frame, whatever a tool throws.
pub fn clip_message(m: String, max: usize) -> String {
    if m.len() <= max {
        return m;
    }
    let mut cut = max;
    while !m.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} …[{} bytes in all]", &m[..cut], m.len())
}

/// Splits text into chunks of at most [`CHUNK_BYTES`] on UTF-8 boundaries.
pub fn chunks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > CHUNK_BYTES {
        let mut cut = CHUNK_BYTES;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out.push(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            call_id: 7,
            code: "return a + 1".into(),
            args_json: r#"{"a":1}"#.into(),
            statics_json: "{}".into(),
            declared: vec!["a".into(), "b".into()],
            tool_safety_json: "{}".into(),
            sandbox: SandboxSpec {
                fs: FsAccess::ReadOnly,
                base_path: "/srv/x".into(),
                uid: 65534,
                gid: 65534,
                network: NetworkGrant::Blocked,
            },
            seccomp: SeccompBpf::default(),
            limits: JobLimits::default(),
            attack: None,
            keep_alive: false,
            compile_only: false,
            reuse_calls: 1,
            bytecode: None,
            withheld: Default::default(),
        }
    }

    #[test]
    fn frames_round_trip() {
        let f = ToWorker::Job(Box::new(job()));
        let bytes = encode(&f).unwrap_or_default();
        assert_eq!(decode::<ToWorker>(&bytes).ok(), Some(f));
        let e = FromWorker::Error {
            code: "JS_ERROR".into(),
            message: "boom".into(),
            stack: Some("at <anonymous> (tool.js:1)".into()),
        };
        assert_eq!(
            decode::<FromWorker>(&encode(&e).unwrap_or_default()).ok(),
            Some(e)
        );
    }

    #[test]
    fn garbage_and_oversize_are_errors_not_panics() {
        assert!(decode::<ToWorker>(&[0xff; 64]).is_err());
        assert!(decode::<ToWorker>(&[]).is_err());
        assert!(matches!(
            decode::<ToWorker>(&vec![0u8; MAX_FRAME_BYTES + 1]),
            Err(FrameError::TooLarge(_))
        ));
        // A length prefix claiming a huge string must not allocate it.
        let mut evil = vec![0u8, 7];
        evil.extend_from_slice(&[0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode::<ToWorker>(&evil).is_err());
    }

    #[test]
    fn chunks_respect_utf8_and_size() {
        let s = "é".repeat(CHUNK_BYTES);
        let parts = chunks(&s);
        assert!(parts.len() >= 2);
        assert!(parts.iter().all(|p| p.len() <= CHUNK_BYTES));
        assert_eq!(parts.concat(), s);
        assert_eq!(chunks(""), vec![""]);
    }
}

/// The record a zygote sends first, once, when it made a sealed memfd of stsd's code in huge
/// pages (the first zygote; later ones map the memfd they were given): the memfd travels with
/// it (SCM_RIGHTS). The supervisor keeps it and hands it to each
/// zygote it execs later, on [`ZYGOTE_CODE_FD`], which maps it instead of making its own.
pub const ZYGOTE_CODE_OFFER: &[u8] = b"C";

/// The record a zygote sends once it has made everything its workers inherit, just before it
/// takes its first fork request: a zygote started ahead of its predecessor's last fork takes
/// over only once it has said this (the supervisor skips it in a zygote it waits for anyway).
pub const ZYGOTE_READY: &[u8] = b"R";

/// Where a zygote finds the code memfd an earlier zygote offered (see [`ZYGOTE_CODE_OFFER`]).
pub const ZYGOTE_CODE_FD: i32 = 4;

/// The zygote's answer to one fork request: the new worker's pid and the CPU time the fork
/// cost the zygote, or the errno of a failed fork. The supervisor's end of the worker's
/// socket travels with a successful answer (SCM_RIGHTS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkReply {
    pub pid: u32,
    pub errno: u32,
    pub cpu_ns: u64,
}

impl ForkReply {
    /// Encoded size (little-endian pid, errno, cpu_ns).
    pub const BYTES: usize = 16;

    pub fn forked(pid: u32, cpu_ns: u64) -> ForkReply {
        ForkReply {
            pid,
            errno: 0,
            cpu_ns,
        }
    }

    pub fn failed(errno: i32) -> ForkReply {
        ForkReply {
            pid: 0,
            errno: errno.max(1) as u32,
            cpu_ns: 0,
        }
    }

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..8].copy_from_slice(&self.errno.to_le_bytes());
        b[8..].copy_from_slice(&self.cpu_ns.to_le_bytes());
        b
    }

    /// None unless `b` is exactly one encoded reply.
    pub fn decode(b: &[u8]) -> Option<ForkReply> {
        let b: &[u8; Self::BYTES] = b.try_into().ok()?;
        let (pid, rest) = b.split_at(4);
        let (errno, cpu) = rest.split_at(4);
        Some(ForkReply {
            pid: u32::from_le_bytes(pid.try_into().ok()?),
            errno: u32::from_le_bytes(errno.try_into().ok()?),
            cpu_ns: u64::from_le_bytes(cpu.try_into().ok()?),
        })
    }
}
