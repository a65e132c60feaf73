//! Runtime globals installed before a tool's code runs. The encoding and crypto groups and
//! structuredClone are always available (spec §8.3: tool-safety-helpers/v1#encoding, #crypto);
//! capability-gated helpers (safety.fs, fetch) come with the posture that grants them.

mod fetch;
pub(crate) mod fs;
mod host;
pub(crate) use host::install_math_random;
mod html;
mod intl;
mod parser;

use rquickjs::context::EvalOptions;
use rquickjs::{Ctx, Function, Module, WriteOptions};

thread_local! {
    /// The call's memory budget in bytes (its QuickJS heap limit). Host helpers that build
    /// something whose size the tool controls check against it before allocating.
    static MEMORY_BUDGET: std::cell::Cell<usize> = const { std::cell::Cell::new(128 << 20) };
}

pub(crate) fn set_memory_budget(bytes: usize) {
    MEMORY_BUDGET.with(|b| b.set(bytes));
}

pub(crate) fn memory_budget() -> usize {
    MEMORY_BUDGET.with(|b| b.get())
}

/// A classified helper failure, thrown as an `Error` whose name the engine maps to the error
/// code: `kind` is SECURITY, INVALID_INPUT, OUTPUT_LIMIT, MEMORY_LIMIT or HELPER_RUNTIME.
pub(crate) fn helper_error(ctx: &Ctx<'_>, kind: &str, msg: impl AsRef<str>) -> rquickjs::Error {
    let name = match kind {
        "SECURITY" => "SecurityError",
        "INVALID_INPUT" => "InvalidInputError",
        "OUTPUT_LIMIT" => "OutputLimitError",
        "MEMORY_LIMIT" => "MemoryLimitError",
        _ => "HelperRuntimeError",
    };
    let thrown = rquickjs::Exception::from_message(ctx.clone(), msg.as_ref()).and_then(|e| {
        e.as_object().set("name", name)?;
        Ok(e)
    });
    match thrown {
        Ok(e) => ctx.throw(e.into_value()),
        Err(e) => e,
    }
}

const URL: &str = include_str!("url.js");
const HTML: &str = include_str!("html.js");
const WEB: &str = include_str!("web.js");
const PARSER: &str = include_str!("parser.js");

const FS: &str = include_str!("fs.js");
const FETCH: &str = include_str!("fetch.js");

/// `fetch` (safety.http/v1) for a posture with network: requests go to the supervisor's broker
/// over `channel`.
pub fn install_fetch(
    ctx: &Ctx<'_>,
    channel: std::rc::Rc<crate::channel::Channel>,
) -> rquickjs::Result<()> {
    let mut opts = EvalOptions::default();
    opts.global = true;
    opts.strict = true;
    opts.filename = Some("stsd-fetch.js".into());
    let f: Function = ctx.eval_with_options(FETCH, opts)?;
    f.call::<_, ()>((fetch::host_object(ctx, channel)?,))
}

/// `safety.fs/v1` for a posture with file access, confined to `base`.
pub fn install_fs(
    ctx: &Ctx<'_>,
    base: &str,
    can_read: bool,
    can_write: bool,
    budget: fs::WriteBudget,
) -> rquickjs::Result<()> {
    let mut opts = EvalOptions::default();
    opts.global = true;
    opts.strict = true;
    opts.filename = Some("stsd-fs.js".into());
    let f: Function = ctx.eval_with_options(FS, opts)?;
    f.call::<_, ()>((fs::host_object(ctx, base, budget)?, can_read, can_write))
}

pub fn install(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let f = prelude(ctx)?;
    f.call::<_, ()>((host::host_object(ctx)?, html::host_object(ctx)?))
}

/// The prelude as a module whose one export is its installer function.
const PRELUDE_MODULE: &str = concat!("export default ", include_str!("prelude.js"));

thread_local! {
    /// The prelude module's bytecode, written the first time it is compiled (in the zygote,
    /// before any worker is forked). Parsing its source was most of a fresh context's cost,
    /// and a reused worker makes a fresh context after every call.
    static PRELUDE_BYTECODE: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

/// The prelude's installer in `ctx`: loaded from bytecode when this process has it, else
/// compiled from source (and its bytecode kept).
fn prelude<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Function<'js>> {
    let loaded = PRELUDE_BYTECODE.with(|b| {
        b.borrow().as_ref().map(|bytes| {
            // SAFETY: the bytes were written by `Module::write` in this process (or in the
            // zygote it was forked from), from `PRELUDE_MODULE`, by this QuickJS build.
            unsafe { Module::load(ctx.clone(), bytes) }
        })
    });
    let module = match loaded {
        Some(m) => m?,
        None => {
            let m = Module::declare(ctx.clone(), "stsd-prelude.js", PRELUDE_MODULE)?;
            if let Ok(bytes) = m.write(WriteOptions::default()) {
                PRELUDE_BYTECODE.with(|b| *b.borrow_mut() = Some(bytes));
            }
            m
        }
    };
    // No imports and no top-level await: evaluated at once (the promise is settled).
    let (module, _evaluated) = module.eval()?;
    module.get("default")
}

#[cfg(test)]
mod tests {
    use rquickjs::{Context, Runtime};

    /// The first install compiles the prelude and keeps its bytecode; a later fresh context
    /// (in a runtime of its own, as a reused worker makes after each call) is installed from
    /// that bytecode, with the same globals.
    #[test]
    fn a_fresh_context_installs_the_prelude_from_its_bytecode() {
        let fresh = |src: &str| -> String {
            let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
            let cx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
            cx.with(|ctx| {
                super::install(&ctx).unwrap_or_else(|e| panic!("install: {e}"));
                ctx.eval::<String, _>(src)
                    .unwrap_or_else(|e| panic!("eval: {e}"))
            })
        };
        let probe = "[typeof safety, typeof TextEncoder, typeof structuredClone, typeof URL, \
                     typeof Error.prepareStackTrace].join()";
        assert!(super::PRELUDE_BYTECODE.with(|b| b.borrow().is_none()));
        let first = fresh(probe);
        assert!(super::PRELUDE_BYTECODE.with(|b| b.borrow().is_some()));
        assert_eq!(first, "object,function,function,function,undefined");
        assert_eq!(fresh(probe), first);
    }
}
