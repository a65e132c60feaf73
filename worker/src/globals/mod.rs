//! Runtime globals installed before a tool's code runs. The encoding and crypto groups and
//! structuredClone are always available (spec §8.3: tool-safety-helpers/v1#encoding, #crypto);
//! capability-gated helpers (safety.fs, fetch) come with the posture that grants them.

mod fetch;
pub(crate) mod fs;
mod host;
pub(crate) use host::{install_math_random, seed_math_random, RandomState};
mod html;
mod intl;
mod parser;

use rquickjs::context::EvalOptions;
use rquickjs::{CatchResultExt, Ctx, Function, Module, WriteOptions};

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

/// Every name [`script`] knows besides the Intl groups ([`INTL_GROUPS`]).
#[cfg(test)]
const OTHER_SCRIPTS: &[&str] = &["url", "html", "web", "parser"];

thread_local! {
    /// The runtime globals' scripts this process has compiled, by file name; from the second
    /// time, with the bytecode of the script compiled as a module whose default export is the
    /// function the script evaluates to. The zygote compiles the prelude once (making its
    /// context); a reused worker makes a fresh context after every call and loads the prelude
    /// from bytecode from its second call on; a helper group is likewise parsed twice in a
    /// worker's life and loaded after that. Parsing was most of a fresh context's cost. A
    /// script compiled only once (every one-shot worker's case) is not written out: writing
    /// the bytecode cost more than it saved there. (Compiling every group in the zygote's own
    /// context made each fork dearer: it grew the heap a forked worker writes through before
    /// Ready. The Intl groups are compiled there in a throwaway runtime instead, see
    /// [`precompile_intl`]: spawn CPU 138 us before, 143-148 after, in single runs.)
    static COMPILED: std::cell::RefCell<std::collections::HashMap<&'static str, Compiled>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

enum Compiled {
    /// Compiled once, from source.
    Once,
    Bytecode(Vec<u8>),
}

/// The function the runtime-globals script `src` evaluates to, in `ctx`: parsed the first
/// time this process compiles it, then compiled as a module whose bytecode is kept, then
/// loaded from that bytecode.
pub(crate) fn script_function<'js>(
    ctx: &Ctx<'js>,
    file: &'static str,
    src: &str,
) -> rquickjs::Result<Function<'js>> {
    let loaded = COMPILED.with(|c| match c.borrow().get(file) {
        None => None,
        Some(Compiled::Once) => Some(None),
        Some(Compiled::Bytecode(bytes)) => Some(Some(
            // SAFETY: the bytes were written by `Module::write` in this process (or in the
            // zygote it was forked from), from `src`, by this QuickJS build.
            unsafe { Module::load(ctx.clone(), bytes) },
        )),
    });
    let module = match loaded {
        None => {
            COMPILED.with(|c| c.borrow_mut().insert(file, Compiled::Once));
            let mut opts = EvalOptions::default();
            opts.global = true;
            opts.strict = true;
            opts.filename = Some(file.into());
            return ctx.eval_with_options(src, opts);
        }
        // With the source: a reused worker's helpers print the same from its first call (parsed)
        // as from its later ones (loaded).
        Some(None) => declare(ctx, file, src, false)?,
        Some(Some(m)) => m?,
    };
    // No imports and no top-level await: evaluated at once (the promise is settled).
    let (module, _evaluated) = module.eval()?;
    module.get("default")
}

/// The zygote, once: compiles the Intl groups to bytecode, so a worker's first Intl use
/// loads them rather than parsing them (the parse was most of that first use).
pub fn precompile_intl() {
    let Ok(rt) = rquickjs::Runtime::new() else {
        return;
    };
    let Ok(cx) = rquickjs::Context::full(&rt) else {
        return;
    };
    cx.with(|ctx| {
        for name in INTL_GROUPS {
            if let Some((src, file)) = script(name) {
                // Stripped: the Intl groups' bytecode, held by the zygote and so in every
                // worker's heap, 90 -> 27 KiB (load time unchanged, 41 us for the Intl core);
                // a worker never parses them, so their functions always print as native.
                let _ = declare(&ctx, file, src, true);
            }
        }
    });
}

