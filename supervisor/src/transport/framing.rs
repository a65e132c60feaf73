//! Inbound framing: one newline-delimited JSON-RPC message per line, read without letting a
//! line grow past its limit, checked for nesting depth before it is parsed, and classified.
//! Anything that is not a message rmcp can dispatch gets its JSON-RPC error here, with the
//! request's id when there is one: -32700 for text that is not JSON (or nests too deep),
//! -32600 for JSON that is not a request, -32602 for a known method with malformed params.

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ErrorCode, JsonRpcMessage,
    JsonRpcRequest, JsonRpcVersion2_0, ListToolsRequest, RequestId,
};
use rmcp::service::RxJsonRpcMessage;
use rmcp::RoleServer;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

/// Deepest nesting of arrays and objects a message may have. serde_json's own recursion
/// limit is 128; refusing earlier keeps the error ours and the stack small.
pub const MAX_DEPTH: usize = 64;

/// The notification `stsd mcp` sends while its client is quiet, so that a bridged session is
/// not taken for an idle one. It counts as activity and is not passed on.
pub const KEEPALIVE_METHOD: &str = "stsd/keepalive";

/// The notification `stsd mcp` sends first: from then on the session carries MCP only, and
/// every `stsd/...` request on it is refused. The bridge is what an agent host starts, so an
/// agent never reaches the admin channel through it, whatever uid runs it. One way: nothing
/// turns it off.
pub const MCP_ONLY_METHOD: &str = "stsd/mcp-only";

/// Requests whose method starts with this go to the admin channel, not to MCP.
pub const ADMIN_PREFIX: &str = "stsd/";

/// What one line turned out to be.
#[derive(Debug)]
pub enum Inbound {
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    /// A keepalive from the bridge.
    KeepAlive,
    /// The bridge's declaration that the session is MCP only ([`MCP_ONLY_METHOD`]).
    McpOnly,
    /// A request for the admin channel (`stsd/...`), for the admin handler.
    Admin {
        id: Value,
        method: String,
        params: Value,
    },
    /// Not dispatchable: this JSON-RPC error goes back to the client.
    Reject(Value),
    /// Blank line: ignored.
    Nothing,
}

/// A JSON-RPC error object as a whole message. Without a readable id the `id` member is
/// left out (MCP 2026-07-28 §Error Responses; rmcp does the same).
pub fn error_reply(id: Option<&Value>, code: ErrorCode, message: &str) -> Value {
    let mut v = json!({
        "jsonrpc": "2.0",
        "error": {"code": code.0, "message": message},
    });
    if let Some(id) = id {
        v["id"] = id.clone();
    }
    v
}

fn depth_exceeds(line: &[u8], limit: usize) -> bool {
    stsd_protocol::json::nesting_over(line, limit).is_some()
}

/// Methods of MCP whose params rmcp types; a request for one that rmcp could only read as a
/// custom request had params of the wrong shape.
fn is_typed_method(method: &str) -> bool {
    matches!(
        method,
        "initialize"
            | "ping"
            | "server/discover"
            | "prompts/get"
            | "prompts/list"
            | "resources/list"
            | "resources/read"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "resources/templates/list"
            | "subscriptions/listen"
            | "tools/call"
            | "tools/list"
            | "completion/complete"
            | "logging/setLevel"
    )
}

/// Why the params of `method` do not fit, as precisely as serde can say.
fn params_problem(method: &str, params: Option<&Value>) -> String {
    let detail = match (method, params) {
        (_, Some(p)) if !p.is_object() => "params must be an object".to_string(),
        ("tools/call", None) => "params are required (name, arguments)".to_string(),
        ("tools/call", Some(p)) => match p.get("arguments") {
            Some(a) if !a.is_object() && !a.is_null() => "arguments must be an object".into(),
            _ => serde_json::from_value::<CallToolRequestParams>(p.clone())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "malformed params".into()),
        },
        _ => "malformed params".to_string(),
    };
    format!("invalid params for {method}: {detail}")
}

