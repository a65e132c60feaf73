//! `console.log/info/warn/error/debug`, streamed to the supervisor as each line happens, with
//! a line cap and a byte cap per call.

use crate::channel::Channel;
use rquickjs::function::Rest;
use rquickjs::{Coerced, Ctx, FromJs, Function, Object, Value};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use stsd_protocol::frames::{ConsoleLevel, FromWorker, LINE_TRUNCATED_MARK};

/// Longest single line; longer ones are cut (the byte cap still counts what was sent).
const MAX_LINE_BYTES: usize = 16 * 1024;

pub struct ConsoleState {
    channel: Rc<Channel>,
    /// Raised when output goes over its caps; the engine's interrupt handler then stops the
    /// body at its next poll point and the call ends as OUTPUT_LIMIT.
    over_cap: Rc<Cell<bool>>,
    lines_left: Cell<u64>,
    bytes_left: Cell<u64>,
    truncated: Cell<bool>,
}

impl ConsoleState {
    pub fn new(
        channel: Rc<Channel>,
        over_cap: Rc<Cell<bool>>,
        max_lines: u64,
        max_bytes: u64,
    ) -> Rc<ConsoleState> {
        Rc::new(ConsoleState {
            channel,
            over_cap,
            lines_left: Cell::new(max_lines),
            bytes_left: Cell::new(max_bytes),
            truncated: Cell::new(false),
        })
    }

    fn emit(&self, level: ConsoleLevel, mut line: String) {
        if self.truncated.get() {
            return;
        }
        if line.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str(LINE_TRUNCATED_MARK);
        }
        let cost = line.len() as u64;
        if self.lines_left.get() == 0 || self.bytes_left.get() < cost {
            self.truncated.set(true);
            self.over_cap.set(true);
            let _ = self.channel.send(&FromWorker::ConsoleTruncated);
            return;
        }
        self.lines_left.set(self.lines_left.get() - 1);
        self.bytes_left.set(self.bytes_left.get() - cost);
        let _ = self.channel.send(&FromWorker::Console { level, line });
    }
}

/// How one console argument prints: strings as they are (a lone surrogate as its `\\uXXXX`
/// escape, see [`crate::jsstring`]), objects as JSON when they can be,
/// everything else as JavaScript's own String(). Exceptions (a throwing getter, `toJSON` or
/// `toString`, or the engine's own interrupt) propagate to the caller.
fn render<'js>(ctx: &Ctx<'js>, v: Value<'js>) -> rquickjs::Result<String> {
    if let Some(s) = v.as_string() {
        return crate::jsstring::lossless(s);
    }
    if v.is_undefined() {
        return Ok("undefined".into());
    }
    let is_error = v
        .as_object()
        .is_some_and(|o| o.get::<_, Value>("stack").is_ok_and(|s| s.is_string()));
    if (v.is_object() || v.is_array()) && !v.is_function() && !is_error {
        if let Some(s) = ctx.json_stringify(v.clone())? {
            return crate::jsstring::lossless(&s);
        }
    }
    Coerced::<rquickjs::String>::from_js(ctx, v).and_then(|c| crate::jsstring::lossless(&c.0))
}

/// Where the console's functions find their call's caps and channel. The functions are
/// installed with the runtime globals, before any call is known (in the zygote, once for all
/// the workers it forks); each call's engine fills the slot before any of its code runs.
#[derive(Clone, Default)]
pub struct ConsoleSlot(Rc<RefCell<Option<Rc<ConsoleState>>>>);

impl ConsoleSlot {
    /// The call's state, from now on.
    pub fn fill(&self, state: Rc<ConsoleState>) {
        *self.0.borrow_mut() = Some(state);
    }

    fn state(&self) -> Option<Rc<ConsoleState>> {
        self.0.borrow().clone()
    }
}

/// `console` and its five functions. Made per worker, they cost about 50 µs of CPU in each
/// (a primed one-shot call: 938 -> 887 µs of CPU, p50 0.438 -> 0.381 ms without them, `N=800
/// scripts/ab 3 1 stats-summary`), mostly the copy-on-write of the zygote's heap pages they
/// allocated into.
pub fn install<'js>(ctx: &Ctx<'js>, slot: &ConsoleSlot) -> rquickjs::Result<()> {
    let console = Object::new(ctx.clone())?;
    for (name, level) in [
        ("log", ConsoleLevel::Log),
        ("info", ConsoleLevel::Info),
        ("warn", ConsoleLevel::Warn),
        ("error", ConsoleLevel::Error),
        ("debug", ConsoleLevel::Debug),
    ] {
        let slot = slot.clone();
        let f = Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, args: Rest<Value<'js>>| -> rquickjs::Result<()> {
                // No call bound: nothing is printed (no tool code runs before one is).
                let Some(st) = slot.state() else {
                    return Ok(());
                };
                // Arguments are rendered one by one and rendering stops once the line is over its
                // budget, so `console.log(...hugeStrings)` costs one string copy, not all of them.
                let budget = (MAX_LINE_BYTES as u64).min(st.bytes_left.get()) as usize + 1;
                let mut line = String::new();
                for (i, v) in args.0.into_iter().enumerate() {
                    if line.len() > budget {
                        break;
                    }
                    if i > 0 {
                        line.push(' ');
                    }
                    line.push_str(&render(&ctx, v)?);
                }
                st.emit(level, line);
                Ok(())
            },
        )?
        .with_name(name)?;
        console.set(name, f)?;
    }
    ctx.globals().set("console", console)?;
    Ok(())
}
