//! See mod.rs.
