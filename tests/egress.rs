//! Network egress end to end: a tool's `fetch` in a confined worker, the supervisor's broker,
//! and a loopback HTTP/HTTPS fixture server (its CA given through `egress.extra_ca_files`,
//! the catalog's hosts pointed at it through `egress.host_overrides`).

use serde_json::{json, Value};
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use stsd::egress::dns::Dns;
use stsd::egress::Broker;
use stsd::exec::{run_job, CallOutcome, CallValue, ExecOptions};
use stsd_profiles::Config;
use stsd_protocol::frames::{FsAccess, Job, NetworkGrant};
use stsd_protocol::Code;
use stsd_tests::fixture_server::{self, FixtureServer};
use stsd_tests::{job, stsd_bin};

fn server() -> &'static FixtureServer {
    static S: OnceLock<FixtureServer> = OnceLock::new();
    S.get_or_init(FixtureServer::start)
}

/// Every fixture host (catalog services and test names) overridden to the fixture server,
/// except the names the DNS tests resolve themselves.
fn config() -> Config {
    let s = server();
    let mut c = Config::default();
    for h in fixture_server::hosts() {
        if h != "rebind.test" {
            c.egress
                .host_overrides
                .insert(h, format!("127.0.0.1:{}", s.port));
        }
    }
    c.egress.extra_ca_files = vec![s.ca_file.clone()];
    c
}

fn options(c: &Config, dns: Option<Arc<dyn Dns>>) -> ExecOptions {
    let mut o = ExecOptions::new(stsd_bin(), c).unwrap_or_else(|e| panic!("{e}"));
    if let Some(d) = dns {
        let b = Broker::new(&c.egress).unwrap_or_else(|e| panic!("{e}"));
        o.broker = Arc::new(b.with_dns(d));
    }
    o
}

fn net_job(code: &str, mode: &str, hosts: &[&str]) -> Job {
    let mut j = job(code, FsAccess::None, Path::new("/nonexistent"));
    j.sandbox.network = NetworkGrant::Brokered;
    j.tool_safety_json =
        json!({"capabilities": {"network": {"mode": mode, "hosts": hosts}}}).to_string();
    j
}

fn run_with(o: &ExecOptions, j: &Job) -> CallOutcome {
    run_job(j, o, &mut |_| {})
}

fn value(out: &CallOutcome) -> Value {
    match &out.result {
        Ok(CallValue::Json(t)) => serde_json::from_str(t).unwrap_or_else(|e| panic!("{e}: {t}")),
        Ok(CallValue::Undefined) => Value::Null,
        Err(e) => panic!("call failed: {} {}", e.code, e.message),
    }
}

/// Runs `code` and returns its value.
fn eval(code: &str, mode: &str, hosts: &[&str]) -> Value {
    value(&run_with(
        &options(&config(), None),
        &net_job(code, mode, hosts),
    ))
}

/// JS that fetches each URL and returns, per URL, "ok <status>" or "<error name>|<message>".
fn probe_urls(urls: &[String]) -> String {
    format!(
        "const out = [];
         for (const u of {}) {{
           try {{ const r = await fetch(u); out.push('ok ' + r.status); }}
           catch (e) {{ out.push(e.name + '|' + e.message); }}
         }}
         return out;",
        json!(urls)
    )
}

fn assert_refused(got: &Value, url: &str, rule: &str) {
    let s = got.as_str().unwrap_or_default();
    let want = format!("SecurityError|[fetch] denied: {rule}: ");
    assert!(s.starts_with(&want), "{url}: expected rule {rule}, got {s}");
}

