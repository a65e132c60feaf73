//! Bounded fuzzing of the three readers that take bytes from someone else: the daemon's
//! JSON-RPC line reader (from any client), the spec reader (from any spec file) and the worker
//! frame decoder (from a worker that may be compromised). Each gets random bytes and mutations
//! of real inputs (the catalog's specs, real requests, real frames) and must return an answer,
//! never panic, and stay fast. Runs in CI for a bounded number of cases per reader
//! (`STSD_FUZZ_CASES`, default 10000); proptest shrinks a failure to a minimal input.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};
use stsd::store::SpecFile;
use stsd::transport::{classify, Inbound};
use stsd_protocol::frames::{self, ConsoleLevel, FromWorker, ToWorker};

fn cases() -> u32 {
    std::env::var("STSD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10000)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    })
}

/// One edit of a seed input.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    /// Repeats a slice (nesting, long strings).
    Repeat(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let tokens = prop::sample::select(vec![
        b"{".to_vec(),
        b"}".to_vec(),
        b"[".to_vec(),
        b"\"".to_vec(),
        b"\\".to_vec(),
        b"\\u0000".to_vec(),
        b"\xff\xfe".to_vec(),
        b"\n".to_vec(),
        b"null".to_vec(),
        b"1e999999".to_vec(),
        b"-0".to_vec(),
        b"18446744073709551616".to_vec(),
        "\u{2028}".as_bytes().to_vec(),
    ]);
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Edit::Flip(p, b)),
        (
            any::<usize>(),
            prop_oneof![tokens, prop::collection::vec(any::<u8>(), 1..8)]
        )
            .prop_map(|(p, b)| Edit::Insert(p, b)),
        (any::<usize>(), 1usize..16).prop_map(|(p, n)| Edit::Delete(p, n)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 1usize..8, 1usize..200).prop_map(|(p, n, k)| Edit::Repeat(p, n, k)),
    ]
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        let len = b.len().max(1);
        match e {
            Edit::Flip(p, x) => {
                if !b.is_empty() {
                    let i = p % b.len();
                    b[i] ^= x;
                }
            }
            Edit::Insert(p, bytes) => {
                let i = p % (b.len() + 1);
                b.splice(i..i, bytes.iter().copied());
            }
            Edit::Delete(p, n) => {
                let i = p % len;
                let end = (i + n).min(b.len());
                if i < end {
                    b.drain(i..end);
                }
            }
            Edit::Truncate(p) => b.truncate(p % len),
            Edit::Repeat(p, n, k) => {
                let i = p % len;
                let end = (i + n).min(b.len());
                if i < end {
                    let piece = b[i..end].to_vec();
                    for _ in 0..*k {
                        b.splice(i..i, piece.iter().copied());
                    }
                }
            }
        }
    }
    b
}

/// Runs `check` on random bytes and on mutations of every seed; each input must take under
/// a second.
fn fuzz(name: &str, seeds: &[Vec<u8>], check: impl Fn(&[u8])) {
    let t0 = Instant::now();
    let timed = |input: &[u8]| {
        let t = Instant::now();
        check(input);
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "{name}: one input of {} bytes took {took:?}",
            input.len()
        );
    };
    let random = prop::collection::vec(any::<u8>(), 0..2048);
    runner()
        .run(&random, |input| {
            timed(&input);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name} (random bytes): {e}"));
    let mutated = (0..seeds.len(), prop::collection::vec(edit(), 1..6));
    runner()
        .run(&mutated, |(i, edits)| {
            timed(&apply(&seeds[i], &edits));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name} (mutated seeds): {e}"));
    eprintln!(
        "{name}: {} random + {} mutated inputs in {:?}",
        cases(),
        cases(),
        t0.elapsed()
    );
}

#[test]
fn the_json_rpc_reader_answers_every_line() {
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}});
    let seeds: Vec<Vec<u8>> = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "slow", "arguments": {"ms": 5}, "_meta": meta}}),
        json!({"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {"_meta": meta}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "c", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": 1}}),
        json!({"jsonrpc": "2.0", "method": "stsd/keepalive"}),
        json!({"jsonrpc": "2.0", "id": 3, "result": {}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    fuzz("json-rpc reader", &seeds, |line| {
        // Every line is a message, nothing, or a rejection that is itself a JSON-RPC error.
        if let Inbound::Reject(v) = classify(line) {
            assert!(v["error"]["code"].is_i64(), "{v}");
            assert_eq!(v["jsonrpc"], "2.0");
        }
    });
}

#[test]
fn the_spec_reader_reports_every_document() {
    let mut seeds = Vec::new();
    for f in stsd_tests::catalog_spec_files() {
        let text = std::fs::read(&f).unwrap_or_else(|e| panic!("{e}"));
        let all: serde_json::Value =
            serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{e}"));
        // One spec per seed keeps inputs small enough for many cases.
        for spec in all.as_array().into_iter().flatten().take(6) {
            seeds.push(spec.to_string().into_bytes());
        }
    }
    let config = stsd_profiles::Config::default();
    fuzz("spec reader", &seeds, |bytes| {
        if let Ok(Some(file)) = SpecFile::parse(Path::new("fuzz.json"), bytes, false) {
            for (_, doc) in file.documents() {
                let validated = stsd_protocol::validate::validate_document(doc);
                if let Some(spec) = &validated.spec {
                    let _ = stsd_profiles::resolve(spec, &config);
                    let _ = stsd::service::input_schema(spec);
                }
            }
        }
    });
}

#[test]
fn the_frame_decoder_refuses_what_it_cannot_read() {
    let seeds: Vec<Vec<u8>> = [
        FromWorker::Ready {
            pid: 7,
            cpu_us: 300,
        },
        FromWorker::Console {
            level: ConsoleLevel::Warn,
            line: "a line".into(),
        },
        FromWorker::ResultChunk {
            data: "{\"a\":[1,2]}".into(),
            last: true,
        },
        FromWorker::Error {
            code: "JS_ERROR".into(),
            message: "boom".into(),
            stack: Some("at x".into()),
        },
        FromWorker::FetchBody {
            data: vec![1, 2, 3],
        },
    ]
    .iter()
    .filter_map(|f| frames::encode(f).ok())
    .collect();
    fuzz("frame decoder", &seeds, |bytes| {
        let _ = frames::decode::<FromWorker>(bytes);
        let _ = frames::decode_first::<FromWorker>(bytes);
        let _ = frames::decode::<ToWorker>(bytes);
    });
}
