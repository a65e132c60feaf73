//! toolId derivation (spec §4.1): UUID v5 of the name under a fixed namespace of stsd's own.

use uuid::Uuid;

/// stsd's namespace for tool ids. Fixed forever: changing it changes every derived toolId.
pub const TOOL_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6d1c_2b7e_4f0a_4c55_9e1d_57d5_0000_0001);

pub fn derive_tool_id(name: &str) -> String {
    Uuid::new_v5(&TOOL_ID_NAMESPACE, name.as_bytes()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_v5_uuids() {
        let a = derive_tool_id("base64");
        assert_eq!(a, derive_tool_id("base64"));
        assert_ne!(a, derive_tool_id("hex"));
        let u = Uuid::parse_str(&a).unwrap_or_default();
        assert_eq!(u.get_version_num(), 5);
    }
}
