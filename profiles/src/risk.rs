//! The Risk Level (spec §10.6), as the reference calculator computes it, plus `destructive` -> L5.
//! A view on the posture, never stored in toolSafety.

use crate::baseline::Baseline;
use crate::tool_safety::ToolSafety;
use serde::{Serialize, Serializer};
use std::fmt;
use stsd_protocol::{NetworkMode, ToolSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RiskLevel {
    L0,
    L1,
    L2,
    L3,
    L4,
    L5,
}

impl RiskLevel {
    pub const ALL: [RiskLevel; 6] = [
        RiskLevel::L0,
        RiskLevel::L1,
        RiskLevel::L2,
        RiskLevel::L3,
        RiskLevel::L4,
        RiskLevel::L5,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RiskLevel::L0 => "L0",
            RiskLevel::L1 => "L1",
            RiskLevel::L2 => "L2",
            RiskLevel::L3 => "L3",
            RiskLevel::L4 => "L4",
            RiskLevel::L5 => "L5",
        }
    }
}

impl fmt::Display for RiskLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for RiskLevel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        RiskLevel::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| serde::de::Error::custom(format!("a risk level L0..L5, got {s:?}")))
    }
}

impl Serialize for RiskLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

fn is_critical(class: &str) -> bool {
    ["java.lang.System", "java.lang.Runtime", "java.lang.Process"]
        .iter()
        .any(|p| class.starts_with(p))
}

fn is_file_write(class: &str) -> bool {
    [
        "FileWriter",
        "FileOutputStream",
        "RandomAccessFile",
        "FileChannel",
    ]
    .iter()
    .any(|p| class.contains(p))
}

fn is_reflection_network_or_file_read(class: &str) -> bool {
    let reflection = class.starts_with("java.lang.reflect")
        || class.starts_with("java.lang.invoke")
        || class == "java.lang.Class";
    let network = class.starts_with("java.net.http")
        || class.starts_with("javax.net.ssl")
        || class.starts_with("org.jsoup")
        || ["Socket", "URLConnection", "SocketChannel"]
            .iter()
            .any(|p| class.contains(p))
        || class == "java.net.URL";
    let file_read = ["java.io.File", "java.nio.file.Files", "java.nio.file.Path"]
        .iter()
        .any(|p| class.starts_with(p))
        || class.contains("FileReader")
        || class.contains("FileInputStream");
    reflection || network || file_read
}

/// Monotonic max-merge over the resolved capabilities and the class-list escalations.
pub fn risk_level(ts: &ToolSafety, spec: &ToolSpec, baseline: &Baseline) -> RiskLevel {
    let mut risk = RiskLevel::L0;
    let caps = &ts.capabilities;
    match caps.network.mode {
        NetworkMode::Allowlist if caps.network.hosts.iter().any(|h| h == "*") => {
            risk = risk.max(RiskLevel::L4)
        }
        // The reference raises allowlist to L3 only when the list is non-empty; an empty
        // allowlist denies every host.
        NetworkMode::Allowlist if !caps.network.hosts.is_empty() => risk = risk.max(RiskLevel::L3),
        NetworkMode::Strict => risk = risk.max(RiskLevel::L3),
        NetworkMode::Open => risk = risk.max(RiskLevel::L4),
        _ => {}
    }
    if caps.file_write {
        risk = risk.max(RiskLevel::L4);
    } else if caps.file_read {
        risk = risk.max(RiskLevel::L3);
    }
    if caps.destructive {
        risk = risk.max(RiskLevel::L5);
    }

    let o = &spec.sandbox_overrides;
    // Escalation: entries removed from the baseline denylist.
    let removed: Vec<&String> = baseline
        .deny_classes
        .iter()
        .filter(|c| o.remove_deny_classes.contains(c))
        .collect();
    if removed.iter().any(|c| is_critical(c)) {
        risk = risk.max(RiskLevel::L5);
    }
    if removed.len() >= 3 {
        risk = risk.max(RiskLevel::L4);
    } else if !removed.is_empty() {
        risk = risk.max(RiskLevel::L3);
    }
    // Escalation: entries added to the allowlist beyond the baseline.
    for cls in o
        .add_allow_classes
        .iter()
        .filter(|c| !baseline.allow_classes.contains(c) && !o.remove_allow_classes.contains(c))
    {
        let level = if is_critical(cls) || is_file_write(cls) {
            RiskLevel::L5
        } else if is_reflection_network_or_file_read(cls) {
            RiskLevel::L4
        } else {
            RiskLevel::L3
        };
        risk = risk.max(level);
    }
    risk
}