#[test]
fn ssrf_literal_and_local_targets_are_refused_with_their_rule() {
    let cases = [
        ("http://127.0.0.1/", "loopback"),
        ("http://localhost/", "loopback"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://2130706433/", "loopback"),
        ("http://0x7f.1/", "loopback"),
        ("http://017700000001/", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://api.example.com@127.0.0.1/", "loopback"),
        ("http://[fd00::1]/", "unique-local"),
        ("http://[64:ff9b::7f00:1]/", "nat64"),
        ("http://100.64.0.1/", "cgnat"),
        ("http://198.18.0.1/", "benchmarking"),
        ("http://192.0.0.1/", "ietf-protocol"),
        ("http://240.0.0.1/", "reserved"),
        ("http://255.255.255.255/", "broadcast"),
        ("file:///etc/passwd", "unsupported-scheme"),
        ("ftp://fixture.test/", "unsupported-scheme"),
        ("data:text/plain,hello", "unsupported-scheme"),
    ];
    let urls: Vec<String> = cases.iter().map(|(u, _)| u.to_string()).collect();
    let got = eval(&probe_urls(&urls), "strict", &[]);
    for (i, (url, rule)) in cases.iter().enumerate() {
        assert_refused(&got[i], url, rule);
    }
    // Uncaught, the refusal is the call's SECURITY error.
    let out = run_with(
        &options(&config(), None),
        &net_job("await fetch('http://127.0.0.1:9/');", "strict", &[]),
    );
    let e = out
        .result
        .err()
        .unwrap_or_else(|| panic!("loopback fetched"));
    assert_eq!(e.code, Code::Security, "{}", e.message);
    assert!(e.message.contains("loopback"), "{}", e.message);
    assert_eq!(out.egress.last().and_then(|h| h.refused), Some("loopback"));
}

/// Scripted DNS: each name answers from its list, in turn (the last answer repeats).
struct ScriptedDns {
    answers: Mutex<Vec<(String, Vec<Vec<IpAddr>>)>>,
    lookups: AtomicU32,
}

impl ScriptedDns {
    fn new(answers: &[(&str, &[&[&str]])]) -> Arc<ScriptedDns> {
        let parse = |a: &&str| a.parse::<IpAddr>().unwrap_or_else(|e| panic!("{e}"));
        Arc::new(ScriptedDns {
            answers: Mutex::new(
                answers
                    .iter()
                    .map(|(n, seq)| {
                        let seq = seq.iter().map(|s| s.iter().map(parse).collect()).collect();
                        (n.to_string(), seq)
                    })
                    .collect(),
            ),
            lookups: AtomicU32::new(0),
        })
    }
}

impl Dns for ScriptedDns {
    fn lookup(&self, host: &str, _timeout: Duration) -> io::Result<Vec<IpAddr>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let mut all = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, seq)) = all.iter_mut().find(|(n, _)| n == host) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such host"));
        };
        Ok(if seq.len() > 1 {
            seq.remove(0)
        } else {
            seq[0].clone()
        })
    }
}

#[test]
fn ssrf_a_name_with_a_public_and_a_private_address_is_refused() {
    let dns = ScriptedDns::new(&[("mixed.test", &[&["93.184.215.14", "10.0.0.5"]])]);
    let mut c = config();
    c.egress.host_overrides.remove("mixed.test");
    let o = options(&c, Some(dns.clone()));
    let out = run_with(
        &o,
        &net_job(&probe_urls(&["https://mixed.test/".into()]), "strict", &[]),
    );
    let got = value(&out);
    assert_refused(&got[0], "mixed.test", "private");
    assert!(
        got[0].as_str().unwrap_or_default().contains("10.0.0.5"),
        "{got}"
    );
    // Allowlisted hosts get the address rules too.
    let out = run_with(
        &o,
        &net_job(
            &probe_urls(&["https://mixed.test/".into()]),
            "allowlist",
            &["mixed.test"],
        ),
    );
    assert_refused(&value(&out)[0], "mixed.test (allowlist)", "private");
}

