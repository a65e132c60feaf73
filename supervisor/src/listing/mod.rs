//! What `tools/list` serves. The served tools are gathered once per change (a publish, an
//! upstream's new list, a policy reload, an exposure change), not once per request; which
//! of them a caller may see is decided once per caller and change; and the list goes out in
//! pages of `[daemon] list_page_size` with an opaque cursor (MCP pagination: every page but
//! the last holds exactly that many tools). A page's MCP `Tool`s are made as it is served,
//! from the tool they show: a page held its clones of them anyway, and keeping every tool
//! made up front (with its policy attributes) was 1.9 KiB per served tool for nothing.
//!
//! [`Cache::get`] is the one entry point: it hands back the listing made from the sources it
//! is given, making a new one only when one of them is not the one the last listing was made
//! from (compared by identity: each source is an `Arc` replaced whole on change).

pub mod tool;

use crate::catalog::Published;
use crate::gateway::Exposed;
use crate::policy::{Policy, ToolAttrs, Who};
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

/// The served tools: stsd's own (in the catalog's order), then the wrapped ones. Nothing of
/// a tool is copied here: a listed tool is its position, its name, `Tool` and policy
/// attributes read from the sources when asked for (kept, they were about 1.9 KiB a tool).
pub struct Listing {
    from: Sources,
    /// How many of the listed tools are stsd's own (the first ones).
    own: usize,
    len: usize,
    /// Positions by name (the first position of a name served twice), for lookups by name.
    by_name: Vec<u32>,
    /// Per caller: the positions the policy lets it list.
    visible: Mutex<HashMap<CallerKey, Arc<[u32]>>>,
}

/// One page of `tools/list`.
pub struct Page {
    pub tools: Vec<Tool>,
    pub next_cursor: Option<String>,
}

impl Listing {
    fn new(from: Sources) -> Listing {
        let own = if from.own {
            from.published.tools.len()
        } else {
            0
        };
        let len = own + from.exposed.as_ref().map_or(0, |e| e.tools.len());
        let mut listing = Listing {
            from,
            own,
            len,
            by_name: Vec::new(),
            visible: Mutex::new(HashMap::new()),
        };
        // A stable sort: of two tools with one name, the first listed is found.
        let mut by_name: Vec<u32> = (0..len as u32).collect();
        by_name.sort_by(|&a, &b| listing.name(a as usize).cmp(listing.name(b as usize)));
        listing.by_name = by_name;
        listing
    }

    /// The position of the tool served as `name`.
    fn position(&self, name: &str) -> Option<usize> {
        let at = self
            .by_name
            .partition_point(|&i| self.name(i as usize) < name);
        let &i = self.by_name.get(at)?;
        (self.name(i as usize) == name).then_some(i as usize)
    }

    /// The name the tool at `i` is served as ("" past the end, which no caller asks for).
    fn name(&self, i: usize) -> &str {
        match self.source(i) {
            Some(Source::Own(t)) => &t.spec.name,
            Some(Source::Wrapped(t)) => &t.alias,
            None => "",
        }
    }

    fn source(&self, i: usize) -> Option<Source<'_>> {
        if i < self.own {
            return self.from.published.tools.get(i).map(Source::Own);
        }
        let e = self.from.exposed.as_ref()?;
        e.tools.get(i - self.own).map(Source::Wrapped)
    }

    /// A served tool by name, whoever asks (the HTTP transport's schema lookup).
    pub fn get(&self, name: &str) -> Option<Tool> {
        self.position(name).and_then(|i| self.tool(i))
    }

    /// The MCP `Tool` of the tool at `i`.
    fn tool(&self, i: usize) -> Option<Tool> {
        Some(match self.source(i)? {
            Source::Own(t) => tool::own(t),
            Source::Wrapped(t) => tool::wrapped(t),
        })
    }

    /// What the policy reads of the tool at `i`.
    fn attrs(&self, i: usize) -> Option<ToolAttrs> {
        Some(match self.source(i)? {
            Source::Own(t) => ToolAttrs::own(t),
            Source::Wrapped(t) => ToolAttrs::wrapped(t),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
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
            .filter_map(|&i| self.tool(i as usize))
            .collect();
        let next_cursor = (end < visible.len()).then(|| {
            let last = self.name(visible[end - 1] as usize);
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
            .position(&name)
            .and_then(|i| visible.binary_search(&(i as u32)).ok())
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
        // Not through the policy's decision cache (see `Policy::lister`): the set is kept
        // here. So a caller's first list after a change evaluates every tool afresh (about
        // 15 µs a tool with 100 policies), where the cache could answer from the last.
        let may_list = policy.lister(who);
        let v: Arc<[u32]> = (0..self.len)
            .filter(|&i| self.attrs(i).is_some_and(|a| may_list(&a)))
            .map(|i| i as u32)
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

/// Where a listed tool comes from.
enum Source<'a> {
    Own(&'a crate::catalog::PublishedTool),
    Wrapped(&'a crate::gateway::WrappedTool),
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

#[cfg(test)]
mod tests;
