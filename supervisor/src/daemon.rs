//! `stsd` with no subcommand: the daemon. MCP on a Unix socket (0600, peer credentials checked),
//! a pre-warmed pool, the audit log, SIGTERM/SIGINT graceful stop, SIGHUP catalog reload.
//! And `stsd mcp`: MCP on stdio, bridged to a running daemon or served by an embedded one.

use crate::audit::AuditLog;
use crate::exec::ExecOptions;
use crate::listener;
use crate::mcp::{self, Handler};
use crate::service::{Service, Source};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_profiles::Config;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub struct DaemonOptions {
    pub config: Config,
    pub pool: usize,
    pub socket: PathBuf,
    pub sources: Vec<Source>,
    pub worker_exe: PathBuf,
    /// `--worker-reuse K`: a worker serves up to K calls of one tool (1 = one call per worker).
    pub reuse: u32,
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("stsd")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn build_service(o: &DaemonOptions) -> Result<Arc<Service>, String> {
    let audit_path = o
        .config
        .daemon
        .audit_log
        .clone()
        .unwrap_or_else(crate::paths::default_audit_log);
    let audit = AuditLog::open(&audit_path)
        .map_err(|e| format!("cannot open the audit log {}: {e}", audit_path.display()))?;
    let opts = ExecOptions::new(o.worker_exe.clone(), &o.config)?;
    Ok(Service::new(
        o.config.clone(),
        opts,
        o.pool,
        o.reuse,
        o.sources.clone(),
        Some(audit),
    ))
}

fn banner(service: &Service, what: &str) -> String {
    let p = service.published();
    let mut s = format!(
        "{what}\npool: {} workers ({}), queue limit {}; audit log: {}\nserving {} tools: {}\n",
        service.pool.target(),
        if service.reuse() > 1 {
            format!("each serves up to {} calls of one tool", service.reuse())
        } else {
            "one call per worker".to_string()
        },
        service.config.daemon.queue_limit,
        service
            .audit_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "-".into()),
        p.tools.len(),
        p.names().join(", ")
    );
    for (name, why) in &p.withheld {
        s.push_str(&format!("withheld {name}: {why}\n"));
    }
    s
}

/// Runs the daemon until SIGTERM/SIGINT.
pub fn run(o: DaemonOptions) -> Result<(), String> {
    let rt = runtime()?;
    rt.block_on(async move {
        let bound = listener::bind(&o.socket, o.config.daemon.socket_group)?;
        let service = build_service(&o)?;
        let (changed, _) = broadcast::channel::<()>(16);
        print!(
            "{}",
            banner(
                &service,
                &format!(
                    "stsd {} listening on {} (MCP 2026-07-28 and 2025-11-25, newline-delimited JSON-RPC)",
                    env!("CARGO_PKG_VERSION"),
                    bound.path.display()
                )
            )
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();

        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
        let stop_all = CancellationToken::new();
        let mut sessions = tokio::task::JoinSet::new();
        let allowed = o.config.daemon.allowed_uids.clone();
        loop {
            tokio::select! {
                accepted = bound.listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    match listener::check_peer(&stream, &allowed) {
                        Ok(uid) => {
                            let handler = Handler::new(service.clone(), changed.clone(), Some(uid), "unix");
                            let stop = stop_all.clone();
                            sessions.spawn(async move {
                                let (r, w) = stream.into_split();
                                tokio::select! {
                                    _ = mcp::serve(handler, r, w) => {}
                                    _ = stop.cancelled() => {}
                                }
                            });
                        }
                        Err(why) => {
                            tracing::warn!(%why, "connection refused");
                            drop(stream);
                        }
                    }
                }
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                _ = hup.recv() => {
                    if service.reload() {
                        let _ = changed.send(());
                    }
                    eprint!("{}", banner(&service, "catalog reloaded (SIGHUP)"));
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        // Stop accepting, let in-flight calls finish within the grace period, kill the rest.
        drop(bound.listener);
        let _ = std::fs::remove_file(&bound.path);
        let grace = Duration::from_secs(o.config.daemon.shutdown_grace_seconds);
        let t0 = Instant::now();
        while service.in_flight() > 0 && t0.elapsed() < grace {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = service.in_flight();
        stop_all.cancel();
        sessions.shutdown().await;
        service.shutdown();
        eprintln!("stsd stopped ({left} calls cut off after the grace period)");
        Ok(())
    })
}

/// `stsd mcp`: stdio. Bridges to the daemon on `socket` when one answers, else serves the
/// catalog itself with an embedded supervisor.
pub fn run_stdio(o: DaemonOptions) -> Result<(), String> {
    let rt = runtime()?;
    rt.block_on(async move {
        if let Ok(stream) = tokio::net::UnixStream::connect(&o.socket).await {
            tracing::info!(socket = %o.socket.display(), "bridging stdio to the running daemon");
            let (mut sr, mut sw) = stream.into_split();
            let (mut stdin, mut stdout) = rmcp::transport::stdio_pipes();
            let up = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut stdin, &mut sw).await;
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut sw).await;
            });
            let _ = tokio::io::copy(&mut sr, &mut stdout).await;
            let _ = tokio::io::AsyncWriteExt::flush(&mut stdout).await;
            up.abort();
            // A blocking stdin read would stall runtime shutdown; the session is over.
            std::process::exit(0);
        }
        let service = build_service(&o)?;
        eprint!(
            "{}",
            banner(
                &service,
                "stsd mcp: no daemon answered; serving on stdio with an embedded supervisor"
            )
        );
        let (changed, _) = broadcast::channel::<()>(16);
        let uid = nix::unistd::Uid::effective().as_raw();
        let handler = Handler::new(service.clone(), changed, Some(uid), "stdio");
        let (r, w) = rmcp::transport::stdio_pipes();
        mcp::serve(handler, r, w).await;
        service.shutdown();
        Ok(())
    })
}