#[test]
fn ssrf_no_second_resolution_the_checked_address_is_the_one_connected_to() {
    // First answer: the fixture (loopback, trusted for this test). Any later answer: a private
    // address that is not trusted. A client that resolved again would be refused or fail.
    let dns = ScriptedDns::new(&[("rebind.test", &[&["127.0.0.1"], &["10.9.9.9"]])]);
    let mut c = config();
    c.egress.trusted_ranges = vec!["127.0.0.1/32".into()];
    let o = options(&c, Some(dns.clone()));
    let port = server().port;
    let code =
        format!("const r = await fetch('https://rebind.test:{port}/stsd/echo'); return r.json();");
    let out = run_with(&o, &net_job(&code, "strict", &[]));
    let v = value(&out);
    assert_eq!(v["host"], "rebind.test");
    assert_eq!(v["tls"], true);
    assert_eq!(
        dns.lookups.load(Ordering::SeqCst),
        1,
        "exactly one resolution"
    );
    let hop = &out.egress[0];
    assert_eq!(hop.via, Some("dns"));
    assert_eq!(hop.address.as_deref(), Some(&*format!("127.0.0.1:{port}")));
    assert_eq!(
        hop.trusted_range.as_deref(),
        Some("127.0.0.1/32"),
        "the audit names the range"
    );
    // The next request resolves again (once) and gets the untrusted answer: refused.
    let out = run_with(
        &o,
        &net_job(
            &probe_urls(&[format!("https://rebind.test:{port}/")]),
            "strict",
            &[],
        ),
    );
    assert_refused(&value(&out)[0], "rebind.test second request", "private");
    assert_eq!(dns.lookups.load(Ordering::SeqCst), 2);
}

fn fixture_url(path: &str) -> String {
    format!("https://fixture.test{path}")
}

#[test]
fn ssrf_redirects_are_checked_hop_by_hop_and_capped() {
    let port = server().port;
    let to = |target: &str| {
        let enc: String = target
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        fixture_url(&format!("/stsd/to?u={enc}"))
    };
    let before = server().seen().len();
    let o = options(&config(), None);
    // Strict: any public host; the fixture is reached through its override.
    let urls = vec![
        to(&format!("http://127.0.0.1:{port}/stsd/never-contacted")),
        to("http://[::ffff:7f00:1]/stsd/never-contacted"),
        fixture_url("/stsd/redirect/6"),
        fixture_url("/stsd/redirect/5"),
        to("file:///etc/passwd"),
    ];
    let out = run_with(&o, &net_job(&probe_urls(&urls), "strict", &[]));
    let got = value(&out);
    assert_refused(&got[0], "redirect to 127.0.0.1", "loopback");
    assert_refused(&got[1], "redirect to ::ffff:127.0.0.1", "loopback");
    assert_refused(&got[2], "six redirects", "too-many-redirects");
    assert_eq!(got[3], "ok 200", "five redirects are allowed");
    assert_refused(&got[4], "redirect to file:", "unsupported-scheme");
    // Every hop is in the record, the refused ones with their rule.
    let refused: Vec<_> = out.egress.iter().filter_map(|h| h.refused).collect();
    assert_eq!(
        refused,
        [
            "loopback",
            "loopback",
            "too-many-redirects",
            "unsupported-scheme"
        ],
        "{:?}",
        out.egress
    );
    // Allowlist: the list is checked on every hop, and listing an address does not lift the
    // address rules.
    // A path no other test uses: the fixture server is shared by the tests running beside.
    let urls = vec![
        to(&format!("http://127.0.0.1:{port}/stsd/never-contacted")),
        to("https://other.test/stsd/never-contacted"),
    ];
    let hosts = ["fixture.test", "127.0.0.1"];
    let got = value(&run_with(
        &o,
        &net_job(&probe_urls(&urls), "allowlist", &hosts),
    ));
    assert_refused(&got[0], "redirect to a listed loopback address", "loopback");
    assert_refused(&got[1], "redirect off the list", "host-not-in-allowlist");
    // The refused targets were never contacted.
    let seen = server().seen();
    let new = &seen[before..];
    assert!(
        !new.iter().any(|s| s.path.contains("never-contacted")),
        "{new:?}"
    );
}

#[test]
fn ssrf_body_cap_and_trickling_server() {
    let cap = 10 * 1024 * 1024;
    let urls = vec![
        fixture_url(&format!("/stsd/big/{}", cap + 1)),
        fixture_url(&format!("/stsd/big/{cap}")),
    ];
    let got = eval(&probe_urls(&urls), "allowlist", &["fixture.test"]);
    assert_refused(&got[0], "body over the cap", "response-body-too-large");
    assert_eq!(got[1], "ok 200", "exactly the cap is fine");

    let mut c = config();
    c.egress.request_timeout_ms = 1500;
    let t0 = Instant::now();
    let out = run_with(
        &options(&c, None),
        &net_job(
            &probe_urls(&[fixture_url("/stsd/trickle")]),
            "allowlist",
            &["fixture.test"],
        ),
    );
    let got = value(&out);
    let s = got[0].as_str().unwrap_or_default();
    assert!(
        s.starts_with("HelperRuntimeError|[fetch] timeout: request-timeout"),
        "{s}"
    );
    assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
}

