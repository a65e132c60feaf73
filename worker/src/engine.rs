//! One call in QuickJS: a fresh runtime and context with a memory limit, a stack limit and an
//! interrupt handler for the deadline and the step budget; the body runs as the body of an
//! async function; the outcome is classified.
//!
//! A *step* is one QuickJS poll point: a JS function call or a backward jump (a loop
//! iteration). QuickJS calls the interrupt handler once every 10,000 poll points, so the budget
//! is enforced in units of 10,000 steps. Single C builtins (`Array.prototype.join` on a huge
//! array) poll nothing; the supervisor's SIGKILL at the deadline covers them.

use crate::channel::Channel;
use crate::console::{self, ConsoleState};
use rquickjs::context::{intrinsic, EvalOptions};
use rquickjs::promise::PromiseState;
use rquickjs::{
    CatchResultExt, CaughtError, Context, Ctx, Function, Object, Promise, Runtime, Value,
};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;
use stsd_protocol::frames::{self, FromWorker, Job};
use stsd_protocol::Code;

/// Poll points between two interrupt-handler calls in QuickJS-NG (JS_INTERRUPT_COUNTER_INIT).
pub const STEPS_PER_TICK: u64 = 10_000;

/// The engine's builtins a tool gets: no module loader, no std/os, no bytecode loading.
type Intrinsics = (
    intrinsic::Date,
    intrinsic::Eval,
    intrinsic::RegExpCompiler,
    intrinsic::RegExp,
    intrinsic::Json,
    intrinsic::Proxy,
    intrinsic::MapSet,
    intrinsic::TypedArrays,
    intrinsic::Promise,
    intrinsic::WeakRef,
    intrinsic::DOMException,
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Deadline,
    Steps,
    Console,
}

/// A classified failure inside the worker.
pub struct Failure {
    pub code: Code,
    pub message: String,
    pub stack: Option<String>,
}

impl Failure {
    /// Stands in for a warm engine that has been taken.
    pub fn placeholder() -> Failure {
        Failure::new(Code::WorkerCrashed, "no warm engine")
    }

    fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            stack: None,
        }
    }
}

/// What a successful body returned.
pub enum Returned {
    Undefined,
    Json(String),
}

/// A runtime and context made before the job is known (nothing of any tool is in them yet);
/// limits, handlers and globals are set when the job arrives.
pub struct Warm {
    // Field order matters: the context must drop before the runtime.
    context: Context,
    runtime: Runtime,
}

impl Warm {
    pub fn new() -> Result<Warm, Failure> {
        let runtime = Runtime::new()
            .map_err(|e| Failure::new(Code::WorkerCrashed, format!("QuickJS runtime: {e}")))?;
        let context = Context::custom::<Intrinsics>(&runtime)
            .map_err(|e| Failure::new(Code::WorkerCrashed, format!("QuickJS context: {e}")))?;
        // The always-available globals do not depend on the job: installed before Ready.
        context
            .with(|ctx| crate::globals::install(&ctx))
            .map_err(|e| Failure::new(Code::WorkerCrashed, format!("runtime globals: {e}")))?;
        Ok(Warm { context, runtime })
    }
}

pub struct Engine {
    // Field order matters: the context must drop before the runtime.
    context: Context,
    _runtime: Runtime,
    stop: Rc<Cell<Option<Stop>>>,
    console_over: Rc<Cell<bool>>,
    limits: stsd_protocol::frames::JobLimits,
}

impl Engine {
    /// Sets a warm runtime up for `job`. `deadline` is the absolute end of the call.
    pub fn bind(
        warm: Warm,
        job: &Job,
        deadline: Instant,
        channel: &Rc<Channel>,
    ) -> Result<Engine, Failure> {
        let l = &job.limits;
        let Warm {
            context,
            runtime: rt,
        } = warm;
        rt.set_memory_limit(l.memory_bytes as usize);
        crate::globals::set_memory_budget(l.memory_bytes as usize);
        rt.set_max_stack_size(l.stack_bytes as usize);
        let stop: Rc<Cell<Option<Stop>>> = Rc::new(Cell::new(None));
        let console_over = Rc::new(Cell::new(false));
        let ticks = Cell::new(0u64);
        let max_ticks = l.max_steps.div_ceil(STEPS_PER_TICK).max(1);
        let (s, over) = (stop.clone(), console_over.clone());
        rt.set_interrupt_handler(Some(Box::new(move || {
            if s.get().is_some() {
                return true;
            }
            if over.get() {
                s.set(Some(Stop::Console));
                return true;
            }
            ticks.set(ticks.get() + 1);
            if ticks.get() > max_ticks {
                s.set(Some(Stop::Steps));
            } else if Instant::now() >= deadline {
                s.set(Some(Stop::Deadline));
            }
            s.get().is_some()
        })));
        let console = ConsoleState::new(
            channel.clone(),
            console_over.clone(),
            l.max_console_lines,
            l.max_console_bytes,
        );
        context
            .with(|ctx| -> rquickjs::Result<()> {
                crate::globals::install_math_random(&ctx)?;
                console::install(&ctx, &console)?;
                let fs = job.sandbox.fs;
                if fs != stsd_protocol::frames::FsAccess::None {
                    crate::globals::install_fs(
                        &ctx,
                        &job.sandbox.base_path,
                        fs.can_read(),
                        fs.can_write(),
                        crate::globals::fs::WriteBudget::new(l.max_write_bytes, l.max_files),
                    )?;
                }
                if job.sandbox.network == stsd_protocol::frames::NetworkGrant::Brokered {
                    crate::globals::install_fetch(&ctx, channel.clone())?;
                }
                bind_globals(&ctx, job)
            })
            .map_err(|e| Failure::new(Code::InvalidInput, format!("binding arguments: {e}")))?;
        Ok(Engine {
            context,
            _runtime: rt,
            stop,
            console_over,
            limits: l.clone(),
        })
    }

