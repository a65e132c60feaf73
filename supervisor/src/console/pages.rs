//! The console's pages: each reads through admin methods as the person, and renders a
//! template (minijinja, HTML-escaped by default: a tool's description or an upstream's
//! prompt is text, never markup). The chips carry their label in text beside the colour.

use super::door::Door;
use super::reply::{html, json_reply, plain, redirect, Ask, Body};
use crate::policy::Action;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use minijinja::{context, Environment, Value as Jv};
use serde_json::{json, Value};

const NOT_ALLOWED: i32 = -32001;
const NO_SUCH: i32 = -32002;

pub struct Pages {
    env: Environment<'static>,
}

/// The templates, compiled into the binary.
const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("tools.html", include_str!("templates/tools.html")),
    ("tool.html", include_str!("templates/tool.html")),
    ("servers.html", include_str!("templates/servers.html")),
    ("preview.html", include_str!("templates/preview.html")),
    ("approvals.html", include_str!("templates/approvals.html")),
    ("ledger.html", include_str!("templates/ledger.html")),
    ("audit.html", include_str!("templates/audit.html")),
    ("inspector.html", include_str!("templates/inspector.html")),
];

/// Seed 001's MCP chip labels; the sandbox Risk Level (seed 000 §10.6) runs from "no
/// detected risk" to "escape-class allowed".
fn mcp_label(level: &str) -> &'static str {
    match level {
        "L0" => "Verified",
        "L1" => "Safe",
        "L2" => "Low",
        "L3" => "Moderate",
        "L4" => "High",
        "L5" => "Critical",
        _ => "Unknown",
    }
}

fn sandbox_label(level: &str) -> &'static str {
    match level {
        "L0" => "No detected risk",
        "L1" => "Minimal",
        "L2" => "Low",
        "L3" => "Moderate",
        "L4" => "High",
        "L5" => "Escape-class",
        _ => "Unknown",
    }
}

impl Pages {
    pub fn new() -> Result<Pages, String> {
        let mut env = Environment::new();
        for (name, text) in TEMPLATES {
            env.add_template(name, text)
                .map_err(|e| format!("console template {name}: {e}"))?;
        }
        env.add_filter("mcp_label", |l: String| mcp_label(&l).to_string());
        env.add_filter("sandbox_label", |l: String| sandbox_label(&l).to_string());
        env.add_filter("floor_chip", |f: String| {
            crate::gateway::floor_chip(&f)
                .unwrap_or(f.as_str())
                .to_string()
        });
        env.add_filter("json", |v: Jv| {
            serde_json::to_string_pretty(&v).unwrap_or_default()
        });
        Ok(Pages { env })
    }

