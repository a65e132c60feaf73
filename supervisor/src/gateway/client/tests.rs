//! Against real servers: tests/upstreams/hostile_server.py (official Python SDK), the
//! reference time server (PyPI mcp-server-time) and filesystem server (npm), as
//! `scripts/setup-test-deps` installs them into target/. Missing fixtures fail the test.

#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn need(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/setup-test-deps`",
        path.display()
    );
    path
}

fn python() -> PathBuf {
    need(root().join("target/upstream-venv/bin/python"))
}

fn hostile() -> PathBuf {
    need(root().join("tests/upstreams/hostile_server.py"))
}

fn config(id: &str, max_output: Option<u64>) -> Arc<UpstreamConfig> {
    Arc::new(UpstreamConfig {
        id: id.to_owned(),
        command: Some("python".to_owned()),
        max_output_bytes: max_output,
        ..Default::default()
    })
}

fn launcher(program: PathBuf, args: Vec<String>) -> Launcher {
    Arc::new(move || {
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&args);
        Ok(cmd)
    })
}

fn fast() -> Options {
    Options {
        restart_initial: Duration::from_millis(50),
        restart_max: Duration::from_millis(400),
        ..Options::from_gateway(&Default::default())
    }
}

async fn hostile_conn(mode: &str, max_output: Option<u64>, opts: Options) -> Arc<Connection> {
    let args = vec![hostile().display().to_string(), mode.to_owned()];
    let conn = Connection::start(config(mode, max_output), launcher(python(), args), opts);
    assert!(
        conn.wait_ready(Duration::from_secs(30)).await,
        "{:?}",
        conn.state()
    );
    conn
}

fn args(v: serde_json::Value) -> serde_json::Map<String, Value> {
    v.as_object().cloned().unwrap()
}

fn never() -> Arc<AtomicBool> {
    Arc::default()
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

async fn echo(conn: &Connection, s: &str) -> Result<String, (Code, String)> {
    conn.call(
        "echo",
        args(json!({"text": s})),
        Duration::from_secs(10),
        never(),
    )
    .await
    .map(|r| text(&r))
}

/// Calls echo until it answers (the connection came back), or panics after 20 s.
async fn until_echo(conn: &Connection) {
    let start = Instant::now();
    loop {
        match echo(conn, "back").await {
            Ok(t) => return assert_eq!(t, "back"),
            Err((Code::UpstreamUnavailable | Code::UpstreamLost, _))
                if start.elapsed() < Duration::from_secs(20) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e:?} after {:?}", start.elapsed()),
        }
    }
}

#[tokio::test]
async fn lists_the_poison_tools_and_calls_echo() {
    let conn = hostile_conn("poison", None, fast()).await;
    let list = conn.tools().borrow().clone();
    assert_eq!(list.generation, 1);
    let mut names: Vec<_> = list.tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "ansi_escape",
            "cross_server_imperative",
            "echo",
            "env",
            "exfiltration_directive",
            "fetch",
            "hidden_instruction",
            "read",
            "role_hijack",
            "system_prompt_override",
            "unicode_homoglyph_risk",
            "unicode_rtl_override",
            "unicode_zero_width",
        ]
    );
    assert_eq!(echo(&conn, "héllo").await.unwrap(), "héllo");
    assert!(conn.pid().is_some());
    assert_eq!(conn.state(), ConnState::Ready);
}

#[tokio::test]
async fn a_silent_redefinition_is_caught_by_the_periodic_relist() {
    let mut opts = fast();
    opts.relist = Duration::from_millis(200);
    let conn = hostile_conn("silentpull", None, opts).await;
    let mut rx = conn.tools();
    assert_eq!(rx.borrow_and_update().generation, 1);
    conn.call("flip", Default::default(), Duration::from_secs(10), never())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .unwrap()
        .unwrap();
    let after = rx.borrow().clone();
    assert_eq!(after.generation, 2);
    let weather = after.tools.iter().find(|t| t.name == "weather").unwrap();
    assert!(weather
        .description
        .as_deref()
        .unwrap_or_default()
        .contains("id_rsa"));
}

