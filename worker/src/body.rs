//! A tool's wrapped body, compiled once per reused worker. A reused worker makes a fresh
//! runtime and context for every call, and compiling the body again in each was most of a
//! small body's run (the parse of `stats-summary`'s eight lines: about 40 µs of a reused
//! call's 80). A call that will be followed by another on the same worker (`keep`) compiles
//! its body to bytecode and keeps it; the next call whose wrapped source is the same loads
//! the bytecode instead of parsing. A one-shot worker writes none (it would not use it),
//! unless it is primed and asked for it (below).
//!
//! The bytecode is written from the same source by the same QuickJS build, and it carries
//! the source and its line numbers: stacks, `Function.prototype.toString` and sloppy-mode
//! semantics are those of a parse. It is this process's own, or (one-shot) given with the job
//! or the prime: written by a worker primed for the same tool and posture before any call
//! reached it (see the supervisor's `exec::bodies`), a function of the tool's own code that
//! this worker runs anyway. A worker primed and asked for it hands its own on
//! ([`take_kept`]). Bytecode that does not read is forgotten and the source parsed.
//!
//! Like the runtime globals' bytecode (`globals::script_function`), a reused worker's is
//! state a call leaves in its process: a compromised call could already change the next call
//! of the same tool in the same worker (see docs/src/performance.md, Reuse), and a reused
//! worker only ever serves one tool and posture.

use rquickjs::{qjs, Ctx, Value};
use std::cell::RefCell;
use std::ffi::{CStr, CString};

thread_local! {
    /// The wrapped source of the body kept, and its bytecode.
    static KEPT: RefCell<Option<(String, Vec<u8>)>> = const { RefCell::new(None) };
}

/// Evaluates `source` as a global script in sloppy mode (as `file`), as
/// `ctx.eval_with_options` does, and returns its value. With `keep`, its bytecode is kept
/// for the next evaluation of the same source in this process; a source kept before is
/// loaded from its bytecode.
pub(crate) fn eval<'js>(
    ctx: &Ctx<'js>,
    source: String,
    file: &CStr,
    keep: bool,
) -> rquickjs::Result<Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    let loaded = KEPT.with(|k| {
        let k = k.borrow();
        let (_, bytes) = k.as_ref().filter(|(s, _)| *s == source)?;
        // SAFETY: `raw` is the live context `ctx` borrows; the bytes were written by
        // JS_WriteObject from this source, in this process (below) or in a worker primed for
        // the same tool and posture before any call reached it (`offer_bytecode`), and are
        // copied by the read. QuickJS does not check bytecode: where it comes from is what
        // makes reading it safe (see the module's doc).
        Some(unsafe {
            qjs::JS_ReadObject(
                raw,
                bytes.as_ptr(),
                bytes.len() as _,
                qjs::JS_READ_OBJ_BYTECODE as i32,
            )
        })
    });
    // Bytecode that does not read (offered with the job and not as it should be, or no memory
    // left to read it into): forgotten, and the source parsed instead.
    let loaded = match loaded {
        // SAFETY: reads the tag only.
        Some(obj) if unsafe { qjs::JS_IsException(obj) } => {
            KEPT.with(|k| *k.borrow_mut() = None);
            drop(ctx.catch());
            None
        }
        other => other,
    };
    let compiled = match loaded {
        Some(obj) => obj,
        None => {
            let len = source.len();
            // The source is kept with the bytecode only when `keep`; otherwise it is moved.
            let (src, kept) = if keep {
                (CString::new(source.clone())?, Some(source))
            } else {
                (CString::new(source)?, None)
            };
            let flags = qjs::JS_EVAL_TYPE_GLOBAL
                | if kept.is_some() {
                    qjs::JS_EVAL_FLAG_COMPILE_ONLY
                } else {
                    0
                };
            // SAFETY: `src` is NUL-terminated and `len` bytes long before the NUL, as JS_Eval
            // requires; `file` is a C string; `raw` is live.
            let v =
                unsafe { qjs::JS_Eval(raw, src.as_ptr(), len as _, file.as_ptr(), flags as i32) };
            let Some(source) = kept else {
                return value(ctx, v);
            };
            keep_bytecode(ctx, v, source);
            v
        }
    };
    // SAFETY: `compiled` is a function bytecode object or the exception marker; only the
    // former reaches JS_EvalFunction, which takes ownership of it.
    let v = unsafe {
        if qjs::JS_IsException(compiled) {
            compiled
        } else {
            qjs::JS_EvalFunction(raw, compiled)
        }
    };
    value(ctx, v)
}