    /// Runs the body to completion (every pending job drained) and classifies the outcome.
    pub fn run(&self, job: &Job) -> Result<Returned, Failure> {
        let source = wrap(&job.code, job);
        self.context.with(|ctx| {
            if job.compile_only {
                let mut opts = EvalOptions::default();
                opts.global = true;
                opts.strict = false;
                opts.filename = Some("tool.js".into());
                return match ctx.eval_with_options::<Value, _>(source, opts).catch(&ctx) {
                    Ok(_) => Ok(Returned::Undefined),
                    Err(e) => Err(classify(e)),
                };
            }
            let outcome = run_in(&ctx, &source, &self.stop);
            // A limit hit wins over whatever error surfaced because of it. Console output over
            // its caps fails the call even when the body finished before the next poll point.
            if self.console_over.get() && self.stop.get().is_none() {
                self.stop.set(Some(Stop::Console));
            }
            if let Some(stop) = self.stop.get() {
                return Err(self.stop_failure(stop));
            }
            match outcome {
                Ok(v) => serialize(&ctx, v, self.limits.max_result_bytes),
                Err(e) => Err(missing_grant_hint(classify(e), job)),
            }
        })
    }

    /// What the QuickJS heap holds now.
    pub fn heap_bytes(&self) -> u64 {
        self._runtime.memory_usage().malloc_size.max(0) as u64
    }

    fn stop_failure(&self, stop: Stop) -> Failure {
        match stop {
            Stop::Deadline => Failure::new(
                Code::Timeout,
                format!("execution timed out after {} ms", self.limits.timeout_ms),
            ),
            Stop::Console => Failure::new(
                Code::OutputLimit,
                format!(
                    "console output went over its caps ({} lines or {} bytes)",
                    self.limits.max_console_lines, self.limits.max_console_bytes
                ),
            ),
            Stop::Steps => Failure::new(
                Code::StepLimit,
                format!(
                    "execution exceeded its budget of {} steps (a step is a JS function call or loop iteration)",
                    self.limits.max_steps
                ),
            ),
        }
    }
}

/// The body becomes the body of an async function, on the wrapper's first line so that line
/// numbers in stacks are the body's own (see [`Job::wrapper_prefix`]).
fn wrap(code: &str, job: &Job) -> String {
    format!("{}{code}\n}})", job.wrapper_prefix())
}

fn bind_globals(ctx: &Ctx<'_>, job: &Job) -> rquickjs::Result<()> {
    let globals = ctx.globals();
    // Params first, then static variables: a static value wins on a name clash, as the
    // reference runtime does.
    for json in [&job.args_json, &job.statics_json] {
        let v: Value = ctx.json_parse(json.as_bytes())?;
        if let Some(obj) = v.as_object() {
            for key in obj.keys::<String>() {
                let key = key?;
                let value: Value = obj.get(&key)?;
                globals.set(key, value)?;
            }
        }
    }
    Ok(())
}

fn run_in<'js>(
    ctx: &Ctx<'js>,
    source: &str,
    stop: &Cell<Option<Stop>>,
) -> Result<Value<'js>, CaughtError<'js>> {
    let mut opts = EvalOptions::default();
    opts.global = true;
    opts.strict = false;
    opts.filename = Some("tool.js".into());
    let f: Function = ctx.eval_with_options(source, opts).catch(ctx)?;
    let p: Promise = f.call(()).catch(ctx)?;
    // Once a limit has stopped the body, no further job runs: many microtask chains must not
    // each get their own slice of CPU until the deadline.
    while p.state() == PromiseState::Pending && stop.get().is_none() && ctx.execute_pending_job() {}
    match p.result::<Value>() {
        Some(r) => r.catch(ctx),
        None => Err(CaughtError::Error(rquickjs::Error::WouldBlock)),
    }
}

