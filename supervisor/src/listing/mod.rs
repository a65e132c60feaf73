//! What `tools/list` serves. The served tools become MCP `Tool`s once per change (a publish,
//! an upstream's new list, a policy reload, an exposure change), not once per request; which
//! of them a caller may see is decided once per caller and change; and the list goes out in
//! pages of `[daemon] list_page_size` with an opaque cursor (MCP pagination: every page but
//! the last holds exactly that many tools).
//!
//! [`Cache::get`] is the one entry point: it hands back the listing made from the sources it
//! is given, making a new one only when one of them is not the one the last listing was made
//! from (compared by identity: each source is an `Arc` replaced whole on change).

pub mod tool;

use crate::catalog::Published;
use crate::gateway::Exposed;
use crate::policy::{Action, Policy, ToolAttrs, Who};
use rmcp::model::Tool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a listing is made from.
#[derive(Clone)]
pub struct Sources {
    pub published: Arc<Published>,
    /// The gateway's wrapped tools, when the exposure serves them.
    pub exposed: Option<Arc<Exposed>>,
    /// Whether stsd's own tools are served (the exposure is not upstream-only).
    pub own: bool,
    pub policy: Arc<Policy>,
}

impl Sources {
    fn same(&self, other: &Sources) -> bool {
        Arc::ptr_eq(&self.published, &other.published)
            && match (&self.exposed, &other.exposed) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
            && self.own == other.own
            && Arc::ptr_eq(&self.policy, &other.policy)
    }
}

/// The last listing made, remade when its sources change.
#[derive(Default)]
pub struct Cache {
    current: Mutex<Option<Arc<Listing>>>,
}

impl Cache {
    pub fn get(&self, from: Sources) -> Arc<Listing> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match &*current {
            Some(l) if l.from.same(&from) => l.clone(),
            _ => {
                let fresh = Arc::new(Listing::new(from));
                *current = Some(fresh.clone());
                fresh
            }
        }
    }
}

/// Callers whose visible sets are kept per listing; past it the set is started over (a
/// caller's set is remade in one pass over the tools).
const CALLERS_KEPT: usize = 256;

/// The served tools, made once: stsd's own (in the catalog's order), then the wrapped ones.
pub struct Listing {
    from: Sources,
    tools: Vec<Entry>,
    by_name: HashMap<String, usize>,
    /// Per caller: the positions in `tools` the policy lets it list.
    visible: Mutex<HashMap<CallerKey, Arc<[u32]>>>,
}

struct Entry {
    tool: Tool,
    attrs: ToolAttrs,
}

/// One page of `tools/list`.
pub struct Page {
    pub tools: Vec<Tool>,
    pub next_cursor: Option<String>,
}

impl Listing {
    fn new(from: Sources) -> Listing {
        let mut tools = Vec::new();
        if from.own {
            tools.extend(from.published.tools.iter().map(|t| Entry {
                tool: tool::own(t),
                attrs: ToolAttrs::own(t),
            }));
        }
        if let Some(e) = &from.exposed {
            tools.extend(e.tools.iter().map(|t| Entry {
                tool: tool::wrapped(t),
                attrs: ToolAttrs::wrapped(t),
            }));
        }
        let mut by_name = HashMap::with_capacity(tools.len());
        for (i, e) in tools.iter().enumerate() {
            by_name.entry(e.attrs.name.clone()).or_insert(i);
        }
        Listing {
            from,
            tools,
            by_name,
            visible: Mutex::new(HashMap::new()),
        }
    }

    /// A served tool by name, whoever asks (the HTTP transport's schema lookup).
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.by_name.get(name).map(|&i| &self.tools[i].tool)
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Every served tool, whoever asks.
    pub fn all(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().map(|e| &e.tool)
    }

    /// The page of the tools `who` may list that `cursor` points at (the first page when
    /// none), of `size` tools (0: all of them in one page). Err: a cursor this daemon did not
    /// give out.
    pub fn page(&self, who: &Who, cursor: Option<&str>, size: usize) -> Result<Page, String> {
        let visible = self.visible_to(who);
        let start = match cursor {
            None | Some("") => 0,
            Some(c) => self.resume(&visible, c)?,
        };
        let end = if size == 0 {
            visible.len()
        } else {
            visible.len().min(start.saturating_add(size))
        };
        let tools = visible[start..end]
            .iter()
            .map(|&i| self.tools[i as usize].tool.clone())
            .collect();
        let next_cursor = (end < visible.len()).then(|| {
            let last = &self.tools[visible[end - 1] as usize].attrs.name;
            cursor::encode(end, last)
        });
        Ok(Page { tools, next_cursor })
    }

    /// Where the page after `cursor` starts in `visible`: right after the tool it names when
    /// that tool is still listed (tools published or removed between pages shift nothing
    /// else), else at the offset it carries (a `tools/list_changed` went out: the client
    /// lists again).
    fn resume(&self, visible: &[u32], c: &str) -> Result<usize, String> {
        let (offset, name) = cursor::decode(c).ok_or_else(|| "invalid cursor".to_string())?;
        let after = self
            .by_name
            .get(&name)
            .and_then(|&i| visible.binary_search(&(i as u32)).ok())
            .map(|p| p + 1);
        Ok(after.unwrap_or(offset).min(visible.len()))
    }

    fn visible_to(&self, who: &Who) -> Arc<[u32]> {
        // The groups are looked up per request: a uid that joins or leaves a Unix group
        // sees the list of its groups now, not of when its set was made.
        let policy = &self.from.policy;
        let key = CallerKey {
            who: who.clone(),
            groups: policy.groups_of(who),
        };
        if let Some(v) = self.kept().get(&key) {
            return v.clone();
        }
        // Decided without the lock held: other callers' lists are not held up meanwhile.
        let v: Arc<[u32]> = self
            .tools
            .iter()
            .enumerate()
            .filter(|(_, e)| policy.decide(who, Action::List, Some(&e.attrs)).allowed)
            .map(|(i, _)| i as u32)
            .collect();
        let mut kept = self.kept();
        if kept.len() >= CALLERS_KEPT {
            kept.clear();
        }
        kept.insert(key, v.clone());
        v
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, HashMap<CallerKey, Arc<[u32]>>> {
        self.visible.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Everything of a caller a list decision reads besides the tool and the policies.
#[derive(PartialEq, Eq, Hash)]
struct CallerKey {
    who: Who,
    groups: Vec<String>,
}

/// The cursor: the offset of the next page and the name of the last tool given, hex-coded
/// (opaque to clients, as MCP asks).
mod cursor {
    pub fn encode(offset: usize, last: &str) -> String {
        format!("{offset}:{last}")
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn decode(c: &str) -> Option<(usize, String)> {
        if !c.len().is_multiple_of(2) || c.len() > 2048 {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..c.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(c.get(i..i + 2)?, 16).ok())
            .collect();
        let text = String::from_utf8(bytes?).ok()?;
        let (offset, name) = text.split_once(':')?;
        Some((offset.parse().ok()?, name.to_string()))
    }
}
