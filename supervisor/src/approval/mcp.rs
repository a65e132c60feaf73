//! The elicit strategy over MCP, in both eras. 2025-11-25: a server-to-client
//! `elicitation/create` on the session. 2026-07-28 (no server-to-client requests): the first
//! `tools/call` answers `input_required` with the elicitation and a sealed `requestState`; the
//! client retries with its answer and the state. The state is HMAC-sealed (rmcp's
//! `RequestStateCodec`; the key from `[approval] state_key_file` or `STSD_APPROVAL_STATE_KEY`
//! so that replicas behind a load balancer open each other's states, else made at start),
//! bound to the caller (peer uid, or HTTP principal), the tool and a digest of the exact
//! arguments, expires with `[approval] timeout_seconds`, and is single-use: across every
//! daemon sharing the state store (its spent list is kept there), else within the process.

use crate::approval::{Elicited, Elicitor};
use rmcp::model::{
    ElicitRequest, ElicitRequestParams, ElicitationAction, ElicitationSchema, InputRequest,
    InputRequests, InputRequiredResult, JsonObject, RequestStateCodec, SealOptions,
};
use rmcp::service::Peer;
use rmcp::RoleServer;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The key of our one input request in `inputRequests` / `inputResponses`.
pub const INPUT_KEY: &str = "stsd-approval";

/// How a client that cannot be asked gets approval instead.
pub const HOW_TO_APPROVE: &str = "this call needs approval and the MCP client did not declare \
    the elicitation capability; use a client that supports elicitation, or ask the operator \
    for an [approval] rule (operator or command strategy)";

fn schema() -> ElicitationSchema {
    // Approval needs no data, only accept or decline.
    serde_json::from_value(json!({"type": "object", "properties": {}})).unwrap_or_else(|_| {
        // The literal above always parses; keep a non-panicking path anyway.
        ElicitationSchema::builder().build_unchecked()
    })
}

fn form(message: String) -> ElicitRequestParams {
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema(),
    }
}

/// An elicitor for one call.
pub enum McpElicitor {
    /// 2025-11-25: ask with a server-to-client request on the session.
    Session {
        peer: Peer<RoleServer>,
        client: String,
    },
    /// 2026-07-28: the answer came with the retry (or the state was refused).
    Answered { client: String, answer: Elicited },
    /// The client cannot be asked.
    Unsupported { client: String },
}

impl Elicitor for McpElicitor {
    fn who(&self) -> String {
        match self {
            McpElicitor::Session { client, .. } => format!("MCP client {client} (elicitation)"),
            McpElicitor::Answered { client, .. } => {
                format!("MCP client {client} (elicitation, input_required)")
            }
            McpElicitor::Unsupported { client } => format!("MCP client {client}"),
        }
    }

    fn ask(&self, message: String) -> Pin<Box<dyn Future<Output = Elicited> + Send + '_>> {
        Box::pin(async move {
            match self {
                McpElicitor::Unsupported { .. } => Elicited::Unsupported(HOW_TO_APPROVE.into()),
                McpElicitor::Answered { answer, .. } => answer.clone(),
                McpElicitor::Session { peer, .. } => {
                    match peer
                        .create_elicitation_with_timeout(form(message), None)
                        .await
                    {
                        Ok(r) => match r.action {
                            ElicitationAction::Accept => Elicited::Accepted,
                            ElicitationAction::Decline => {
                                Elicited::Declined("the user declined".into())
                            }
                            ElicitationAction::Cancel => {
                                Elicited::Declined("the user dismissed the request".into())
                            }
                            _ => Elicited::Declined("the client gave no recognised answer".into()),
                        },
                        Err(e) => Elicited::Failed(e.to_string()),
                    }
                }
            }
        })
    }
}

