//! The admin channel's JSON-RPC error codes (a leaf: the channel's parts share them).

/// The caller may not do this.
pub const NOT_ALLOWED: i32 = -32001;
/// No such tool, upstream or ledger entry.
pub const NO_SUCH: i32 = -32002;
/// A change the publish gate refused (the catalog is unchanged).
pub const GATE_FAILED: i32 = -32003;
