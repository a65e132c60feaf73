//! [`ExecOptions`]: how calls are run (the spawner, the kill grace, the worker user, the
//! fetch broker, reuse and priming).

use super::spawner::Spawner;
use crate::egress::Broker;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Makes workers (the zygote, or exec of the stsd binary held open since start).
    pub spawner: Arc<Spawner>,
    pub kill_grace: Duration,
    /// The user a worker switches to when the supervisor runs as root.
    pub uid: u32,
    pub gid: u32,
    /// Makes the requests of tools whose posture grants network.
    pub broker: Arc<Broker>,
    /// Reuse: how long a parked worker may wait for its next call.
    pub reuse_idle: Duration,
    /// Reuse: parked workers in all; `None`: the pool size.
    pub reuse_max_parked: Option<usize>,
    /// One-shot: pool workers are primed for the tools called lately (`[worker] prime`).
    pub prime: bool,
    /// One-shot with priming: primed workers are forked by a template of their posture
    /// (`[worker] template`, see [`super::template`]).
    pub template: bool,
    /// Forks a zygote, or a template, makes before it is replaced.
    pub max_forks: u32,
}

impl ExecOptions {
    /// Fails when the stsd binary cannot be opened or the egress configuration cannot be
    /// loaded (an unreadable CA file).
    pub fn new(worker_exe: PathBuf, config: &stsd_profiles::Config) -> Result<ExecOptions, String> {
        let group = crate::cgroup::for_pool(&config.cgroups)?;
        let spawner = Spawner::new(&worker_exe, &config.worker, group).map_err(|e| {
            format!(
                "cannot open the worker binary {}: {e}",
                worker_exe.display()
            )
        })?;
        Ok(ExecOptions {
            spawner: Arc::new(spawner),
            kill_grace: Duration::from_millis(config.worker.kill_grace_ms),
            uid: config.worker.uid,
            gid: config.worker.gid,
            broker: Arc::new(Broker::new(&config.egress)?),
            reuse_idle: Duration::from_secs(config.worker.reuse_idle_seconds),
            reuse_max_parked: config.worker.reuse_max_parked,
            prime: config.worker.prime,
            template: config.worker.template,
            max_forks: config.worker.zygote_max_forks,
        })
    }
}