/// A request for one of the hot methods (`tools/call`, `tools/list`), read straight into its
/// rmcp type: the message rmcp's own reading makes of it, without its search. That reading
/// buffers the message and tries each kind of message, then each of the client's 22 kinds of
/// request in turn until one fits (`tools/call` is the 14th), each failure a formatted error:
/// 13 of the daemon's ~190 µs of CPU on a reused call. None for anything else, or for a hot
/// request that does not read (rmcp's reading then decides, as for every other message).
fn hot_request(value: &Value) -> Option<RxJsonRpcMessage<RoleServer>> {
    fn read<R: DeserializeOwned>(
        value: &Value,
        wrap: fn(R) -> ClientRequest,
    ) -> Option<ClientRequest> {
        // The request's own fields (`method`, `params`) are read from the whole message, as
        // rmcp's flattened reading does; the others (`jsonrpc`, `id`) it ignores.
        R::deserialize(value).ok().map(wrap)
    }
    let obj = value.as_object()?;
    // rmcp's shape check: a request has a method and an id, and no result or error.
    if obj.contains_key("result") || obj.contains_key("error") {
        return None;
    }
    let request = match obj.get("method")?.as_str()? {
        "tools/call" => read::<CallToolRequest>(value, ClientRequest::CallToolRequest)?,
        "tools/list" => read::<ListToolsRequest>(value, ClientRequest::ListToolsRequest)?,
        _ => return None,
    };
    let jsonrpc = JsonRpcVersion2_0::deserialize(obj.get("jsonrpc")?).ok()?;
    let id = RequestId::deserialize(obj.get("id")?).ok()?;
    Some(JsonRpcMessage::Request(JsonRpcRequest {
        jsonrpc,
        id,
        request,
    }))
}

