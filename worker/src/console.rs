//! `console.log/info/warn/error/debug`, streamed to the supervisor as each line happens, with
//! a line cap and a byte cap per call.

use crate::channel::Channel;
use rquickjs::function::Rest;
use rquickjs::{Coerced, Ctx, FromJs, Function, Object, Value};
use std::cell::Cell;
use std::rc::Rc;
use stsd_protocol::frames::{ConsoleLevel, FromWorker};

/// Longest single line; longer ones are cut (the byte cap still counts what was sent).
const MAX_LINE_BYTES: usize = 16 * 1024;

pub struct ConsoleState {
    channel: Rc<Channel>,
    lines_left: Cell<u64>,
    bytes_left: Cell<u64>,
    truncated: Cell<bool>,
}

impl ConsoleState {
    pub fn new(channel: Rc<Channel>, max_lines: u64, max_bytes: u64) -> Rc<ConsoleState> {
        Rc::new(ConsoleState {
            channel,
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
            line.push_str(" …[line truncated]");
        }
        let cost = line.len() as u64;
        if self.lines_left.get() == 0 || self.bytes_left.get() < cost {
            self.truncated.set(true);
            let _ = self.channel.send(&FromWorker::ConsoleTruncated);
            return;
        }
        self.lines_left.set(self.lines_left.get() - 1);
        self.bytes_left.set(self.bytes_left.get() - cost);
        let _ = self.channel.send(&FromWorker::Console { level, line });
    }
}

/// How one console argument prints: strings as they are, objects as JSON when they can be,
/// everything else as JavaScript's own String().
fn render<'js>(ctx: &Ctx<'js>, v: Value<'js>) -> String {
    if let Some(s) = v.as_string() {
        return s.to_string().unwrap_or_default();
    }
    if v.is_undefined() {
        return "undefined".into();
    }
    let is_error = v
        .as_object()
        .is_some_and(|o| o.get::<_, Value>("stack").is_ok_and(|s| s.is_string()));
    if (v.is_object() || v.is_array()) && !v.is_function() && !is_error {
        if let Ok(Some(s)) = ctx.json_stringify(v.clone()) {
            if let Ok(s) = s.to_string() {
                return s;
            }
        }
    }
    Coerced::<String>::from_js(ctx, v)
        .map(|c| c.0)
        .unwrap_or_else(|_| "[unprintable]".into())
}

pub fn install<'js>(ctx: &Ctx<'js>, state: &Rc<ConsoleState>) -> rquickjs::Result<()> {
    let console = Object::new(ctx.clone())?;
    for (name, level) in [
        ("log", ConsoleLevel::Log),
        ("info", ConsoleLevel::Info),
        ("warn", ConsoleLevel::Warn),
        ("error", ConsoleLevel::Error),
        ("debug", ConsoleLevel::Debug),
    ] {
        let st = state.clone();
        let f = Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
            let parts: Vec<String> = args.0.into_iter().map(|v| render(&ctx, v)).collect();
            st.emit(level, parts.join(" "));
        })?
        .with_name(name)?;
        console.set(name, f)?;
    }
    ctx.globals().set("console", console)?;
    Ok(())
}
