//! One call in QuickJS: a fresh runtime and context with a memory limit, a stack limit and an
//! interrupt handler for the deadline and the step budget; the body runs as the body of an
//! async function; the outcome is classified.
//!
//! A *step* is one QuickJS poll point: a function call (JS or builtin) or a jump (a loop
//! iteration, an `else`, a `break`). QuickJS cannot count statements, which is what the
//! reference runtime limits (500,000); the default budget (5,000,000) is set so that code the
//! reference accepts passes (tests/js_limits.rs measures the ratio on real loops). QuickJS calls
//! the interrupt handler once every 10,000 poll points, so the budget is enforced in units of
//! 10,000 steps. Single C builtins (`Array.prototype.join` on a huge
//! array) poll nothing; the supervisor's SIGKILL at the deadline covers them.

use crate::channel::Channel;
use crate::console::{self, ConsoleState};
use rquickjs::context::intrinsic;
use rquickjs::promise::PromiseState;
use rquickjs::{
    CatchResultExt, CaughtError, Context, Ctx, FromJs, Function, Object, Persistent, Promise,
    Runtime, Value,
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
    /// The call's console caps and channel, for the console installed here.
    console: console::ConsoleSlot,
    /// Math.random's state, for the Math.random installed here.
    random: crate::globals::RandomState,
    /// The runtime's allocator's count: the call's memory limit is enforced there.
    meter: Rc<crate::heap::Meter>,
}

impl Warm {
    pub fn new() -> Result<Warm, Failure> {
        let meter = Rc::new(crate::heap::Meter::default());
        let runtime = Runtime::new_with_alloc(crate::heap::Metered(meter.clone()))
            .map_err(|e| Failure::new(Code::WorkerCrashed, format!("QuickJS runtime: {e}")))?;
        let context = Context::custom::<Intrinsics>(&runtime)
            .map_err(|e| Failure::new(Code::WorkerCrashed, format!("QuickJS context: {e}")))?;
        // The always-available globals do not depend on the job: installed before Ready. So
        // are the console and Math.random, whose per-call state (the call's caps, a fresh
        // seed) the call's engine sets (see `Engine::prepare`).
        let console = console::ConsoleSlot::default();
        let random = crate::globals::RandomState::default();
        context
            .with(|ctx| -> rquickjs::Result<()> {
                crate::globals::install(&ctx)?;
                crate::globals::install_math_random(&ctx, &random)?;
                console::install(&ctx, &console)
            })
            .map_err(|e| Failure::new(Code::WorkerCrashed, format!("runtime globals: {e}")))?;
        Ok(Warm {
            context,
            runtime,
            console,
            random,
            meter,
        })
    }

    /// Loads the parts of Intl that `code` names into this context ahead of any job
    /// (`globals::preload_intl`: stsd's own code; nothing of the tool runs), under the job's
    /// memory limit as a priming child would (a part that does not fit is not kept, and is
    /// loaded by a call that touches it). A template does it once, and every child it forks
    /// inherits Intl loaded instead of loading it as it primes.
    pub fn preload_intl(&self, code: &str, memory_bytes: u64) {
        self.meter.set_limit(memory_bytes as usize);
        crate::globals::set_memory_budget(memory_bytes as usize);
        self.context
            .with(|ctx| crate::globals::preload_intl(&ctx, code));
    }
}

pub struct Engine {
    // Field order matters: the context (and the compiled body in it) must drop before the
    // runtime.
    compiled: std::cell::RefCell<Option<Compiled>>,
    context: Context,
    _runtime: Runtime,
    stop: Rc<Cell<Option<Stop>>>,
    console_over: Rc<Cell<bool>>,
    /// The absolute end of the call: set when the call starts (a primed engine is made before).
    deadline: Rc<Cell<Instant>>,
    /// Interrupt-handler calls so far (the step budget), counted from the call's start.
    ticks: Rc<Cell<u64>>,
    limits: stsd_protocol::frames::JobLimits,
    meter: Rc<crate::heap::Meter>,
}

/// A body compiled ahead of its call (a primed worker), with the wrapper prefix it was
/// compiled with: the call runs it only when its own arguments give the same prefix.
struct Compiled {
    prefix: String,
    function: Persistent<Function<'static>>,
}

