//! The approval gate: whether a call needs a decision before it runs, and who decides.
//! `policy` computes each tool's effective requirement when the catalog is published;
//! `toolsets` reads the operator's CJSON toolsets documents (seed 003).

pub mod policy;
pub mod toolsets;

pub use policy::{mitigated, requirement, Requirement, Source, ToolFacts};
