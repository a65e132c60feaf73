//! stsd-protocol: the Safe Tool Spec document (types, validation, JSON Schema), `${ENV}`
//! placeholders and secret masking, and (later) the supervisor<->worker frames.
//! No I/O here beyond parsing bytes handed in.

pub mod diag;
pub mod envvar;
pub mod frames;
pub mod fs_denial;
pub mod ids;
pub mod json;
pub mod names;
pub mod schema;
pub mod spec;
pub mod validate;

pub use diag::{Code, Diagnostic, Severity};
pub use names::{check_tool_name, NameError, ToolName};
pub use spec::{
    NetworkMode, ParamSpec, ParamType, SandboxOverrides, StaticVariable, ToolSpec, Tri,
};
pub use validate::{validate_document, Validated};
