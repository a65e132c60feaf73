//! A file operation the kernel refused (EACCES), as the worker reports it and the supervisor
//! reads it back. Inside its sandbox the worker cannot tell Landlock's refusal from the file
//! system's own permissions (both are EACCES, and it may not stat paths); the supervisor,
//! outside, can, and says which layer refused (`stsd::workspace::explain_denial`). This is the
//! one format both sides share.

/// What the refused operation needed of the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Read the file (or list the directory) at the path.
    Read,
    /// Write the file at the path (or create it in its directory).
    Write,
    /// Add, remove or rename an entry of the path's directory.
    Entry,
}

impl Need {
    const ALL: [Need; 3] = [Need::Read, Need::Write, Need::Entry];

    fn words(self) -> &'static str {
        match self {
            Need::Read => "to read",
            Need::Write => "to write",
            Need::Entry => "to add or remove it",
        }
    }
}

const HEAD: &str = "access denied by the sandbox: ";

/// The worker's message: `access denied by the sandbox: PATH (to read)`.
pub fn message(path: &str, need: Need) -> String {
    format!("{HEAD}{path} ({})", need.words())
}

/// The path and the need of a [`message`]; None for any other text.
pub fn parse(msg: &str) -> Option<(&str, Need)> {
    let rest = msg.strip_prefix(HEAD)?.strip_suffix(')')?;
    Need::ALL.into_iter().find_map(|need| {
        rest.strip_suffix(need.words())
            .and_then(|r| r.strip_suffix(" ("))
            .map(|p| (p, need))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reads_back_and_nothing_else_does() {
        for need in Need::ALL {
            for p in ["a.txt", "dir/b (1).txt", "/abs/x"] {
                let m = message(p, need);
                assert_eq!(parse(&m), Some((p, need)), "{m}");
            }
        }
        assert_eq!(parse("access denied by the sandbox: x"), None);
        assert_eq!(parse("something else (to read)"), None);
    }
}
