//! `stsd check PATH...`: state, risk, resolved toolSafety and every finding for each spec, then a
//! summary. Human text by default, one JSON document with `--json`.

use crate::approval::{mitigated, requirement, ToolFacts};
use crate::lifecycle::{state_of, State};
use crate::store::Catalog;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};
use stsd_profiles::{resolve, Config, RiskLevel, ToolSafety};
use stsd_protocol::envvar::EnvSource;
use stsd_protocol::{Diagnostic, Severity};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecReport {
    pub file: String,
    pub index: Option<usize>,
    pub name: String,
    pub tool_id: String,
    pub valid: bool,
    /// `None` when the spec is invalid: an invalid spec has no lifecycle state.
    pub state: Option<State>,
    pub risk_level: Option<RiskLevel>,
    pub tool_safety: Option<ToolSafety>,
    pub fs_base_path: Option<String>,
    pub missing_env: Vec<String>,
    /// Whether a call needs approval, why, by which strategy, and the risk level shown with
    /// the HITL mitigation (seed 001: one band lower, floored at L1). Without toolsets: a
    /// running daemon's `tools/list` `_meta` includes them.
    pub approval: Option<ApprovalView>,
    pub diagnostics: Vec<Diagnostic>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalView {
    pub required: bool,
    pub source: &'static str,
    pub strategy: Option<&'static str>,
    pub risk_level_with_approval: Option<RiskLevel>,
    /// An operator rule tried to lift the spec's REQUIRED without allow_override_required.
    pub override_refused: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileReport {
    pub path: String,
    pub diagnostic: Diagnostic,
}

#[derive(Debug, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub files: usize,
    pub specs: usize,
    pub valid: usize,
    pub invalid: usize,
    pub unreadable_files: usize,
    pub warnings: usize,
    pub by_state: BTreeMap<State, usize>,
    pub by_risk: BTreeMap<RiskLevel, usize>,
    pub skipped: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub specs: Vec<SpecReport>,
    #[serde(rename = "fileProblems")]
    pub file_problems: Vec<FileReport>,
    pub summary: Summary,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.summary.invalid == 0 && self.summary.unreadable_files == 0
    }
}

pub fn build(cat: &Catalog, config: &Config, env: &dyn EnvSource) -> Report {
    let mut summary = Summary {
        files: cat.files.len(),
        skipped: cat
            .skipped
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        unreadable_files: cat.problems.len(),
        ..Summary::default()
    };
    let mut specs = Vec::with_capacity(cat.entries.len());
    for e in &cat.entries {
        let mut diagnostics = e.validated.diagnostics.clone();
        let mut report = SpecReport {
            file: cat.files[e.file].path.display().to_string(),
            index: e.index,
            name: e
                .validated
                .spec
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default(),
            tool_id: e.tool_id.clone(),
            valid: false,
            state: None,
            risk_level: None,
            tool_safety: None,
            fs_base_path: None,
            missing_env: Vec::new(),
            approval: None,
            diagnostics: Vec::new(),
        };
        if let Some(spec) = &e.validated.spec {
            match resolve(spec, config) {
                Ok(r) => {
                    let facts = ToolFacts {
                        name: &spec.name,
                        category: spec.category.as_deref(),
                        risk: r.risk,
                        destructive: r.tool_safety.capabilities.destructive,
                        spec_required: spec
                            .human_in_the_loop
                            .as_ref()
                            .is_some_and(|h| h.mode.eq_ignore_ascii_case("REQUIRED")),
                    };
                    let a = requirement(&facts, None, &config.approval);
                    report.approval = Some(ApprovalView {
                        required: a.required,
                        source: a.source.as_str(),
                        strategy: a.required.then(|| a.strategy.as_str()),
                        risk_level_with_approval: a.required.then(|| mitigated(r.risk)),
                        override_refused: a.refused_override,
                    });
                    let doc = crate::local_pass::document(cat, e);
                    diagnostics.extend(crate::lint::lint(spec, doc, &r, env));
                    if !spec.draft && !doc.is_some_and(crate::local_pass::verified) {
                        diagnostics.push(Diagnostic::warning(
                            stsd_protocol::Code::LocalPassFailed,
                            "/draft",
                            "draft:false without a recorded Local Pass of this content (edited \
                             since, or never passed): the daemon withholds it; run stsd test \
                             --write",
                        ));
                    }
                    report.risk_level = Some(r.risk);
                    report.tool_safety = Some(r.tool_safety);
                    report.fs_base_path = Some(r.fs_base_path.display().to_string());
                }
                Err(d) => diagnostics.push(d),
            }
            let (state, missing) = state_of(spec, env);
            report.missing_env = missing;
            report.valid = !diagnostics.iter().any(Diagnostic::is_error);
            if report.valid {
                report.state = Some(state);
            }
        }
        summary.specs += 1;
        summary.warnings += diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Warning)
            .count();
        if report.valid {
            summary.valid += 1;
            if let Some(s) = report.state {
                *summary.by_state.entry(s).or_default() += 1;
            }
            if let Some(r) = report.risk_level {
                *summary.by_risk.entry(r).or_default() += 1;
            }
        } else {
            summary.invalid += 1;
        }
        report.diagnostics = diagnostics;
        specs.push(report);
    }
    let file_problems = cat
        .problems
        .iter()
        .map(|p| FileReport {
            path: p.path.display().to_string(),
            diagnostic: p.diagnostic.clone(),
        })
        .collect();
    Report {
        specs,
        file_problems,
        summary,
    }
}