impl Engine {
    /// Sets a warm runtime up for `job`, arguments included. `deadline` is the absolute end
    /// of the call.
    pub fn bind(
        warm: Warm,
        job: &Job,
        deadline: Instant,
        channel: &Rc<Channel>,
    ) -> Result<Engine, Failure> {
        let engine = Engine::prepare(warm, job, deadline, channel)?;
        engine.bind_json(&[&job.args_json, &job.statics_json], &[])?;
        Ok(engine)
    }

    /// A primed engine: everything of `prime.job` but the arguments, its static variables
    /// bound, the parts of Intl its code names loaded, and its body compiled for
    /// `prime.expect_args`. Nothing of the body runs.
    pub fn prime(
        warm: Warm,
        prime: &stsd_protocol::frames::Prime,
        channel: &Rc<Channel>,
    ) -> Result<Engine, Failure> {
        let job = &prime.job;
        // Until the call starts, the deadline is the template's own timeout from now: it
        // bounds the Intl preload (stsd's own code) and a pathological parse; the call's
        // budgets start afresh at `start`.
        let until = Instant::now() + std::time::Duration::from_millis(job.limits.timeout_ms);
        let engine = Engine::prepare(warm, job, until, channel)?;
        engine
            .context
            .with(|ctx| crate::globals::preload_intl(&ctx, &job.code));
        engine.bind_json(&[&job.statics_json], &[])?;
        let prefix = job.wrapper_prefix_with(&prime.expect_args);
        let source = job.wrapped_body(&prefix);
        if let Some(b) = &job.bytecode {
            crate::body::offer_bytecode(b);
        }
        // A body that does not compile is not an error yet: the call compiles it again and
        // gets the error in the usual way. Asked for its bytecode, the worker keeps it (a
        // compile that writes it, as a reused worker's does), for `body::take_kept`.
        let compiled = engine.context.with(|ctx| {
            compile(&ctx, source, prime.want_bytecode)
                .ok()
                .map(|f| Persistent::save(&ctx, f))
        });
        *engine.compiled.borrow_mut() = compiled.map(|function| Compiled { prefix, function });
        Ok(engine)
    }

    /// A primed engine's call starts: its deadline, and its arguments bound (a name that is
    /// also a static variable keeps the static's value, as [`Engine::bind`] does).
    pub fn start(&self, job: &Job, deadline: Instant) -> Result<(), Failure> {
        // The call's budgets start now, whatever the priming used or tripped (a body that
        // breaks out of its wrapper runs code as it is compiled).
        self.deadline.set(deadline);
        self.ticks.set(0);
        self.stop.set(None);
        self.console_over.set(false);
        self.meter.set_limit(self.limits.memory_bytes as usize);
        let statics = self.context.with(|ctx| -> rquickjs::Result<Vec<String>> {
            let v: Value = ctx.json_parse(job.statics_json.as_bytes())?;
            match v.as_object() {
                Some(o) => o.keys::<String>().collect(),
                None => Ok(Vec::new()),
            }
        });
        let statics = statics
            .map_err(|e| Failure::new(Code::InvalidInput, format!("binding arguments: {e}")))?;
        self.bind_json(&[&job.args_json], &statics)
    }

    /// Limits, handlers and the posture's globals: all of a call but its arguments.
    fn prepare(
        warm: Warm,
        job: &Job,
        deadline: Instant,
        channel: &Rc<Channel>,
    ) -> Result<Engine, Failure> {
        let l = &job.limits;
        let Warm {
            context,
            runtime: rt,
            console,
            random,
            meter,
        } = warm;
        // Not QuickJS's own limit: see `heap` for why the allocator enforces it.
        meter.set_limit(l.memory_bytes as usize);
        crate::globals::set_memory_budget(l.memory_bytes as usize);
        rt.set_max_stack_size(l.stack_bytes as usize);
        let stop: Rc<Cell<Option<Stop>>> = Rc::new(Cell::new(None));
        let console_over = Rc::new(Cell::new(false));
        let deadline = Rc::new(Cell::new(deadline));
        let ticks = Rc::new(Cell::new(0u64));
        let max_ticks = l.max_steps.div_ceil(STEPS_PER_TICK).max(1);
        let (s, over, end, t) = (
            stop.clone(),
            console_over.clone(),
            deadline.clone(),
            ticks.clone(),
        );
        rt.set_interrupt_handler(Some(Box::new(move || {
            if s.get().is_some() {
                return true;
            }
            if over.get() {
                s.set(Some(Stop::Console));
                return true;
            }
            t.set(t.get() + 1);
            if t.get() > max_ticks {
                s.set(Some(Stop::Steps));
            } else if Instant::now() >= end.get() {
                s.set(Some(Stop::Deadline));
            }
            s.get().is_some()
        })));
        console.fill(ConsoleState::new(
            channel.clone(),
            console_over.clone(),
            l.max_console_lines,
            l.max_console_bytes,
        ));
        crate::globals::seed_math_random(&random)
            .map_err(|e| Failure::new(Code::WorkerCrashed, format!("Math.random: {e}")))?;
        context
            .with(|ctx| -> rquickjs::Result<()> {
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
                Ok(())
            })
            .map_err(|e| Failure::new(Code::InvalidInput, format!("binding arguments: {e}")))?;
        Ok(Engine {
            compiled: std::cell::RefCell::new(None),
            context,
            _runtime: rt,
            stop,
            console_over,
            deadline,
            ticks,
            limits: l.clone(),
            meter,
        })
    }

