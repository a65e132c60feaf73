//! The elicit strategy's side for the commands run at a terminal (`stsd run`, `stsd test`):
//! the answer given ahead (`--approve`, `--deny`), else the terminal asked, else a refusal
//! that says how to answer.

use super::{Elicited, Elicitor};
use std::future::Future;
use std::pin::Pin;

pub struct Terminal {
    /// `--approve` (true) or `--deny` (false).
    pub answer: Option<bool>,
    /// The command, for the refusal's advice ("stsd run", "stsd test").
    pub command: &'static str,
}

impl Elicitor for Terminal {
    fn who(&self) -> String {
        match self.answer {
            Some(_) => "the command line (--approve/--deny)".into(),
            None => "the terminal".into(),
        }
    }

    fn ask(&self, message: String) -> Pin<Box<dyn Future<Output = Elicited> + Send + '_>> {
        let answer = self.answer;
        let command = self.command;
        Box::pin(async move {
            match answer {
                Some(true) => return Elicited::Accepted,
                Some(false) => return Elicited::Declined("denied on the command line".into()),
                None => {}
            }
            // SAFETY: isatty has no preconditions.
            if unsafe { libc::isatty(0) } != 1 {
                return Elicited::Unsupported(format!(
                    "this tool needs approval: run {command} at a terminal, or pass --approve or --deny"
                ));
            }
            eprint!("{message} [y/N] ");
            let mut line = String::new();
            match std::io::stdin().read_line(&mut line) {
                Ok(_) if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes") => {
                    Elicited::Accepted
                }
                Ok(_) => Elicited::Declined("declined at the terminal".into()),
                Err(e) => Elicited::Failed(e.to_string()),
            }
        })
    }
}

/// An answer an approver gave ahead on the admin channel (`stsd catalog add` asked them, or
/// `--approve-required`), named in the audit record as who gave it.
pub struct AnsweredAhead {
    pub who: String,
}

impl Elicitor for AnsweredAhead {
    fn who(&self) -> String {
        format!("{} (answered ahead on the admin channel)", self.who)
    }

    fn ask(&self, _message: String) -> Pin<Box<dyn Future<Output = Elicited> + Send + '_>> {
        Box::pin(async { Elicited::Accepted })
    }
}
