//! Malformed input never panics and always ends in SPEC_PARSE: truncated JSON at every length, a
//! 50 MB file, pathological nesting, invalid UTF-8.

use std::io::Write;
use stsd::store::{Catalog, SpecFile};
use stsd_protocol::Code;
use stsd_tests::catalog_spec_files;

fn spec_parse_of(bytes: &[u8]) -> Code {
    match SpecFile::parse(std::path::Path::new("x.json"), bytes, true) {
        Err(d) => d.code,
        Ok(_) => panic!("malformed input accepted"),
    }
}

#[test]
fn every_truncation_of_a_real_spec_file_is_spec_parse() {
    let bytes = std::fs::read(&catalog_spec_files()[1]).unwrap_or_default();
    // Every prefix would be ~26k parses of up to 26 KB; a prime stride covers every kind of cut
    // (inside strings, escapes, numbers, between tokens) in well under a second.
    let mut n = 0;
    for len in (0..bytes.len()).step_by(7) {
        assert_eq!(
            spec_parse_of(&bytes[..len]),
            Code::SpecParse,
            "prefix of {len} bytes"
        );
        n += 1;
    }
    assert!(n > 1000);
}

#[test]
fn a_50_mb_file_is_refused_without_reading_it_as_json() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("huge.json");
    let mut f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
    let chunk = format!(
        "{{\"name\": \"a\", \"code\": \"{}\", \"codeType\": \"Javascript\"}},",
        "x".repeat(1000)
    );
    let _ = f.write_all(b"[");
    for _ in 0..(50 * 1024) {
        let _ = f.write_all(chunk.as_bytes());
    }
    let _ = f.write_all(b"{}]");
    drop(f);
    assert!(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) > 50_000_000);
    let cat = Catalog::load(&[path]);
    assert_eq!(cat.entries.len(), 0);
    assert_eq!(cat.problems.len(), 1);
    assert_eq!(cat.problems[0].diagnostic.code, Code::SpecParse);
    assert!(cat.problems[0].diagnostic.message.contains("byte limit"));
}

#[test]
fn pathological_nesting_is_spec_parse() {
    for depth in [65usize, 129, 10_000, 1_000_000] {
        let doc = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(
            spec_parse_of(doc.as_bytes()),
            Code::SpecParse,
            "depth {depth}"
        );
        let obj = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        assert_eq!(
            spec_parse_of(obj.as_bytes()),
            Code::SpecParse,
            "object depth {depth}"
        );
    }
}

#[test]
fn invalid_utf8_anywhere_is_spec_parse() {
    let good = br#"{"name": "probe", "code": "return 1;", "codeType": "Javascript"}"#;
    for pos in 0..good.len() {
        for bad in [0xffu8, 0xc3, 0x80, 0xed] {
            let mut b = good.to_vec();
            b[pos] = bad;
            assert_eq!(spec_parse_of(&b), Code::SpecParse, "byte {bad:#x} at {pos}");
        }
    }
    // An overlong encoding and a lone surrogate encoded in UTF-8 are both invalid UTF-8.
    assert_eq!(spec_parse_of(b"{\"name\": \"\xc0\xaf\"}"), Code::SpecParse);
    assert_eq!(
        spec_parse_of(b"{\"name\": \"\xed\xa0\x80\"}"),
        Code::SpecParse
    );
}

#[test]
fn json_that_is_not_a_spec_container_is_spec_parse() {
    for doc in ["42", "null", "\"s\"", "true"] {
        assert_eq!(spec_parse_of(doc.as_bytes()), Code::SpecParse, "{doc}");
    }
    // An array of non-objects: each element is a SPEC_PARSE spec.
    let cat = {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("a.json");
        let _ = std::fs::write(&p, "[1, \"x\", null]");
        Catalog::load(&[p])
    };
    assert_eq!(cat.entries.len(), 3);
    for e in &cat.entries {
        assert!(!e.validated.is_valid());
        assert_eq!(e.validated.diagnostics[0].code, Code::SpecParse);
    }
}
