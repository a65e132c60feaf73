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
    let f = script_function(ctx, PRELUDE_FILE, PRELUDE)?;
    f.call::<_, ()>((host::host_object(ctx)?, html::host_object(ctx)?))
}

const PRELUDE: &str = include_str!("prelude.js");
const PRELUDE_FILE: &str = "stsd-prelude.js";

/// The lazily compiled parts of the runtime globals (see prelude.js `load`), by the name the
/// prelude asks for: the source and the file name it is compiled under.
pub(crate) fn script(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "intl" => (intl::CORE_JS, "stsd-intl.js"),
        "url" => (URL, "stsd-url.js"),
        "html" => (HTML, "stsd-html.js"),
        "web" => (WEB, "stsd-web.js"),
        "parser" => (PARSER, "stsd-parser.js"),
        other if other.starts_with("intl-") => return intl::class_js(other),
        _ => return None,
    })
}

/// Every name [`script`] knows.
const SCRIPTS: &[&str] = &[
    "intl",
    "url",
    "html",
    "web",
    "parser",
    "intl-datetime",
    "intl-number",
    "intl-collator",
    "intl-plural",
    "intl-list",
    "intl-relative",
    "intl-segmenter",
];

thread_local! {
    /// The bytecode of the runtime globals' scripts, by file name, each compiled as a module
    /// whose default export is the function the script evaluates to. Kept the first time this
    /// process compiles one; the zygote compiles them all before any fork ([`precompile`]).
    /// Parsing was most of a fresh context's cost (a reused worker makes one after every
    /// call), and of a tool's first touch of a helper group.
    static BYTECODE: std::cell::RefCell<std::collections::HashMap<&'static str, Vec<u8>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// The function the runtime-globals script `src` evaluates to, in `ctx`: loaded from this
/// process's bytecode when it has it, else compiled (and its bytecode kept).
pub(crate) fn script_function<'js>(
    ctx: &Ctx<'js>,
    file: &'static str,
    src: &str,
) -> rquickjs::Result<Function<'js>> {
    let loaded = BYTECODE.with(|b| {
        b.borrow().get(file).map(|bytes| {
            // SAFETY: the bytes were written by `Module::write` in this process (or in the
            // zygote it was forked from), from `src`, by this QuickJS build.
            unsafe { Module::load(ctx.clone(), bytes) }
        })
    });
    let module = match loaded {
        Some(m) => m?,
        None => declare(ctx, file, src)?,
    };
    // No imports and no top-level await: evaluated at once (the promise is settled).
    let (module, _evaluated) = module.eval()?;
    module.get("default")
}

/// Compiles `src` as a module (keeping its bytecode), without evaluating it.
fn declare<'js>(
    ctx: &Ctx<'js>,
    file: &'static str,
    src: &str,
) -> rquickjs::Result<Module<'js, rquickjs::module::Declared>> {
    let m = Module::declare(ctx.clone(), file, format!("export default {src}"))?;
    if let Ok(bytes) = m.write(WriteOptions::default()) {
        BYTECODE.with(|b| b.borrow_mut().insert(file, bytes));
    }
    Ok(m)
}

/// Compiles every runtime-globals script once, in a runtime of its own (nothing of it is left
/// in any context a tool runs in), so that the workers forked from this process load them
/// from bytecode.
pub fn precompile() -> rquickjs::Result<()> {
    let rt = rquickjs::Runtime::new()?;
    let cx = rquickjs::Context::full(&rt)?;
    cx.with(|ctx| {
        declare(&ctx, PRELUDE_FILE, PRELUDE)?;
        for (src, file) in SCRIPTS.iter().filter_map(|n| script(n)) {
            declare(&ctx, file, src)?;
        }
        Ok(())
    })
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
        let kept = || super::BYTECODE.with(|b| b.borrow().contains_key(super::PRELUDE_FILE));
        assert!(!kept());
        let first = fresh(probe);
        assert!(kept());
        assert_eq!(first, "object,function,function,function,undefined");
        assert_eq!(fresh(probe), first);
    }

    /// The zygote's precompile leaves the bytecode of every script; a fresh context then runs
    /// each helper group from it as it did from source.
    #[test]
    fn precompiled_scripts_load_in_a_fresh_context() {
        super::precompile().unwrap_or_else(|e| panic!("precompile: {e}"));
        for name in super::SCRIPTS {
            let (_, file) = super::script(name).unwrap_or_else(|| panic!("{name}"));
            assert!(
                super::BYTECODE.with(|b| b.borrow().contains_key(file)),
                "{file}"
            );
        }
        let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
        let cx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
        let got = cx.with(|ctx| {
            super::install(&ctx).unwrap_or_else(|e| panic!("install: {e}"));
            ctx.eval::<String, _>(
                "[new URL('https://example.com/a?b=1').searchParams.get('b'), \
                  new TextEncoder().encode('h\\u00e9').length, btoa('hi'), \
                  new Intl.NumberFormat('en-US').format(1234.5), \
                  typeof parseHTML === 'function' || typeof safety.html]\
                 .join('|')",
            )
            .unwrap_or_else(|e| panic!("eval: {e}"))
        });
        assert!(got.starts_with("1|3|aGk=|1,234.5|"), "{got}");
    }
}