/// What a primed worker loads of Intl before its call, by the names in the tool's code: a
/// needle, and what is touched when the code contains it. The Intl core and each class group
/// are otherwise loaded inside the call that first touches them, and the locale-sensitive
/// methods called without a locale make their default-locale formatter there too. On the
/// daemon's path (one-shot, primed; a call's p50 less a `return 1` tool's, four alternating
/// daemons each): `NumberFormat('de')` 161 -> 92 µs, a `localeCompare` sort 118 -> 99, a
/// ko-KR full date 200 -> 118 (its formatter for ko-KR is still built in the call). A needle
/// found in a comment or a string loads what the call would not have: the priming's time,
/// and the Intl objects in the call's heap (under its memory limit). Nothing of the tool runs.
const INTL_PRELOADS: &[(&str, &str)] = &[
    ("Intl", "Intl;"),
    ("NumberFormat", "Intl.NumberFormat;"),
    ("DateTimeFormat", "Intl.DateTimeFormat;"),
    ("Collator", "Intl.Collator;"),
    ("PluralRules", "Intl.PluralRules;"),
    ("ListFormat", "Intl.ListFormat;"),
    ("RelativeTimeFormat", "Intl.RelativeTimeFormat;"),
    ("Segmenter", "Intl.Segmenter;"),
    (
        "toLocaleString",
        "(0).toLocaleString(); Intl.DateTimeFormat;",
    ),
    ("toLocaleDateString", "Intl.DateTimeFormat;"),
    ("toLocaleTimeString", "Intl.DateTimeFormat;"),
    ("localeCompare", "Intl; ''.localeCompare('');"),
    ("toLocaleUpperCase", "Intl;"),
    ("toLocaleLowerCase", "Intl;"),
];

/// A primed worker, before the tool's code is compiled (so nothing of the tool can stand in
/// for `Intl` or the methods touched), and a template once for all its children (which then
/// find it done): loads the parts of Intl that `code` names, as its
/// first use would, so that the call does not. A failure (the tool's memory limit, say)
/// caches nothing (each part is kept only once it loaded), so the call loads it again if it
/// touches it.
pub(crate) fn preload_intl(ctx: &Ctx<'_>, code: &str) {
    let mut touches: Vec<&str> = Vec::new();
    for (needle, touch) in INTL_PRELOADS {
        if code.contains(needle) && !touches.contains(touch) {
            touches.push(touch);
        }
    }
    if touches.is_empty() {
        return;
    }
    let mut opts = EvalOptions::default();
    opts.global = true;
    opts.strict = true;
    opts.filename = Some("stsd-preload.js".into());
    // Caught, so that no exception is left pending in the context for the call to find.
    let _ = ctx
        .eval_with_options::<(), _>(touches.concat(), opts)
        .catch(ctx);
}

const INTL_GROUPS: &[&str] = &[
    "intl",
    "intl-datetime",
    "intl-number",
    "intl-collator",
    "intl-plural",
    "intl-list",
    "intl-relative",
    "intl-segmenter",
];

