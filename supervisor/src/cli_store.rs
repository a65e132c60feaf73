//! `stsd store export|import`: the config's state store (`stsd::state`) out to one JSON
//! document, or such a document into a store that holds nothing yet.

use std::path::Path;
use stsd_profiles::Config;

/// Writes the store as one document, to `out` (atomically) or standard output.
pub fn export(config: &Config, out: Option<&Path>) -> Result<(), String> {
    let store = stsd::state::Store::of_config(config)?;
    let doc = stsd::state::export::export(&store)?;
    let mut text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    text.push('\n');
    match out {
        Some(p) => stsd::store::write_atomic(p, text.as_bytes())
            .map_err(|e| format!("{}: {e}", p.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Reads a document `export` wrote into the config's store.
pub fn import(config: &Config, file: &Path) -> Result<(), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
    let store = stsd::state::Store::of_config(config)?;
    let got = stsd::state::export::import(&store, &doc)?;
    eprintln!("stsd: imported into {}: {got}", store.path().display());
    Ok(())
}
