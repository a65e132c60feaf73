//! Bounded JSON reading. Spec files come from users; whatever they hold (truncated text, huge
//! files, deep nesting, invalid UTF-8) must end in a SPEC_PARSE diagnostic, never a panic or an
//! unbounded allocation.

use crate::diag::{Code, Diagnostic};
use serde_json::Value;

/// Largest spec file stsd reads. The whole reference catalog's largest file is 110 KB.
pub const MAX_SPEC_FILE_BYTES: usize = 16 * 1024 * 1024;
/// Deepest array/object nesting accepted. A spec needs about 6 levels; serde_json's own
/// recursion guard (128) would also stop a hostile document, but we refuse earlier with a
/// message that says why.
pub const MAX_NESTING: usize = 64;

/// Parses one JSON document with the limits above.
pub fn parse_bounded(bytes: &[u8]) -> Result<Value, Diagnostic> {
    if bytes.len() > MAX_SPEC_FILE_BYTES {
        return Err(Diagnostic::error(
            Code::SpecParse,
            "",
            format!(
                "document is {} bytes, over the {} byte limit for a spec file",
                bytes.len(),
                MAX_SPEC_FILE_BYTES
            ),
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        Diagnostic::error(
            Code::SpecParse,
            "",
            format!(
                "document is not valid UTF-8: invalid byte sequence at byte offset {}",
                e.valid_up_to()
            ),
        )
    })?;
    // A leading BOM is legal in files written by some editors; JSON itself does not allow it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    check_nesting(text)?;
    serde_json::from_str(text).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Eof => "document ends early (truncated JSON)",
            serde_json::error::Category::Syntax => "JSON syntax error",
            serde_json::error::Category::Data => "JSON data error",
            serde_json::error::Category::Io => "read error",
        };
        Diagnostic::error(
            Code::SpecParse,
            "",
            format!("{what} at line {} column {}: {e}", e.line(), e.column()),
        )
    })
}

/// Scans bracket depth outside strings, so nesting is refused before serde recurses.
fn check_nesting(text: &str) -> Result<(), Diagnostic> {
    match nesting_over(text.as_bytes(), MAX_NESTING) {
        None => Ok(()),
        Some(line) => Err(Diagnostic::error(
            Code::SpecParse,
            "",
            format!("document nests arrays/objects deeper than {MAX_NESTING} levels (line {line})"),
        )),
    }
}

/// The line (1-based) where arrays and objects, counted outside strings, first nest deeper
/// than `limit`; None when they never do. Any JSON reader that takes text from someone else
/// runs this before parsing.
pub fn nesting_over(bytes: &[u8], limit: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped, mut line) = (0usize, false, false, 1usize);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' => line += 1,
            _ => {}
        }
    }
    None
}

/// Human-readable JSON type name for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(bytes: &[u8]) -> Diagnostic {
        match parse_bounded(bytes) {
            Ok(v) => panic!("expected an error, parsed {v}"),
            Err(d) => d,
        }
    }

    #[test]
    fn truncated_json_is_spec_parse() {
        let d = parse_err(br#"{"name": "a", "code": "ret"#);
        assert_eq!(d.code, Code::SpecParse);
        assert!(d.message.contains("truncated"), "{}", d.message);
    }

    #[test]
    fn invalid_utf8_reports_offset() {
        let d = parse_err(b"{\"name\": \"\xff\xfe\"}");
        assert_eq!(d.code, Code::SpecParse);
        assert!(d.message.contains("byte offset 10"), "{}", d.message);
    }

    #[test]
    fn deep_nesting_is_refused_before_recursion() {
        let mut s = "[".repeat(100_000);
        s.push_str(&"]".repeat(100_000));
        let d = parse_err(s.as_bytes());
        assert!(d.message.contains("deeper than"), "{}", d.message);
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let s = format!("{{\"code\": \"{}\"}}", "[".repeat(1000));
        assert!(parse_bounded(s.as_bytes()).is_ok());
    }

    #[test]
    fn oversized_document_is_refused() {
        let big = vec![b' '; MAX_SPEC_FILE_BYTES + 1];
        let d = parse_err(&big);
        assert!(d.message.contains("over the"), "{}", d.message);
    }

    #[test]
    fn bom_is_tolerated() {
        let v = parse_bounded("\u{feff}{\"a\":1}".as_bytes());
        assert!(v.is_ok());
    }
}

