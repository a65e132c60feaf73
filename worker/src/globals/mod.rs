//! Runtime globals installed before a tool's code runs. The encoding and crypto groups and
//! structuredClone are always available (spec §8.3: tool-safety-helpers/v1#encoding, #crypto);
//! capability-gated helpers (safety.fs, fetch) come with the posture that grants them.

mod host;

use rquickjs::context::EvalOptions;
use rquickjs::{Ctx, Function};

const PRELUDE: &str = include_str!("prelude.js");

pub fn install(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let mut opts = EvalOptions::default();
    opts.global = true;
    opts.strict = true;
    opts.filename = Some("stsd-prelude.js".into());
    let f: Function = ctx.eval_with_options(PRELUDE, opts)?;
    f.call::<_, ()>((host::host_object(ctx)?,))
}
