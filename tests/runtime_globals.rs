//! The always-available runtime globals (encoding, crypto, structuredClone): behaviour, error
//! classes, and equality with node for the deterministic catalog tools that use them.

use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use stsd::exec::{run_job, CallValue};
use stsd::store::Catalog;
use stsd_protocol::frames::FsAccess;
use stsd_tests::{catalog_dir, exec_options, job, scratch_base};

fn run_code(code: &str, args: Value, declared: &[&str]) -> Result<Value, String> {
    let base = scratch_base();
    let mut j = job(code, FsAccess::None, base.path());
    j.args_json = args.to_string();
    j.declared = declared.iter().map(|s| s.to_string()).collect();
    match run_job(&j, &exec_options(), &mut |_| {}).result {
        Ok(CallValue::Json(t)) => Ok(serde_json::from_str(&t).unwrap_or(Value::Null)),
        Ok(CallValue::Undefined) => Ok(Value::Null),
        Err(e) => Err(e.message),
    }
}

fn ok(code: &str) -> Value {
    run_code(code, json!({}), &[]).unwrap_or_else(|e| panic!("{code}: {e}"))
}

#[test]
fn text_encoder_and_decoder() {
    assert_eq!(
        ok("return Array.from(new TextEncoder().encode('é€😀'));"),
        json!([195, 169, 226, 130, 172, 240, 159, 152, 128])
    );
    assert_eq!(
        ok("return new TextDecoder().decode(new Uint8Array([0xEF,0xBB,0xBF,104,105]));"),
        "hi"
    );
    assert_eq!(ok("return new TextDecoder('utf-8', {ignoreBOM: true}).decode(new Uint8Array([0xEF,0xBB,0xBF,104])).length;"), 2);
    // Malformed UTF-8: replacement characters, or a TypeError when fatal.
    assert_eq!(
        ok("return new TextDecoder().decode(new Uint8Array([0x61, 0xff, 0x62]));"),
        "a\u{fffd}b"
    );
    assert_eq!(ok("try { new TextDecoder('utf-8', {fatal: true}).decode(new Uint8Array([0xff])); } catch (e) { return e.name; }"), "TypeError");
    assert_eq!(
        ok("try { new TextDecoder('latin1'); } catch (e) { return e.name; }"),
        "RangeError"
    );
    assert_eq!(
        ok("const d = new Uint8Array(3); return new TextEncoder().encodeInto('a€', d);"),
        json!({"read": 1, "written": 1})
    );
}

#[test]
fn atob_and_btoa_follow_the_browsers() {
    assert_eq!(ok("return btoa('hello world');"), "aGVsbG8gd29ybGQ=");
    assert_eq!(ok("return btoa(String.fromCharCode(255, 0, 128));"), "/wCA");
    assert_eq!(ok("return atob(' aGVs\\nbG8= ');"), "hello");
    // Non-zero trailing bits are forgiven (WHATWG forgiving-base64, as node and browsers).
    assert_eq!(ok("return atob('SGVsbG8gV29ybGR=');"), "Hello World");
    assert_eq!(ok("return atob('YQ') + atob('YR==');"), "aa");
    assert_eq!(
        ok("return atob('aGVsbG8');"),
        "hello",
        "missing padding is forgiven"
    );
    for bad in [
        "btoa('€')",
        "atob('a')",
        "atob('a*b=')",
        "atob('aGVsbG8===')",
    ] {
        let code = format!("try {{ {bad}; return 'no error'; }} catch (e) {{ return [e.name, e instanceof DOMException]; }}");
        assert_eq!(ok(&code), json!(["InvalidCharacterError", true]), "{bad}");
    }
}

