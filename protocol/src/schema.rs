//! The JSON Schema 2020-12 document for the Safe Tool Spec (spec §16), written by us from the
//! spec text and shipped with the binary (`stsd schema`).

/// The schema text, byte for byte as shipped in `protocol/schema/`.
pub const SAFE_TOOL_SPEC_SCHEMA: &str = include_str!("../schema/safe-tool-spec.schema.json");

#[cfg(test)]
mod tests {
    #[test]
    fn schema_is_json_with_the_2020_12_dialect() {
        let v: serde_json::Value =
            serde_json::from_str(super::SAFE_TOOL_SPEC_SCHEMA).unwrap_or_default();
        assert_eq!(
            v["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "schema must declare the 2020-12 dialect"
        );
    }
}
