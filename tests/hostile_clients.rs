//! The daemon against clients that misbehave: ones that leave before their reply, mid-call, or
//! by a killed bridge; a client that pipelines requests and never reads; malformed, over-deep
//! and oversized messages; one client's burst against another's call; thousands of idle
//! connections, with and without running out of descriptors; sessions that go quiet. After
//! each, the daemon is still serving.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_tests::harness::{is_error, meta, text, Daemon};
use stsd_tests::stsd_bin;

/// A catalog with a tool that writes console lines for as long as it runs.
fn chatty_catalog(dir: &std::path::Path) -> String {
    let path = dir.join("chatty.json");
    let specs = json!([
        {"name": "chatty", "description": "test tool", "codeType": "Javascript", "draft": false,
         "params": [{"name": "ms", "type": "INTEGER", "required": true, "description": "", "testValue": "10"}],
         "code": "const end = Date.now() + ms; let i = 0; \
                  while (Date.now() < end) { console.log('line ' + (i++)); \
                  const t = Date.now() + 2; while (Date.now() < t) {} } return 'done ' + i;"},
        {"name": "measure", "description": "test tool", "codeType": "Javascript", "draft": false,
         "params": [{"name": "text", "type": "STRING", "required": true, "description": "", "testValue": "x"}],
         "code": "return {length: text.length, last: text.slice(-3)};"},
        {"name": "throwsHuge", "description": "test tool", "codeType": "Javascript", "draft": false,
         "code": "throw new Error('x'.repeat(200000));"},
        {"name": "slow", "description": "test tool", "codeType": "Javascript", "draft": false,
         "params": [{"name": "ms", "type": "INTEGER", "required": true, "description": "", "testValue": "10"}],
         "code": "const end = Date.now() + ms; while (Date.now() < end) {} return 'slept ' + ms;"}
    ]);
    std::fs::write(&path, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    path.display().to_string()
}

fn chatty_daemon(pool: usize, extra: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = chatty_catalog(dir.path());
    Daemon::start_with(dir, pool, extra, &catalog, &[])
}

/// One request line (MCP 2026-07-28), with console lines asked for.
fn request(id: u64, method: &str, mut params: Value) -> String {
    params["_meta"] = meta();
    params["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string() + "\n"
}

fn call_line(id: u64, tool: &str, args: Value) -> String {
    request(id, "tools/call", json!({"name": tool, "arguments": args}))
}

/// A fresh connection can list the tools: the daemon is serving.
fn assert_serving(d: &mut Daemon) {
    assert!(d.is_running(), "the daemon died");
    let mut c = d.connect();
    c.send(99, "tools/list", json!({}));
    let r = c.response();
    assert!(r["result"]["tools"].is_array(), "{r}");
}

/// The one call so far was recorded CANCELLED within 3 s, and the daemon still serves.
fn assert_one_cancelled_call_and_serving(d: &mut Daemon) {
    let recs = audit_after(d, 1, 3);
    assert_eq!(recs.len(), 1, "no audit record within 3 s");
    assert_eq!(recs[0]["error"]["code"], "CANCELLED", "{}", recs[0]);
    assert_serving(d);
}

/// Waits for the audit log to hold `n` records.
fn audit_after(d: &Daemon, n: usize, secs: u64) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let recs = d.audit_records();
        if recs.len() >= n || t0.elapsed() > Duration::from_secs(secs) {
            return recs;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn clients_that_leave_before_their_reply_do_not_kill_the_daemon() {
    let mut d = chatty_daemon(1, "");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
    .to_string()
        + "\n";
    for i in 0..40u64 {
        let mut s = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
        let line = if i % 2 == 0 {
            init.clone()
        } else {
            request(i, "tools/list", json!({}))
        };
        let _ = s.write_all(line.as_bytes());
        // Gone without reading: the reply is written to a closed socket.
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_serving(&mut d);
}

#[test]
fn a_client_gone_mid_call_while_console_lines_stream_is_cancelled_and_audited() {
    let mut d = chatty_daemon(1, "");
    {
        let mut s = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
        s.write_all(call_line(1, "chatty", json!({"ms": 5000})).as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        // Read a notification so the stream is flowing, then vanish.
        let mut r = BufReader::new(s.try_clone().unwrap_or_else(|e| panic!("{e}")));
        let mut first = String::new();
        let _ = r.read_line(&mut first);
        assert!(first.contains("notifications/message"), "{first}");
    }
    assert_one_cancelled_call_and_serving(&mut d);
}

#[test]
fn a_killed_bridge_leaves_the_daemon_serving() {
    let mut d = chatty_daemon(1, "");
    let mut bridge = stsd_tests::spawn_bridge(&d.socket, &[]);
    let mut stdin = bridge.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let stdout = bridge.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    stdin
        .write_all(call_line(1, "chatty", json!({"ms": 5000})).as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut first = String::new();
    let _ = BufReader::new(stdout).read_line(&mut first);
    assert!(first.contains("notifications/message"), "{first}");
    let _ = bridge.kill();
    let _ = bridge.wait();
    assert_one_cancelled_call_and_serving(&mut d);
}

/// Pipelines `tools/list` on a session that `initialize`d first (as every real client does)
/// and never reads a reply; `same_id` reuses one request id for every line. Returns the
/// daemon's RSS at the start, its peak, and whether the daemon closed the session.
fn pipeline_without_reading(d: &mut Daemon, same_id: bool) -> (u64, u64, bool) {
    let base = d.rss_kib();
    let s = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let _ = s.set_write_timeout(Some(Duration::from_secs(20)));
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    (&s).write_all(format!("{init}\n").as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut first = String::new();
    let _ = BufReader::new(s.try_clone().unwrap_or_else(|e| panic!("{e}"))).read_line(&mut first);
    assert!(first.contains("protocolVersion"), "{first}");
    (&s).write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (mut s, stop) = (
            s.try_clone().unwrap_or_else(|e| panic!("{e}")),
            stop.clone(),
        );
        std::thread::spawn(move || {
            let mut sent = 0u64;
            let reused = request(1, "tools/list", json!({}));
            while !stop.load(Ordering::Relaxed) {
                let line = match same_id {
                    true => reused.clone(),
                    false => request(sent + 1, "tools/list", json!({})),
                };
                if s.write_all(line.as_bytes()).is_err() {
                    return (sent, true);
                }
                sent += 1;
            }
            (sent, false)
        })
    };
    let t0 = Instant::now();
    let mut peak = 0;
    // Returns as soon as the daemon closes the session; the bound is for a loaded machine.
    while !writer.is_finished() && t0.elapsed() < Duration::from_secs(45) {
        peak = peak.max(d.rss_kib());
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let (sent, closed) = writer.join().unwrap_or_else(|_| panic!("writer panicked"));
    eprintln!(
        "same id {same_id}: pipelined {sent} tools/list; daemon RSS {base} KiB at start, peak \
         {peak} KiB; closed after {:?}",
        t0.elapsed()
    );
    (base, peak, closed)
}

/// Issue 31 item 4: after `initialize`, a client that pipelined `tools/list` with one id and
/// never read grew the daemon to 1.9 GB (each copy of the id started a handler that waited to
/// answer, while the bound on open requests counted the id once and the outbox never
/// filled), and the session was never closed. Now a reused id is refused, the session stalls
/// and is closed, memory stays bounded, and it is given back once the client has gone.
#[test]
fn a_client_that_pipelines_and_never_reads_is_bounded_then_closed() {
    // The bundled catalog: tools/list is large (every spec's schema and _meta).
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // A 1 MiB outbox (8 MiB by default): the stall comes after a few thousand refused lines,
    // seconds sooner on a loaded machine.
    let config = "stall_timeout_ms = 2000\nmax_outbox_bytes = 1048576\n";
    let mut d = Daemon::launch(dir, 1, config, None, &[], None);
    let start = d.rss_kib();
    for same_id in [false, true] {
        let (_, peak, closed) = pipeline_without_reading(&mut d, same_id);
        assert!(
            closed,
            "same id {same_id}: the daemon never closed a session that stopped reading"
        );
        assert!(
            peak < 200 * 1024,
            "same id {same_id}: daemon RSS peaked at {peak} KiB"
        );
        assert_serving(&mut d);
    }
    // Given back after the clients left: near where it started, not at the peak. Waited for
    // with a deadline (the session ends after its flush grace).
    let t0 = Instant::now();
    let mut now = d.rss_kib();
    while now > start + 48 * 1024 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        now = d.rss_kib();
    }
    assert!(
        now <= start + 48 * 1024,
        "daemon RSS {now} KiB after the clients left, {start} KiB at start"
    );
}

/// Sends one raw line on a fresh connection and returns the one reply line.
fn raw_exchange(c: &mut stsd_tests::harness::Conn, line: &[u8]) -> Value {
    c.writer.write_all(line).unwrap_or_else(|e| panic!("{e}"));
    c.response_or_error()
}

#[test]
fn protocol_errors_are_answered_with_their_codes_and_the_session_goes_on() {
    let mut d = chatty_daemon(1, "max_request_bytes = 65536\n");
    let mut c = d.connect();
    let r = raw_exchange(&mut c, b"this is not json\n");
    assert_eq!(r["error"]["code"], -32700, "{r}");
    let deep = format!("{}{}\n", "[".repeat(1000), "]".repeat(1000));
    let r = raw_exchange(&mut c, deep.as_bytes());
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("deeper"),
        "{r}"
    );
    let bad = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                     "params": {"name": 5, "_meta": meta()}});
    let r = raw_exchange(&mut c, format!("{bad}\n").as_bytes());
    assert_eq!(
        (r["error"]["code"].clone(), r["id"].clone()),
        (json!(-32602), json!(5)),
        "{r}"
    );
    let big = call_line(6, "slow", json!({"ms": "x".repeat(100_000)}));
    let r = raw_exchange(&mut c, big.as_bytes());
    assert_eq!(
        (r["error"]["code"].clone(), r["id"].clone()),
        (json!(-32600), json!(6)),
        "{r}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("max_request_bytes"),
        "{r}"
    );
    // The same session still works.
    c.send(7, "tools/list", json!({}));
    assert!(c.response()["result"]["tools"].is_array());
    assert_serving(&mut d);
}

#[test]
fn one_clients_burst_neither_starves_another_nor_exceeds_its_own_bound() {
    let d = chatty_daemon(1, "max_calls_per_session = 4\n");
    let mut a = d.connect();
    for i in 0..6u64 {
        a.call(i, "slow", json!({"ms": 300}));
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut b = d.connect();
    // B's call is told from A's by its argument, in the audit log.
    b.call(100, "slow", json!({"ms": 301}));
    let rb = b.response();
    assert_eq!(text(&rb), "slept 301", "{rb}");
    let a_texts: Vec<String> = (0..6).map(|_| text(&a.response())).collect();
    let overloaded: Vec<&String> = a_texts
        .iter()
        .filter(|t| t.starts_with("OVERLOADED"))
        .collect();
    assert_eq!(overloaded.len(), 2, "{a_texts:?}");
    assert!(
        overloaded[0].contains("max_calls_per_session"),
        "{overloaded:?}"
    );
    // Round robin, by the order calls finished (the audit log is written as each ends), not
    // by a clock: B's call ran before at least two of A's four, rather than after all of
    // them. (A bound on B's wall time, 900 and then 1100 ms, failed on loaded machines.)
    let recs = audit_after(&d, 5, 10);
    let finished: Vec<u64> = recs
        .iter()
        .filter(|r| r["name"] == "slow" && r["outcome"] == "OK")
        .filter_map(|r| r["params"]["ms"].as_u64())
        .collect();
    assert_eq!(finished.len(), 5, "{recs:?}");
    let b_at = finished.iter().position(|ms| *ms == 301);
    assert!(
        b_at.is_some_and(|i| finished.len() > i + 2),
        "B's call was not served in turn: calls finished in the order {finished:?}"
    );
}

/// Opens `n` connections that never say anything.
fn idle_connections(d: &Daemon, n: usize) -> Vec<UnixStream> {
    (0..n)
        .filter_map(|_| UnixStream::connect(&d.socket).ok())
        .collect()
}

fn raise_own_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// A new client is served while the idle crowd is there (not blocked behind it: within
/// 30 s, not 2 s, which a debug build on a loaded machine went over at 2.2 and 4.5 s; an
/// accept loop that waits for the crowd never serves it), and the daemon's CPU use over a
/// quiet second stays under 10%.
fn assert_new_client_served_without_spinning(d: &mut Daemon) {
    let t0 = Instant::now();
    assert_serving(d);
    let served = t0.elapsed();
    assert!(
        served < Duration::from_secs(30),
        "new client waited {served:?}"
    );
    let before = d.cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let used = d.cpu_ticks() - before;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    eprintln!("new client served in {served:?}; daemon CPU over 1 s: {used} ticks of {hz}");
    assert!(
        used * 10 < hz,
        "the daemon used {used}/{hz} ticks in a quiet second"
    );
}

#[test]
fn two_thousand_idle_connections_neither_block_a_new_client_nor_spin() {
    raise_own_nofile();
    let mut d = chatty_daemon(1, "");
    let idle = idle_connections(&d, 2000);
    assert_eq!(idle.len(), 2000);
    assert_new_client_served_without_spinning(&mut d);
    drop(idle);
}

/// What an idle session holds, after its first request, is bounded: 400 more of them cost the
/// daemon at most 64 KiB of resident memory each (issue 39's goal; rmcp's initialisation,
/// some 40-90 KiB of future, once sized every session's task for its whole life). Measured
/// from 50 sessions already held, so that no session ends (and trims the heap) in between.
#[test]
fn an_idle_session_after_one_request_holds_at_most_64_kib() {
    raise_own_nofile();
    let d = chatty_daemon(
        1,
        "max_connections = 1024\nmax_connections_per_uid = 1024\n",
    );
    let open = |from: u64, n: u64| -> Vec<stsd_tests::harness::Conn> {
        (from..from + n)
            .map(|i| {
                let mut c = d.connect();
                c.send(i, "tools/list", json!({}));
                assert!(c.response()["result"]["tools"].is_array());
                c
            })
            .collect()
    };
    let warm = open(0, 50);
    let before = d.rss_kib();
    let n = 400u64;
    let held = open(50, n);
    let after = d.rss_kib();
    assert!(
        after > before,
        "no growth measured: {before} -> {after} KiB"
    );
    let per = (after - before) / n;
    eprintln!("daemon resident memory per idle session: {per} KiB");
    assert!(per <= 64, "{per} KiB per idle session");
    drop((warm, held));
}

#[test]
fn out_of_descriptors_the_daemon_backs_off_and_makes_room() {
    raise_own_nofile();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = chatty_catalog(dir.path());
    let mut d = Daemon::launch(dir, 1, "", Some(&catalog), &[], Some(128));
    let idle = idle_connections(&d, 2000);
    std::thread::sleep(Duration::from_millis(500));
    assert_new_client_served_without_spinning(&mut d);
    drop(idle);
}

#[test]
fn idle_sessions_are_closed_unless_kept_alive() {
    let mut d = chatty_daemon(
        1,
        "idle_timeout_seconds = 1\nfirst_message_timeout_ms = 500\n",
    );
    // Silent from the start: closed after the first-message timeout.
    let mut silent = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let _ = silent.set_read_timeout(Some(Duration::from_secs(5)));
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(silent.read(&mut buf).unwrap_or(usize::MAX), 0);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // Spoke once, then went quiet: closed after the idle timeout.
    let mut quiet = d.connect();
    quiet.send(1, "tools/list", json!({}));
    let _ = quiet.response();
    let t0 = Instant::now();
    let mut line = String::new();
    assert_eq!(quiet.reader.read_line(&mut line).unwrap_or(usize::MAX), 0);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // Keepalives hold a session open past the timeout.
    let mut kept = d.connect();
    for _ in 0..8 {
        kept.writer
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"stsd/keepalive\"}\n")
            .unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(Duration::from_millis(250));
    }
    kept.send(2, "tools/list", json!({}));
    assert!(kept.response()["result"]["tools"].is_array());
    assert_serving(&mut d);
}

#[test]
fn the_bridge_keeps_a_quiet_client_connected() {
    let d = chatty_daemon(1, "idle_timeout_seconds = 1\n");
    let mut bridge = stsd_tests::spawn_bridge(&d.socket, &["--keepalive-ms", "200"]);
    let mut stdin = bridge.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let mut out = BufReader::new(bridge.stdout.take().unwrap_or_else(|| panic!("no stdout")));
    let mut exchange = |id: u64| {
        stdin
            .write_all(request(id, "tools/list", json!({})).as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        line
    };
    assert!(exchange(1).contains("\"tools\""));
    std::thread::sleep(Duration::from_millis(2500));
    let second = exchange(2);
    assert!(second.contains("\"tools\""), "session closed: {second:?}");
    let _ = bridge.kill();
    let _ = bridge.wait();
}

#[test]
fn the_audit_log_bounds_arguments_and_escapes_unicode_line_breaks() {
    let d = chatty_daemon(1, "");
    let mut c = d.connect();
    // 15 MB, refused at argument checking (ms is an INTEGER).
    c.call(1, "slow", json!({"ms": "9".repeat(15_000_000)}));
    let r = c.response();
    assert!(text(&r).starts_with("INVALID_INPUT"), "{r}");
    // A forged record boundary inside an argument.
    c.call(
        2,
        "slow",
        json!({"ms": "1\u{2028}{\"forged\":true}\u{85}\u{9b}"}),
    );
    let _ = c.response();
    let bytes = std::fs::read(&d.audit).unwrap_or_default();
    let lines: Vec<&[u8]> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 2, "{}", String::from_utf8_lossy(&bytes));
    assert!(
        lines[0].len() < 8 * 1024,
        "a {} byte record",
        lines[0].len()
    );
    let first: Value = serde_json::from_slice(lines[0]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first["params"]["ms"]["bytes"], 15_000_000, "{first}");
    let text2 = String::from_utf8_lossy(lines[1]);
    for raw in ['\u{2028}', '\u{85}', '\u{9b}'] {
        assert!(!text2.contains(raw), "raw {raw:?} in {text2}");
    }
    assert!(
        text2.contains("\\u2028") && text2.contains("\\u0085"),
        "{text2}"
    );
    let second: Value = serde_json::from_slice(lines[1]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        second["params"]["ms"],
        "1\u{2028}{\"forged\":true}\u{85}\u{9b}"
    );
}

#[test]
fn a_one_mib_argument_works_and_a_huge_thrown_message_is_a_classified_error() {
    let d = chatty_daemon(1, "");
    let mut c = d.connect();
    let big = format!("{}end", "é".repeat(512 * 1024));
    c.call(1, "measure", json!({"text": big}));
    let r = c.response();
    assert_eq!(
        r["result"]["structuredContent"],
        json!({"length": 512 * 1024 + 3, "last": "end"}),
        "{}",
        text(&r).chars().take(300).collect::<String>()
    );
    c.call(2, "throwsHuge", json!({}));
    let r = c.response();
    let t = text(&r);
    assert!(
        t.starts_with("JS_ERROR: Error: xxx"),
        "{}",
        &t[..t.len().min(200)]
    );
    assert!(
        t.len() < 20_000 && t.contains("bytes in all"),
        "{} bytes",
        t.len()
    );
    // The same through `stsd run`.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = chatty_catalog(dir.path());
    let args = dir.path().join("args.json");
    std::fs::write(&args, json!({"text": "z".repeat(1024 * 1024)}).to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(stsd_bin())
        .args(["run", "--json", "--tool", "measure", "--args-json"])
        .arg(format!("@{}", args.display()))
        .arg(&catalog)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["result"]["length"], 1024 * 1024, "{v}");
}

/// Issue 31 item 6: a client sending refused calls as fast as it can (arguments of the wrong
/// type) is not written one record per call past the budget: at most
/// `audit_refusals_per_second` of its refusals a second, the rest counted into one summary a
/// second. Every refusal is accounted for.
#[test]
fn refused_calls_past_the_budget_are_summarised_in_the_audit() {
    let d = chatty_daemon(1, "audit_refusals_per_second = 5\n");
    let mut c = d.connect();
    let n = 300u64;
    for i in 0..n {
        c.call(i, "slow", json!({"ms": "not a number"}));
    }
    for _ in 0..n {
        let r = c.response();
        assert!(text(&r).starts_with("INVALID_INPUT"), "a refused call: {r}");
    }
    // Summaries are written once their second is over: waited for, with a deadline.
    let t0 = Instant::now();
    loop {
        let recs = d.audit_records();
        let written: Vec<&Value> = recs.iter().filter(|r| r["name"] == "slow").collect();
        let summarised: u64 = recs
            .iter()
            .filter(|r| r["event"] == "refusals-summarised")
            .filter_map(|r| r["count"].as_u64())
            .sum();
        if written.len() as u64 + summarised == n {
            let mut per_second = std::collections::HashMap::new();
            for r in &written {
                *per_second
                    .entry(r["ts"].as_i64().unwrap_or(0) / 1000)
                    .or_insert(0) += 1;
            }
            assert!(
                per_second.values().all(|n| *n <= 5),
                "more than 5 refusals written in a second: {per_second:?}"
            );
            assert!(summarised > 0, "nothing summarised");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{} written + {summarised} summarised of {n}",
            written.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 31 item 6: a principal past `calls_per_second` is refused RATE_LIMITED with the wait,
/// whatever the tool, every refusal audited; another principal (another uid) is untouched,
/// and the first gets calls through again once its bucket refills.
#[test]
fn a_principal_past_its_call_rate_is_refused_and_others_are_not() {
    let d = chatty_daemon(2, "calls_per_second = 4\ncall_burst = 4\naudit_refusals_per_second = 0\nallowed_uids = [65534]\n");
    let mut c = d.connect();
    let n = 40u64;
    let t0 = Instant::now();
    for i in 0..n {
        c.call(i, "measure", json!({"text": "x"}));
    }
    let (mut ok, mut limited) = (0u64, 0u64);
    for _ in 0..n {
        let r = c.response();
        let t = text(&r);
        if t.starts_with("RATE_LIMITED: rate limit") {
            assert!(t.contains("retry in"), "{t}");
            limited += 1;
        } else {
            assert!(!is_error(&r), "{r}");
            ok += 1;
        }
    }
    // The burst, plus 4 a second for as long as the sends took.
    let allowed = 4 + (t0.elapsed().as_secs_f64() * 4.0).ceil() as u64;
    assert!(
        ok >= 4 && ok <= allowed,
        "{ok} passed, at most {allowed} may"
    );
    assert_eq!(ok + limited, n);
    // Another principal: its own bucket (root only: the test acts as uid 65534).
    if nix::unistd::Uid::effective().is_root() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let _ = std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o777));
        let _ = std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755));
        let out = Command::new(stsd_bin())
            .args(["call", "measure", "--arg", "text=y", "--socket"])
            .arg(&d.socket)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Refilled: the first principal gets through again.
    std::thread::sleep(Duration::from_millis(600));
    c.call(n, "measure", json!({"text": "z"}));
    assert!(!is_error(&c.response()));
    // Every refusal is in the audit log, with its code.
    let recs = d.audit_records();
    let refused = recs
        .iter()
        .filter(|r| r["error"]["code"] == "RATE_LIMITED" && r["name"] == "measure")
        .count() as u64;
    assert_eq!(refused, limited);
}