/// Compiles every valid spec's body in a sandboxed worker; a body that does not parse makes
/// its spec invalid, with the line and column in the body.
pub fn syntax_pass(
    report: &mut Report,
    cat: &Catalog,
    config: &Config,
    opts: &crate::exec::ExecOptions,
) {
    for (e, s) in cat.entries.iter().zip(report.specs.iter_mut()) {
        let Some(spec) = e.validated.spec.as_ref().filter(|_| s.valid) else {
            continue;
        };
        let Ok(resolved) = resolve(spec, config) else {
            continue;
        };
        if let Some(p) = crate::exec::job::syntax_check(spec, &resolved, config, opts) {
            s.diagnostics.push(Diagnostic::error(
                stsd_protocol::Code::SpecInvariant,
                "/code",
                format!(
                    "the code does not parse: {} (line {}, column {})",
                    p.message, p.line, p.column
                ),
            ));
            s.valid = false;
            if let Some(st) = s.state.take() {
                if let Some(n) = report.summary.by_state.get_mut(&st) {
                    *n = n.saturating_sub(1);
                }
            }
            if let Some(r) = s.risk_level {
                if let Some(n) = report.summary.by_risk.get_mut(&r) {
                    *n = n.saturating_sub(1);
                }
            }
            report.summary.valid = report.summary.valid.saturating_sub(1);
            report.summary.invalid += 1;
        }
    }
}

pub fn print_json(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    writeln!(out)
}

pub fn print_text(report: &Report, show_warnings: bool, out: &mut dyn Write) -> io::Result<()> {
    for f in &report.file_problems {
        writeln!(out, "{}: unreadable", f.path)?;
        writeln!(out, "    {}", f.diagnostic)?;
    }
    for s in &report.specs {
        let at = match s.index {
            Some(i) => format!("{}#{i}", s.file),
            None => s.file.clone(),
        };
        let state = s.state.map(|s| s.as_str()).unwrap_or("INVALID");
        let risk = s.risk_level.map(|r| r.as_str()).unwrap_or("-");
        let name = if s.name.is_empty() {
            "(no name)"
        } else {
            &s.name
        };
        writeln!(out, "{name:<28} {state:<20} {risk:<3} {at}")?;
        if let Some(a) = s.approval.as_ref().filter(|a| a.required) {
            writeln!(
                out,
                "    approval required ({}, strategy {}); risk with approval {}",
                a.source,
                a.strategy.unwrap_or("-"),
                a.risk_level_with_approval
                    .map(|r| r.as_str())
                    .unwrap_or("-")
            )?;
        }
        if let Some(ts) = &s.tool_safety {
            writeln!(
                out,
                "    toolSafety {}",
                serde_json::to_string(ts).unwrap_or_default()
            )?;
        }
        if !s.missing_env.is_empty() {
            writeln!(out, "    missing env: {}", s.missing_env.join(", "))?;
        }
        for d in &s.diagnostics {
            if d.is_error() || show_warnings {
                writeln!(out, "    {d}")?;
            }
        }
    }
    let sum = &report.summary;
    writeln!(out)?;
    writeln!(
        out,
        "{} specs in {} files: {} valid, {} invalid, {} unreadable files, {} warnings",
        sum.specs, sum.files, sum.valid, sum.invalid, sum.unreadable_files, sum.warnings
    )?;
    let states: Vec<String> = State::ALL
        .iter()
        .map(|s| format!("{} {}", s, sum.by_state.get(s).copied().unwrap_or(0)))
        .collect();
    writeln!(out, "state: {}", states.join(", "))?;
    let risks: Vec<String> = RiskLevel::ALL
        .iter()
        .map(|r| format!("{} {}", r, sum.by_risk.get(r).copied().unwrap_or(0)))
        .collect();
    writeln!(out, "risk: {}", risks.join(", "))?;
    for p in &sum.skipped {
        writeln!(out, "skipped (no spec in it): {p}")?;
    }
    Ok(())
}