fn serialize<'js>(ctx: &Ctx<'js>, v: Value<'js>, max: u64) -> Result<Returned, Failure> {
    if v.is_undefined() || v.is_null() {
        return Ok(Returned::Undefined);
    }
    let text = match ctx.json_stringify(v).catch(ctx) {
        Ok(Some(s)) => s
            .to_string()
            .map_err(|e| Failure::new(Code::JsError, e.to_string()))?,
        Ok(None) => return Ok(Returned::Undefined),
        Err(e) => {
            let f = classify(e);
            return Err(Failure::new(
                f.code,
                format!("the result is not JSON-serialisable: {}", f.message),
            ));
        }
    };
    if text.len() as u64 > max {
        return Err(Failure::new(
            Code::OutputLimit,
            format!(
                "the result is {} bytes, over the {} byte limit",
                text.len(),
                max
            ),
        ));
    }
    Ok(Returned::Json(text))
}

/// A tool without a grant sees no `fetch` and no `safety.fs`, exactly as the reference
/// runtime (so `typeof fetch` stays honest); when that is why it failed, the message says
/// which grant is missing instead of leaving a bare ReferenceError or TypeError.
fn missing_grant_hint(mut f: Failure, job: &Job) -> Failure {
    if f.code != Code::JsError {
        return f;
    }
    let blocked = job.sandbox.network == stsd_protocol::frames::NetworkGrant::Blocked;
    let no_fs = job.sandbox.fs == stsd_protocol::frames::FsAccess::None;
    let m = &f.message;
    let hint = if blocked && m.starts_with("ReferenceError:") && m.contains("fetch") {
        Some("fetch needs sandboxOverrides.networkMode allowlist, strict or open; this tool's posture blocks the network")
    } else if no_fs
        && m.starts_with("TypeError:")
        && m.contains("undefined")
        && job.code.contains("safety.fs")
    {
        Some("safety.fs needs sandboxOverrides.fileRead or fileWrite; this tool's posture grants no file access")
    } else {
        None
    };
    if let Some(h) = hint {
        f.message = format!("{} ({h})", f.message);
    }
    f
}

fn classify(e: CaughtError<'_>) -> Failure {
    match e {
        CaughtError::Exception(ex) => {
            let obj: &Object = ex.as_object();
            let name: String = obj.get("name").unwrap_or_else(|_| "Error".into());
            let message = ex.message().unwrap_or_default();
            if name == "InternalError" && message.contains("out of memory") {
                return Failure::new(Code::MemoryLimit, "the tool exceeded its memory limit");
            }
            // Errors thrown by the safety.* helpers carry their class in the name.
            let helper = match name.as_str() {
                "SecurityError" => Some(Code::Security),
                "InvalidInputError" => Some(Code::InvalidInput),
                "OutputLimitError" => Some(Code::OutputLimit),
                "MemoryLimitError" => Some(Code::MemoryLimit),
                "HelperRuntimeError" => Some(Code::HelperRuntime),
                _ => None,
            };
            if let Some(code) = helper {
                return Failure {
                    code,
                    message,
                    stack: ex.stack().filter(|s| !s.is_empty()),
                };
            }
            Failure {
                code: Code::JsError,
                message: format!("{name}: {message}"),
                stack: ex.stack().filter(|s| !s.is_empty()),
            }
        }
        CaughtError::Value(v) => {
            let text = v
                .as_string()
                .and_then(|s| s.to_string().ok())
                .or_else(|| {
                    v.ctx()
                        .json_stringify(v.clone())
                        .ok()
                        .flatten()
                        .and_then(|s| s.to_string().ok())
                })
                .unwrap_or_else(|| format!("{:?}", v.type_of()));
            Failure::new(Code::JsError, format!("Uncaught {text}"))
        }
        CaughtError::Error(rquickjs::Error::WouldBlock) => Failure::new(
            Code::JsError,
            "the tool's promise never settled (it awaits something that never resolves)",
        ),
        CaughtError::Error(e) => Failure::new(Code::JsError, e.to_string()),
    }
}

/// Sends a successful result, in chunks.
pub fn send_result(channel: &Channel, r: &Returned) -> Result<(), String> {
    match r {
        Returned::Undefined => channel.send(&FromWorker::ResultUndefined),
        Returned::Json(text) => {
            let parts = frames::chunks(text);
            let n = parts.len();
            for (i, part) in parts.into_iter().enumerate() {
                channel.send(&FromWorker::ResultChunk {
                    data: part.to_string(),
                    last: i + 1 == n,
                })?;
            }
            Ok(())
        }
    }
}