#[test]
fn crypto_random_values_uuid_and_limits() {
    // A real fill of the element width: 32-bit values above 255 appear.
    assert_eq!(ok("const a = crypto.getRandomValues(new Uint32Array(64)); return a.some(x => x > 0xffff);"), true);
    assert_eq!(
        ok("const a = new Uint8Array(8); return crypto.getRandomValues(a) === a;"),
        true
    );
    assert_eq!(
        ok("try { crypto.getRandomValues(new Uint8Array(65537)); } catch (e) { return e.name; }"),
        "QuotaExceededError"
    );
    assert_eq!(
        ok("try { crypto.getRandomValues(new Float64Array(2)); } catch (e) { return e.name; }"),
        "TypeMismatchError"
    );
    let re = "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";
    assert_eq!(
        ok(&format!(
            "const u = crypto.randomUUID(); return [/{re}/.test(u), u !== crypto.randomUUID()];"
        )),
        json!([true, true])
    );
}

#[test]
fn subtle_digest_sign_verify() {
    let hex = "const h = (b) => Array.from(b, x => x.toString(16).padStart(2, '0')).join('');";
    assert_eq!(
        ok(&format!("{hex} return h(await crypto.subtle.digest('SHA-256', new TextEncoder().encode('abc')));")),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        ok(&format!(
            "{hex} return h(await crypto.subtle.digest({{name: 'sha-1'}}, 'abc'));"
        )),
        "a9993e364706816aba3e25717850c26c9cd0d89d"
    );
    let code = format!(
        "{hex} const k = await crypto.subtle.importKey('raw', new TextEncoder().encode('Jefe'), {{name: 'HMAC', hash: 'SHA-256'}}, false, ['sign']);
         const data = new TextEncoder().encode('what do ya want for nothing?');
         const sig = await crypto.subtle.sign('HMAC', k, data);
         return [h(sig), await crypto.subtle.verify('HMAC', k, sig, data), await crypto.subtle.verify('HMAC', k, sig, 'other'), k.type, k.extractable];"
    );
    assert_eq!(
        ok(&code),
        json!([
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            true,
            false,
            "secret",
            false
        ])
    );
    assert_eq!(
        ok("try { await crypto.subtle.digest('MD5', 'x'); } catch (e) { return e.name; }"),
        "NotSupportedError"
    );
}

#[test]
fn structured_clone_handles_cycles_and_refuses_functions() {
    let code = "const a = {d: new Date(5), m: new Map([[1, {x: [1, 2]}]]), s: new Set([3])}; a.self = a;
                const c = structuredClone(a);
                return [c !== a, c.self === c, c.d.getTime(), c.m.get(1).x, [...c.s], c.m.get(1) !== a.m.get(1)];";
    assert_eq!(ok(code), json!([true, true, 5, [1, 2], [3], true]));
    assert_eq!(
        ok("try { structuredClone({f() {}}); } catch (e) { return e.name; }"),
        "DataCloneError"
    );
}

#[test]
fn host_functions_are_not_reachable_from_the_tool() {
    assert_eq!(
        ok("return [typeof host, typeof utf8Encode, Object.keys(crypto).sort(), Object.isFrozen(crypto)];"),
        json!(["undefined", "undefined", ["getRandomValues", "randomUUID", "subtle"], true])
    );
}

/// Runs the same body under node and under stsd with the same arguments.
fn node(code: &str, args: &Value, declared: &[String]) -> Result<Value, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/node_oracle.js");
    let mut child = Command::new("node")
        .arg(script)
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("node: {e}"))?;
    let input = json!({"code": code, "args": args, "declared": declared}).to_string();
    child
        .stdin
        .take()
        .map(|mut s| s.write_all(input.as_bytes()));
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("node output: {e}"))?;
    if v["ok"] == true {
        Ok(v["result"].clone())
    } else {
        Err(v["error"].as_str().unwrap_or_default().to_string())
    }
}

