//! What a page may ask of the console (a leaf, so the pages do not import the console that
//! serves them): an admin method as the person, one that changes something (audited), and
//! whether the policy lets them do a thing.

use crate::call::Principal;
use serde_json::Value;

#[async_trait::async_trait]
pub trait Door: Send + Sync {
    /// One admin method, as `who`.
    async fn call(
        &self,
        who: &Principal,
        method: &str,
        params: Value,
    ) -> Result<Value, (i32, String)>;
    /// An admin method that changes something: called, then audited with the person.
    async fn act(
        &self,
        who: &Principal,
        method: &str,
        params: Value,
    ) -> Result<Value, (i32, String)>;
    /// Whether the policy lets `who` do `action` (buttons are shown only to those who may
    /// press them; the method checks again).
    fn may(&self, who: &Principal, action: crate::policy::Action) -> bool;
    /// A tools/call as `who`, through the daemon's one call pipeline (policy, approval,
    /// admission, audit) with the console as its transport: the reply, its console lines
    /// and metrics, as JSON.
    async fn run(&self, who: &Principal, tool: &str, args: serde_json::Map<String, Value>)
        -> Value;
}