/// Classifies one line (without its newline).
pub fn classify(line: &[u8]) -> Inbound {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Inbound::Nothing;
    }
    if depth_exceeds(line, MAX_DEPTH) {
        return Inbound::Reject(error_reply(
            None,
            ErrorCode::PARSE_ERROR,
            &format!("parse error: JSON nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Inbound::Reject(error_reply(
                None,
                ErrorCode::PARSE_ERROR,
                &format!("parse error: {e}"),
            ))
        }
    };
    let Value::Object(obj) = &value else {
        let why = if value.is_array() {
            "batches are not supported: send one message per line"
        } else {
            "a message must be a JSON object"
        };
        return Inbound::Reject(error_reply(None, ErrorCode::INVALID_REQUEST, why));
    };
    let id = obj.get("id").filter(|v| v.is_string() || v.is_number());
    let method = obj.get("method").and_then(Value::as_str);
    if method == Some(KEEPALIVE_METHOD) && id.is_none() {
        return Inbound::KeepAlive;
    }
    if method == Some(MCP_ONLY_METHOD) && id.is_none() {
        return Inbound::McpOnly;
    }
    if let (Some(id), Some(m)) = (id, method) {
        if m.starts_with(ADMIN_PREFIX) {
            return Inbound::Admin {
                id: id.clone(),
                method: m.to_string(),
                params: obj.get("params").cloned().unwrap_or(Value::Null),
            };
        }
    }
    if let Some(hot) = hot_request(&value) {
        return Inbound::Message(Box::new(hot));
    }
    let params = obj.get("params");
    match RxJsonRpcMessage::<RoleServer>::deserialize(&value) {
        Ok(JsonRpcMessage::Request(r)) => match (&r.request, method) {
            (ClientRequest::CustomRequest(_), Some(m)) if is_typed_method(m) => Inbound::Reject(
                error_reply(id, ErrorCode::INVALID_PARAMS, &params_problem(m, params)),
            ),
            _ => Inbound::Message(Box::new(JsonRpcMessage::Request(r))),
        },
        Ok(m) => Inbound::Message(Box::new(m)),
        // A request (it has an id and a method) whose params or envelope do not fit.
        Err(_) if id.is_some() && method.is_some_and(is_typed_method) => {
            let m = method.unwrap_or_default();
            Inbound::Reject(error_reply(
                id,
                ErrorCode::INVALID_PARAMS,
                &params_problem(m, params),
            ))
        }
        Err(e) if id.is_some() => Inbound::Reject(error_reply(
            id,
            ErrorCode::INVALID_REQUEST,
            &format!("invalid request: {e}"),
        )),
        // A notification nobody can answer, or a response to nothing: dropped, logged.
        Err(e) => {
            tracing::debug!(error = %e, "dropping a malformed notification");
            Inbound::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(i: Inbound) -> (i64, Value) {
        match i {
            Inbound::Reject(v) => (v["error"]["code"].as_i64().unwrap_or(0), v["id"].clone()),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn text_that_is_not_json_is_a_parse_error_with_a_null_id() {
        assert_eq!(code(classify(b"not json")), (-32700, Value::Null));
        assert_eq!(code(classify(b"{\"jsonrpc\":")), (-32700, Value::Null));
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing_but_deep_strings_are_fine() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(code(classify(deep.as_bytes())), (-32700, Value::Null));
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(!depth_exceeds(ok.as_bytes(), MAX_DEPTH));
        let in_string = format!("{{\"a\":\"{}\\\"{}\"}}", "[".repeat(500), "{".repeat(500));
        assert!(!depth_exceeds(in_string.as_bytes(), MAX_DEPTH));
    }

    #[test]
    fn malformed_tools_call_params_are_invalid_params_with_the_id() {
        for line in [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":5}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":"y"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
        ] {
            assert_eq!(
                code(classify(line.as_bytes())),
                (-32602, json!(7)),
                "{line}"
            );
        }
    }

    /// Every hot request reads as rmcp's own reading makes it; anything that does not read
    /// (a wrong id, version or params, a stray result) is left to that reading.
    #[test]
    fn hot_requests_read_as_rmcps_own_reading_makes_them() {
        let meta = r#""_meta":{"progressToken":3,"io.modelcontextprotocol/protocolVersion":"2026-07-28","stsd/console":true}"#;
        let read = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"n":[3,1.5,-4,18446744073709551615],"s":"x"}}}"#.to_string(),
            format!(r#"{{"jsonrpc":"2.0","id":"a-7","method":"tools/call","params":{{{meta},"name":"t"}}}}"#),
            format!(r#"{{"id":-9,"params":{{"name":"t","arguments":null,{meta}}},"method":"tools/call","jsonrpc":"2.0","extra":1}}"#),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","task":{"ttl":5}}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"c1"}}"#.to_string(),
            format!(r#"{{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{{{meta}}}}}"#),
            // rmcp reads a cursor that is not a string as no params at all.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":7}}"#.to_string(),
        ];
        for line in &read {
            let value: Value = serde_json::from_slice(line.as_bytes()).expect("json");
            let hot = hot_request(&value).unwrap_or_else(|| panic!("not read as hot: {line}"));
            let general =
                RxJsonRpcMessage::<RoleServer>::deserialize(&value).expect("rmcp reads it");
            assert_eq!(format!("{hot:?}"), format!("{general:?}"), "{line}");
            assert_eq!(
                serde_json::to_value(&hot).expect("hot"),
                serde_json::to_value(&general).expect("general"),
                "{line}"
            );
        }
        let left = [
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        ];
        for line in left {
            let value: Value = serde_json::from_slice(line.as_bytes()).expect("json");
            let general = RxJsonRpcMessage::<RoleServer>::deserialize(&value);
            assert!(hot_request(&value).is_none(), "{line}: {general:?}");
        }
    }

    #[test]
    fn batches_and_non_objects_are_invalid_requests() {
        assert_eq!(code(classify(b"[{\"a\":1}]")).0, -32600);
        assert_eq!(code(classify(b"42")).0, -32600);
    }

    #[test]
    fn well_formed_messages_pass_and_keepalives_are_recognised() {
        let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
        assert!(matches!(classify(list.as_bytes()), Inbound::Message(_)));
        let unknown = r#"{"jsonrpc":"2.0","id":1,"method":"no/such","params":{}}"#;
        assert!(matches!(classify(unknown.as_bytes()), Inbound::Message(_)));
        let admin = r#"{"jsonrpc":"2.0","id":3,"method":"stsd/approvals/list"}"#;
        assert!(matches!(classify(admin.as_bytes()), Inbound::Admin { .. }));
        let ka = r#"{"jsonrpc":"2.0","method":"stsd/keepalive"}"#;
        assert!(matches!(classify(ka.as_bytes()), Inbound::KeepAlive));
        let only = r#"{"jsonrpc":"2.0","method":"stsd/mcp-only"}"#;
        assert!(matches!(classify(only.as_bytes()), Inbound::McpOnly));
        assert!(matches!(classify(b"  \r"), Inbound::Nothing));
    }
}
