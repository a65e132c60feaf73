//! The Local Pass (spec §11.3): run a spec with every required param set from its testValue,
//! under its own resolved posture, in the same sandbox a published call gets.

use crate::exec::{self, job, CallValue, ExecOptions};
use crate::store::{now_ms, Catalog, Entry};
use serde_json::Value;
use std::time::Duration;
use stsd_profiles::{resolve, Config};
use stsd_protocol::envvar::EnvSource;
use stsd_protocol::{Code, Diagnostic};

#[derive(Debug, Clone)]
pub struct PassReport {
    pub name: String,
    pub location: String,
    /// Ok: the call's result. Err: LOCAL_PASS_FAILED, with the cause's code in the message.
    pub outcome: Result<CallValue, Diagnostic>,
    pub elapsed: Duration,
}

fn failed(cause: Code, message: impl AsRef<str>, pointer: &str) -> Diagnostic {
    Diagnostic::error(
        Code::LocalPassFailed,
        pointer,
        format!("{cause}: {}", message.as_ref()),
    )
}

/// Runs the Local Pass of one entry. Console output is dropped (it is not part of the pass).
pub fn run_entry(
    cat: &Catalog,
    e: &Entry,
    config: &Config,
    env: &dyn EnvSource,
    opts: &ExecOptions,
) -> PassReport {
    let t0 = std::time::Instant::now();
    let name = e
        .validated
        .spec
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    let outcome = (|| {
        let Some(spec) = e.validated.spec.as_ref().filter(|_| e.validated.is_valid()) else {
            let first = e.validated.errors().next().cloned();
            return Err(match first {
                Some(d) => failed(d.code, &d.message, &d.pointer),
                None => failed(Code::SpecParse, "the spec is invalid", ""),
            });
        };
        let resolved = resolve(spec, config).map_err(|d| failed(d.code, &d.message, &d.pointer))?;
        let args = job::test_arguments(spec).map_err(|d| failed(d.code, &d.message, &d.pointer))?;
        let mut prepared = job::prepare(0, spec, &resolved, config, args, env)
            .map_err(|d| failed(d.code, &d.message, &d.pointer))?;
        crate::workspace::prepare_base_path(&mut prepared.job.sandbox, config)
            .map_err(|e| failed(Code::SandboxUnavailable, e, "/sandboxOverrides/fsBasePath"))?;
        let out = exec::run_job(&prepared.job, opts, &mut |_| {});
        match out.result {
            Ok(v) => Ok(v),
            Err(err) => Err(failed(
                err.code,
                prepared.secrets.mask(&err.message),
                "/code",
            )),
        }
    })();
    PassReport {
        name,
        location: cat.location(e),
        outcome,
        elapsed: t0.elapsed(),
    }
}

/// Persists `draft: false` for every passed entry, file by file, atomically.
pub fn write_passes(cat: &mut Catalog, passed: &[usize]) -> std::io::Result<usize> {
    let now = now_ms();
    let mut touched_files = Vec::new();
    for &i in passed {
        let (file, index) = (cat.entries[i].file, cat.entries[i].index);
        let f = &mut cat.files[file];
        if let Some(doc) = f.document_mut(index) {
            doc.insert("draft".into(), Value::Bool(false));
            f.touch(index, now);
            if !touched_files.contains(&file) {
                touched_files.push(file);
            }
        }
    }
    for &file in &touched_files {
        cat.files[file].write_atomic()?;
    }
    Ok(touched_files.len())
}
