//! stsd-profiles: the posture resolver (baseline + sandboxOverrides -> toolSafety), the Risk
//! Level, and (with the execution work) the OS profile derived from a toolSafety.

pub mod approval;
pub mod baseline;
pub mod resolve;
pub mod risk;
pub mod tool_safety;
pub mod upstream;

pub use baseline::{Baseline, Config, EgressConfig};
pub use resolve::{resolve, Limits, Resolved};
pub use risk::RiskLevel;
pub use tool_safety::ToolSafety;
pub mod os;