#[test]
fn allowlist_host_matching_case_trailing_dot_and_lookalikes() {
    let urls = vec![
        "https://FIXTURE.Test/stsd/echo".to_string(),
        "http://fixture.test./stsd/echo".to_string(),
        "https://sub.example.org/".to_string(),
        "https://\u{0430}pi.github.com/".to_string(), // Cyrillic a
        "https://api.github.com.evil.test/".to_string(),
        "https://example.org/stsd/echo".to_string(),
    ];
    let got = eval(
        &probe_urls(&urls),
        "allowlist",
        &["fixture.test", "api.github.com", "*.example.org"],
    );
    assert_eq!(got[0], "ok 200", "{got}");
    assert_eq!(got[1], "ok 200", "{got}");
    // sub.example.org matches the wildcard; it has no override, so DNS (not the allowlist)
    // is what fails it.
    assert!(
        !got[2]
            .as_str()
            .unwrap_or_default()
            .contains("host-not-in-allowlist"),
        "{got}"
    );
    assert_refused(&got[3], "IDN look-alike", "host-not-in-allowlist");
    assert!(
        got[3].as_str().unwrap_or_default().contains("xn--"),
        "{got}"
    );
    assert_refused(&got[4], "suffix trick", "host-not-in-allowlist");
    assert_eq!(got[5], "ok 200", "*. matches the apex");
    // An empty list allows nothing.
    let got = eval(&probe_urls(&[fixture_url("/stsd/echo")]), "allowlist", &[]);
    assert_refused(&got[0], "empty list", "host-not-in-allowlist");
}

#[test]
fn open_mode_reaches_private_addresses_and_says_so() {
    let port = server().port;
    let code =
        format!("const r = await fetch('http://127.0.0.1:{port}/stsd/echo'); return r.json();");
    let out = run_with(&options(&config(), None), &net_job(&code, "open", &[]));
    assert_eq!(value(&out)["method"], "GET");
    assert!(out.egress[0].private_address, "{:?}", out.egress);
    assert_eq!(out.egress[0].mode, "open");
}

#[test]
fn the_response_object_is_what_the_catalog_expects() {
    let code = r#"
      const [a, b, c] = await Promise.all([
        fetch('https://fixture.test/stsd/multi'),
        fetch('https://fixture.test/stsd/echo?x=1', {method: 'post', body: 'hello body',
          headers: {'Content-Type': 'text/plain', 'X-Custom': 'yes', Host: 'evil.test',
                    Connection: 'upgrade', 'Transfer-Encoding': 'chunked'}}),
        fetch('https://fixture.test/stsd/big/100', {startIndex: 10, maxLength: 25}),
      ]);
      const echo = b.json();
      const last = await fetch('https://fixture.test/stsd/big/30', {startIndex: 10, maxLength: 25});
      return {
        a: {status: a.status, ok: a.ok, statusText: a.statusText, url: a.url, multi: a.headers.get('X-MULTI'),
            missing: a.headers.get('nope'), contentType: a.contentType, text: a.text(),
            bytes: a.arrayBuffer().byteLength, truncated: a.truncated, next: a.nextStartIndex},
        echo: {method: echo.method, body: echo.body, host: echo.headers.host, custom: echo.headers['x-custom'],
               connection: echo.headers.connection || null, te: echo.headers['transfer-encoding'] || null,
               ua: echo.headers['user-agent'], tls: echo.tls, query: echo.query},
        c: {len: c.text().length, truncated: c.truncated, next: c.nextStartIndex},
        last: {len: last.text().length, truncated: last.truncated, next: last.nextStartIndex},
        notFound: (await fetch('https://fixture.test/nowhere')).status,
        badJson: (() => { try { a.json(); return 'parsed'; } catch (e) { return e.name + ': ' + e.message; } })(),
      };"#;
    let v = eval(code, "allowlist", &["fixture.test"]);
    assert_eq!(
        v["a"],
        json!({"status": 201, "ok": true, "statusText": "Created",
               "url": "https://fixture.test/stsd/multi", "multi": "a, b", "missing": null,
               "contentType": "text/plain; charset=utf-8", "text": "héllo", "bytes": 6,
               "truncated": false, "next": null})
    );
    assert_eq!(v["echo"]["method"], "POST");
    assert_eq!(v["echo"]["body"], "hello body");
    assert_eq!(v["echo"]["host"], "fixture.test", "a tool cannot set Host");
    assert_eq!(v["echo"]["custom"], "yes");
    assert_eq!(v["echo"]["connection"], Value::Null);
    assert_eq!(v["echo"]["te"], Value::Null);
    assert!(v["echo"]["ua"]
        .as_str()
        .unwrap_or_default()
        .starts_with("stsd/"));
    assert_eq!(v["echo"]["tls"], true);
    assert_eq!(v["echo"]["query"], "x=1");
    assert_eq!(v["c"], json!({"len": 25, "truncated": true, "next": 35}));
    assert_eq!(
        v["last"],
        json!({"len": 20, "truncated": false, "next": null})
    );
    assert_eq!(v["notFound"], 404);
    assert!(
        v["badJson"]
            .as_str()
            .unwrap_or_default()
            .starts_with("HelperRuntimeError: [fetch] invalid json"),
        "{v}"
    );
}

