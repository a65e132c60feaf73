//! [`Spawner`]: how workers are made, one per daemon (or per `stsd run`): forked by the
//! zygote, or exec'd fresh (`super::spawn`).

use super::spawn::{spawn_exec, ExeFile, Spawned};
use super::zygote::Zygote;
use crate::cgroup::Group;
use std::path::Path;
use std::sync::Arc;
use stsd_profiles::baseline::{SpawnMode, WorkerConfig};

/// How workers are made: one per daemon (or per `stsd run`), shared by every call.
#[derive(Debug)]
pub enum Spawner {
    Exec { exe: ExeFile, uid: u32, gid: u32 },
    Zygote(Zygote),
}

impl Spawner {
    /// `group`: the pool's control group, which the zygote (and so every worker it forks) or
    /// every exec'd worker joins.
    pub fn new(
        exe: &Path,
        cfg: &WorkerConfig,
        group: Option<Arc<Group>>,
    ) -> std::io::Result<Spawner> {
        let exe = ExeFile::open(exe)?.in_group(group);
        Ok(match cfg.spawn {
            SpawnMode::Exec => Spawner::Exec {
                exe,
                uid: cfg.uid,
                gid: cfg.gid,
            },
            SpawnMode::Zygote => Spawner::Zygote(Zygote::start(exe, cfg)),
        })
    }

    pub fn mode(&self) -> SpawnMode {
        match self {
            Spawner::Exec { .. } => SpawnMode::Exec,
            Spawner::Zygote(_) => SpawnMode::Zygote,
        }
    }

    /// A path that execs the stsd binary held open since start (for `stsd upstream-exec`).
    pub fn exe_path(&self) -> String {
        match self {
            Spawner::Exec { exe, .. } => exe.exec_path(),
            Spawner::Zygote(z) => z.exe_path(),
        }
    }

    /// The zygote's pid right now (None in exec mode, or while none runs).
    pub fn zygote_pid(&self) -> Option<u32> {
        match self {
            Spawner::Exec { .. } => None,
            Spawner::Zygote(z) => z.pid(),
        }
    }

    /// The live zygote's successor, started ahead and ready (see `exec::zygote`).
    pub fn zygote_successor_pid(&self) -> Option<u32> {
        match self {
            Spawner::Exec { .. } => None,
            Spawner::Zygote(z) => z.successor_pid(),
        }
    }

    /// Zygote handovers so far (none when workers are exec'd).
    pub fn zygote_handovers(&self) -> super::zygote::Handovers {
        match self {
            Spawner::Exec { .. } => Default::default(),
            Spawner::Zygote(z) => z.handovers(),
        }
    }

    /// A new worker. `urgent`: a call waits for it (else it is for the pool: see
    /// `os::priority`).
    pub fn spawn(&self, urgent: bool) -> std::io::Result<Spawned> {
        match self {
            Spawner::Exec { exe, uid, gid } => spawn_exec(exe, *uid, *gid),
            Spawner::Zygote(z) => z.fork(urgent),
        }
    }
}
