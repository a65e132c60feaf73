//! `stsd store export|import`: the config's state store (`stsd::state`) out to one JSON
//! document, or such a document into a store that holds nothing yet. And `stsd token rm|list`,
//! the bearer tokens kept in it.

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

/// Removes every token of principal `name`.
pub fn token_rm(config: &Config, name: &str) -> Result<(), String> {
    let store = stsd::state::Store::of_config(config)?;
    match store.tokens_rm(name)? {
        0 => Err(format!(
            "no token of {name:?} in the state store {}",
            store.path().display()
        )),
        n => {
            eprintln!(
                "stsd: removed {n} token(s) of {name} from {}",
                store.path().display()
            );
            Ok(())
        }
    }
}

/// The principals with tokens in the store (never a digest).
pub fn token_list(config: &Config, json: bool) -> Result<(), String> {
    let store = stsd::state::Store::of_config(config)?;
    let mut count: std::collections::BTreeMap<String, usize> = Default::default();
    for (name, _) in store.tokens()? {
        *count.entry(name).or_default() += 1;
    }
    if json {
        println!("{}", serde_json::json!({"principals": count}));
    } else {
        for (name, n) in &count {
            println!("{name}\t{n}");
        }
    }
    Ok(())
}