/// Arguments in a canonical form (keys sorted at every level), for the digest.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for k in keys {
                out.insert(k.clone(), canonical(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// Whom a sealed state belongs to: the HTTP principal when there is one, else the peer uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateOwner(String);

impl StateOwner {
    pub fn of(caller: &crate::call::vocab::Caller) -> StateOwner {
        match &caller.principal {
            Some(p) => StateOwner(format!("principal={}", p.name)),
            None => StateOwner::uid(caller.peer_uid),
        }
    }

    pub fn uid(uid: Option<u32>) -> StateOwner {
        StateOwner(format!("uid={}", uid.unwrap_or(u32::MAX)))
    }
}

/// The environment variable that may carry the state key (at least 32 bytes).
pub const STATE_KEY_ENV: &str = "STSD_APPROVAL_STATE_KEY";

/// The configured state key: `[approval] state_key_file`, else `STSD_APPROVAL_STATE_KEY`;
/// None when neither is set. Surrounding whitespace (a trailing newline) is not key.
pub fn configured_key(
    cfg: &stsd_profiles::approval::ApprovalConfig,
) -> Result<Option<Vec<u8>>, String> {
    let (key, from) = match (&cfg.state_key_file, std::env::var_os(STATE_KEY_ENV)) {
        (Some(f), _) => (
            std::fs::read(f).map_err(|e| {
                format!("cannot read [approval] state_key_file {}: {e}", f.display())
            })?,
            format!("[approval] state_key_file {}", f.display()),
        ),
        (None, Some(v)) => (
            std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec(),
            STATE_KEY_ENV.to_string(),
        ),
        (None, None) => return Ok(None),
    };
    let key = key.trim_ascii().to_vec();
    if key.len() < 32 {
        return Err(format!(
            "the approval state key from {from} has {} bytes; at least 32 are needed \
             (e.g. head -c 32 /dev/urandom | base64)",
            key.len()
        ));
    }
    Ok(Some(key))
}

fn binding(who: &StateOwner, tool: &str, args: &JsonObject) -> Vec<u8> {
    let text = serde_json::to_vec(&canonical(&Value::Object(args.clone()))).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &text);
    let mut ad = format!("stsd-approval/v1|{}|tool={tool}|args=", who.0).into_bytes();
    ad.extend_from_slice(digest.as_ref());
    ad
}

/// Seals and opens approval states; remembers spent ones until they expire.
pub struct StateBook {
    codec: RequestStateCodec,
    ttl: Duration,
    spent: Mutex<HashMap<String, Instant>>,
    /// The state store, when the daemon has one: spent states are kept there, so a state is
    /// single-use across every replica sharing it, not per process.
    store: Option<std::sync::Arc<crate::state::Store>>,
}

impl StateBook {
    /// A book with a random key, private to this process.
    pub fn new(ttl: Duration) -> Result<StateBook, String> {
        let mut key = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
            .map_err(|_| "no randomness for the approval state key".to_string())?;
        StateBook::with_key(key.to_vec(), ttl)
    }

    /// A book with a given key (shared by replicas).
    pub fn with_key(key: Vec<u8>, ttl: Duration) -> Result<StateBook, String> {
        let codec = RequestStateCodec::try_new(key).map_err(|e| e.to_string())?;
        Ok(StateBook {
            codec,
            ttl,
            spent: Mutex::new(HashMap::new()),
            store: None,
        })
    }

    /// Spent states kept in `store` (shared by the replicas on it).
    pub fn with_store(mut self, store: Option<std::sync::Arc<crate::state::Store>>) -> StateBook {
        self.store = store;
        self
    }

    /// The first round's answer: the elicitation, and the sealed state bound to this call.
    pub fn input_required(
        &self,
        who: &StateOwner,
        tool: &str,
        args: &JsonObject,
        message: String,
    ) -> Result<InputRequiredResult, String> {
        let mut nonce = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
            .map_err(|_| "no randomness for the approval state".to_string())?;
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        let ad = binding(who, tool, args);
        let sealed = self.codec.seal_with(
            nonce.as_bytes(),
            &SealOptions::new().associated_data(&ad).ttl(self.ttl),
        );
        let mut requests = InputRequests::new();
        requests.insert(
            INPUT_KEY.to_string(),
            InputRequest::Elicitation(ElicitRequest::new(form(message))),
        );
        Ok(InputRequiredResult::new(Some(requests), Some(sealed)))
    }

    /// Spends the state `nonce`: in the store when there is one (single use across the
    /// replicas; a store that cannot answer refuses, never lets it through), else in memory.
    fn spend(&self, nonce: String) -> Result<(), String> {
        let keep = self.ttl + Duration::from_secs(60);
        if let Some(store) = &self.store {
            let until = crate::store::now_ms() + keep.as_millis() as i64;
            return match store.spend(&nonce, until) {
                Ok(true) => Ok(()),
                Ok(false) => Err("the approval state was already used".into()),
                Err(e) => Err(format!("the approval state cannot be checked: {e}")),
            };
        }
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        spent.retain(|_, t| *t > now);
        if spent.contains_key(&nonce) {
            return Err("the approval state was already used".into());
        }
        spent.insert(nonce, now + keep);
        Ok(())
    }

    /// The retry: opens the state against this call and spends it; then reads the answer.
    pub fn redeem(
        &self,
        who: &StateOwner,
        tool: &str,
        args: &JsonObject,
        state: &str,
        responses: Option<&HashMap<String, Value>>,
    ) -> Elicited {
        let ad = binding(who, tool, args);
        let nonce = match self.codec.open_with(state, &ad) {
            Ok(n) => String::from_utf8_lossy(&n).into_owned(),
            Err(e) => {
                return Elicited::Failed(format!(
                    "the approval state was refused ({e}): it was altered, has expired, or was \
                     made for another caller, tool or arguments"
                ))
            }
        };
        if let Err(refused) = self.spend(nonce) {
            return Elicited::Failed(refused);
        }
        let answer = responses.and_then(|r| r.get(INPUT_KEY));
        match answer.and_then(|a| a.get("action")).and_then(Value::as_str) {
            Some("accept") => Elicited::Accepted,
            Some("decline") => Elicited::Declined("the user declined".into()),
            Some("cancel") => Elicited::Declined("the user dismissed the request".into()),
            _ => Elicited::Failed(format!(
                "the retry carries no answer to the approval request (inputResponses.{INPUT_KEY})"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> JsonObject {
        match v {
            Value::Object(m) => m,
            _ => JsonObject::new(),
        }
    }

    #[test]
    fn replicas_with_one_key_open_each_others_states_and_other_keys_do_not() {
        let key = b"0123456789abcdef0123456789abcdef".to_vec();
        let ttl = Duration::from_secs(60);
        let a = StateBook::with_key(key.clone(), ttl).unwrap_or_else(|e| panic!("{e}"));
        let b = StateBook::with_key(key, ttl).unwrap_or_else(|e| panic!("{e}"));
        let c = StateBook::new(ttl).unwrap_or_else(|e| panic!("{e}"));
        let args = args(json!({"path": "x"}));
        let alice = StateOwner("principal=alice".into());
        let state = a
            .input_required(&alice, "deleteFile", &args, "ok?".into())
            .unwrap_or_else(|e| panic!("{e}"))
            .request_state
            .unwrap_or_default();
        let yes: HashMap<String, Value> =
            [(INPUT_KEY.to_string(), json!({"action": "accept"}))].into();
        assert!(matches!(
            c.redeem(&alice, "deleteFile", &args, &state, Some(&yes)),
            Elicited::Failed(_)
        ));
        let bob = StateOwner("principal=bob".into());
        assert!(matches!(
            b.redeem(&bob, "deleteFile", &args, &state, Some(&yes)),
            Elicited::Failed(_)
        ));
        assert_eq!(
            b.redeem(&alice, "deleteFile", &args, &state, Some(&yes)),
            Elicited::Accepted
        );
    }

    #[test]
    fn a_short_configured_key_is_refused() {
        let dir = std::env::temp_dir().join(format!("stsd-key-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let f = dir.join("k");
        let _ = std::fs::write(&f, "short\n");
        let cfg = stsd_profiles::approval::ApprovalConfig {
            state_key_file: Some(f.clone()),
            ..Default::default()
        };
        let e = configured_key(&cfg).err().unwrap_or_default();
        assert!(e.contains("at least 32"), "{e}");
        let _ = std::fs::write(&f, "0123456789abcdef0123456789abcdef\n");
        let k = configured_key(&cfg).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.map(|k| k.len()), Some(32));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_state_opens_once_for_the_same_call_only() {
        let book = StateBook::new(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
        let a = args(json!({"path": "x.txt", "n": 1}));
        let r = book
            .input_required(&StateOwner::uid(Some(0)), "deleteFile", &a, "ok?".into())
            .unwrap_or_else(|e| panic!("{e}"));
        let state = r.request_state.clone().unwrap_or_default();
        let yes: HashMap<String, Value> =
            [(INPUT_KEY.to_string(), json!({"action": "accept"}))].into();
        // Other arguments, another uid, another tool: refused (and the state not spent).
        let other = args(json!({"path": "y.txt", "n": 1}));
        assert!(matches!(
            book.redeem(
                &StateOwner::uid(Some(0)),
                "deleteFile",
                &other,
                &state,
                Some(&yes)
            ),
            Elicited::Failed(_)
        ));
        assert!(matches!(
            book.redeem(
                &StateOwner::uid(Some(7)),
                "deleteFile",
                &a,
                &state,
                Some(&yes)
            ),
            Elicited::Failed(_)
        ));
        assert!(matches!(
            book.redeem(
                &StateOwner::uid(Some(0)),
                "readFile",
                &a,
                &state,
                Some(&yes)
            ),
            Elicited::Failed(_)
        ));
        // Key order does not matter; the exact arguments do.
        let reordered = args(json!({"n": 1, "path": "x.txt"}));
        assert_eq!(
            book.redeem(
                &StateOwner::uid(Some(0)),
                "deleteFile",
                &reordered,
                &state,
                Some(&yes)
            ),
            Elicited::Accepted
        );
        // Single use.
        assert!(
            matches!(book.redeem(&StateOwner::uid(Some(0)), "deleteFile", &a, &state, Some(&yes)), Elicited::Failed(m) if m.contains("already used"))
        );
        // Altered.
        let mut altered = state.clone();
        altered.push('A');
        assert!(matches!(
            book.redeem(
                &StateOwner::uid(Some(0)),
                "deleteFile",
                &a,
                &altered,
                Some(&yes)
            ),
            Elicited::Failed(_)
        ));
    }
}
