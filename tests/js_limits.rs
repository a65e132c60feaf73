//! JavaScript-level behaviour of a call: limits, classification, bindings, isolation.

use std::time::{Duration, Instant};
use stsd::exec::{run_job, CallOutcome, CallValue};
use stsd_profiles::baseline::SpawnMode;
use stsd_protocol::frames::{FsAccess, Job};
use stsd_protocol::Code;
use stsd_tests::{exec_options, job, scratch_base};

fn base_job(code: &str) -> (Job, tempfile::TempDir) {
    let base = scratch_base();
    (job(code, FsAccess::None, base.path()), base)
}

fn run(j: &Job) -> CallOutcome {
    run_job(j, &exec_options(), &mut |_| {})
}

fn ok_json(out: &CallOutcome) -> serde_json::Value {
    match &out.result {
        Ok(CallValue::Json(t)) => serde_json::from_str(t).unwrap_or_else(|e| panic!("{e}: {t}")),
        other => panic!("expected a JSON result, got {other:?}"),
    }
}

fn err_code(out: &CallOutcome) -> Code {
    match &out.result {
        Err(e) => e.code,
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn infinite_loop_times_out_within_the_deadline_plus_one_second() {
    let (mut j, _b) = base_job("while (true) {}");
    j.limits.timeout_ms = 2000;
    j.limits.max_steps = u64::MAX; // the deadline, not the step budget, is under test
    let t0 = Instant::now();
    let out = run(&j);
    let took = t0.elapsed();
    assert_eq!(err_code(&out), Code::Timeout, "{out:?}");
    assert!(
        took >= Duration::from_millis(2000) && took < Duration::from_millis(3000),
        "{took:?}"
    );
}

#[test]
fn the_step_budget_stops_a_loop_long_before_the_deadline() {
    let (j, _b) = base_job("let i = 0; while (true) { i++; }");
    let t0 = Instant::now();
    let out = run(&j);
    assert_eq!(err_code(&out), Code::StepLimit, "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn index_of_over_a_huge_array_like_is_stopped_at_the_deadline() {
    let (mut j, _b) = base_job("return Array.prototype.indexOf.call({length: 2**32 - 1}, 1);");
    j.limits.timeout_ms = 1500;
    j.limits.max_steps = u64::MAX;
    let t0 = Instant::now();
    let out = run(&j);
    assert_eq!(err_code(&out), Code::Timeout, "{out:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn a_c_builtin_that_never_polls_is_killed_by_the_supervisor() {
    // join over a sparse array of 2^31 holes runs in C without reaching the interrupt handler.
    let (mut j, _b) = base_job("return new Array(2**31 - 1).join('');");
    j.limits.timeout_ms = 1000;
    j.limits.max_steps = u64::MAX;
    let t0 = Instant::now();
    let out = run(&j);
    let took = t0.elapsed();
    assert_eq!(err_code(&out), Code::Timeout, "{out:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");
}

#[test]
fn an_allocation_loop_hits_the_memory_limit() {
    let (mut j, _b) =
        base_job("const keep = []; while (true) keep.push(new Array(1e5).fill(1.5));");
    j.limits.max_steps = u64::MAX;
    j.limits.memory_bytes = 64 * 1024 * 1024;
    let out = run(&j);
    assert_eq!(err_code(&out), Code::MemoryLimit, "{out:?}");
}

/// A limit hit so near the top of the heap that QuickJS cannot allocate its own "out of
/// memory" error: QuickJS then throws a bare `null`, which used to come back as the tool's
/// own `JS_ERROR: Uncaught null`. The sort's temporaries are freed by the time the call is
/// classified, so only the refusal itself can tell the two apart. A tool's own `throw null`
/// stays a JS_ERROR (`errors_and_strings`).
#[test]
fn a_limit_hit_where_quickjs_cannot_make_its_error_is_memory_limit() {
    let (mut j, _b) = base_job(
        "const a = []; for (let i = 0; i < 300000; i++) a.push(i * 7919 % 300007);\n\
         while (true) { a.slice().sort(); }",
    );
    j.limits.max_steps = u64::MAX;
    j.limits.timeout_ms = 20_000;
    j.limits.memory_bytes = 32 * 1024 * 1024;
    let out = run(&j);
    assert_eq!(err_code(&out), Code::MemoryLimit, "{out:?}");
}

#[test]
fn deep_recursion_is_a_clean_js_error() {
    let (mut j, _b) = base_job("function f(n) { return f(n + 1) + 1; }\nreturn f(0);");
    j.limits.max_steps = u64::MAX;
    let out = run(&j);
    let e = out
        .result
        .err()
        .unwrap_or_else(|| panic!("recursion returned"));
    assert_eq!(e.code, Code::JsError);
    assert!(e.message.contains("RangeError"), "{}", e.message);
}

#[test]
fn a_10_mb_result_is_output_limit() {
    let (j, _b) = base_job("return 'x'.repeat(10 * 1024 * 1024);");
    assert_eq!(err_code(&run(&j)), Code::OutputLimit);
}

#[test]
fn results_just_under_the_limit_arrive_whole_in_chunks() {
    let (j, _b) = base_job("return 'é'.repeat(400 * 1024);");
    let v = ok_json(&run(&j));
    assert_eq!(v.as_str().map(|s| s.chars().count()), Some(400 * 1024));
}

#[test]
fn js_errors_carry_message_and_a_stack_with_body_line_numbers() {
    let (j, _b) = base_job("const a = 1;\n\nthrow new TypeError('bad input: ' + a);");
    let e = run(&j).result.err().unwrap_or_else(|| panic!("no error"));
    assert_eq!(e.code, Code::JsError);
    assert_eq!(e.message, "TypeError: bad input: 1");
    let stack = e.stack.unwrap_or_default();
    assert!(stack.contains("tool.js:3"), "line 3 of the body: {stack}");
    // A thrown non-Error value is reported too.
    let (j, _b) = base_job("throw 'plain';");
    assert_eq!(
        run(&j).result.err().map(|e| e.message),
        Some("Uncaught plain".into())
    );
}

#[test]
fn top_level_return_and_await_work() {
    let (j, _b) =
        base_job("const v = await new Promise((r) => r(41));\nawait null;\nreturn { v: v + 1 };");
    assert_eq!(ok_json(&run(&j)), serde_json::json!({"v": 42}));
    let (j, _b) = base_job("return;");
    assert_eq!(run(&j).result, Ok(CallValue::Undefined));
}

#[test]
fn a_promise_that_never_settles_is_a_clean_error() {
    let (j, _b) = base_job("await new Promise(() => {});");
    let e = run(&j).result.err().unwrap_or_else(|| panic!("settled"));
    assert_eq!(e.code, Code::JsError);
    assert!(e.message.contains("never settled"), "{}", e.message);
}

#[test]
fn params_and_statics_are_globals_and_undeclared_ones_are_undefined() {
    let (mut j, _b) = base_job("return [q, n, typeof missing, key, typeof other];");
    j.args_json = r#"{"q": "hi", "n": 7}"#.into();
    j.statics_json = r#"{"key": "from-static", "q": "static wins"}"#.into();
    j.declared = vec![
        "q".into(),
        "n".into(),
        "missing".into(),
        "key".into(),
        "other".into(),
    ];
    assert_eq!(
        ok_json(&run(&j)),
        serde_json::json!(["static wins", 7, "undefined", "from-static", "undefined"])
    );
}

#[test]
fn console_lines_stream_in_order_with_caps() {
    let (mut j, _b) = base_job("for (let i = 0; i < 5; i++) console.log('line', i, {a: i});\nconsole.error(new Error('e'));\nreturn 1;");
    j.limits.max_console_lines = 4;
    let mut lines = Vec::new();
    let out = run_job(&j, &exec_options(), &mut |ev| {
        if let stsd::exec::Event::Console(level, line) = ev {
            lines.push(format!("{}:{line}", level.as_str()));
        }
    });
    // Over the caps: the lines within them arrived, in order, and the call is OUTPUT_LIMIT.
    assert_eq!(err_code(&out), Code::OutputLimit, "{out:?}");
    assert_eq!(
        lines,
        [
            "log:line 0 {\"a\":0}",
            "log:line 1 {\"a\":1}",
            "log:line 2 {\"a\":2}",
            "log:line 3 {\"a\":3}"
        ]
    );
    assert!(out.console_truncated);
    // Within the caps, errors print as `Name: message` and the call succeeds.
    let (j, _b) =
        base_job("console.warn(new RangeError('r'), undefined, null, 1.5, [1]);\nreturn 'done';");
    let mut lines = Vec::new();
    let out = run_job(&j, &exec_options(), &mut |ev| {
        if let stsd::exec::Event::Console(level, line) = ev {
            lines.push(format!("{}:{line}", level.as_str()));
        }
    });
    assert_eq!(ok_json(&out), "done");
    assert_eq!(lines, ["warn:RangeError: r undefined null 1.5 [1]"]);
}

#[test]
fn a_tool_sees_no_environment_no_host_path_and_no_host_object() {
    let code = r#"
const names = Object.getOwnPropertyNames(globalThis).sort();
let stack = '';
try { null.x; } catch (e) { stack = String(e.stack); }
return { names, stack, types: [typeof process, typeof require, typeof std, typeof os, typeof Java,
  typeof Deno, typeof fetch, typeof safety.fs, typeof scriptArgs, typeof print] };
"#;
    let (j, _b) = base_job(code);
    let v = ok_json(&run(&j));
    assert_eq!(v["types"], serde_json::json!(vec!["undefined"; 10]));
    let names: Vec<String> = serde_json::from_value(v["names"].clone()).unwrap_or_default();
    // Everything on globalThis is an ECMAScript builtin, plus the posture's `console`.
    const ALLOWED: &[&str] = &[
        "AggregateError",
        "Array",
        "ArrayBuffer",
        "BigInt",
        "BigInt64Array",
        "BigUint64Array",
        "Boolean",
        "DataView",
        "Date",
        "Error",
        "EvalError",
        "FinalizationRegistry",
        "Float16Array",
        "Float32Array",
        "Float64Array",
        "Function",
        "Infinity",
        "Int16Array",
        "Int32Array",
        "Int8Array",
        "InternalError",
        "Iterator",
        "JSON",
        "Map",
        "Math",
        "NaN",
        "Number",
        "Object",
        "Promise",
        "Proxy",
        "RangeError",
        "ReferenceError",
        "Reflect",
        "RegExp",
        "Set",
        "SharedArrayBuffer",
        "String",
        "Symbol",
        "SyntaxError",
        "TypeError",
        "URIError",
        "Uint16Array",
        "Uint32Array",
        "Uint8Array",
        "Uint8ClampedArray",
        "WeakMap",
        "WeakRef",
        "WeakSet",
        "Atomics",
        "console",
        "decodeURI",
        "decodeURIComponent",
        "encodeURI",
        "encodeURIComponent",
        "escape",
        "eval",
        "globalThis",
        "isFinite",
        "isNaN",
        "parseFloat",
        "parseInt",
        "queueMicrotask",
        "undefined",
        "unescape",
        "SuppressedError",
        "DisposableStack",
        "AsyncDisposableStack",
        "Iterator",
        "DOMException",
        // The always-available runtime globals (spec §8.3 encoding and crypto groups).
        "TextEncoder",
        "TextDecoder",
        "atob",
        "btoa",
        "crypto",
        "structuredClone",
        "Intl",
        "safety",
        "URL",
        "URLSearchParams",
    ];
    let extra: Vec<&String> = names
        .iter()
        .filter(|n| !ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(extra.is_empty(), "unexpected globals: {extra:?}");
    let stack = v["stack"].as_str().unwrap_or_default();
    assert!(
        stack.contains("tool.js") && !stack.contains('/'),
        "stack leaks a host path: {stack}"
    );
}

#[test]
fn each_call_gets_a_fresh_process_and_context() {
    let (j, _b) = base_job("globalThis.leak = (globalThis.leak || 0) + 1; return leak;");
    let a = run(&j);
    let b = run(&j);
    assert_eq!(ok_json(&a), 1);
    assert_eq!(ok_json(&b), 1);
    assert_ne!(a.worker_pid, b.worker_pid);
}

#[test]
fn a_job_that_asks_for_a_missing_base_path_is_refused_not_run_weaker() {
    let (mut j, _b) = base_job("return 1;");
    j.sandbox.fs = FsAccess::ReadOnly;
    j.seccomp = stsd_profiles::os::seccomp::bpf_for(FsAccess::ReadOnly).unwrap_or_default();
    j.sandbox.base_path = "/nonexistent/stsd/base".into();
    assert_eq!(err_code(&run(&j)), Code::SandboxUnavailable);
}

#[test]
fn many_microtask_chains_do_not_outlive_the_step_budget() {
    // The body waits forever while 20000 independent chains spin; each interrupt would end only
    // one chain if the job loop kept draining after a stop.
    let code = "let n = 0; for (let c = 0; c < 20000; c++) { const spin = () => { n++; queueMicrotask(spin); }; queueMicrotask(spin); }\nawait new Promise(() => {});";
    let (mut j, _b) = base_job(code);
    j.limits.timeout_ms = 5000;
    // The mechanism is under test, not the default budget's size.
    j.limits.max_steps = 500_000;
    let t0 = Instant::now();
    let out = run(&j);
    assert_eq!(err_code(&out), Code::StepLimit, "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
fn console_with_huge_arguments_is_cut_not_a_crash() {
    // 200 arguments of 16 MiB each: rendering stops at the line budget, so this costs one
    // string copy and the line arrives cut to 16 KiB.
    let (mut j, _b) =
        base_job("const s = 'x'.repeat(16 << 20); console.log(...Array(200).fill(s)); return 1;");
    j.limits.max_steps = u64::MAX;
    let mut sizes = Vec::new();
    let t0 = Instant::now();
    let out = run_job(&j, &exec_options(), &mut |ev| {
        if let stsd::exec::Event::Console(_, line) = ev {
            sizes.push(line.len());
        }
    });
    assert_eq!(ok_json(&out), 1, "{out:?}");
    assert_eq!(sizes.len(), 1);
    assert!(sizes[0] <= 16 * 1024 + 64, "{sizes:?}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_throwing_to_json_in_console_propagates_to_the_tool() {
    let (j, _b) = base_job("try { console.log({ toJSON() { throw new Error('boom'); } }); } catch (e) { return 'caught ' + e.message; }");
    assert_eq!(ok_json(&run(&j)), "caught boom");
}

#[test]
fn nested_argument_keys_do_not_count_as_supplied_names() {
    let (mut j, _b) = base_job("return [typeof a, typeof b];");
    j.args_json = r#"{"a": {"b": 1}}"#.into();
    j.declared = vec!["a".into(), "b".into()];
    assert_eq!(
        ok_json(&run(&j)),
        serde_json::json!(["object", "undefined"])
    );
}

/// A worker that dies before it is ready never ran the tool: SANDBOX_UNAVAILABLE ("the tool
/// did not run"), not a crash of the tool (issue 33 item 7).
#[test]
fn a_worker_binary_that_dies_at_once_is_sandbox_unavailable() {
    let (j, _b) = base_job("return 1;");
    for spawn in [SpawnMode::Zygote, SpawnMode::Exec] {
        let mut c = stsd_profiles::Config::default();
        c.worker.spawn = spawn;
        let opts =
            stsd::exec::ExecOptions::new("/bin/true".into(), &c).unwrap_or_else(|e| panic!("{e}"));
        let out = run_job(&j, &opts, &mut |_| {});
        assert_eq!(
            err_code(&out),
            Code::SandboxUnavailable,
            "{spawn:?}: {out:?}"
        );
        assert!(
            format!("{out:?}").contains("the tool did not run"),
            "{spawn:?}: {out:?}"
        );
    }
}

#[test]
fn a_kept_worker_runs_a_second_job_in_a_fresh_context() {
    let (mut j, _b) = base_job("globalThis.n = (globalThis.n || 0) + 1; return n;");
    j.keep_alive = true;
    j.reuse_calls = 2;
    let opts = exec_options();
    let w = stsd::exec::spawn_ready(&opts, true).unwrap_or_else(|e| panic!("{e:?}"));
    let pid = w.pid();
    let (out, kept) = stsd::exec::run_keeping(w, &j, &opts, None, &mut |_| {});
    assert_eq!(ok_json(&out), 1);
    let w = kept.unwrap_or_else(|| panic!("worker not kept: {out:?}"));
    assert_eq!(w.pid(), pid);
    j.keep_alive = false;
    let (out, kept) = stsd::exec::run_keeping(w, &j, &opts, None, &mut |_| {});
    assert_eq!(ok_json(&out), 1, "a fresh context: {out:?}");
    assert_eq!(out.worker_pid, pid);
    assert!(kept.is_none());
}

#[test]
fn local_time_methods_work_under_the_no_file_posture() {
    // Local time needs glibc's zone data, loaded before the sandbox (TZ=UTC in workers).
    let (j, _b) = base_job("const d = new Date(86400000 + 3600000); return [d.getHours(), d.getTimezoneOffset(), d.getDate(), typeof new Date().getMilliseconds()];");
    assert_eq!(ok_json(&run(&j)), serde_json::json!([1, 0, 2, "number"]));
}

#[test]
fn a_job_without_seccomp_programs_is_refused() {
    let (mut j, _b) = base_job("return 1;");
    j.seccomp = Default::default();
    assert_eq!(err_code(&run(&j)), Code::SandboxUnavailable);
}

/// Host-side allocations a tool can cause are charged to the same budget as the QuickJS heap:
/// each of these used to hold a gigabyte or abort the worker (WORKER_CRASHED). They end in
/// MEMORY_LIMIT, and the worker's peak RSS stays under the budget plus a documented margin
/// (docs/src/limits.md: the binary, the runtime and one transient host copy).
#[test]
fn host_allocations_count_against_the_memory_limit() {
    const BUDGET: u64 = 128 << 20;
    const MARGIN: u64 = 64 << 20;
    let cases = [
        (
            "TextEncoder",
            "const s = 'x'.repeat(50e6); const keep = []; \
             for (let i = 0; i < 20; i++) keep.push(new TextEncoder().encode(s)); return keep.length;",
        ),
        (
            "YAML aliases of a 4 MB anchor",
            "const doc = 'a: &a \"' + 'x'.repeat(4 << 20) + '\"\\nb: [' + Array(250).fill('*a').join(',') + ']\\n'; \
             return safety.parser.yaml(doc).b.length;",
        ),
        (
            "CSV with a wide header",
            "const head = Array.from({length: 200}, (_, i) => i + 'k'.repeat(10000)).join(','); \
             return safety.parser.csv(head + '\\n' + '1\\n'.repeat(100), {header: true}).length;",
        ),
        (
            "XML of 400,000 elements",
            "return safety.parser.xml('<r>' + '<p a=\"1\"><b>x</b><i>y</i></p>'.repeat(100000) + '</r>') ? 1 : 0;",
        ),
        (
            "HTML of 15 MB",
            "return safety.parser.html('<div>' + '<p class=a><b>x</b><i>y</i></p>'.repeat(500000) + '</div>') ? 1 : 0;",
        ),
        (
            "getRandomValues on a Proxy",
            "let n = 0; const a = new Uint8Array(16); \
             const p = new Proxy(a, {get(t, k) { if (k === 'byteLength') return (n++ === 0) ? 16 : 1e9; \
             const v = Reflect.get(t, k); return typeof v === 'function' ? v.bind(t) : v; }}); \
             crypto.getRandomValues(p); return 'filled';",
        ),
    ];
    for (what, code) in cases {
        let (mut j, _b) = base_job(code);
        j.limits.max_steps = u64::MAX;
        j.limits.memory_bytes = BUDGET;
        let out = run(&j);
        let peak = out.peak_rss_kib.unwrap_or(0) * 1024;
        eprintln!(
            "{what}: {:?}, worker peak RSS {} MiB",
            out.result
                .as_ref()
                .map_err(|e| (e.code, e.message.chars().take(90).collect::<String>())),
            peak >> 20
        );
        match (&out.result, what) {
            // The Proxy's first answer passes the check; the second is never asked: the fill
            // uses the size read once, so the call works and allocates nothing large.
            (Ok(_), "getRandomValues on a Proxy") => {}
            _ => assert_eq!(
                err_code(&out),
                Code::MemoryLimit,
                "{what}: {:?}",
                out.result
            ),
        }
        assert!(out.peak_rss_kib.is_some(), "{what}: no peak measured");
        assert!(
            peak < BUDGET + MARGIN,
            "{what}: peak RSS {} MiB",
            peak >> 20
        );
    }
}

/// The step budget against the reference's statement limit: each loop below is sized so that
/// the reference runtime (GraalJS, 500,000 statements) would just accept it, counting every
/// statement of the body and one for the loop's own test. Each runs under the old budget of
/// 500,000 steps and under the default; the default must accept all of them (the old one did
/// not: call-heavy loops cost several steps a statement). Prints steps per statement bounds.
#[test]
fn code_under_the_reference_statement_limit_passes_the_default_step_budget() {
    const STATEMENTS: u64 = 490_000;
    let default_budget = stsd_profiles::Config::default().baseline.max_steps;
    // (label, statements per iteration, setup, body)
    let loops: &[(&str, u64, &str, &str)] = &[
        ("1 simple statement", 2, "let x = 0;", "x = x + 1;"),
        (
            "10 simple statements",
            11,
            "let a = 0, b = 0, c = 0;",
            "a++; b += a; c = a ^ b; a = a % 7; b = b % 11; c += 1; a += c & 1; b -= 1; c = c | 0; a = a + 0;",
        ),
        (
            "2 statements, 4 builtin calls",
            3,
            "const out = []; let s = 0;",
            "out.push(Math.floor(i / 3)); s += String(i).length;",
        ),
        (
            "1 statement, 5 builtin calls",
            2,
            "let s = 0;",
            "s += Math.max(Math.min(i, 5), Math.abs(-i)) + Math.floor(i / 2) + Math.round(i / 3);",
        ),
        (
            "own function calls",
            4,
            "const f = (x) => { return x + 1; }; let s = 0;",
            "s = f(f(s));",
        ),
        (
            "Set and Date calls (cronNext's loop)",
            4,
            "const set = new Set([0]); const d = new Date(0); let hits = 0;",
            "if (set.has(d.getUTCMinutes()) && set.has(d.getUTCHours())) hits++; d.setUTCMinutes(d.getUTCMinutes() + 1);",
        ),
    ];
    let mut old_refused = 0;
    for (label, per_iter, setup, body) in loops {
        let n = STATEMENTS / per_iter;
        let code = format!("{setup} for (let i = 0; i < {n}; i++) {{ {body} }} return 'done';");
        let mut outcomes = Vec::new();
        for budget in [500_000, default_budget] {
            let (mut j, _b) = base_job(&code);
            j.limits.max_steps = budget;
            let out = run(&j);
            outcomes.push(matches!(&out.result, Ok(CallValue::Json(t)) if t == "\"done\""));
            if budget == default_budget {
                assert!(
                    outcomes[1],
                    "{label}: {} statements refused by the default budget: {:?}",
                    n * per_iter,
                    out.result
                );
            }
        }
        if !outcomes[0] {
            old_refused += 1;
        }
        eprintln!(
            "{label}: {} reference statements; 500000 steps: {}, {default_budget} steps: {}",
            n * per_iter,
            if outcomes[0] { "pass" } else { "STEP_LIMIT" },
            if outcomes[1] { "pass" } else { "STEP_LIMIT" }
        );
    }
    assert!(
        old_refused >= 3,
        "the old budget should refuse the call-heavy loops"
    );

    // The catalog's cronNext, the next two monthly runs from the worst start (62 days to walk,
    // about 89,000 minutes and 360,000 statements in the reference).
    let cat = stsd::store::Catalog::load(&[
        stsd_tests::catalog_dir().join("default-tool-specs-builtin.json")
    ]);
    let spec = cat
        .entries
        .iter()
        .filter_map(|e| e.validated.spec.as_ref())
        .find(|s| s.name == "cronNext")
        .unwrap_or_else(|| panic!("cronNext missing"));
    for (budget, want_ok) in [(500_000, false), (default_budget, true)] {
        let (mut j, _b) = base_job(&spec.code);
        j.args_json = serde_json::json!({"expression": "0 0 1 * *", "from": "2026-07-01T00:01:00Z", "count": 2}).to_string();
        j.declared = vec!["expression".into(), "from".into(), "count".into()];
        j.limits.max_steps = budget;
        let out = run(&j);
        if want_ok {
            assert_eq!(
                ok_json(&out),
                serde_json::json!(["2026-08-01T00:00:00.000Z", "2026-09-01T00:00:00.000Z"])
            );
        } else {
            assert_eq!(err_code(&out), Code::StepLimit, "{out:?}");
        }
    }
}
