//! Tools' bodies as QuickJS bytecode, kept by the pool (one-shot with priming) so that a
//! tool's workers load its body instead of each parsing it (`frames::Bytecode`).
//!
//! Where bytecode comes from is the whole of its safety: QuickJS does not check bytecode it
//! reads, so it is taken only from a worker being primed under a key, asked for it, before
//! any call reached that worker (`ReadyWorker::await_primed`; a call's exchange refuses it).
//! It is then a function of the tool's own code, made under the tool's posture, and goes
//! only to workers primed or called under the same key (the tool's name and whole posture),
//! which run that same code anyway. A worker compromised by a call's input has nothing to
//! hand on, and no tool's bytecode reaches another tool's worker.
//!
//! Entries are by key and wrapped source (the wrapper names the arguments the body is
//! compiled for): a few sources per key, the newest kept, a bounded number of keys and of
//! bytes in all (8 MiB; dropping a key costs only its next workers' parses). A
//! source that gave none (a body that does not compile, one too large) is remembered as such,
//! so it is not asked for again; one whose asked primes failed (the worker died, or did not
//! answer in time: a body that runs on past its wrapper as it is compiled) is asked again, up
//! to three failures.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use stsd_protocol::frames::{self, Bytecode, Job, Prime, ToWorker, MAX_BYTECODE_BYTES};

/// Sources kept per key: a tool called with different sets of arguments has its body
/// compiled for each; a changed tool's old source ages out.
const SOURCES_PER_KEY: usize = 4;

/// Keys kept in all; one more drops one of them (a reload that changes postures makes new
/// keys, and Local Pass runs make keys of their own).
const MAX_KEYS: usize = 512;

/// Bytes of bytecode and source kept in all (a catalog's bodies are a few KiB each): past it,
/// keys are dropped until the new entry fits.
const MAX_BYTES: usize = 8 << 20;

/// How long the refill thread waits for the worker primed for a key's bytecode (it waits
/// for no other prime): a body that runs on past its wrapper while it is compiled would
/// otherwise hold every tool's refill for the prime's whole timeout.
pub const PRIMED_WAIT: Duration = Duration::from_secs(5);

/// Primes asked for a source's bytecode that failed (the worker died, or did not answer in
/// [`PRIMED_WAIT`]) before the source is not asked for again.
const TRIES: u8 = 3;

struct Entry {
    source: String,
    /// None: this source gave none (its prime answered without it, or with bytecode not its
    /// own), or its asked primes failed (`failures`).
    made: Option<Arc<Bytecode>>,
    /// Asked primes that failed: the source is asked for again until there are [`TRIES`].
    failures: u8,
}

impl Entry {
    /// What the entry holds, for [`MAX_BYTES`].
    fn bytes(&self) -> usize {
        self.source.len()
            + self
                .made
                .as_ref()
                .map_or(0, |b| b.source.len() + b.bytes.len())
    }
}

/// What a prime under a key should carry.
pub enum ForPrime {
    /// The key's bytecode for the prime's source.
    Give(Arc<Bytecode>),
    /// None is kept for the source yet: the worker is asked for it.
    Ask,
    /// The source gave none before.
    Neither,
}

#[derive(Default)]
pub struct Bodies {
    by_key: Mutex<HashMap<String, Vec<Arc<Entry>>>>,
}

impl Bodies {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Arc<Entry>>>> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entries under `key`, copied out of the lock (no source is built under it).
    fn entries(&self, key: &str) -> Vec<Arc<Entry>> {
        self.lock().get(key).cloned().unwrap_or_default()
    }

    /// The prime to send under `key`: `prime` with the bytecode kept for its source, or
    /// asking the worker for it.
    pub fn prime(&self, key: &str, prime: &Prime) -> Arc<Prime> {
        let mut p = prime.clone();
        match self.for_prime(key, prime) {
            ForPrime::Give(b) => p.job.bytecode = Some((*b).clone()),
            ForPrime::Ask => p.want_bytecode = true,
            ForPrime::Neither => {}
        }
        Arc::new(p)
    }

    fn for_prime(&self, key: &str, prime: &Prime) -> ForPrime {
        let entries = self.entries(key);
        let source = source_of_prime(prime);
        match entries.iter().find(|e| e.source == source).map(|e| &**e) {
            Some(Entry { made: Some(b), .. }) => ForPrime::Give(b.clone()),
            Some(e) if (1..TRIES).contains(&e.failures) => ForPrime::Ask,
            Some(_) => ForPrime::Neither,
            None => ForPrime::Ask,
        }
    }