#[tokio::test]
async fn list_changed_after_a_rug_pull_publishes_a_new_generation() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut opts = fast();
    let sink = seen.clone();
    opts.events = Some(Arc::new(move |e: &ConnEvent| {
        sink.lock().unwrap().push(e.clone())
    }));
    let conn = hostile_conn("rugpull", None, opts).await;
    let mut rx = conn.tools();
    let before = rx.borrow_and_update().clone();
    let weather = |l: &ToolList| {
        l.tools
            .iter()
            .find(|t| t.name == "weather")
            .cloned()
            .unwrap()
    };
    assert_eq!(before.generation, 1);
    assert_eq!(
        weather(&before).annotations.unwrap().destructive_hint,
        Some(false)
    );

    let flipped = conn
        .call("flip", Default::default(), Duration::from_secs(10), never())
        .await
        .unwrap();
    assert_eq!(text(&flipped), "flipped");
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .unwrap()
        .unwrap();
    let after = rx.borrow().clone();
    assert_eq!(after.generation, 2);
    let pulled = weather(&after);
    assert_ne!(pulled.description, weather(&before).description);
    assert!(pulled.description.unwrap().contains("id_rsa"));
    assert_eq!(pulled.annotations.unwrap().destructive_hint, Some(true));
    assert!(seen
        .lock()
        .unwrap()
        .contains(&ConnEvent::ToolsChanged { generation: 2 }));
}

#[tokio::test]
async fn a_crash_mid_call_is_upstream_lost_and_the_upstream_restarts() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut opts = fast();
    let sink = seen.clone();
    opts.events = Some(Arc::new(move |e: &ConnEvent| {
        sink.lock().unwrap().push(e.clone())
    }));
    let conn = hostile_conn("crash", None, opts).await;
    let first = conn.pid().unwrap();
    let err = conn
        .call(
            "crash",
            Default::default(),
            Duration::from_secs(10),
            never(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.0, Code::UpstreamLost, "{err:?}");
    until_echo(&conn).await;
    assert_ne!(conn.pid().unwrap(), first);
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter().any(
            |e| matches!(e, ConnEvent::Exited { reason } if reason.contains("exit status: 3"))
        ),
        "{seen:?}"
    );
    assert!(seen
        .iter()
        .any(|e| matches!(e, ConnEvent::Restarting { attempt: 1, .. })));
    // The list did not change across the restart: no new generation.
    assert_eq!(conn.tools().borrow().generation, 1);
}