/// Compiles `src` as a module (keeping its bytecode), without evaluating it. `strip_source`:
/// the bytecode keeps no function's source text (Function.prototype.toString then says
/// `[native code]`, as a built-in's does); line numbers stay, for stack traces.
fn declare<'js>(
    ctx: &Ctx<'js>,
    file: &'static str,
    src: &str,
    strip_source: bool,
) -> rquickjs::Result<Module<'js, rquickjs::module::Declared>> {
    let m = Module::declare(ctx.clone(), file, format!("export default {src}"))?;
    let opts = WriteOptions {
        strip_source,
        ..WriteOptions::default()
    };
    if let Ok(bytes) = m.write(opts) {
        COMPILED.with(|c| c.borrow_mut().insert(file, Compiled::Bytecode(bytes)));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use rquickjs::{Context, Runtime};

    /// The prelude is parsed by the first install, compiled as a module and kept as bytecode
    /// by the second, and loaded from it by the third (each in a runtime of its own, as a
    /// reused worker makes after each call), with the same globals every time.
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
        let kept = || {
            super::COMPILED.with(|c| {
                matches!(
                    c.borrow().get(super::PRELUDE_FILE),
                    Some(super::Compiled::Bytecode(_))
                )
            })
        };
        let first = fresh(probe);
        assert_eq!(first, "object,function,function,function,undefined");
        assert!(!kept(), "a script compiled once is not written out");
        assert_eq!(fresh(probe), first);
        assert!(kept());
        assert_eq!(fresh(probe), first);
    }

    /// A helper group used in a second fresh context is kept as bytecode; a third runs every
    /// group from it as the first did from source.
    #[test]
    fn helper_groups_are_kept_as_bytecode_and_run_from_it() {
        let fresh = || {
            let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
            let cx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
            cx.with(|ctx| {
                super::install(&ctx).unwrap_or_else(|e| panic!("install: {e}"));
                ctx.eval::<String, _>(
                    "[new URL('https://example.com/a?b=1').searchParams.get('b'), \
                      new TextEncoder().encode('h\\u00e9').length, btoa('hi'), \
                      new Intl.NumberFormat('en-US').format(1234.5)].join('|')",
                )
                .unwrap_or_else(|e| panic!("eval: {e}"))
            })
        };
        let kept = |name: &str| {
            let (_, file) = super::script(name).unwrap_or_else(|| panic!("{name}"));
            super::COMPILED
                .with(|c| matches!(c.borrow().get(file), Some(super::Compiled::Bytecode(_))))
        };
        let first = fresh();
        assert_eq!(first, "1|3|aGk=|1,234.5");
        assert!(!kept("url"));
        assert_eq!(fresh(), first);
        for name in ["url", "web", "intl", "intl-number"] {
            assert!(kept(name), "{name}");
        }
        assert!(super::OTHER_SCRIPTS
            .iter()
            .chain(super::INTL_GROUPS)
            .all(|n| super::script(n).is_some()));
        assert_eq!(fresh(), first);
    }

    /// `src`'s value in a fresh context with the runtime globals, after the Intl preload for
    /// a tool whose code is `code`.
    fn preloaded(code: &str, src: &str) -> String {
        let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
        let cx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
        cx.with(|ctx| {
            super::install(&ctx).unwrap_or_else(|e| panic!("install: {e}"));
            super::preload_intl(&ctx, code);
            ctx.eval::<String, _>(src)
                .unwrap_or_else(|e| panic!("eval: {e}"))
        })
    }

    /// A primed worker loads, before its call, the parts of Intl its tool's code names (the
    /// core, the class groups, the default-locale collator of a bare localeCompare) and no
    /// others; code that names none loads nothing; the tool's results are those of a lazy load.
    #[test]
    fn a_primed_context_loads_the_intl_its_code_names() {
        // Which of Intl's lazy accessors have been replaced by loaded values.
        let probe = "const own = (o, p) => Object.getOwnPropertyDescriptor(o, p); \
                     const loaded = own(globalThis, 'Intl').get === undefined; \
                     return (loaded ? ['Intl'].concat(['NumberFormat', 'DateTimeFormat', \
                       'Collator', 'PluralRules'].filter(c => own(Intl, c).get === undefined)) \
                       : []).join()";
        let fresh = |code: &str, then: &str| -> (String, String) {
            let both = preloaded(
                code,
                &format!("[(() => {{ {probe} }})(), {then}].join('\\n')"),
            );
            let (before, result) = both.split_once('\n').unwrap_or_else(|| panic!("{both}"));
            (before.to_string(), result.to_string())
        };
        let nf = "new Intl.NumberFormat('de').format(1234567.891)";
        assert_eq!(
            fresh(nf, nf),
            ("Intl,NumberFormat".into(), "1.234.567,891".into())
        );
        let sort = "['z','ä','a'].sort((a, b) => a.localeCompare(b)).join()";
        assert_eq!(fresh(sort, sort), ("Intl,Collator".into(), "a,ä,z".into()));
        let date = "new Date(Date.UTC(2024, 0, 15)).toLocaleDateString('ko-KR', {timeZone: 'UTC'})";
        let (before, ko) = fresh(date, date);
        assert_eq!(before, "Intl,DateTimeFormat");
        assert_eq!(fresh("return 1", date), (String::new(), ko));
        assert_eq!(fresh("return 1", nf).0, "");
        // A bare toLocaleString (a number's or a date's: both loaded) and a case method.
        let bare = "(1234.5).toLocaleString()";
        assert_eq!(
            fresh(bare, bare),
            ("Intl,NumberFormat,DateTimeFormat".into(), "1,234.5".into())
        );
        let upper = "'i'.toLocaleUpperCase('tr')";
        assert_eq!(fresh(upper, upper), ("Intl".into(), "\u{130}".into()));
    }

    /// A locale method the tool replaced before Intl loaded stays the tool's once Intl loads
    /// (as in node), whether Intl loads in the call or was loaded before it; one still the
    /// prelude's stand-in becomes the real one; a stand-in the tool kept calls the real one.
    #[test]
    fn a_locale_method_the_tool_replaced_stays_replaced_when_intl_loads() {
        let run = |preload: &str| -> String {
            preloaded(
                preload,
                "const kept = String.prototype.localeCompare; \
                 String.prototype.localeCompare = () => 7; \
                 const n = (1234.5).toLocaleString('en-US'); \
                 [n, 'b'.localeCompare('a'), kept.call('b', 'a'), \
                  'i'.toLocaleUpperCase('tr')].join('|')",
            )
        };
        // The tool's own method answers 7; the one it kept a reference to, the real compare.
        assert_eq!(run(""), "1,234.5|7|1|\u{130}");
        assert_eq!(run("localeCompare toLocaleString"), "1,234.5|7|1|\u{130}");
    }
}