/// Keeps the bytecode of `compiled` (a function bytecode object, not consumed), written from
/// `source`. Not kept if it cannot be written: the next call parses again.
fn keep_bytecode(ctx: &Ctx<'_>, compiled: qjs::JSValue, source: String) {
    // SAFETY: reads the tag only.
    if unsafe { qjs::JS_IsException(compiled) } {
        return;
    }
    let raw = ctx.as_raw().as_ptr();
    let mut len: qjs::size_t = 0;
    // SAFETY: `compiled` is live and owned by the caller; JS_WriteObject only reads it and
    // returns a buffer of `len` bytes allocated in the context (freed below), or NULL.
    let buf =
        unsafe { qjs::JS_WriteObject(raw, &mut len, compiled, qjs::JS_WRITE_OBJ_BYTECODE as i32) };
    // SAFETY: `raw` is live. A write that ran out of memory part-way can return a
    // truncated buffer and leave the exception pending, so the exception is what says it
    // failed, not only a NULL buffer.
    if buf.is_null() || unsafe { qjs::JS_HasException(raw) } {
        if !buf.is_null() {
            // SAFETY: `buf` was allocated by JS_WriteObject in this context.
            unsafe { qjs::js_free(raw, buf.cast()) };
        }
        // The exception is the write's, not the call's: the next call parses again.
        drop(ctx.catch());
        return;
    }
    // SAFETY: `buf` holds `len` bytes, copied before it is freed with the context's allocator.
    let bytes = unsafe {
        let b = std::slice::from_raw_parts(buf, len as usize).to_vec();
        qjs::js_free(raw, buf.cast());
        b
    };
    KEPT.with(|k| *k.borrow_mut() = Some((source, bytes)));
}

/// Bytecode the supervisor gave with the job (made by a worker primed for the same tool and
/// posture, see `frames::Bytecode`): kept as this process's own would be, so that the next
/// evaluation of the same source loads it. A process that already keeps a body keeps its own.
pub(crate) fn offer_bytecode(b: &stsd_protocol::frames::Bytecode) {
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if k.is_none() {
            *k = Some((b.source.clone(), b.bytes.clone()));
        }
    });
}

/// The body kept by the last evaluation with `keep` (or offered), taken out.
pub(crate) fn take_kept() -> Option<stsd_protocol::frames::Bytecode> {
    KEPT.with(|k| k.borrow_mut().take())
        .map(|(source, bytes)| stsd_protocol::frames::Bytecode { source, bytes })
}

/// `v` as a Value, or the pending exception as `Error::Exception` (for `.catch`).
fn value<'js>(ctx: &Ctx<'js>, v: qjs::JSValue) -> rquickjs::Result<Value<'js>> {
    // SAFETY: `v` is an owned value of this context (or the exception marker, which owns
    // nothing); Value::from_raw takes ownership.
    unsafe {
        if qjs::JS_IsException(v) {
            return Err(rquickjs::Error::Exception);
        }
        Ok(Value::from_raw(ctx.clone(), v))
    }
}

