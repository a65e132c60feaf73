//! Collects a formatter's output as ECMA-402 parts (`formatToParts`): ICU4X annotates its output
//! with `writeable` parts; the outermost part names the piece, unannotated text is a literal.

use std::fmt;
use writeable::{Part, PartsWrite, Writeable};

/// One piece of formatted output: its ECMA-402 type and text.
pub(crate) type Piece = (String, String);

#[derive(Default)]
pub(crate) struct Collector {
    pieces: Vec<Piece>,
    /// For a range: which end each piece comes from (startRange, endRange or shared).
    sources: Vec<&'static str>,
    source: Option<&'static str>,
    /// The parts open now, outermost first: (category, ECMA-402 name).
    stack: Vec<(&'static str, &'static str)>,
    /// Whether the next text starts a new piece even when the type repeats.
    fresh: bool,
}

impl Collector {
    /// The ECMA-402 type of text written now: the outermost part's, except that a second with
    /// a fraction splits into second, a literal separator and fractionalSecond, as in ECMA-402.
    ///
    /// A date field's digits are the field (its number parts nested inside do not split it);
    /// elsewhere (numbers, currencies, lists) the innermost part names the text: a group
    /// separator inside an integer is a group.
    fn kind(&self) -> &'static str {
        match self.stack.as_slice() {
            [] => "literal",
            [(_, "second"), (_, "decimal"), ..] => "literal",
            [(_, "second"), (_, "fraction"), ..] => "fractionalSecond",
            [("datetime", outer), ..] => outer,
            [.., (_, inner)] => inner,
        }
    }
}

impl fmt::Write for Collector {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if s.is_empty() {
            return Ok(());
        }
        let kind = self.kind();
        match self.pieces.last_mut() {
            Some((k, v)) if k == kind && !self.fresh => v.push_str(s),
            _ => {
                self.pieces.push((kind.to_string(), s.to_string()));
                self.sources.push(self.source.unwrap_or("shared"));
            }
        }
        self.fresh = false;
        Ok(())
    }
}

impl PartsWrite for Collector {
    type SubPartsWrite = Self;
    fn with_part(
        &mut self,
        part: Part,
        mut f: impl FnMut(&mut Self) -> fmt::Result,
    ) -> fmt::Result {
        if part.value == "startRange" || part.value == "endRange" {
            let outer = self.source.replace(part.value);
            self.fresh = true;
            let r = f(self);
            self.source = outer;
            self.fresh = true;
            return r;
        }
        let before = self.kind();
        self.stack.push((part.category, part_name(part)));
        if self.kind() != before || self.stack.len() == 1 {
            self.fresh = true;
        }
        let r = f(self);
        self.stack.pop();
        if self.kind() != before || self.stack.is_empty() {
            self.fresh = true;
        }
        r
    }
}

/// ICU4X's part names, mapped to the ones ECMA-402 uses where they differ.
fn part_name(part: Part) -> &'static str {
    match part.value {
        "timeZoneName" | "zone" => "timeZoneName",
        "relatedYear" => "relatedYear",
        "fractionalSecond" | "fractional_second" => "fractionalSecond",
        "percentSign" | "percent" => "percentSign",
        "element" => "element",
        v => v,
    }
}

/// The pieces of anything ICU4X formats.
pub(crate) fn collect(w: &impl Writeable) -> Vec<Piece> {
    let mut c = Collector::default();
    // Writing into a Vec of Strings cannot fail.
    let _ = w.write_to_parts(&mut c);
    c.pieces
}

/// The pieces of a formatted range, each with the end it comes from.
pub(crate) fn collect_range(w: &impl Writeable) -> Vec<(String, String, String)> {
    let mut c = Collector::default();
    let _ = w.write_to_parts(&mut c);
    c.pieces
        .into_iter()
        .zip(c.sources)
        .map(|((k, v), s)| (k, v, s.to_string()))
        .collect()
}