    fn render(&self, name: &str, ctx: Jv) -> Response<Body> {
        match self.env.get_template(name).and_then(|t| t.render(ctx)) {
            Ok(body) => html(StatusCode::OK, body),
            Err(e) => {
                tracing::error!(error = %e, template = name, "console page failed");
                plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the page could not be made\n",
                )
            }
        }
    }

    pub fn login(&self, error: Option<&str>) -> Response<Body> {
        self.render("login.html", context! { error => error })
    }

    /// The context every page has.
    fn base(&self, c: &dyn Door, ask: &Ask, page: &str) -> Jv {
        let who = &ask.principal;
        context! {
            page => page,
            me => who.name,
            csrf => ask.csrf,
            may_admin => c.may(who, Action::Admin),
            may_approve => c.may(who, Action::Approve),
            may_read => c.may(who, Action::ReadAudit),
            notice => ask.fields.get("notice"),
        }
    }

    /// A page whose data could not be read: the reason, on the page's frame.
    fn refused(&self, c: &dyn Door, ask: &Ask, page: &str, e: (i32, String)) -> Response<Body> {
        let mut r = self.render(
            "base.html",
            context! { ..self.base(c, ask, page), ..context! { error => e.1 } },
        );
        match e.0 {
            NOT_ALLOWED => *r.status_mut() = StatusCode::FORBIDDEN,
            NO_SUCH => *r.status_mut() = StatusCode::NOT_FOUND,
            _ => {}
        }
        r
    }

    pub async fn get(&self, c: &dyn Door, path: &str, ask: &Ask) -> Response<Body> {
        match path {
            "/ui/tools" => self.tools(c, ask).await,
            "/ui/servers" => self.servers(c, ask).await,
            "/ui/preview" => self.preview(c, ask).await,
            "/ui/api/preview" => match preview_risk(c, ask).await {
                Ok(v) => json_reply(&v),
                Err(e) => json_reply(&json!({"error": e.1})),
            },
            "/ui/approvals" => self.approvals(c, ask).await,
            "/ui/ledger" => self.ledger(c, ask).await,
            "/ui/audit" => self.audit(c, ask).await,
            "/ui/inspector" => self.inspector(c, ask, None).await,
            p => match p.strip_prefix("/ui/tools/") {
                Some(name) => self.tool(c, ask, name).await,
                None => plain(StatusCode::NOT_FOUND, "no such page\n"),
            },
        }
    }

    pub async fn post(&self, c: &dyn Door, path: &str, ask: &Ask) -> Response<Body> {
        let field = |k: &str| ask.fields.get(k).cloned().unwrap_or_default();
        if path == "/ui/inspector" {
            return self.inspect(c, ask).await;
        }
        if let Some(id) = path
            .strip_prefix("/ui/servers/")
            .and_then(|r| r.strip_suffix("/expose"))
        {
            return self.expose(c, ask, id).await;
        }
        let (method, params, back) = if let Some(rest) = path.strip_prefix("/ui/tools/") {
            let (name, what) = rest.rsplit_once('/').unwrap_or((rest, ""));
            if what == "test" {
                let run = c
                    .act(&ask.principal, "stsd/tools/test", json!({"name": name}))
                    .await;
                return match run {
                    Ok(results) => self.tool_page(c, ask, name, results).await,
                    Err(e) => self.refused(c, ask, "tools", e),
                };
            }
            let method = match what {
                "enable" => "stsd/tools/enable",
                "disable" => "stsd/tools/disable",
                _ => return plain(StatusCode::NOT_FOUND, "no such action\n"),
            };
            (method, json!({"name": name}), "/ui/tools".to_string())
        } else if let Some(id) = path.strip_prefix("/ui/approvals/") {
            let Ok(id) = id.parse::<u64>() else {
                return plain(StatusCode::NOT_FOUND, "no such call\n");
            };
            let approve = field("decision") == "approve";
            (
                "stsd/approvals/decide",
                json!({"id": id, "approve": approve, "reason": field("reason")}),
                "/ui/approvals".to_string(),
            )
        } else if path == "/ui/ledger" {
            let method = match field("action").as_str() {
                "approve" => "stsd/ledger/approve",
                "revoke" => "stsd/ledger/revoke",
                _ => return plain(StatusCode::BAD_REQUEST, "action: approve or revoke\n"),
            };
            // The fingerprint the person reviewed: approved only if it is still the one.
            let mut params = json!({"id": field("id")});
            if !field("fingerprint").is_empty() {
                params["fingerprint"] = json!(field("fingerprint"));
            }
            (method, params, "/ui/ledger".to_string())
        } else {
            return plain(StatusCode::NOT_FOUND, "no such action\n");
        };
        match c.act(&ask.principal, method, params).await {
            Ok(_) => redirect(&format!("{back}?notice=done")),
            Err(e) => self.refused(c, ask, back.trim_start_matches("/ui/"), e),
        }
    }

    async fn tools(&self, c: &dyn Door, ask: &Ask) -> Response<Body> {
        let list = match c.call(&ask.principal, "stsd/tools/list", json!({})).await {
            Ok(v) => v,
            Err(e) => return self.refused(c, ask, "tools", e),
        };
        let mut tools: Vec<Value> = list["tools"].as_array().cloned().unwrap_or_default();
        tools.sort_by(|a, b| {
            (a["state"] != "WITHHELD", a["name"].as_str())
                .cmp(&(b["state"] != "WITHHELD", b["name"].as_str()))
        });
        self.render(
            "tools.html",
            context! { ..self.base(c, ask, "tools"), ..context! { tools => Jv::from_serialize(&tools) } },
        )
    }

    async fn tool(&self, c: &dyn Door, ask: &Ask, name: &str) -> Response<Body> {
        self.tool_page(c, ask, name, Value::Null).await
    }

    /// A tool's page, with the results of a test run when there was one.
    async fn tool_page(&self, c: &dyn Door, ask: &Ask, name: &str, tests: Value) -> Response<Body> {
        // Its last calls, when the person may read the audit.
        let calls = c
            .call(
                &ask.principal,
                "stsd/audit/list",
                json!({"tool": name, "limit": 10}),
            )
            .await
            .map(|v| {
                // The filter is a substring: this tool's own calls only.
                let own = v["records"].as_array().into_iter().flatten();
                Value::from(
                    own.filter(|r| r["name"] == name)
                        .cloned()
                        .collect::<Vec<_>>(),
                )
            })
            .unwrap_or(Value::Null);
        match c
            .call(&ask.principal, "stsd/tools/show", json!({"name": name}))
            .await
        {
            Ok(t) => self.render(
                "tool.html",
                context! { ..self.base(c, ask, "tools"), ..context! {
                    tool => Jv::from_serialize(&t), calls => Jv::from_serialize(&calls),
                    tests => Jv::from_serialize(&tests),
                } },
            ),
            Err(e) => self.refused(c, ask, "tools", e),
        }
    }

    async fn servers(&self, c: &dyn Door, ask: &Ask) -> Response<Body> {
        match c.call(&ask.principal, "stsd/upstream/list", json!({})).await {
            Ok(v) => self.render(
                "servers.html",
                context! { ..self.base(c, ask, "servers"), ..context! { upstreams => Jv::from_serialize(&v["upstreams"]) } },
            ),
            Err(e) => self.refused(c, ask, "servers", e),
        }
    }

    async fn preview(&self, c: &dyn Door, ask: &Ask) -> Response<Body> {
        let risk = if ask.fields.contains_key("url") || ask.fields.contains_key("command") {
            preview_risk(c, ask).await.ok()
        } else {
            None
        };
        let f = |k: &str| ask.fields.get(k).cloned().unwrap_or_default();
        self.render(
            "preview.html",
            context! { ..self.base(c, ask, "preview"), ..context! {
                risk => Jv::from_serialize(&risk),
                url => f("url"), command => f("command"), auth => f("auth"),
                trust => f("trust"), docs_url => f("docs_url"),
                docs_adequate => f("docs_adequate") == "true",
            } },
        )
    }

    async fn approvals(&self, c: &dyn Door, ask: &Ask) -> Response<Body> {
        match c
            .call(&ask.principal, "stsd/approvals/list", json!({}))
            .await
        {
            Ok(v) => self.render(
                "approvals.html",
                context! { ..self.base(c, ask, "approvals"), ..context! {
                    pending => Jv::from_serialize(&v["pending"]),
                    expired => Jv::from_serialize(&v["expired"]),
                } },
            ),
            Err(e) => self.refused(c, ask, "approvals", e),
        }
    }

    async fn ledger(&self, c: &dyn Door, ask: &Ask) -> Response<Body> {
        match c.call(&ask.principal, "stsd/ledger/list", json!({})).await {
            Ok(v) => {
                let mut entries = v["entries"].as_array().cloned().unwrap_or_default();
                // What needs a person first.
                entries.sort_by_key(|e| {
                    (
                        e["state"] != "AWAITING_REREVIEW",
                        e["id"].as_str().map(str::to_string),
                    )
                });
                for e in &mut entries {
                    if let (Some(old), Some(new)) =
                        (e.get("approvedObject"), e.get("pendingObject"))
                    {
                        e["diff"] = side_by_side(old, new);
                    }
                }
                self.render(
                    "ledger.html",
                    context! { ..self.base(c, ask, "ledger"), ..context! { entries => Jv::from_serialize(&entries) } },
                )
            }
            Err(e) => self.refused(c, ask, "ledger", e),
        }
    }

    async fn audit(&self, c: &dyn Door, ask: &Ask) -> Response<Body> {
        let f = |k: &str| ask.fields.get(k).cloned().unwrap_or_default();
        let params = json!({"tool": f("tool"), "principal": f("principal"), "outcome": f("outcome"), "limit": 200});
        match c.call(&ask.principal, "stsd/audit/list", params).await {
            Ok(v) => self.render(
                "audit.html",
                context! { ..self.base(c, ask, "audit"), ..context! {
                    records => Jv::from_serialize(&v["records"]),
                    after => v["end"].as_u64().unwrap_or(0),
                    tool => f("tool"), principal => f("principal"), outcome => f("outcome"),
                } },
            ),
            Err(e) => self.refused(c, ask, "audit", e),
        }
    }
}