    /// The bytecode under `key` for `job`'s body as this call wraps it (for a worker that was
    /// not primed: a primed one has its body compiled). Nothing is built when the key has none.
    pub fn for_job(&self, key: &str, job: &Job) -> Option<Bytecode> {
        let entries = self.entries(key);
        if entries.iter().all(|e| e.made.is_none()) {
            return None;
        }
        let source = job.wrapped_body(&job.wrapper_prefix());
        let e = entries.iter().find(|e| e.source == source)?;
        e.made.as_ref().map(|b| (**b).clone())
    }

    /// What the worker primed with `prime` (which asked) handed on: kept for the prime's
    /// source when it is that source's, within [`MAX_BYTECODE_BYTES`], and a prime carrying it
    /// still fits one frame; otherwise the source is remembered as giving none.
    pub fn keep(&self, key: &str, prime: &Prime, made: Option<Bytecode>) {
        let source = source_of_prime(prime);
        let made = made.filter(|b| {
            b.source == source
                && b.source.len() + b.bytes.len() <= MAX_BYTECODE_BYTES
                && fits_a_prime(prime, b)
        });
        self.insert(
            key,
            Entry {
                source,
                made: made.map(Arc::new),
                failures: 0,
            },
        );
    }

    /// The worker primed with `prime` (which asked) failed: the source is asked for again, up
    /// to [`TRIES`] failures in all.
    pub fn failed(&self, key: &str, prime: &Prime) {
        let source = source_of_prime(prime);
        let before = self
            .entries(key)
            .iter()
            .find(|e| e.source == source && e.made.is_none())
            .map_or(0, |e| e.failures);
        self.insert(
            key,
            Entry {
                source,
                made: None,
                failures: before.saturating_add(1),
            },
        );
    }

    /// Keeps `entry` under `key` (in place of the key's entry for its source), within the
    /// bounds.
    fn insert(&self, key: &str, entry: Entry) {
        let entry = Arc::new(entry);
        let mut by_key = self.lock();
        let held = |m: &HashMap<String, Vec<Arc<Entry>>>| -> usize {
            m.values().flatten().map(|e| e.bytes()).sum()
        };
        while !by_key.is_empty()
            && ((!by_key.contains_key(key) && by_key.len() >= MAX_KEYS)
                || held(&by_key) + entry.bytes() > MAX_BYTES)
        {
            // Another key when there is one: the new entry's own key keeps its sources.
            let other = by_key
                .keys()
                .find(|k| *k != key)
                .or_else(|| by_key.keys().next());
            let Some(other) = other.cloned() else { break };
            by_key.remove(&other);
        }
        let list = by_key.entry(key.to_string()).or_default();
        list.retain(|e| e.source != entry.source);
        if list.len() >= SOURCES_PER_KEY {
            list.remove(0);
        }
        list.push(entry);
    }

    /// How many bodies are kept as bytecode (`stsd status`: `pool.bytecodes`).
    pub fn count(&self) -> usize {
        self.lock()
            .values()
            .flatten()
            .filter(|e| e.made.is_some())
            .count()
    }
}

/// The source a prime's worker compiles.
fn source_of_prime(prime: &Prime) -> String {
    prime
        .job
        .wrapped_body(&prime.job.wrapper_prefix_with(&prime.expect_args))
}