/// Parses JSON as `JSON.stringify` writes it. JavaScript strings may hold lone surrogates,
/// which `JSON.stringify` writes as `\ud83d` and serde_json refuses; here such an escape is
/// kept as its six characters of text (the string holds a backslash, `u` and four hex
/// digits), so a result with half an emoji stays a result instead of becoming an error.
pub fn parse_js_json(text: &str) -> serde_json::Result<Value> {
    match serde_json::from_str(text) {
        Err(e) if text.contains("\\u") => {
            serde_json::from_str(&escape_lone_surrogates(text)).map_err(|_| e)
        }
        other => other,
    }
}

/// Rewrites each `\uXXXX` escape of a lone surrogate as `\\uXXXX` (an escaped backslash).
fn escape_lone_surrogates(text: &str) -> String {
    let hex = |s: &str| -> Option<u32> {
        let h = s.get(..4)?;
        if h.bytes().all(|b| b.is_ascii_hexdigit()) {
            u32::from_str_radix(h, 16).ok()
        } else {
            None
        }
    };
    let is_high = |u: u32| (0xD800..0xDC00).contains(&u);
    let is_low = |u: u32| (0xDC00..0xE000).contains(&u);
    let mut out = String::with_capacity(text.len() + 8);
    let mut rest = text;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let esc = &rest[i..];
        let unit = esc.strip_prefix("\\u").and_then(hex);
        match unit {
            Some(u) if is_high(u) => {
                let pair = esc[6..].strip_prefix("\\u").and_then(hex);
                if pair.is_some_and(is_low) {
                    out.push_str(&esc[..12]);
                    rest = &esc[12..];
                } else {
                    out.push('\\');
                    out.push_str(&esc[..6]);
                    rest = &esc[6..];
                }
            }
            Some(u) if is_low(u) => {
                out.push('\\');
                out.push_str(&esc[..6]);
                rest = &esc[6..];
            }
            // Any other escape (`\\`, `\"`, `\n`, a BMP `\u`) is copied whole, so an escaped
            // backslash is never read as the start of another escape.
            _ => {
                let n = esc.chars().nth(1).map_or(1, |c| 1 + c.len_utf8());
                out.push_str(&esc[..n]);
                rest = &esc[n..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod js_json_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lone_surrogates_are_kept_as_text() {
        let v = parse_js_json(r#"["\ud83d","\ude00","a","\ud83d\ude00","\\ud83d"]"#).ok();
        assert_eq!(v, Some(json!(["\\ud83d", "\\ude00", "a", "😀", "\\ud83d"])));
        assert_eq!(parse_js_json(r#""x\udfff""#).ok(), Some(json!("x\\udfff")));
        assert_eq!(
            parse_js_json(r#"{"\ud800":1}"#).ok(),
            Some(json!({"\\ud800": 1}))
        );
        assert!(parse_js_json(r#"["\ud83d"#).is_err());
        assert!(parse_js_json("nope").is_err());
    }
}

/// JSON text written once and shared: a clone is a reference count, and it is serialised as
/// it is, without a parse (a served tool's toolSafety, which every call's audit record
/// carries, was a `Value` tree per tool and a deep copy per call).
pub type SharedJson = std::sync::Arc<serde_json::value::RawValue>;

/// `v` as [`SharedJson`]; `null` if it cannot be written (a map with non-string keys).
pub fn shared_json<T: serde::Serialize + ?Sized>(v: &T) -> SharedJson {
    let raw = serde_json::value::to_raw_value(v)
        .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned());
    std::sync::Arc::from(raw)
}