impl Pages {
    /// The Inspector: a form made from the tool's inputSchema, and after a call its reply.
    async fn inspector(
        &self,
        c: &dyn Door,
        ask: &Ask,
        reply: Option<(Value, Value)>,
    ) -> Response<Body> {
        let name = ask.fields.get("tool").cloned().unwrap_or_default();
        let tools = match c.call(&ask.principal, "stsd/tools/list", json!({})).await {
            Ok(v) => v["tools"].as_array().cloned().unwrap_or_default(),
            Err(e) => return self.refused(c, ask, "inspector", e),
        };
        let names: Vec<&str> = tools
            .iter()
            .filter(|t| t["state"] == "ACTIVE")
            .filter_map(|t| t["name"].as_str())
            .collect();
        let tool = if name.is_empty() {
            Value::Null
        } else {
            match c
                .call(&ask.principal, "stsd/tools/show", json!({"name": name}))
                .await
            {
                Ok(t) => t,
                Err(e) => return self.refused(c, ask, "inspector", e),
            }
        };
        let fields = form_fields(&tool["inputSchema"]);
        let (args, result) = reply.unwrap_or((Value::Null, Value::Null));
        self.render(
            "inspector.html",
            context! { ..self.base(c, ask, "inspector"), ..context! {
                names => names, tool => Jv::from_serialize(&tool),
                fields => Jv::from_serialize(&fields), args => Jv::from_serialize(&args),
                result => Jv::from_serialize(&result),
            } },
        )
    }