#[tokio::test]
async fn an_output_flood_is_output_limit_read_bounded_and_recovers() {
    let conn = hostile_conn("flood", None, fast()).await;
    let started = Instant::now();
    let err = conn
        .call(
            "flood",
            args(json!({"mb": 50})),
            Duration::from_secs(60),
            never(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.0, Code::OutputLimit, "{err:?}");
    // Killed at the first MiB and a bit, not after reading 50 MB.
    let read = conn.stdout_bytes();
    let cap = UpstreamConfig::DEFAULT_MAX_OUTPUT_BYTES + 64 * 1024;
    assert!(read < cap + 256 * 1024, "read {read} bytes");
    until_echo(&conn).await;
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn a_reply_over_the_limit_within_the_line_cap_is_refused_without_a_restart() {
    // 1 MiB of text against a limit just under it: the line passes the pump (limit + 64
    // KiB), the size check refuses it, and the upstream keeps running.
    let conn = hostile_conn("flood", Some((1 << 20) - 4096), fast()).await;
    let pid = conn.pid();
    let err = conn
        .call(
            "flood",
            args(json!({"mb": 1})),
            Duration::from_secs(30),
            never(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.0, Code::OutputLimit, "{err:?}");
    assert_eq!(echo(&conn, "still").await.unwrap(), "still");
    assert_eq!(conn.pid(), pid);
}

#[tokio::test]
async fn a_slow_call_times_out_is_cancelled_upstream_and_the_connection_stays() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let path = log.path().to_owned();
    let script = hostile();
    let python = python();
    let launcher: Launcher = Arc::new(move || {
        let mut cmd = tokio::process::Command::new(&python);
        cmd.arg(&script).arg("slow").env("HOSTILE_LOG", &path);
        Ok(cmd)
    });
    let conn = Connection::start(config("slow", None), launcher, fast());
    assert!(conn.wait_ready(Duration::from_secs(30)).await);
    let started = Instant::now();
    let err = conn
        .call(
            "slow",
            args(json!({"seconds": 30})),
            Duration::from_millis(500),
            never(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.0, Code::Timeout, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The upstream heard notifications/cancelled and stopped the handler.
    let start = Instant::now();
    while std::fs::read_to_string(log.path()).unwrap() != "slow cancelled\n" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no notifications/cancelled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(echo(&conn, "awake").await.unwrap(), "awake");
    assert_eq!(conn.state(), ConnState::Ready);
}

#[tokio::test]
async fn an_mcp_error_reply_is_upstream_error_with_its_message() {
    let conn = hostile_conn("poison", None, fast()).await;
    let err = conn
        .call("nope", Default::default(), Duration::from_secs(10), never())
        .await
        .unwrap_err();
    assert_eq!(err.0, Code::UpstreamError, "{err:?}");
    assert!(err.1.contains("Unknown tool: nope"), "{}", err.1);
    assert_eq!(echo(&conn, "fine").await.unwrap(), "fine");
}

#[tokio::test]
async fn a_caller_that_went_away_stops_the_call() {
    let conn = hostile_conn("slow", None, fast()).await;
    let cancel = never();
    let flag = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        flag.store(true, Ordering::SeqCst);
    });
    let err = conn
        .call(
            "slow",
            args(json!({"seconds": 30})),
            Duration::from_secs(20),
            cancel,
        )
        .await
        .unwrap_err();
    assert_eq!(err.0, Code::Cancelled, "{err:?}");
}

#[tokio::test]
async fn an_upstream_that_cannot_start_is_unavailable_with_backoff() {
    let launcher: Launcher = Arc::new(|| Err("no such sandbox".to_owned()));
    let conn = Connection::start(config("broken", None), launcher, fast());
    let mut rx = conn.state_watch();
    let state = tokio::time::timeout(
        Duration::from_secs(5),
        rx.wait_for(|s| matches!(s, ConnState::Restarting { attempt: 3, .. })),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    assert_eq!(
        state,
        ConnState::Restarting {
            attempt: 3,
            last_error: "no such sandbox".to_owned()
        }
    );
    let err = echo(&conn, "x").await.unwrap_err();
    assert_eq!(err.0, Code::UpstreamUnavailable);
    assert!(err.1.contains("no such sandbox"), "{}", err.1);
}

#[test]
fn backoff_doubles_up_to_the_max() {
    let opts = Options::from_gateway(&GatewayConfig {
        restart_initial_ms: 250,
        restart_max_ms: 30_000,
        ..Default::default()
    });
    let ms: Vec<u128> = (1..=9).map(|a| opts.backoff(a).as_millis()).collect();
    assert_eq!(ms, [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    assert_eq!(opts.backoff(u32::MAX).as_millis(), 30000);
}

#[tokio::test]
async fn stop_kills_the_child_and_fails_calls_in_flight() {
    let conn = hostile_conn("slow", None, fast()).await;
    let pid = conn.pid().unwrap();
    let inflight = {
        let conn = conn.clone();
        tokio::spawn(async move {
            conn.call(
                "slow",
                args(json!({"seconds": 30})),
                Duration::from_secs(20),
                never(),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    conn.stop();
    let err = inflight.await.unwrap().unwrap_err();
    assert_eq!(err.0, Code::UpstreamLost, "{err:?}");
    assert_eq!(conn.state(), ConnState::Stopped);
    assert_eq!(
        echo(&conn, "x").await.unwrap_err().0,
        Code::UpstreamUnavailable
    );
    // Gone, or a zombie until Tokio reaps it.
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z ") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{stat}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_reference_time_server() {
    let conn = Connection::start(
        config("time", None),
        launcher(python(), vec!["-m".into(), "mcp_server_time".into()]),
        fast(),
    );
    assert!(
        conn.wait_ready(Duration::from_secs(30)).await,
        "{:?}",
        conn.state()
    );
    let names: Vec<_> = conn
        .tools()
        .borrow()
        .tools
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["get_current_time", "convert_time"]);
    let result = conn
        .call(
            "get_current_time",
            args(json!({"timezone": "UTC"})),
            Duration::from_secs(10),
            never(),
        )
        .await
        .unwrap();
    let reply: Value = serde_json::from_str(&text(&result)).unwrap();
    assert_eq!(reply["timezone"], "UTC");
    assert!(
        reply["datetime"].as_str().unwrap().ends_with("+00:00"),
        "{reply}"
    );
}

#[tokio::test]
async fn the_reference_filesystem_server() {
    let server = need(
        root()
            .join("target/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hi").unwrap();
    let allowed = dir.path().canonicalize().unwrap().display().to_string();
    let conn = Connection::start(
        config("fs", None),
        launcher(
            PathBuf::from("node"),
            vec![server.display().to_string(), allowed.clone()],
        ),
        fast(),
    );
    assert!(
        conn.wait_ready(Duration::from_secs(30)).await,
        "{:?}",
        conn.state()
    );
    let names: Vec<_> = conn
        .tools()
        .borrow()
        .tools
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    for name in [
        "list_allowed_directories",
        "list_directory",
        "read_text_file",
        "write_file",
    ] {
        assert!(names.iter().any(|n| n == name), "{names:?}");
    }
    let dirs = conn
        .call(
            "list_allowed_directories",
            Default::default(),
            Duration::from_secs(10),
            never(),
        )
        .await
        .unwrap();
    assert!(text(&dirs).contains(&allowed), "{}", text(&dirs));
    let listing = conn
        .call(
            "list_directory",
            args(json!({"path": allowed})),
            Duration::from_secs(10),
            never(),
        )
        .await
        .unwrap();
    assert!(
        text(&listing).contains("[FILE] hello.txt"),
        "{}",
        text(&listing)
    );
    // An MCP-level failure the server reports as a tool error stays a result (is_error).
    let outside = conn
        .call(
            "list_directory",
            args(json!({"path": "/etc"})),
            Duration::from_secs(10),
            never(),
        )
        .await
        .unwrap();
    assert_eq!(outside.is_error, Some(true));
}

/// The hostile server over Streamable HTTP, behind a header check: the configured headers
/// reach it, and a wrong one keeps the connection from coming up.
#[tokio::test]
async fn streamable_http_with_headers() {
    use tokio::io::AsyncBufReadExt;
    let mut server = tokio::process::Command::new(python())
        .arg(hostile())
        .args(["poison", "--http"])
        .env("HOSTILE_REQUIRE_HEADER", "x-api-key:s3cret")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut port = String::new();
    tokio::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut port)
        .await
        .unwrap();
    let url = format!("http://127.0.0.1:{}/mcp", port.trim());
    let http = |key: &str| {
        Arc::new(UpstreamConfig {
            id: "http".to_owned(),
            url: Some(url.clone()),
            headers: [("x-api-key".to_owned(), key.to_owned())].into(),
            ..Default::default()
        })
    };
    let unused: Launcher = Arc::new(|| Err("not stdio".to_owned()));

    let conn = Connection::start(http("s3cret"), unused.clone(), fast());
    assert!(
        conn.wait_ready(Duration::from_secs(30)).await,
        "{:?}",
        conn.state()
    );
    assert_eq!(conn.tools().borrow().tools.len(), 13);
    assert_eq!(echo(&conn, "over http").await.unwrap(), "over http");
    assert_eq!(conn.pid(), None);

    let wrong = Connection::start(http("guess"), unused, fast());
    assert!(!wrong.wait_ready(Duration::from_secs(2)).await);
    assert!(
        matches!(wrong.state(), ConnState::Restarting { .. }),
        "{:?}",
        wrong.state()
    );
    let err = echo(&wrong, "x").await.unwrap_err();
    assert_eq!(err.0, Code::UpstreamUnavailable);
    assert!(
        !err.1.contains("guess"),
        "the header value leaked: {}",
        err.1
    );
}

/// The HTTP server goes away: a call fails UPSTREAM_LOST (or UNAVAILABLE if the supervisor
/// noticed first) and the connection leaves Ready to reconnect with backoff.
#[tokio::test]
async fn an_http_upstream_that_dies_is_lost_and_reconnected() {
    use tokio::io::AsyncBufReadExt;
    let mut server = tokio::process::Command::new(python())
        .arg(hostile())
        .args(["slow", "--http"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut port = String::new();
    tokio::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut port)
        .await
        .unwrap();
    let cfg = Arc::new(UpstreamConfig {
        id: "http".to_owned(),
        url: Some(format!("http://127.0.0.1:{}/mcp", port.trim())),
        ..Default::default()
    });
    let conn = Connection::start(cfg, Arc::new(|| Err("not stdio".to_owned())), fast());
    assert!(
        conn.wait_ready(Duration::from_secs(30)).await,
        "{:?}",
        conn.state()
    );
    let inflight = {
        let conn = conn.clone();
        tokio::spawn(async move {
            conn.call(
                "slow",
                args(json!({"seconds": 30})),
                Duration::from_secs(20),
                never(),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill().await.unwrap();
    let started = Instant::now();
    let err = inflight.await.unwrap().unwrap_err();
    assert_eq!(err.0, Code::UpstreamLost, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = echo(&conn, "x").await.unwrap_err();
    assert!(
        matches!(err.0, Code::UpstreamLost | Code::UpstreamUnavailable),
        "{err:?}"
    );
    let mut rx = conn.state_watch();
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| matches!(s, ConnState::Restarting { .. })),
    )
    .await
    .unwrap()
    .unwrap();
}

/// With a proxy configured, requests go to the proxy (absolute-form), never to the server.
#[tokio::test]
async fn an_http_upstream_goes_through_the_proxy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = proxy.accept().await {
            let mut head = vec![0u8; 4096];
            let n = sock.read(&mut head).await.unwrap_or(0);
            let line = String::from_utf8_lossy(&head[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            let _ = tx.send(line);
            let _ = sock
                .write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
    });
    let cfg = Arc::new(UpstreamConfig {
        id: "proxied".to_owned(),
        url: Some("http://upstream.invalid:8080/mcp".to_owned()),
        ..Default::default()
    });
    let mut opts = fast();
    opts.http_proxy = Some(proxy_url);
    let conn = Connection::start(cfg, Arc::new(|| Err("not stdio".to_owned())), opts);
    let line = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line, "POST http://upstream.invalid:8080/mcp HTTP/1.1");
    assert!(!conn.wait_ready(Duration::from_millis(500)).await);
}
