//! The one grammar for tool names, wherever a name enters stsd: spec files, the admin
//! channel, toolsets documents, aliases, upstream tools.
//!
//! MCP's tool-name rule: 1 to 128 characters of `A-Z a-z 0-9 _ . -`. stsd adds one rule of
//! its own: no leading dot, so that no name is `.`, `..` or a hidden file. With that, a valid
//! name is also a safe single path component (no separator, no NUL, no Unicode look-alike of
//! a dot or a slash, nothing a shell or a file system treats specially), which is why the
//! managed catalog can build a file name from it. Directory handles that cannot be left
//! (`supervisor/src/beneath.rs`) are the second layer, for when this check is wrong.
//!
//! The spec (§4.2) asks consumers not to refuse a name *solely on slug grounds*; a name that
//! is not a slug but fits this grammar is accepted with a warning. A name outside it cannot
//! be served over MCP at all.

use std::fmt;

/// The longest tool name (MCP's rule).
pub const MAX_TOOL_NAME: usize = 128;

/// A tool name that follows the grammar. The only way to make one is [`ToolName::parse`],
/// so a function that takes a `&ToolName` cannot be handed an unchecked string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolName(String);

/// Why a name is refused, in words a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    pub name: String,
    pub reason: String,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tool name {:?} is not allowed: {}; a tool name is 1-{MAX_TOOL_NAME} of the \
             characters A-Z a-z 0-9 _ . - and does not start with a dot (MCP's tool-name rule)",
            self.name, self.reason
        )
    }
}

impl std::error::Error for NameError {}

/// Checks `name` against the grammar.
pub fn check_tool_name(name: &str) -> Result<(), NameError> {
    let refuse = |reason: String| {
        Err(NameError {
            // Bounded and escaped: the name is the caller's, and goes into logs and replies.
            name: name.chars().take(MAX_TOOL_NAME + 8).collect(),
            reason,
        })
    };
    if name.is_empty() {
        return refuse("it is empty".into());
    }
    let len = name.chars().count();
    if len > MAX_TOOL_NAME {
        return refuse(format!("it is {len} characters long"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !matches!(c, 'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '.' | '-'))
    {
        return refuse(format!("it holds {c:?} (U+{:04X})", c as u32));
    }
    if name.starts_with('.') {
        return refuse("it starts with a dot".into());
    }
    Ok(())
}

impl ToolName {
    pub fn parse(name: &str) -> Result<ToolName, NameError> {
        check_tool_name(name).map(|()| ToolName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ToolName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_of_the_grammar_are_accepted() {
        for n in [
            "base64",
            "echo-console",
            "kr.weather_v2",
            "A",
            "a..b",
            "x-",
            "_",
        ] {
            assert!(check_tool_name(n).is_ok(), "{n}");
        }
        assert!(check_tool_name(&"a".repeat(MAX_TOOL_NAME)).is_ok());
    }

    #[test]
    fn names_that_could_leave_a_directory_or_fool_a_reader_are_refused() {
        let long = "a".repeat(MAX_TOOL_NAME + 1);
        for n in [
            "",
            ".",
            "..",
            ".hidden",
            "../x",
            "../../../../tmp/x/PWNED",
            "a/b",
            "/abs",
            "a\\b",
            "a\0b",
            "a b",
            "a\nb",
            "a\u{2024}b",       // ONE DOT LEADER
            "\u{2024}\u{2024}", // looks like ..
            "a\u{2215}b",       // DIVISION SLASH
            "a\u{FF0F}b",       // FULLWIDTH SOLIDUS
            "a\u{FF0E}b",       // FULLWIDTH FULL STOP
            "a\u{00AD}b",       // SOFT HYPHEN
            "caf\u{e9}",
            long.as_str(),
        ] {
            let e = check_tool_name(n).err();
            assert!(e.is_some(), "{n:?} was accepted");
            let text = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(text.contains("MCP's tool-name rule"), "{text}");
        }
    }

    proptest! {
        /// Whatever the string, an accepted name is one path component that stays in its
        /// directory: no separator, no NUL, not `.` or `..`, nothing outside ASCII.
        #[test]
        fn an_accepted_name_is_one_plain_path_component(s in "\\PC{0,140}") {
            if check_tool_name(&s).is_ok() {
                prop_assert!(!s.is_empty() && s.len() <= MAX_TOOL_NAME);
                prop_assert!(s.is_ascii());
                prop_assert!(!s.contains('/') && !s.contains('\\') && !s.contains('\0'));
                prop_assert!(!s.starts_with('.'));
                let p = std::path::Path::new(&s);
                prop_assert_eq!(p.components().count(), 1);
                prop_assert!(matches!(
                    p.components().next(),
                    Some(std::path::Component::Normal(_))
                ));
            }
        }

        /// Names drawn from the grammar's own alphabet are accepted unless they start with a dot.
        #[test]
        fn the_grammar_alphabet_is_accepted(s in "[A-Za-z0-9_.-]{1,128}") {
            prop_assert_eq!(check_tool_name(&s).is_ok(), !s.starts_with('.'));
        }
    }
}
