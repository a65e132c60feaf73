//! The daemon's logs: `tracing` to stderr, one event per line.
//!
//! - `STSD_LOG` is the filter (`info`, `debug`, `stsd=debug,rmcp=warn`...); the default is
//!   given by the command (the daemon logs INFO, one-shot commands only warnings).
//! - `STSD_LOG_FORMAT=json` writes one JSON object per line (for journald, Loki, jq); anything
//!   else the plain text form.
//! - Colour only when stderr is a terminal and `NO_COLOR` is unset or empty (no-color.org), so
//!   a log file or the journal never holds ANSI codes.
//! - Banners (what the daemon serves, at start and on every reload) are events of the target
//!   [`BANNER`], always on, so they go to the same stream and in the same format as the rest.
//! - Third-party libraries that would log URLs or headers are silenced (see [`QUIET`]).

use std::io::IsTerminal;

/// The target of the startup and reload banners; enabled whatever `STSD_LOG` says.
pub const BANNER: &str = "stsd::banner";

/// The HTTP client logs the URLs and headers it sends, which carry a tool's resolved
/// secrets; stsd's own lines are masked, a library's are not, so it is kept silent whatever
/// STSD_LOG asks (the audit record names every hop, masked).
const QUIET: &[&str] = &["ureq=off", "rustls=warn"];

/// Whether to write ANSI colour codes: a terminal, and no `NO_COLOR`.
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the subscriber. `default` is the filter when `STSD_LOG` is unset or unparsable.
pub fn init(default: &str) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("STSD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let always = format!("{BANNER}=info");
    for directive in QUIET.iter().copied().chain([always.as_str()]) {
        if let Ok(d) = directive.parse() {
            filter = filter.add_directive(d);
        }
    }
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let json = std::env::var("STSD_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    // The trace spans are never log lines.
    if let Ok(d) = format!("{}=off", crate::telemetry::TARGET).parse() {
        filter = filter.add_directive(d);
    }
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let fmt = if json {
        fmt.json()
            .with_current_span(false)
            .with_span_list(false)
            .with_filter(filter)
            .boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    // The trace layer first, on the registry itself (it is empty until `telemetry::start`).
    let _ = tracing_subscriber::registry()
        .with(crate::telemetry::layer())
        .with(fmt)
        .try_init();
}

/// Logs a banner, one event per line (a multi-line message would break one-line readers).
pub fn banner(text: &str) {
    for line in text.lines().filter(|l| !l.is_empty()) {
        tracing::info!(target: BANNER, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
    }
}
