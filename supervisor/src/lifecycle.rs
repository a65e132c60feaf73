//! Lifecycle states (spec §11.1) and the env-var requirement check (§11.2).

use serde::Serialize;
use std::fmt;
use stsd_protocol::envvar::{missing_requirements, EnvSource};
use stsd_protocol::ToolSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    Draft,
    MissingRequirements,
    Active,
    /// Reserved by the spec; the reference never returns it and neither does stsd.
    TestFailed,
}

impl State {
    pub const ALL: [State; 4] = [
        State::Draft,
        State::MissingRequirements,
        State::Active,
        State::TestFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Draft => "DRAFT",
            State::MissingRequirements => "MISSING_REQUIREMENTS",
            State::Active => "ACTIVE",
            State::TestFailed => "TEST_FAILED",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of a spec under `env`, with the missing variable names (sorted) when there are any.
pub fn state_of(spec: &ToolSpec, env: &dyn EnvSource) -> (State, Vec<String>) {
    let missing = missing_requirements(
        spec.static_variables.iter().map(|sv| sv.value.as_str()),
        env,
    );
    let state = if spec.draft {
        State::Draft
    } else if !missing.is_empty() {
        State::MissingRequirements
    } else {
        State::Active
    };
    (state, missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use stsd_protocol::validate_document;

    fn spec(draft: bool) -> ToolSpec {
        let doc = json!({"name": "s", "code": "x", "codeType": "Javascript", "draft": draft,
            "staticVariables": [{"id": "${CLIENT_ID}"}, {"secret": "${CLIENT_SECRET}"}, {"lit": "${lower}"}]});
        validate_document(&doc)
            .spec
            .unwrap_or_else(|| unreachable!())
    }

    #[test]
    fn draft_wins_over_everything() {
        let none = |_: &str| None;
        assert_eq!(state_of(&spec(true), &none).0, State::Draft);
    }

    #[test]
    fn missing_env_gives_missing_requirements_until_set() {
        let only_id = |n: &str| (n == "CLIENT_ID").then(|| "abc".to_string());
        let (state, missing) = state_of(&spec(false), &only_id);
        assert_eq!(state, State::MissingRequirements);
        assert_eq!(missing, ["CLIENT_SECRET"]);
        let blank = |n: &str| Some(if n == "CLIENT_ID" { "abc" } else { "   " }.to_string());
        assert_eq!(state_of(&spec(false), &blank).0, State::MissingRequirements);
        let both = |_: &str| Some("value".to_string());
        assert_eq!(state_of(&spec(false), &both), (State::Active, vec![]));
    }
}