#[test]
fn tls_needs_the_configured_ca() {
    let mut c = config();
    c.egress.extra_ca_files.clear();
    let out = run_with(
        &options(&c, None),
        &net_job(
            &probe_urls(&[fixture_url("/stsd/echo")]),
            "allowlist",
            &["fixture.test"],
        ),
    );
    let got = value(&out);
    assert!(
        got[0]
            .as_str()
            .unwrap_or_default()
            .starts_with("HelperRuntimeError|[fetch] tls: "),
        "{got}"
    );
    assert!(!out.egress[0].extra_ca);
}

#[test]
fn fetch_is_absent_without_a_network_grant() {
    let mut j = net_job("return typeof fetch;", "blocked", &[]);
    j.sandbox.network = NetworkGrant::Blocked;
    assert_eq!(value(&run_with(&options(&config(), None), &j)), "undefined");
}

#[test]
fn a_strict_mode_worker_still_cannot_open_a_socket_itself() {
    for probe in ["socket_inet", "socket_unix", "connect_abstract_unix"] {
        let mut j = net_job("", "strict", &[]);
        j.attack = Some(probe.into());
        let out = run_with(&options(&config(), None), &j);
        match out.probe {
            Some(stsd_protocol::frames::ProbeOutcome::Denied { .. }) => {}
            None if out
                .result
                .as_ref()
                .is_err_and(|e| e.code == Code::SandboxViolation) => {}
            other => panic!("{probe}: {other:?} {:?}", out.result),
        }
    }
}