    /// Binds each JSON object's members as globals, in order (a later one wins), except the
    /// names in `skip`.
    fn bind_json(&self, objects: &[&str], skip: &[String]) -> Result<(), Failure> {
        self.context
            .with(|ctx| bind_globals(&ctx, objects, skip))
            .map_err(|e| Failure::new(Code::InvalidInput, format!("binding arguments: {e}")))
    }

    /// Runs the body to completion (every pending job drained) and classifies the outcome.
    pub fn run(&self, job: &Job) -> Result<Returned, Failure> {
        let prefix = job.wrapper_prefix();
        let compiled = self.compiled.borrow_mut().take();
        self.context.with(|ctx| {
            if job.compile_only {
                let source = job.wrapped_body(&prefix);
                return match compile(&ctx, source, false) {
                    Ok(_) => Ok(Returned::Undefined),
                    Err(e) => Err(classify(e, self.meter.refused())),
                };
            }
            // Compiled ahead (a primed worker) for the arguments this call supplied, or now.
            let f = match compiled {
                Some(c) if c.prefix == prefix => c.function.restore(&ctx).catch(&ctx),
                _ => {
                    if let Some(b) = &job.bytecode {
                        crate::body::offer_bytecode(b);
                    }
                    compile(&ctx, job.wrapped_body(&prefix), job.keep_alive)
                }
            };
            let outcome = f.and_then(|f| run_in(&ctx, f, &self.stop));
            // A limit hit wins over whatever error surfaced because of it. Console output over
            // its caps fails the call even when the body finished before the next poll point.
            if self.console_over.get() && self.stop.get().is_none() {
                self.stop.set(Some(Stop::Console));
            }
            if let Some(stop) = self.stop.get() {
                return Err(self.stop_failure(stop));
            }
            match outcome {
                Ok(v) => serialize(&ctx, v, self.limits.max_result_bytes, &self.meter),
                Err(e) => Err(missing_grant_hint(classify(e, self.meter.refused()), job)),
            }
        })
    }

    /// What the QuickJS heap holds now.
    pub fn heap_bytes(&self) -> u64 {
        self.context.with(|ctx| malloc_size(&ctx))
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
                    "execution exceeded its budget of {} steps (a step is a function call or a loop iteration, `[baseline] max_steps`)",
                    self.limits.max_steps
                ),
            ),
        }
    }
}

/// The body becomes the body of an async function, on the wrapper's first line so that line
/// numbers in stacks are the body's own (see [`Job::wrapper_prefix`]). `source` is the whole
/// wrapped text; evaluating it only makes the function.
/// `keep`: this worker serves another call after this one, which may load the body from
/// bytecode (see `body.rs`).
fn compile<'js>(
    ctx: &Ctx<'js>,
    source: String,
    keep: bool,
) -> Result<Function<'js>, CaughtError<'js>> {
    crate::body::eval(ctx, source, c"tool.js", keep)
        .and_then(|v| v.get())
        .catch(ctx)
}

fn bind_globals(ctx: &Ctx<'_>, objects: &[&str], skip: &[String]) -> rquickjs::Result<()> {
    let globals = ctx.globals();
    // Params first, then static variables: a static value wins on a name clash, as the
    // reference runtime does.
    for json in objects {
        let v: Value = ctx.json_parse(json.as_bytes())?;
        if let Some(obj) = v.as_object() {
            for key in obj.keys::<String>() {
                let key = key?;
                if skip.contains(&key) {
                    continue;
                }
                let value: Value = obj.get(&key)?;
                globals.set(key, value)?;
            }
        }
    }
    Ok(())
}