/// Whether a body is kept (tests).
#[cfg(test)]
fn kept_source() -> Option<String> {
    KEPT.with(|k| k.borrow().as_ref().map(|(s, _)| s.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rquickjs::{CatchResultExt, Context, Function, Runtime};

    const FILE: &CStr = c"tool.js";

    /// A fresh runtime and context per call, as a reused worker makes them.
    fn with_fresh<R>(f: impl FnOnce(&Ctx<'_>) -> R) -> R {
        let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
        let ctx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
        ctx.with(|ctx| f(&ctx))
    }

    /// What a body shows of how it was compiled: a sloppy-mode global made by assignment,
    /// `this`, its own source text, and the line of a throw in its stack.
    const SRC: &str = "(async function () { leaked = 7; const t = typeof this;\n\
                       const e = new Error('x');\n\
                       return [leaked, globalThis.leaked, t, String(arguments.length), e.stack.split('\\n')[0]].join('|');\n})";

    fn run(ctx: &Ctx<'_>, keep: bool) -> String {
        let f: Function = eval(ctx, SRC.to_string(), FILE, keep)
            .and_then(|v| v.get())
            .unwrap_or_else(|e| panic!("{e}"));
        let p: rquickjs::Promise = f.call(()).unwrap_or_else(|e| panic!("{e}"));
        while ctx.execute_pending_job() {}
        let out: String = p
            .result::<String>()
            .and_then(|r| r.ok())
            .unwrap_or_else(|| panic!("no result"));
        let src: String = ctx
            .eval::<Function, _>("(f) => f.toString()")
            .and_then(|g| g.call((f,)))
            .unwrap_or_else(|e| panic!("{e}"));
        format!("{out}||{src}")
    }

    #[test]
    fn a_kept_body_runs_from_its_bytecode_as_it_ran_from_source() {
        let parsed = with_fresh(|ctx| run(ctx, false));
        assert_eq!(
            kept_source(),
            None,
            "a call that is not kept writes nothing"
        );
        let first = with_fresh(|ctx| run(ctx, true));
        assert_eq!(kept_source().as_deref(), Some(SRC));
        let loaded = with_fresh(|ctx| run(ctx, false));
        assert_eq!(first, parsed);
        assert_eq!(loaded, parsed);
        assert!(parsed.starts_with("7|7|object|0|"), "{parsed}");
        assert!(parsed.contains("leaked = 7"), "{parsed}");
    }

    #[test]
    fn another_source_is_parsed_and_a_syntax_error_is_caught() {
        with_fresh(|ctx| {
            let _ = eval(ctx, "(function () { return 1; })".into(), FILE, true);
        });
        with_fresh(|ctx| {
            let f: Function = eval(ctx, "(function () { return 2; })".into(), FILE, false)
                .and_then(|v| v.get())
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(f.call::<_, i32>(()).ok(), Some(2));
            let bad = eval(ctx, "(function () { return ; ) })".into(), FILE, true).catch(ctx);
            let msg = format!("{:?}", bad.err());
            assert!(msg.contains("unexpected token"), "{msg}");
        });
        assert_eq!(
            kept_source().as_deref(),
            Some("(function () { return 1; })")
        );
    }
    /// A body whose bytecode is big enough that writing it can run out of memory after the
    /// compile did not.
    fn big_source() -> String {
        let mut s = String::from("(function () { const parts = [];\n");
        for i in 0..400 {
            s.push_str(&format!(
                "parts.push('constant string number {i} of the body');\n"
            ));
        }
        s.push_str("return parts.length; })");
        s
    }

    /// A write that ran out of memory part-way keeps nothing: under every memory limit from
    /// just enough to make a context to well past what the write needs, a kept body's next
    /// evaluation (unlimited) still runs. A truncated buffer kept would fail every later call.
    #[test]
    fn a_write_that_runs_out_of_memory_keeps_nothing() {
        let src = big_source();
        let mut kept_any = false;
        for extra in (0..512 * 1024).step_by(2048) {
            KEPT.with(|k| *k.borrow_mut() = None);
            let rt = Runtime::new().unwrap_or_else(|e| panic!("{e}"));
            let ctx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
            let used = rt.memory_usage().malloc_size as usize;
            rt.set_memory_limit(used + extra);
            ctx.with(|ctx| {
                let _ = eval(&ctx, src.clone(), FILE, true);
                drop(ctx.catch());
            });
            drop(ctx);
            drop(rt);
            kept_any |= kept_source().is_some();
            let n = with_fresh(|ctx| {
                eval(ctx, src.clone(), FILE, false)
                    .and_then(|v| v.get::<Function>())
                    .and_then(|f| f.call::<_, i32>(()))
                    .map_err(|e| format!("{e}: {:?}", ctx.catch()))
            });
            assert_eq!(n, Ok(400), "limit used+{extra}");
        }
        assert!(
            kept_any,
            "the sweep never reached a limit the write fits in"
        );
        KEPT.with(|k| *k.borrow_mut() = None);
    }
}
