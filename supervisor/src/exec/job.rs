//! Turning a spec, its resolved posture and a caller's arguments into a worker job: arguments
//! checked against the params, `${ENV}` static variables resolved, secrets collected.

use serde_json::{Map, Value};
use stsd_profiles::{Config, Resolved};
use stsd_protocol::envvar::{self, EnvSource, SecretSet};
use stsd_protocol::frames::{FsAccess, Job, JobLimits, NetworkGrant, SandboxSpec};
use stsd_protocol::{Code, Diagnostic, NetworkMode, ToolSpec};

/// Checks arguments against the params (§6): unknown names, missing required ones and wrong
/// types are INVALID_INPUT with a pointer (`/arguments/NAME`). Only absent and `null` arguments
/// are missing: `""` and whitespace are strings like any other, as the advertised inputSchema
/// says (the reference runtime drops blank strings; docs/src/fidelity.md, "Arguments follow the inputSchema").
pub fn check_arguments(
    spec: &ToolSpec,
    args: &Map<String, Value>,
) -> Result<Map<String, Value>, Diagnostic> {
    let bad = |name: &str, msg: String| {
        Diagnostic::error(Code::InvalidInput, format!("/arguments/{name}"), msg)
    };
    for name in args.keys() {
        if spec.param(name).is_none() {
            let known: Vec<&str> = spec.params.iter().map(|p| p.name.as_str()).collect();
            return Err(bad(
                name,
                format!("unknown argument {name:?}; this tool takes {known:?}"),
            ));
        }
    }
    let mut out = Map::new();
    for p in &spec.params {
        let v = args.get(&p.name).filter(|v| !v.is_null());
        match v {
            None if p.required => {
                return Err(bad(
                    &p.name,
                    format!(
                        "missing required argument {:?} ({})",
                        p.name,
                        p.ty.spec_name()
                    ),
                ))
            }
            None => {}
            Some(v) if !p.ty.accepts(v) => {
                return Err(bad(
                    &p.name,
                    format!(
                        "argument {:?} must be {}, got {}",
                        p.name,
                        p.ty.json_schema_name(),
                        stsd_protocol::json::type_name(v)
                    ),
                ))
            }
            Some(v) => {
                out.insert(p.name.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

/// Parses `NAME=VALUE` text arguments to the declared types (the CLI's `--arg`).
pub fn parse_text_argument(spec: &ToolSpec, pair: &str) -> Result<(String, Value), Diagnostic> {
    let Some((name, text)) = pair.split_once('=') else {
        return Err(Diagnostic::error(
            Code::InvalidInput,
            "/arguments",
            format!("--arg takes NAME=VALUE, got {pair:?}"),
        ));
    };
    let Some(p) = spec.param(name) else {
        let known: Vec<&str> = spec.params.iter().map(|p| p.name.as_str()).collect();
        return Err(Diagnostic::error(
            Code::InvalidInput,
            format!("/arguments/{name}"),
            format!("unknown argument {name:?}; this tool takes {known:?}"),
        ));
    };
    let v =
        p.ty.parse_text(text)
            .map_err(|e| Diagnostic::error(Code::InvalidInput, format!("/arguments/{name}"), e))?;
    Ok((name.to_string(), v))
}

/// The arguments of the Local Pass (§11.3): every required param from its testValue, parsed to
/// its type, and every optional param whose testValue is non-blank and parses. The catalog
/// depends on the latter: evalExpression's test expression uses its optional `variables`.
pub fn test_arguments(spec: &ToolSpec) -> Result<Map<String, Value>, Diagnostic> {
    let mut out = Map::new();
    for p in &spec.params {
        let Some(tv) = p.test_value.as_deref().filter(|t| !t.trim().is_empty()) else {
            continue;
        };
        match p.ty.parse_text(tv) {
            Ok(v) => {
                out.insert(p.name.clone(), v);
            }
            Err(e) if p.required => {
                return Err(Diagnostic::error(
                    Code::SpecInvariant,
                    format!("/params/{}/testValue", p.index),
                    e,
                ))
            }
            Err(_) => {}
        }
    }
    Ok(out)
}

/// A job ready to send, and the secrets to mask in everything that comes back.
pub struct Prepared {
    pub job: Job,
    pub secrets: SecretSet,
}

pub fn prepare(
    call_id: u64,
    spec: &ToolSpec,
    resolved: &Resolved,
    config: &Config,
    args: Map<String, Value>,
    env: &dyn EnvSource,
) -> Result<Prepared, Diagnostic> {
    // The code gets each secret as a placeholder; the broker puts it back at egress.
    let net = &resolved.tool_safety.capabilities.network;
    let (tool_hosts, default_hosts) = match net.mode {
        NetworkMode::Allowlist | NetworkMode::Strict => (net.hosts.clone(), net.hosts.clone()),
        NetworkMode::Open => (vec!["*".to_string()], Vec::new()),
        NetworkMode::Blocked => (Vec::new(), Vec::new()),
    };
    let withholding = crate::egress::secrets::Withholding {
        env,
        tool: &spec.name,
        tool_hosts: &tool_hosts,
        default_hosts: &default_hosts,
        config: &config.secrets,
        found: Default::default(),
    };
    let mut statics = Map::new();
    for (key, template) in spec.static_bag() {
        match envvar::resolve(template, &withholding) {
            Ok(v) => {
                statics.insert(key.to_string(), Value::String(v));
            }
            Err((_, missing)) => {
                return Err(Diagnostic::error(
                    Code::MissingRequirements,
                    "/staticVariables",
                    format!(
                        "{} not set (non-blank) for this tool to run (§11.2): stsd secret set \
                         {} (read at the next call), or name it in [baseline] env_allow and set it \
                         in the daemon's environment",
                        missing.join(", "),
                        missing
                            .first()
                            .map(|m| stsd_protocol::envvar::secret_name(m).unwrap_or(m))
                            .unwrap_or("NAME")
                    ),
                ))
            }
        }
    }
    let withheld = envvar::WithheldSet(withholding.found.into_inner());
    let secrets = SecretSet::collect(spec.static_variables.iter().map(|s| s.value.as_str()), env)
        .and(withheld.0.iter().map(|w| w.placeholder.clone()));
    let caps = &resolved.tool_safety.capabilities;
    let mut declared: Vec<String> = spec.params.iter().map(|p| p.name.clone()).collect();
    for (k, _) in spec.static_bag() {
        if !declared.iter().any(|d| d == k) {
            declared.push(k.to_string());
        }
    }
    let fs = FsAccess::from_flags(caps.file_read, caps.file_write);
    let seccomp = stsd_profiles::os::seccomp::bpf_for(fs)
        .map_err(|e| Diagnostic::error(Code::SandboxUnavailable, "", format!("seccomp: {e}")))?;
    let job = Job {
        call_id,
        code: spec.code.clone(),
        args_json: Value::Object(args).to_string(),
        statics_json: Value::Object(statics).to_string(),
        declared,
        tool_safety_json: serde_json::to_string(&resolved.tool_safety).unwrap_or_default(),
        seccomp,
        sandbox: SandboxSpec {
            fs,
            base_path: resolved.fs_base_path.display().to_string(),
            uid: config.worker.uid,
            gid: config.worker.gid,
            network: if caps.network.mode == NetworkMode::Blocked {
                NetworkGrant::Blocked
            } else {
                NetworkGrant::Brokered
            },
        },
        limits: JobLimits {
            timeout_ms: resolved.limits.timeout_ms,
            max_steps: resolved.limits.max_steps,
            memory_bytes: resolved.limits.memory_limit_bytes,
            max_write_bytes: config.baseline.max_write_bytes,
            max_files: config.baseline.max_files,
            ..JobLimits::default()
        },
        attack: None,
        keep_alive: false,
        compile_only: false,
        reuse_calls: 1,
        bytecode: None,
        withheld,
    };
    Ok(Prepared { job, secrets })
}

/// Where a body fails to parse: the engine's message and the line and column in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxProblem {
    pub message: String,
    pub line: u32,
    pub column: u32,
}

/// Compiles a spec's body in a sandboxed worker (no file or network access, no argument,
/// no secret: placeholders read as `x`) without running any of it. None when it parses.
pub fn syntax_check(
    spec: &ToolSpec,
    resolved: &Resolved,
    config: &Config,
    opts: &crate::exec::ExecOptions,
) -> Option<SyntaxProblem> {
    let no_secrets = |_: &str| Some("x".to_string());
    let mut prepared = prepare(0, spec, resolved, config, Map::new(), &no_secrets).ok()?;
    let job = &mut prepared.job;
    job.compile_only = true;
    job.sandbox.fs = FsAccess::None;
    job.sandbox.network = NetworkGrant::Blocked;
    job.seccomp = stsd_profiles::os::seccomp::bpf_for(FsAccess::None).ok()?;
    let out = crate::exec::run_job(job, opts, &mut |_| {});
    let e = out.result.err()?;
    if !e.message.starts_with("SyntaxError") {
        return None;
    }
    // The body sits on the wrapper's first line after its prefix (engine.rs `wrap`).
    let at = e.stack.as_deref().unwrap_or_default();
    let pos = at
        .split("tool.js:")
        .nth(1)
        .map(|r| {
            r.split(|c: char| !(c.is_ascii_digit() || c == ':'))
                .next()
                .unwrap_or("")
        })
        .unwrap_or("");
    let mut nums = pos.split(':').filter_map(|n| n.parse::<u32>().ok());
    let (line, mut column) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    if line == 1 {
        column = column.saturating_sub(job.wrapper_prefix().chars().count() as u32);
    }
    Some(SyntaxProblem {
        message: e.message,
        line,
        column,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> ToolSpec {
        let doc = json!({"name": "t", "code": "x", "codeType": "Javascript", "params": [
            {"name": "q", "type": "STRING", "required": true, "testValue": "a"},
            {"name": "n", "type": "INTEGER", "required": false, "testValue": "3"},
            {"name": "o", "type": "OBJECT", "required": false}]});
        stsd_protocol::validate_document(&doc)
            .spec
            .unwrap_or_else(|| unreachable!())
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn argument_checks() {
        let s = spec();
        assert!(check_arguments(&s, &args(json!({"q": "x", "n": 2}))).is_ok());
        let e = check_arguments(&s, &args(json!({"n": 2}))).err();
        assert_eq!(
            e.map(|d| (d.code, d.pointer)),
            Some((Code::InvalidInput, "/arguments/q".into()))
        );
        let e = check_arguments(&s, &args(json!({"q": "x", "n": "2"}))).err();
        assert_eq!(e.map(|d| d.pointer), Some("/arguments/n".into()));
        let e = check_arguments(&s, &args(json!({"q": "x", "n": 2.5}))).err();
        assert!(e.is_some(), "2.5 is not an INTEGER");
        let e = check_arguments(&s, &args(json!({"q": "x", "zz": 1}))).err();
        assert_eq!(e.map(|d| d.pointer), Some("/arguments/zz".into()));
        // Blank strings are bound as they are (the inputSchema allows any string); null is
        // missing.
        for blank in ["", "  ", "\t", "\n"] {
            let ok = check_arguments(&s, &args(json!({"q": blank}))).unwrap_or_default();
            assert_eq!(ok.get("q"), Some(&json!(blank)), "{blank:?} must be bound");
        }
        assert!(check_arguments(&s, &args(json!({"q": null}))).is_err());
        let ok = check_arguments(&s, &args(json!({"q": "x", "o": null}))).unwrap_or_default();
        assert!(!ok.contains_key("o"));
    }

    #[test]
    fn text_arguments_parse_to_declared_types() {
        let s = spec();
        assert_eq!(
            parse_text_argument(&s, "n=7").ok(),
            Some(("n".into(), json!(7)))
        );
        assert!(parse_text_argument(&s, "n=seven").is_err());
        assert_eq!(
            parse_text_argument(&s, "o={\"a\":1}").ok(),
            Some(("o".into(), json!({"a": 1})))
        );
        assert!(parse_text_argument(&s, "novalue").is_err());
        assert_eq!(
            test_arguments(&s).ok(),
            Some(args(json!({"q": "a", "n": 3})))
        );
    }
}