fn run_in<'js>(
    ctx: &Ctx<'js>,
    f: Function<'js>,
    stop: &Cell<Option<Stop>>,
) -> Result<Value<'js>, CaughtError<'js>> {
    let p: Promise = f.call(()).catch(ctx)?;
    // Once a limit has stopped the body, no further job runs: many microtask chains must not
    // each get their own slice of CPU until the deadline.
    while p.state() == PromiseState::Pending && stop.get().is_none() && ctx.execute_pending_job() {}
    match p.result::<Value>() {
        Some(r) => r.catch(ctx),
        None => Err(CaughtError::Error(rquickjs::Error::WouldBlock)),
    }
}

fn serialize<'js>(
    ctx: &Ctx<'js>,
    v: Value<'js>,
    max: u64,
    meter: &crate::heap::Meter,
) -> Result<Returned, Failure> {
    if v.is_undefined() || v.is_null() {
        return Ok(Returned::Undefined);
    }
    let text = match ctx.json_stringify(v).catch(ctx) {
        Ok(Some(s)) => s
            .to_string()
            .map_err(|e| Failure::new(Code::JsError, e.to_string()))?,
        Ok(None) => return Ok(Returned::Undefined),
        Err(e) => {
            let f = classify(e, meter.refused());
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

/// `refused`: the runtime's allocator refused a request during the call (see `heap`). Then
/// QuickJS's out-of-memory error, the `null` it throws when it cannot make one, and a failed
/// allocation on stsd's side are the memory limit's.
fn classify(e: CaughtError<'_>, refused: bool) -> Failure {
    let memory_limit = || Failure::new(Code::MemoryLimit, "the tool exceeded its memory limit");
    match e {
        CaughtError::Value(v) if refused && v.is_null() => memory_limit(),
        CaughtError::Error(rquickjs::Error::Allocation) if refused => memory_limit(),
        CaughtError::Exception(ex) => {
            let obj: &Object = ex.as_object();
            let text = |key: &str| {
                obj.get::<_, Value>(key).ok().and_then(|v| {
                    v.as_string()
                        .and_then(|s| crate::jsstring::lossless(s).ok())
                })
            };
            let name = text("name").unwrap_or_else(|| "Error".into());
            let message = text("message").unwrap_or_default();
            if name == "InternalError" && message.contains("out of memory") {
                return memory_limit();
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
        CaughtError::Value(v) => thrown_value(v),
        CaughtError::Error(rquickjs::Error::WouldBlock) => Failure::new(
            Code::JsError,
            "the tool's promise never settled (it awaits something that never resolves)",
        ),
        CaughtError::Error(e) => Failure::new(Code::JsError, e.to_string()),
    }
}

/// A thrown value that QuickJS does not count as an Error (its own Error class): a
/// DOMException or another error-like object is reported as `Name: message`, as node prints
/// it; anything else by its JSON (or, when that says nothing, its string) form.
fn thrown_value(v: Value<'_>) -> Failure {
    let text_of = |x: Value<'_>| {
        x.as_string()
            .and_then(|s| crate::jsstring::lossless(s).ok())
    };
    if let Some(obj) = v.as_object() {
        let name = obj.get::<_, Value>("name").ok().and_then(text_of);
        let message = obj.get::<_, Value>("message").ok().and_then(text_of);
        if let (Some(name), Some(message)) = (name, message) {
            let stack = obj
                .get::<_, Value>("stack")
                .ok()
                .and_then(text_of)
                .filter(|s| !s.is_empty());
            return Failure {
                code: Code::JsError,
                message: if message.is_empty() {
                    name
                } else {
                    format!("{name}: {message}")
                },
                stack,
            };
        }
    }
    let ctx = v.ctx().clone();
    let json = || {
        ctx.json_stringify(v.clone())
            .ok()
            .flatten()
            .and_then(|s| crate::jsstring::lossless(&s).ok())
    };
    let string = || {
        rquickjs::Coerced::<rquickjs::String>::from_js(&ctx, v.clone())
            .ok()
            .and_then(|s| crate::jsstring::lossless(&s.0).ok())
    };
    let text = match v.as_string() {
        Some(s) => crate::jsstring::lossless(s).ok(),
        // `{}` says nothing about an object with a class of its own: its String() may.
        None => match json() {
            Some(j) if j == "{}" => string().filter(|s| s != "[object Object]").or(Some(j)),
            other => other.or_else(string),
        },
    }
    .unwrap_or_else(|| format!("{:?}", v.type_of()));
    Failure::new(Code::JsError, format!("Uncaught {text}"))
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

/// QuickJS's own count of the bytes its runtime holds: what `JS_ComputeMemoryUsage` reports
/// as `malloc_size`, read from the runtime. That function also walks every object, shape and
/// atom to fill the rest of its report, about 30 µs at the end of every call, on the call's
/// path; this is one load. In the quickjs-ng that rquickjs-sys 0.14 builds, `struct
/// JSRuntime` begins with its `JSMallocFunctions` and then `JSMallocState { malloc_count,
/// malloc_size, .. }` (both `size_t`); `heap_bytes_is_what_quickjs_counts` fails if that
/// layout ever changes.
fn malloc_size(ctx: &Ctx<'_>) -> u64 {
    // SAFETY: the context is live, so is its runtime; the offset is inside `struct JSRuntime`
    // (see above) and the field is a `size_t`, read on the runtime's own thread.
    unsafe {
        let rt = rquickjs::qjs::JS_GetRuntime(ctx.as_raw().as_ptr()) as *const u8;
        let state = rt.add(std::mem::size_of::<rquickjs::qjs::JSMallocFunctions>()) as *const usize;
        state.add(1).read() as u64
    }
}

#[cfg(test)]
mod heap_tests {
    use super::*;

    /// QuickJS throws a bare `null` when it cannot make its out-of-memory error: that is the
    /// memory limit's only after the allocator refused a request; else it is the tool's own.
    #[test]
    fn a_thrown_null_is_the_memory_limit_only_after_a_refusal() {
        let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
        let context = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
        context.with(|ctx| {
            for (refused, code) in [(true, Code::MemoryLimit), (false, Code::JsError)] {
                let Err(e) = ctx.eval::<Value, _>("throw null").catch(&ctx) else {
                    panic!("throw null did not throw");
                };
                assert!(matches!(&e, CaughtError::Value(v) if v.is_null()));
                assert_eq!(classify(e, refused).code, code);
            }
            // A thrown object stays the tool's error either way.
            let Err(e) = ctx.eval::<Value, _>("throw new TypeError('t')").catch(&ctx) else {
                panic!("throw did not throw");
            };
            assert_eq!(classify(e, true).code, Code::JsError);
        });
    }

    #[test]
    fn heap_bytes_is_what_quickjs_counts() {
        let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
        let context = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
        let mut seen = Vec::new();
        for n in [0, 1_000, 100_000] {
            let fast = context.with(|ctx| {
                let _: Value = ctx
                    .eval(format!(
                        "globalThis.keep = new Array({n}).fill('x').map((s, i) => s + i)"
                    ))
                    .unwrap_or_else(|e| panic!("{e}"));
                malloc_size(&ctx)
            });
            assert_eq!(fast, rt.memory_usage().malloc_size as u64);
            seen.push(fast);
        }
        // A real count, not a constant that happens to match: it grows with what is kept.
        assert!(seen[0] > 0 && seen[2] > seen[1] + 1_000_000, "{seen:?}");
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// Where a warm context's time goes (a measurement, not a check):
    /// `cargo test -p stsd-worker --release warm_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn warm_cost() {
        let n = 300;
        let t = Instant::now();
        let rts: Vec<Runtime> = (0..n).filter_map(|_| Runtime::new().ok()).collect();
        let rt_us = t.elapsed().as_micros() / n;
        let t = Instant::now();
        let ctxs: Vec<Context> = rts
            .iter()
            .filter_map(|rt| Context::custom::<Intrinsics>(rt).ok())
            .collect();
        let ctx_us = t.elapsed().as_micros() / n;
        let t = Instant::now();
        for c in &ctxs {
            let _ = c.with(|ctx| crate::globals::install(&ctx));
        }
        let glob_us = t.elapsed().as_micros() / n;
        let t = Instant::now();
        drop(ctxs);
        drop(rts);
        let free_us = t.elapsed().as_micros() / n;
        let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
        let t = Instant::now();
        let more: Vec<Context> = (0..n)
            .filter_map(|_| Context::custom::<Intrinsics>(&rt).ok())
            .collect();
        let shared_ctx_us = t.elapsed().as_micros() / n;
        drop(more);
        eprintln!(
            "runtime {rt_us} us, context {ctx_us} us, globals {glob_us} us, free {free_us} us; \
             a context in an existing runtime {shared_ctx_us} us"
        );
    }
}
