//! The man pages: one per command at every depth (`man stsd-tools-add`), rendered by
//! clap_mangen from the command line's own definition, with the EXAMPLES and SEE ALSO sections
//! clap has no place for. Every page a SEE ALSO or SUBCOMMANDS section names is one written
//! here (tests/man_pages.rs checks it).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Worked examples per page, as a shell session shows them.
fn examples(page: &str) -> &'static [&'static str] {
    match page {
        "stsd" => &[
            "stsd                                 # the daemon: bundled catalog, default socket",
            "stsd --pool 8 --catalog /srv/specs   # your own specs, eight warm workers",
            "stsd --listen 127.0.0.1:8443         # MCP over HTTP too ([http] in the config)",
        ],
        "stsd-call" => &[
            "stsd call slugify --arg 'title=Hello World'",
            "stsd call deleteFile --arg path=old.log --approve",
            "stsd call report --args-json @args.json --json",
        ],
        "stsd-run" => &[
            "stsd run greet.json --arg text=Ada",
            "stsd run catalog.json --tool slugify --arg 'title=Hello World' --timings",
        ],
        "stsd-check" => &["stsd check specs/", "stsd check greet.json --json"],
        "stsd-test" => &["stsd test greet.json", "stsd test --write specs/"],
        "stsd-new" => &[
            "stsd new greet",
            "stsd new weather --network api.open-meteo.com",
            "stsd new notes --fs write",
        ],
        "stsd-tools-add" => &["stsd tools add greet.json"],
        "stsd-tools-list" => &["stsd tools list", "stsd tools list --json"],
        "stsd-tools-show" => &["stsd tools show greet"],
        "stsd-catalog-add" => &[
            "stsd catalog add ./catalog --preset dev-essentials",
            "stsd catalog add specs/ --approve-required --json",
        ],
        "stsd-catalog-presets" => &["stsd catalog presets specs/"],
        "stsd-secret-set" => &[
            "stsd secret set WEATHER_API_KEY              # typed, not echoed",
            "printf %s \"$KEY\" | stsd secret set WEATHER_API_KEY",
        ],
        "stsd-secret-list" => &["stsd secret list"],
        "stsd-upstream-check" => &["stsd upstream check", "stsd upstream check fs --json"],
        "stsd-upstream-login" => &["stsd upstream login github --port 8976"],
        "stsd-export" => &[
            "stsd export > toolsets.json          # what the running daemon serves",
            "stsd export specs/ --format openai",
        ],
        "stsd-approve" => &["stsd approvals", "stsd approve 42"],
        "stsd-deny" => &["stsd deny 42 --reason 'not during the freeze'"],
        "stsd-client-setup" => &[
            "stsd client setup claude-desktop",
            "stsd client setup cursor --print",
        ],
        "stsd-token-add" => &["stsd token add ci-bot"],
        "stsd-status" => &["stsd status", "stsd status --json"],
        "stsd-metrics" => &["stsd metrics", "stsd metrics --json"],
        _ => &[],
    }
}

/// Pages about the same thing, besides the parent and the children.
fn related(page: &str) -> &'static [&'static str] {
    match page {
        "stsd-call" => &["stsd-approve", "stsd-run"],
        "stsd-run" => &["stsd-test", "stsd-call"],
        "stsd-new" => &["stsd-check", "stsd-test", "stsd-tools-add"],
        "stsd-test" => &["stsd-run", "stsd-tools-add"],
        "stsd-approve" | "stsd-deny" => &["stsd-approvals"],
        "stsd-approvals" => &["stsd-approve", "stsd-deny"],
        "stsd-catalog-add" => &["stsd-secret-set", "stsd-tools-add"],
        "stsd-secret-set" => &["stsd-catalog-add"],
        _ => &[],
    }
}

/// roff for one literal line: backslashes escaped, a leading `.` or `'` kept literal.
fn roff_line(line: &str) -> String {
    let escaped = line.replace('\\', "\\e");
    match escaped.chars().next() {
        Some('.') | Some('\'') => format!("\\&{escaped}"),
        _ => escaped,
    }
}

/// Writes the page of `c` as `name`, then the pages of its subcommands.
pub fn pages(
    c: &clap::Command,
    name: String,
    parent: Option<&str>,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(c.clone().name(name.clone()));
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    if c.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut buf)?;
    }
    let subs: Vec<&clap::Command> = c.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    if !subs.is_empty() {
        man.render_subcommands_section(&mut buf)?;
    }
    let ex = examples(&name);
    if !ex.is_empty() {
        writeln!(buf, ".SH EXAMPLES\n.nf")?;
        for line in ex {
            writeln!(buf, "{}", roff_line(line))?;
        }
        writeln!(buf, ".fi")?;
    }
    let mut see: Vec<&str> = Vec::new();
    if let Some(p) = parent {
        see.push(p);
    }
    if parent != Some("stsd") && name != "stsd" {
        see.push("stsd");
    }
    see.extend(related(&name));
    if !see.is_empty() {
        let refs: Vec<String> = see.iter().map(|p| format!("\\fB{p}\\fR(1)")).collect();
        writeln!(buf, ".SH \"SEE ALSO\"\n{}", refs.join(", "))?;
    }
    if c.get_version().is_some() || c.get_long_version().is_some() {
        man.render_version_section(&mut buf)?;
    }
    let p = dir.join(format!("{name}.1"));
    std::fs::write(&p, buf)?;
    written.push(p);
    for sub in subs {
        pages(
            sub,
            format!("{name}-{}", sub.get_name()),
            Some(&name),
            dir,
            written,
        )?;
    }
    Ok(())
}