/// Whether `prime` with `b` still goes in one frame.
fn fits_a_prime(prime: &Prime, b: &Bytecode) -> bool {
    let mut p = prime.clone();
    p.job.bytecode = Some(b.clone());
    p.want_bytecode = false;
    frames::encode(&ToWorker::Prime(Box::new(p))).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use stsd_protocol::frames::{FsAccess, JobLimits, NetworkGrant, SandboxSpec, SeccompBpf};

    fn prime(code: &str, expect_args: &[&str]) -> Prime {
        let job = Job {
            call_id: 1,
            code: code.into(),
            args_json: "{}".into(),
            statics_json: "{}".into(),
            declared: vec!["a".into()],
            tool_safety_json: "{}".into(),
            sandbox: SandboxSpec {
                fs: FsAccess::None,
                base_path: "/".into(),
                uid: 65534,
                gid: 65534,
                network: NetworkGrant::Blocked,
            },
            seccomp: SeccompBpf::default(),
            limits: JobLimits::default(),
            attack: None,
            keep_alive: false,
            compile_only: false,
            reuse_calls: 1,
            bytecode: None,
            withheld: Default::default(),
        };
        Prime {
            job,
            expect_args: expect_args.iter().map(|s| s.to_string()).collect(),
            want_bytecode: false,
        }
    }

    fn made(p: &Prime, bytes: Vec<u8>) -> Bytecode {
        Bytecode {
            source: source_of_prime(p),
            bytes,
        }
    }

    /// A prime carries a key's bytecode only for the very source it was made from; a source
    /// not seen is asked for, once; what is kept is checked (its source, its size) and a
    /// source that gave none is not asked for again. Jobs get it the same way.
    #[test]
    fn bytecode_goes_only_to_its_own_key_and_source() {
        let b = Bodies::default();
        let a = prime("return a;", &["a"]);
        assert!(matches!(b.for_prime("k", &a), ForPrime::Ask));
        b.keep("k", &a, Some(made(&a, vec![1, 2, 3])));
        assert_eq!(b.count(), 1);
        let sent = b.prime("k", &a);
        assert!(!sent.want_bytecode);
        assert_eq!(
            sent.job.bytecode.as_ref().map(|b| b.bytes.clone()),
            Some(vec![1, 2, 3])
        );
        // Another key, the tool's code changed, or other argument names: asked for.
        assert!(matches!(b.for_prime("other", &a), ForPrime::Ask));
        let changed = prime("return 1;", &["a"]);
        assert!(matches!(b.for_prime("k", &changed), ForPrime::Ask));
        let no_args = prime("return a;", &[]);
        assert!(matches!(b.for_prime("k", &no_args), ForPrime::Ask));
        // A job supplying `a` gets it; one that does not (another wrapper) does not.
        let mut job = a.job.clone();
        job.args_json = r#"{"a":1}"#.into();
        assert_eq!(b.for_job("k", &job).map(|b| b.bytes), Some(vec![1, 2, 3]));
        assert!(b.for_job("k", &a.job).is_none());
        assert!(b.for_job("other", &job).is_none());
        // Bytecode for a source other than the prime's, or too large: kept as none, and the
        // source is not asked for again.
        let wrong = Bytecode {
            source: source_of_prime(&changed),
            bytes: vec![1],
        };
        b.keep("k2", &a, Some(wrong));
        assert!(matches!(b.for_prime("k2", &a), ForPrime::Neither));
        b.keep("k3", &a, Some(made(&a, vec![0; MAX_BYTECODE_BYTES])));
        assert!(matches!(b.for_prime("k3", &a), ForPrime::Neither));
        b.keep("k4", &a, None);
        let sent = b.prime("k4", &a);
        assert!(!sent.want_bytecode && sent.job.bytecode.is_none());
        assert_eq!(b.count(), 1);
        // A failed prime is asked again, up to TRIES failures; an answer ends the tries.
        for _ in 1..TRIES {
            b.failed("k5", &a);
            assert!(matches!(b.for_prime("k5", &a), ForPrime::Ask));
        }
        b.failed("k5", &a);
        assert!(matches!(b.for_prime("k5", &a), ForPrime::Neither));
        b.failed("k6", &a);
        b.keep("k6", &a, Some(made(&a, vec![4])));
        assert!(matches!(b.for_prime("k6", &a), ForPrime::Give(_)));
    }

    /// A key keeps its newest sources, and the number of keys and the bytes held are bounded.
    #[test]
    fn sources_and_keys_are_bounded() {
        let b = Bodies::default();
        let primes: Vec<Prime> = (0..SOURCES_PER_KEY + 1)
            .map(|i| prime(&format!("return {i};"), &["a"]))
            .collect();
        for p in &primes {
            b.keep("k", p, Some(made(p, vec![7])));
        }
        assert_eq!(b.count(), SOURCES_PER_KEY);
        assert!(matches!(b.for_prime("k", &primes[0]), ForPrime::Ask));
        assert!(matches!(
            b.for_prime("k", &primes[SOURCES_PER_KEY]),
            ForPrime::Give(_)
        ));
        for i in 0..MAX_KEYS + 10 {
            b.keep(&format!("key {i}"), &primes[0], None);
        }
        assert!(b.lock().len() <= MAX_KEYS);
        // And the bytes: bodies of 30 KiB under many keys stay within MAX_BYTES.
        let big = prime("return 'big';", &["a"]);
        for i in 0..(MAX_BYTES / (30 << 10)) + 20 {
            b.keep(
                &format!("big {i}"),
                &big,
                Some(made(&big, vec![1; 30 << 10])),
            );
        }
        let held: usize = b.lock().values().flatten().map(|e| e.bytes()).sum();
        assert!(held <= MAX_BYTES, "{held}");
        assert!(b.count() > 100, "{}", b.count());
    }
}