#[test]
fn deterministic_catalog_tools_match_node() {
    let cases: &[(&str, &[Value])] = &[
        (
            "base64",
            &[
                json!({"text": "hello world"}),
                json!({"text": "héllo ✓ 😀", "mode": "encode"}),
                json!({"text": "aMOpbGxvIOKckyDwn5iA", "mode": "decode"}),
            ],
        ),
        (
            "hex",
            &[
                json!({"text": "hello"}),
                json!({"text": "✓ é", "mode": "encode"}),
                json!({"text": "68 65 6c 6c 6f", "mode": "decode"}),
            ],
        ),
        (
            "hash",
            &[
                json!({"text": "hello"}),
                json!({"text": "", "algorithm": "SHA-384"}),
                json!({"text": "日本語", "algorithm": "SHA-512"}),
            ],
        ),
        (
            "hmac",
            &[
                json!({"secret": "key", "text": "message"}),
                json!({"secret": "s3cr3t", "text": "", "algorithm": "SHA-512"}),
                json!({"secret": "日本", "text": "x", "algorithm": "SHA-384"}),
            ],
        ),
        (
            "jwtDecode",
            &[
                json!({"token": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"}),
                json!({"token": "eyJhbGciOiJub25lIn0.eyJhIjoxfQ."}),
                json!({"token": "not-a-token"}),
            ],
        ),
        (
            "jwtVerify",
            &[
                json!({"token": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "secret": "your-256-bit-secret"}),
                json!({"token": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "secret": "wrong"}),
                json!({"token": "a.b", "secret": "x"}),
            ],
        ),
    ];
    let cat = Catalog::load(&[catalog_dir().join("default-tool-specs-builtin-helpers.json")]);
    let mut compared = 0;
    for (name, arg_sets) in cases {
        let spec = cat
            .entries
            .iter()
            .filter_map(|e| e.validated.spec.as_ref())
            .find(|s| s.name == *name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let declared: Vec<String> = spec.params.iter().map(|p| p.name.clone()).collect();
        let test_args: serde_json::Map<String, Value> =
            stsd::exec::job::test_arguments(spec).unwrap_or_default();
        let mut sets = vec![Value::Object(test_args)];
        sets.extend(arg_sets.iter().cloned());
        for args in sets {
            let d: Vec<&str> = declared.iter().map(String::as_str).collect();
            let ours = run_code(&spec.code, args.clone(), &d);
            let theirs = node(&spec.code, &args, &declared);
            match (&ours, &theirs) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{name} {args}"),
                (Err(a), Err(b)) => assert!(
                    a.ends_with(b.as_str()),
                    "{name} {args}: stsd {a:?} vs node {b:?}"
                ),
                _ => panic!("{name} {args}: stsd {ours:?} vs node {theirs:?}"),
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 24);
}

#[test]
fn intl_date_time_format_matches_node() {
    let opts = [
        json!({"timeZone": "Asia/Seoul", "year": "numeric", "month": "2-digit", "day": "2-digit", "hour": "2-digit", "minute": "2-digit", "second": "2-digit", "hour12": false}),
        json!({"timeZone": "America/New_York", "year": "numeric", "month": "2-digit", "day": "2-digit", "hour": "2-digit", "minute": "2-digit", "second": "2-digit", "hour12": false, "fractionalSecondDigits": 3}),
        json!({"timeZone": "Europe/Berlin", "year": "numeric", "month": "2-digit", "day": "2-digit", "hour": "2-digit", "minute": "2-digit", "second": "2-digit", "hour12": false, "weekday": "short"}),
        json!({"timeZone": "Asia/Kolkata", "hour": "2-digit", "minute": "2-digit", "timeZoneName": "short"}),
        json!({"timeZone": "America/Los_Angeles", "timeZoneName": "short"}),
        json!({"timeZone": "UTC"}),
        json!({"timeZone": "UTC", "year": "numeric", "month": "long", "day": "numeric", "weekday": "long"}),
        json!({"timeZone": "Australia/Adelaide", "hour": "numeric", "minute": "2-digit", "hour12": true}),
        json!({"timeZone": "utc", "month": "short", "day": "numeric"}),
    ];
    // Midnight in Seoul (the h24 quirk), a DST switch day in New York, 1969, a leap day.
    let instants = [
        1_704_466_800_000i64,
        1_710_054_000_000,
        -86_400_000 * 200,
        951_782_400_000,
        1_700_000_000_123,
    ];
    let mut compared = 0;
    for locale in ["en-US", "en-CA"] {
        for o in &opts {
            for ms in instants {
                let code = format!(
                    // node reports ICU's legacy id Asia/Calcutta; stsd keeps the IANA name.
                    "const f = new Intl.DateTimeFormat('{locale}', {o}); const r = f.resolvedOptions(); \
                     if (r.timeZone === 'Asia/Calcutta') r.timeZone = 'Asia/Kolkata'; \
                     return [f.formatToParts(new Date({ms})), f.format({ms}), r];"
                );
                let ours = run_code(&code, json!({}), &[]);
                let theirs = node(&code, &json!({}), &[]);
                assert_eq!(ours, theirs, "{locale} {o} {ms}");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 90);
    // Unknown zones are a RangeError, as in node.
    let bad = "try { new Intl.DateTimeFormat('en-US', {timeZone: 'Mars/Base'}); } catch (e) { return [e.name, e.message]; }";
    assert_eq!(run_code(bad, json!({}), &[]), node(bad, &json!({}), &[]));
    // Date's locale methods agree too.
    let dates = "const d = new Date(1704466800000); return [d.toLocaleString('en-US', {timeZone: 'UTC'}), d.toLocaleDateString('en-US', {timeZone: 'UTC'}), d.toLocaleTimeString('en-US', {timeZone: 'UTC'})];";
    assert_eq!(
        run_code(dates, json!({}), &[]),
        node(dates, &json!({}), &[])
    );
}

/// Tools whose result depends on the clock or on randomness: checked for shape elsewhere.
const NON_DETERMINISTIC: &[&str] = &["uuid", "secureRandom", "passwordGenerate", "getCurrentTime"];

#[test]
fn every_deterministic_non_network_catalog_tool_matches_node_on_its_test_values() {
    let files = [
        "default-tool-specs-builtin.json",
        "default-tool-specs-builtin-helpers.json",
        "default-tool-specs.json",
    ];
    let mut compared = Vec::new();
    for f in files {
        let cat = Catalog::load(&[catalog_dir().join(f)]);
        for spec in cat.entries.iter().filter_map(|e| e.validated.spec.as_ref()) {
            let blocked = spec
                .sandbox_overrides
                .network_mode
                .value()
                .is_none_or(|m| *m == stsd_protocol::NetworkMode::Blocked);
            let uses_host = spec.code.contains("safety.");
            if !blocked
                || uses_host
                || NON_DETERMINISTIC.contains(&spec.name.as_str())
                || !spec.static_variables.is_empty()
            {
                continue;
            }
            let args = Value::Object(stsd::exec::job::test_arguments(spec).unwrap_or_default());
            let declared: Vec<String> = spec.params.iter().map(|p| p.name.clone()).collect();
            let d: Vec<&str> = declared.iter().map(String::as_str).collect();
            let ours = run_code(&spec.code, args.clone(), &d);
            let theirs = node(&spec.code, &args, &declared);
            assert_eq!(ours, theirs, "{} {args}", spec.name);
            compared.push(spec.name.clone());
        }
    }
    assert!(
        compared.len() >= 35,
        "compared only {}: {compared:?}",
        compared.len()
    );
}

#[test]
fn non_deterministic_tools_have_the_right_shape() {
    let find = |file: &str, name: &str| {
        let cat = Catalog::load(&[catalog_dir().join(file)]);
        let spec = cat
            .entries
            .iter()
            .filter_map(|e| e.validated.spec.clone())
            .find(|s| s.name == name);
        spec.unwrap_or_else(|| panic!("{name} missing"))
    };
    let run = |spec: &stsd_protocol::ToolSpec, args: Value| {
        let d: Vec<String> = spec.params.iter().map(|p| p.name.clone()).collect();
        let d: Vec<&str> = d.iter().map(String::as_str).collect();
        run_code(&spec.code, args, &d).unwrap_or_else(|e| panic!("{}: {e}", spec.name))
    };
    let t = run(
        &find("default-tool-specs.json", "getCurrentTime"),
        json!({"timeZone": "Asia/Seoul"}),
    )
    .to_string();
    // In the hour after midnight in Seoul (15:00-16:00 UTC), `hour12: false` formats the hour
    // as 24, as node does too ("2026-11-24, 24:39:48"), and the tool then computes +33:00:
    // the catalog tool's own bug, reproduced faithfully, not a runtime fault.
    assert!(
        t.contains("+09:00") || t.contains("Asia/Seoul") || t.contains("T24:"),
        "{t}"
    );
    let u = run(
        &find("default-tool-specs-builtin-helpers.json", "uuid"),
        json!({}),
    );
    let u = u.as_str().unwrap_or_default().to_string();
    assert!(u.len() == 36 && u.chars().nth(14) == Some('4'), "{u}");
    let a = run(
        &find("default-tool-specs-builtin-helpers.json", "uuid"),
        json!({}),
    );
    assert_ne!(
        a.as_str().unwrap_or_default(),
        u,
        "two calls give two UUIDs"
    );
    let r = run(
        &find("default-tool-specs-builtin-helpers.json", "secureRandom"),
        json!({"bytes": 16}),
    )
    .to_string();
    assert!(
        r.trim_matches('"').chars().all(|c| c.is_ascii_hexdigit())
            && r.trim_matches('"').len() == 32,
        "{r}"
    );
    let p = run(
        &find(
            "default-tool-specs-builtin-helpers.json",
            "passwordGenerate",
        ),
        json!({"length": 24}),
    )
    .to_string();
    assert!(p.contains("24") || p.trim_matches('"').len() == 24, "{p}");
}

#[test]
fn parsers_refuse_hostile_input_with_a_classified_error() {
    let class = |code: &str| {
        let base = scratch_base();
        let j = job(code, FsAccess::None, base.path());
        run_job(&j, &exec_options(), &mut |_| {})
            .result
            .map_err(|e| (e.code, e.message))
    };
    for code in [
        // Billion laughs and an external entity: DTDs are refused outright.
        "return safety.parser.xml('<?xml version=\"1.0\"?><!DOCTYPE l [<!ENTITY a \"aaaa\"><!ENTITY b \"&a;&a;&a;&a;\">]><l>&b;</l>');",
        "return safety.parser.xml('<!DOCTYPE d [<!ENTITY x SYSTEM \"file:///etc/passwd\">]><d>&x;</d>');",
        "return safety.parser.xml('<unclosed>');",
        // YAML aliases that would expand past the node budget.
        "let y = 'a: &a [1,2,3,4,5,6,7,8,9,10]\\n'; let p = 'a'; for (const c of 'bcdefghij') { y += c + ': &' + c + ' [' + Array(10).fill('*' + p).join(',') + ']\\n'; p = c; } return safety.parser.yaml(y);",
        "return safety.parser.csv('a€b', {delimiter: '€'});",
    ] {
        let r = class(code);
        assert!(matches!(&r, Err((stsd_protocol::Code::InvalidInput, _))), "{code}: {r:?}");
    }
    // A 100 MB document stays within the worker's limits: refused or parsed, never a crash.
    let big = "const s = '<r>' + '<i>x</i>'.repeat(12_000_000) + '</r>'; return safety.parser.xml(s).children.length;";
    let r = class(big);
    assert!(
        matches!(
            &r,
            Err((
                stsd_protocol::Code::InvalidInput | stsd_protocol::Code::MemoryLimit,
                _
            ))
        ),
        "{r:?}"
    );
    // A tag that would construct an object elsewhere is only data here.
    assert_eq!(
        ok("return safety.parser.yaml('x: !!python/object:os.system ls');"),
        json!({"x": "ls"})
    );
    // Malformed base64 and UTF-8 were covered above (atob, TextDecoder fatal).
}

#[test]
fn url_and_url_search_params_match_node() {
    let cases = [
        "const u = new URL('https://User:pw@EXAMPLE.com:443/a/../b/%7e?x=1&y=a+b#frag'); return [u.href, u.origin, u.protocol, u.username, u.host, u.hostname, u.port, u.pathname, u.search, u.hash];",
        "const u = new URL('../c?q=1', 'http://h.example/a/b/'); return [u.href, u.searchParams.get('q')];",
        "const u = new URL('http://x.test/p?a=1&b=2&a=3'); u.searchParams.append('c', 'd e'); u.searchParams.delete('b'); u.hash = 'h'; u.port = '8080'; return [u.href, u.searchParams.getAll('a'), u.searchParams.size];",
        "return [URL.canParse('nota url'), URL.canParse('/x', 'https://a.b'), URL.parse('::') === null];",
        "try { new URL('http://[::1'); return 'no'; } catch (e) { return e.name; }",
        "const p = new URLSearchParams('?z=1&a=2&z=0&é=ü'); p.sort(); p.set('a', 'x&y'); return [p.toString(), [...p.keys()], p.has('z', '0')];",
        "const p = new URLSearchParams({q: 'c++ rocks', tag: ['a', 'b']}); return p.toString();",
        "const p = new URLSearchParams([['a', '1'], ['b', '2']]); const o = []; p.forEach((v, k) => o.push(k + v)); return o;",
        "return new URL('https://münchen.example/').hostname;",
        "return JSON.stringify({u: new URL('HTTP://a.b/ c')});",
    ];
    for code in cases {
        assert_eq!(
            run_code(code, json!({}), &[]),
            node(code, &json!({}), &[]),
            "{code}"
        );
    }
}

#[test]
fn extract_page_content_runs_its_html_pipeline_on_a_fixture_page() {
    // The tool's real body, with `fetch` (the network-egress issue) stood in by a fixture page.
    let cat = Catalog::load(&[catalog_dir().join("default-tool-specs.json")]);
    let spec = cat
        .entries
        .iter()
        .filter_map(|e| e.validated.spec.as_ref())
        .find(|s| s.name == "extractPageContent");
    let spec = spec.unwrap_or_else(|| panic!("extractPageContent missing"));
    let page = r#"<html><head><title>Spring AI</title><script>evil()</script><style>p{}</style></head>
      <body><nav>menu</nav><div id="ad-top">buy</div><main><h1>Spring AI</h1>
      <p>Spring AI is an application framework for AI engineering.</p>
      <a href="https://docs.spring.io/x" title="Docs">Reference docs</a> <a href="/relative">rel</a></main>
      <footer>(c)</footer></body></html>"#;
    let fake = format!(
        "globalThis.fetch = async () => ({{ ok: true, status: 200, statusText: 'OK', text: () => {} }});\n",
        serde_json::to_string(page).unwrap_or_default()
    );
    let out = run_code(
        &(fake + &spec.code),
        json!({"pageUrl": "https://spring.io/projects/spring-ai"}),
        &["pageUrl"],
    );
    let text = out.unwrap_or_else(|e| panic!("{e}")).to_string();
    assert!(
        text.contains("Spring AI is an application framework"),
        "{text}"
    );
    assert!(
        !text.contains("evil()") && !text.contains("menu") && !text.contains("buy"),
        "junk kept: {text}"
    );
    assert!(text.contains("https://docs.spring.io/x"), "{text}");
}

/// stsd and node agree: equal results, or both refused the input (QuickJS and V8 word engine
/// errors such as JSON.parse's differently). Returns true for the latter.
fn agree(
    name: &str,
    args: &Value,
    ours: &Result<Value, String>,
    theirs: &Result<Value, String>,
) -> bool {
    match (ours, theirs) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "{name} {args}");
            false
        }
        (Err(_), Err(_)) => true,
        _ => panic!("{name} {args}: stsd {ours:?} vs node {theirs:?}"),
    }
}

/// Argument sets beyond the testValues, derived from the spec: (a) required params only,
/// (b) every param with its testValue, booleans negated, numbers changed, arrays reversed,
/// (c) free-text string params extended with non-ASCII text.
fn variants(spec: &stsd_protocol::ToolSpec) -> Vec<Value> {
    let base = stsd::exec::job::test_arguments(spec).unwrap_or_default();
    let required: serde_json::Map<String, Value> = base
        .iter()
        .filter(|(k, _)| spec.param(k).is_some_and(|p| p.required))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut flipped = base.clone();
    for (k, v) in flipped.iter_mut() {
        *v = match v.clone() {
            Value::Bool(b) => Value::Bool(!b),
            Value::Number(n) if n.is_i64() => json!(n.as_i64().unwrap_or(0) + 1),
            Value::Number(n) => json!(n.as_f64().unwrap_or(0.0) * 2.0),
            Value::Array(mut a) => {
                a.reverse();
                Value::Array(a)
            }
            other => {
                let _ = k;
                other
            }
        };
    }
    let free_text = [
        "text",
        "content",
        "input",
        "title",
        "message",
        "body",
        "subject",
        "description",
        "label",
        "query",
        "a",
        "b",
    ];
    let mut extended = base.clone();
    for (k, v) in extended.iter_mut() {
        if let Value::String(s) = v {
            if free_text.contains(&k.as_str()) {
                *v = Value::String(format!("{s} — Ünïcödé ✓ 日本"));
            }
        }
    }
    vec![
        Value::Object(required),
        Value::Object(flipped),
        Value::Object(extended),
    ]
}

#[test]
fn every_deterministic_non_network_tool_matches_node_on_more_argument_sets() {
    let files = [
        "default-tool-specs-builtin.json",
        "default-tool-specs-builtin-helpers.json",
        "default-tool-specs.json",
    ];
    let (mut tools, mut runs, mut both_failed) = (0, 0, 0);
    for f in files {
        let cat = Catalog::load(&[catalog_dir().join(f)]);
        for spec in cat.entries.iter().filter_map(|e| e.validated.spec.as_ref()) {
            let blocked = spec
                .sandbox_overrides
                .network_mode
                .value()
                .is_none_or(|m| *m == stsd_protocol::NetworkMode::Blocked);
            if !blocked
                || spec.code.contains("safety.")
                || NON_DETERMINISTIC.contains(&spec.name.as_str())
                || !spec.static_variables.is_empty()
            {
                continue;
            }
            let declared: Vec<String> = spec.params.iter().map(|p| p.name.clone()).collect();
            let d: Vec<&str> = declared.iter().map(String::as_str).collect();
            for args in variants(spec) {
                let ours = run_code(&spec.code, args.clone(), &d);
                let theirs = node(&spec.code, &args, &declared);
                if agree(&spec.name, &args, &ours, &theirs) {
                    both_failed += 1;
                }
                runs += 1;
            }
            tools += 1;
        }
    }
    eprintln!("{tools} tools, {runs} runs, {both_failed} where both refused the input");
    assert!(tools >= 35, "{tools}");
}

/// Tools whose params give the derived variants nothing to vary: two hand-picked sets each.
#[test]
fn hand_picked_argument_sets_match_node() {
    let cases: &[(&str, &str, [Value; 2])] = &[
        (
            "default-tool-specs-builtin.json",
            "timezoneConvert",
            [
                json!({"text": "2024-03-10T06:59:59Z", "toTimeZone": "America/New_York"}),
                json!({"text": "2024-12-31T23:30:00Z", "toTimeZone": "Asia/Kolkata"}),
            ],
        ),
        (
            "default-tool-specs-builtin.json",
            "urlEncode",
            [json!({"text": "a b&c=d/é?"}), json!({"text": "100% ✓ #x"})],
        ),
        (
            "default-tool-specs-builtin.json",
            "diffText",
            [
                json!({"a": "one\ntwo\nthree", "b": "one\n2\nthree\nfour"}),
                json!({"a": "same", "b": "same"}),
            ],
        ),
        (
            "default-tool-specs-builtin.json",
            "piiDetect",
            [
                json!({"text": "mail bob@example.com or call +1 415 555 0100"}),
                json!({"text": "nothing personal here"}),
            ],
        ),
        (
            "default-tool-specs-builtin.json",
            "stats",
            [
                json!({"numbers": [5]}),
                json!({"numbers": [-1.5, 2, 2, 10]}),
            ],
        ),
        (
            "default-tool-specs-builtin.json",
            "secretPatternDetect",
            [
                json!({"text": "AKIAIOSFODNN7EXAMPLE and ghp_abcdefghijklmnopqrstuvwxyz0123456789"}),
                json!({"text": "clean text"}),
            ],
        ),
        (
            "default-tool-specs-builtin.json",
            "evalExpression",
            [
                json!({"expression": "2 ** 10 - x", "variables": {"x": 24}}),
                json!({"expression": "(1 < 2) && !false"}),
            ],
        ),
        (
            "default-tool-specs.json",
            "addToCalendar",
            [
                json!({"title": "Standup", "start": "2024-05-01T09:00:00Z", "end": "2024-05-01T09:15:00Z", "location": "Room 1"}),
                json!({"title": "Trip", "start": "2024-06-01", "end": "2024-06-03", "description": "bring passport"}),
            ],
        ),
        (
            "default-tool-specs.json",
            "showLocation",
            [
                json!({"query": "Eiffel Tower", "label": "Paris"}),
                json!({"query": "37.5665,126.9780"}),
            ],
        ),
        (
            "default-tool-specs.json",
            "showImage",
            [
                json!({"url": "https://example.com/a.png", "caption": "A", "alt": "alt"}),
                json!({"url": "https://example.com/b.jpg"}),
            ],
        ),
        (
            "default-tool-specs.json",
            "renderDiff",
            [
                json!({"left": "a\nb", "right": "a\nc", "leftLabel": "old", "rightLabel": "new", "title": "T"}),
                json!({"left": "x", "right": "x"}),
            ],
        ),
        (
            "default-tool-specs.json",
            "requestFileUpload",
            [
                json!({"prompt": "Upload a CSV", "accept": ".csv"}),
                json!({}),
            ],
        ),
        (
            "default-tool-specs.json",
            "describeImage",
            [
                json!({"ref": "img-1", "question": "What is it?"}),
                json!({}),
            ],
        ),
    ];
    for (file, name, sets) in cases {
        let cat = Catalog::load(&[catalog_dir().join(file)]);
        let spec = cat
            .entries
            .iter()
            .filter_map(|e| e.validated.spec.as_ref())
            .find(|s| s.name == *name);
        let spec = spec.unwrap_or_else(|| panic!("{name} missing"));
        let declared: Vec<String> = spec.params.iter().map(|p| p.name.clone()).collect();
        let d: Vec<&str> = declared.iter().map(String::as_str).collect();
        for args in sets {
            let ours = run_code(&spec.code, args.clone(), &d);
            let theirs = node(&spec.code, args, &declared);
            agree(name, args, &ours, &theirs);
        }
    }
}