/// Every network spec of the reference catalog that needs no unset environment variable,
/// run under its own posture with its testValues, answered by the fixture through host
/// overrides: each earns its Local Pass, and its result carries the fixture's data.
#[test]
fn catalog_network_specs_earn_their_local_pass_through_host_overrides() {
    use stsd::local_pass::run_entry;
    use stsd::store::Catalog;
    let services = fixture_server::services();
    let expected = services["tools"].as_object().cloned().unwrap_or_default();
    let cat = Catalog::load(&stsd_tests::catalog_spec_files());
    let c = config();
    let o = options(&c, None);
    let no_env = |_: &str| -> Option<String> { None };
    let (mut passed, mut needs_env) = (Vec::new(), Vec::new());
    for e in &cat.entries {
        let Some(spec) = e.validated.spec.as_ref() else {
            continue;
        };
        let Ok(resolved) = stsd_profiles::resolve(spec, &c) else {
            continue;
        };
        if resolved.tool_safety.capabilities.network.mode == stsd_protocol::NetworkMode::Blocked {
            continue;
        }
        if spec.static_variables.iter().any(|s| s.value.contains("${")) {
            needs_env.push(spec.name.clone());
            let r = run_entry(
                &cat,
                e,
                &c,
                &no_env,
                &o,
                stsd::local_pass::PassPlace::Scratch,
                Some(&stsd_tests::APPROVE),
            );
            let err = r.outcome.err().map(|d| d.message).unwrap_or_default();
            assert!(err.contains("MISSING_REQUIREMENTS"), "{}: {err}", spec.name);
            continue;
        }
        let r = run_entry(
            &cat,
            e,
            &c,
            &no_env,
            &o,
            stsd::local_pass::PassPlace::Scratch,
            Some(&stsd_tests::APPROVE),
        );
        let text = match r.outcome {
            Ok(CallValue::Json(t)) => t,
            other => panic!("{}: {other:?}", spec.name),
        };
        let want = expected
            .get(&spec.name)
            .unwrap_or_else(|| panic!("{} has no fixture expectations", spec.name));
        for s in want["expect"].as_array().into_iter().flatten() {
            let s = s.as_str().unwrap_or_default();
            assert!(text.contains(s), "{}: {s:?} not in {text}", spec.name);
        }
        passed.push(spec.name.clone());
    }
    eprintln!(
        "catalog network specs: {} earned their Local Pass; {} need unset variables",
        passed.len(),
        needs_env.len()
    );
    assert_eq!(passed.len(), expected.len(), "{passed:?}");
    assert_eq!(passed.len(), 32);
}

/// A server that accepts and then only trickles: `tls` sends a TLS record header announcing
/// 16000 bytes and then one byte every 100 ms; otherwise it reads one byte every 100 ms and
/// never answers.
fn trickle_server(tls: bool) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = l.local_addr().map(|a| a.port()).unwrap_or_default();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                if tls {
                    let _ = s.write_all(&[0x16, 0x03, 0x03, 0x3e, 0x80]);
                }
                let mut b = [0u8; 1];
                for _ in 0..3000 {
                    std::thread::sleep(Duration::from_millis(100));
                    let ok = if tls {
                        s.write_all(&[0]).is_ok()
                    } else {
                        s.read(&mut b).is_ok()
                    };
                    if !ok {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn a_trickling_tls_handshake_or_a_slow_reader_cannot_outlast_the_timeout() {
    let mut c = config();
    c.egress.request_timeout_ms = 1500;
    let tls_port = trickle_server(true);
    let read_port = trickle_server(false);
    c.egress
        .host_overrides
        .insert("slowtls.test".into(), format!("127.0.0.1:{tls_port}"));
    c.egress
        .host_overrides
        .insert("slowread.test".into(), format!("127.0.0.1:{read_port}"));
    let code = "const out = [];
        for (const [u, o] of [['https://slowtls.test/', {}],
                              ['http://slowread.test/', {method: 'POST', body: 'x'.repeat(8 << 20)}]]) {
          const t0 = Date.now();
          try { await fetch(u, o); out.push('fetched'); }
          catch (e) { out.push([e.name + '|' + e.message, Date.now() - t0]); }
        }
        return out;";
    let t0 = Instant::now();
    let out = run_with(&options(&c, None), &net_job(code, "strict", &[]));
    let got = value(&out);
    for (i, what) in ["TLS trickle", "slow reader"].iter().enumerate() {
        let msg = got[i][0].as_str().unwrap_or_default();
        assert!(
            msg.starts_with("HelperRuntimeError|[fetch] timeout: request-timeout"),
            "{what}: {got}"
        );
        let ms = got[i][1].as_u64().unwrap_or(u64::MAX);
        // The bound is the point (without the deadline it never ends); its width is for a
        // loaded 2-core machine, where 8 MiB through a trickling reader is slow to give up.
        assert!((1400..6000).contains(&ms), "{what}: took {ms} ms");
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn server_controlled_text_cannot_break_the_reply_and_headers_stay_home() {
    let port = server().port;
    let code = format!(
        "const out = {{}};
         try {{ await fetch('https://fixture.test/stsd/longloc'); }} catch (e) {{ out.longloc = [e.name, e.message.length]; }}
         const r = await fetch('https://fixture.test/stsd/to?u=' + encodeURIComponent('https://other.test:{port}/stsd/echo'),
           {{headers: {{'X-Api-Key': 'k-123', Authorization: 'Bearer t', Accept: 'application/json'}}}});
         const echo = r.json();
         out.headers = {{key: echo.headers['x-api-key'] || null, auth: echo.headers.authorization || null,
                         accept: echo.headers.accept}};
         try {{ await fetch('https://fixture.test/' + 'a'.repeat(9000)); }} catch (e) {{ out.long = e.name + '|' + e.message.slice(0, 40); }}
         return out;"
    );
    let got = eval(&code, "strict", &[]);
    assert_eq!(got["longloc"][0], "InvalidInputError", "{got}");
    assert!(
        got["longloc"][1].as_u64().unwrap_or(u64::MAX) <= 1100,
        "{got}"
    );
    assert_eq!(
        got["headers"],
        json!({"key": null, "auth": null, "accept": "application/json"}),
        "only content-neutral headers follow a cross-origin redirect"
    );
    assert!(
        got["long"]
            .as_str()
            .unwrap_or_default()
            .starts_with("InvalidInputError|[fetch] denied: url-too-long: "),
        "{got}"
    );
}

#[test]
fn redirect_hops_count_against_the_request_budget() {
    let mut c = config();
    c.egress.max_requests_per_call = 3;
    let out = run_with(
        &options(&c, None),
        &net_job(
            &probe_urls(&[fixture_url("/stsd/redirect/5")]),
            "strict",
            &[],
        ),
    );
    assert_refused(&value(&out)[0], "budget", "too-many-requests");
    assert_eq!(
        out.egress.len(),
        4,
        "three hops and the refusal: {:?}",
        out.egress
    );
}

/// TCP connections process `pid` holds open to `port` (its socket fds matched against its
/// /proc/net/tcp and tcp6).
fn tcp_connections_to(pid: i32, port: u16) -> usize {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        let t = target.to_string_lossy();
        if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
            inodes.insert(i.to_string());
        }
    }
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let remote_port = f
                .get(2)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port) && f.get(9).is_some_and(|i| inodes.contains(*i)) {
                n += 1;
            }
        }
    }
    n
}

