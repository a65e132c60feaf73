//! The catalog of stsd's own example tools, compiled into the binary so the daemon serves it
//! with no flags from anywhere.

use crate::store::SpecFile;
use std::path::Path;

pub const EXAMPLES: &str = include_str!("../catalog/examples.json");
pub const EXAMPLES_PATH: &str = "<bundled>/examples.json";

pub fn examples() -> Option<SpecFile> {
    SpecFile::parse(Path::new(EXAMPLES_PATH), EXAMPLES.as_bytes(), true)
        .ok()
        .flatten()
}