    /// POST /ui/inspector: the form's values typed by the schema, then the call.
    async fn inspect(&self, c: &dyn Door, ask: &Ask) -> Response<Body> {
        let name = ask.fields.get("tool").cloned().unwrap_or_default();
        let tool = match c
            .call(&ask.principal, "stsd/tools/show", json!({"name": name}))
            .await
        {
            Ok(t) => t,
            Err(e) => return self.refused(c, ask, "inspector", e),
        };
        let mut args = serde_json::Map::new();
        for f in form_fields(&tool["inputSchema"]) {
            let key = format!("arg.{}", f["name"].as_str().unwrap_or_default());
            let raw = ask.fields.get(&key).cloned().unwrap_or_default();
            if raw.is_empty() && f["kind"] != "boolean" {
                continue;
            }
            let value = match f["kind"].as_str() {
                Some("boolean") => json!(raw == "true"),
                Some("number") => raw.parse::<f64>().map(|n| json!(n)).unwrap_or(json!(raw)),
                Some("integer") => raw.parse::<i64>().map(|n| json!(n)).unwrap_or(json!(raw)),
                Some("json") => serde_json::from_str(&raw).unwrap_or(json!(raw)),
                _ => json!(raw),
            };
            if let Some(n) = f["name"].as_str() {
                args.insert(n.to_string(), value);
            }
        }
        let result = c.run(&ask.principal, &name, args.clone()).await;
        self.inspector(c, ask, Some((Value::Object(args), result)))
            .await
    }
}