/// Polls `f` every 20 ms until it holds; panics with `what()` after `limit`.
fn wait_for(limit: Duration, mut f: impl FnMut() -> bool, what: impl Fn() -> String) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{}", what());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Callers that go away while their tool waits on a trickling response: each fetch is aborted
/// on the wire at once. The daemon's fetch threads and its connections to the server are gone
/// within a second, not left to run out the 30 s request timeout.
#[test]
fn cancelled_fetches_leave_no_thread_or_connection_behind() {
    use stsd_tests::harness::{thread_names, Daemon};
    let srv = FixtureServer::start();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = dir.path().join("net.json");
    let specs = json!([{"name": "trickle", "description": "fetch test", "codeType": "Javascript",
        "sandboxOverrides": {"networkMode": "allowlist", "hostsAllow": ["fixture.test"]},
        "draft": false,
        "code": "return (await fetch('http://fixture.test/stsd/trickle')).text();"}]);
    std::fs::write(&catalog, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let config = format!(
        "[egress.host_overrides]\n\"fixture.test\" = \"127.0.0.1:{}\"\n",
        srv.port
    );
    let pool = 4;
    let d = Daemon::start_with(dir, pool, &config, &catalog.display().to_string(), &[]);
    let pid = d.pid();
    let fetch_threads = || {
        thread_names(pid)
            .iter()
            .filter(|t| *t == "stsd-fetch")
            .count()
    };
    let trickles = || {
        srv.seen()
            .iter()
            .filter(|s| s.path == "/stsd/trickle")
            .count()
    };
    let baseline = thread_names(pid).len();
    let rounds = 5;
    for round in 0..rounds {
        let mut conns: Vec<_> = (0..pool).map(|_| d.connect()).collect();
        for (i, c) in conns.iter_mut().enumerate() {
            c.call(i as u64, "trickle", json!({}));
        }
        wait_for(
            Duration::from_secs(20),
            || trickles() >= (round + 1) * pool,
            || format!("round {round}: {} fetches started", trickles()),
        );
        drop(conns); // every caller goes away mid-fetch
    }
    let t0 = Instant::now();
    wait_for(
        Duration::from_secs(1),
        || fetch_threads() == 0 && tcp_connections_to(pid, srv.port) == 0,
        || {
            format!(
                "after 1 s: {} fetch threads, {} connections to the server",
                fetch_threads(),
                tcp_connections_to(pid, srv.port)
            )
        },
    );
    eprintln!(
        "{} cancelled fetches: threads and connections gone {} ms after the last caller left",
        rounds * pool,
        t0.elapsed().as_millis()
    );
    wait_for(
        Duration::from_secs(5),
        || d.audit_records().len() == rounds * pool,
        || format!("{} audit records", d.audit_records().len()),
    );
    for r in d.audit_records() {
        assert_eq!(r["error"]["code"], "CANCELLED", "{r}");
    }
    // Nothing else piled up either: the runtime's blocking threads (one per running call,
    // idle for a while after; rounds may overlap on a loaded machine) and the reaper are new,
    // but fewer than one per cancelled call, which is what the old code left behind.
    let now = thread_names(pid).len();
    assert!(
        now < baseline + rounds * pool,
        "threads: {baseline} before, {now} after"
    );
}

/// Issue 35: every catalog tool that takes a secret (`${NAME}` in its staticVariables) runs
/// with its code holding only placeholders, and the fixture standing in for the tool's host
/// receives the real value where the tool put it: a header, a query parameter, a path
/// segment, or the whole URL (a webhook). No request anywhere carries a placeholder.
#[test]
fn catalog_tools_that_take_a_secret_send_the_real_value_to_their_own_host_only() {
    use stsd::local_pass::run_entry;
    use stsd::store::Catalog;
    let cat = Catalog::load(&stsd_tests::catalog_spec_files());
    let c = config();
    let o = options(&c, None);
    let names = |t: &str| -> Vec<String> {
        t.split("${")
            .skip(1)
            .filter_map(|r| r.split_once('}').map(|(n, _)| n.to_string()))
            .collect()
    };
    let value = |name: &str| -> String {
        if name.ends_with("_URL") {
            format!("https://hooks.slack.com/services/T0STSD/B0STSD/{name}-hook9")
        } else {
            format!("{name}-val-9Zq")
        }
    };
    let env = move |n: &str| -> Option<String> { Some(value(n)) };
    let mut uses = 0;
    let mut tools = Vec::new();
    for e in &cat.entries {
        let Some(spec) = e.validated.spec.as_ref() else {
            continue;
        };
        let secrets: Vec<String> = spec
            .static_variables
            .iter()
            .flat_map(|s| names(&s.value))
            .collect();
        if secrets.is_empty() {
            continue;
        }
        let resolved = stsd_profiles::resolve(spec, &c).unwrap_or_else(|e| panic!("{e:?}"));
        let hosts = resolved.tool_safety.capabilities.network.hosts.clone();
        let _ = run_entry(
            &cat,
            e,
            &c,
            &env,
            &o,
            stsd::local_pass::PassPlace::Scratch,
            Some(&stsd_tests::APPROVE),
        );
        let seen = server().seen();
        for name in &secrets {
            let v = value(name);
            let want = v.trim_start_matches("https://hooks.slack.com");
            let got: Vec<_> = seen.iter().filter(|s| s.text().contains(want)).collect();
            assert!(
                !got.is_empty(),
                "{}: ${{{name}}} reached no fixture host",
                spec.name
            );
            for s in &got {
                assert!(
                    hosts.iter().any(|h| h == &s.host),
                    "{}: ${{{name}}} went to {} (allowed: {hosts:?})",
                    spec.name,
                    s.host
                );
            }
            uses += 1;
        }
        tools.push(spec.name.clone());
    }
    let placeholders: Vec<_> = server()
        .seen()
        .into_iter()
        .filter(|s| s.text().contains("stsd-secret-"))
        .collect();
    assert!(placeholders.is_empty(), "{placeholders:?}");
    eprintln!(
        "{} catalog tools, {uses} secret uses: {tools:?}",
        tools.len()
    );
    assert_eq!((tools.len(), uses), (16, 19), "{tools:?}");
}