impl Pages {
    /// POST /ui/servers/ID/expose: the Expose Tools drawer, through `stsd/upstream/expose`
    /// (only the exposure changes; the entry's other fields and secrets stay in the daemon).
    async fn expose(&self, c: &dyn Door, ask: &Ask, id: &str) -> Response<Body> {
        let f = |k: String| {
            ask.fields
                .get(&k)
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let (mut exposed, mut all) = (Vec::new(), true);
        let (mut aliases, mut descriptions, mut approval) = (json!({}), json!({}), json!({}));
        for n in 0..ask.fields.len() {
            let name = f(format!("tool.{n}"));
            if name.is_empty() {
                continue;
            }
            if f(format!("expose.{n}")) == "true" {
                exposed.push(name.clone());
            } else {
                all = false;
            }
            aliases[&name] = json!(f(format!("alias.{n}")));
            descriptions[&name] = json!(f(format!("description.{n}")));
            // Checked: required. Unchecked: an explicit "no" stays one; otherwise the
            // upstream's default and the tool's annotations decide (never a silent "no").
            approval[&name] = match (
                f(format!("approval.{n}")).as_str(),
                f(format!("approval_was.{n}")).as_str(),
            ) {
                ("true", _) => json!(true),
                (_, "false") => json!(false),
                _ => Value::Null,
            };
        }
        let filtered = f("filtered".into()) == "true";
        let params = json!({
            "id": id,
            "tools": if all && !filtered { Value::Null } else { json!(exposed) },
            "aliases": aliases, "descriptions": descriptions, "approval": approval,
            "max_risk": match f("max_risk".into()) { r if r.is_empty() => Value::Null, r => json!(r) },
        });
        match c.act(&ask.principal, "stsd/upstream/expose", params).await {
            Ok(_) => redirect("/ui/servers?notice=done"),
            Err(e) => self.refused(c, ask, "servers", e),
        }
    }
}

/// The served object as approved and as it is now, line by line side by side: each row
/// `{old, new, kind}` with kind `same`, `removed`, `added` or `changed`.
fn side_by_side(old: &Value, new: &Value) -> Value {
    use similar::{DiffOp, TextDiff};
    let (a, b) = (
        serde_json::to_string_pretty(old).unwrap_or_default(),
        serde_json::to_string_pretty(new).unwrap_or_default(),
    );
    let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let diff = TextDiff::from_lines(&a, &b);
    let mut rows = Vec::new();
    let line = |l: &[&str], i: usize| l.get(i).copied().unwrap_or_default().to_string();
    for op in diff.ops() {
        match *op {
            DiffOp::Equal {
                old_index,
                new_index,
                len,
            } => {
                for k in 0..len {
                    rows.push(json!({"old": line(&al, old_index + k), "new": line(&bl, new_index + k), "kind": "same"}));
                }
            }
            DiffOp::Delete {
                old_index, old_len, ..
            } => {
                for k in 0..old_len {
                    rows.push(
                        json!({"old": line(&al, old_index + k), "new": "", "kind": "removed"}),
                    );
                }
            }
            DiffOp::Insert {
                new_index, new_len, ..
            } => {
                for k in 0..new_len {
                    rows.push(json!({"old": "", "new": line(&bl, new_index + k), "kind": "added"}));
                }
            }
            DiffOp::Replace {
                old_index,
                old_len,
                new_index,
                new_len,
            } => {
                for k in 0..old_len.max(new_len) {
                    let o = if k < old_len {
                        line(&al, old_index + k)
                    } else {
                        String::new()
                    };
                    let n = if k < new_len {
                        line(&bl, new_index + k)
                    } else {
                        String::new()
                    };
                    rows.push(json!({"old": o, "new": n, "kind": "changed"}));
                }
            }
        }
    }
    Value::from(rows)
}

/// The inputs of a form for `schema`'s properties: name, kind (string, number, integer,
/// boolean, or json for the rest), whether required, the description.
fn form_fields(schema: &Value) -> Vec<Value> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let Some(props) = schema["properties"].as_object() else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, p)| {
            let kind = p["type"]
                .as_str()
                .filter(|t| matches!(*t, "string" | "number" | "integer" | "boolean"))
                .unwrap_or("json");
            json!({"name": name, "kind": kind, "required": required.contains(&name.as_str()),
                   "description": p["description"]})
        })
        .collect()
}

/// The connection risk preview: the entry the form describes, scored from its configuration
/// alone (`stsd/upstream/preview`, the engine `stsd upstream check` uses).
async fn preview_risk(c: &dyn Door, ask: &Ask) -> Result<Value, (i32, String)> {
    let f = |k: &str| {
        ask.fields
            .get(k)
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let mut entry = json!({"id": "preview"});
    for key in ["url", "command", "auth", "trust", "docs_url"] {
        if let Some(v) = f(key) {
            entry[key] = json!(v);
        }
    }
    if let Some(v) = f("docs_adequate") {
        entry["docs_adequate"] = json!(v == "true" || v == "on");
    }
    c.call(
        &ask.principal,
        "stsd/upstream/preview",
        json!({"upstream": entry}),
    )
    .await
}

/// `/ui/static/...`: the stylesheet and the script, from the binary.
pub fn asset(file: &str) -> Response<Body> {
    let (body, kind): (&'static str, &'static str) = match file {
        "console.css" => (
            include_str!("static/console.css"),
            "text/css; charset=utf-8",
        ),
        "console.js" => (
            include_str!("static/console.js"),
            "text/javascript; charset=utf-8",
        ),
        _ => return plain(StatusCode::NOT_FOUND, "no such file\n"),
    };
    let mut r = Response::new(Full::new(bytes::Bytes::from_static(body.as_bytes())).boxed());
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=300"),
    );
    r
}
