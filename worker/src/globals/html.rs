//! `safety.parser.html`: an HTML5 document (html5ever via scraper) with CSS selectors, held on
//! the host side; JavaScript gets numeric handles and a jsoup-like API (prelude.js), covering
//! the calls the reference catalog makes: select, remove, first, size, get, text, attr
//! (including `abs:`), title, body, after, append.

use rquickjs::{Ctx, Exception, Function, Object};
use scraper::{ElementRef, Html, Node, Selector};
use std::cell::RefCell;
use std::rc::Rc;

/// Largest document accepted, and most handles one call may hold: documents live outside the
/// engine's heap limit.
const MAX_HTML_BYTES: usize = 16 * 1024 * 1024;
const MAX_HANDLES: usize = 1_000_000;

#[derive(Default)]
struct State {
    docs: Vec<Html>,
    handles: Vec<(usize, ego_tree::NodeId)>,
    /// HTML parsed or inserted so far in this context: documents live outside the engine's
    /// heap limit, so their total is budgeted.
    bytes: usize,
}

/// Host memory a parsed HTML document takes per byte of markup (measured: 15 MB of tag-dense
/// markup reached about 460 MiB; text-heavy pages take less).
const HTML_HOST_FACTOR: usize = 16;

/// Total HTML one call may parse and insert.
const MAX_TOTAL_HTML_BYTES: usize = 32 * 1024 * 1024;

fn invalid(ctx: &Ctx<'_>, msg: impl AsRef<str>) -> rquickjs::Error {
    Exception::throw_message(
        ctx,
        &format!("INVALID_INPUT: safety.parser.html: {}", msg.as_ref()),
    )
}

impl State {
    fn charge(&mut self, ctx: &Ctx<'_>, bytes: usize) -> rquickjs::Result<()> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > MAX_TOTAL_HTML_BYTES {
            return Err(invalid(
                ctx,
                format!("more than {MAX_TOTAL_HTML_BYTES} bytes of HTML in one call"),
            ));
        }
        // The documents live on the host, outside the engine's heap: they are charged to the
        // call's memory budget at what tag-dense markup measures (HTML_HOST_FACTOR per byte).
        let budget = super::memory_budget();
        if self.bytes.saturating_mul(HTML_HOST_FACTOR) > budget {
            return Err(super::helper_error(
                ctx,
                "MEMORY_LIMIT",
                format!(
                    "safety.parser.html: {} bytes of HTML take about {} MiB on the host, over the call's memory limit of {} MiB",
                    self.bytes,
                    self.bytes.saturating_mul(HTML_HOST_FACTOR) >> 20,
                    budget >> 20
                ),
            ));
        }
        Ok(())
    }

    fn handle(&mut self, ctx: &Ctx<'_>, doc: usize, id: ego_tree::NodeId) -> rquickjs::Result<u32> {
        if self.handles.len() >= MAX_HANDLES {
            return Err(invalid(ctx, "too many elements held at once"));
        }
        self.handles.push((doc, id));
        Ok((self.handles.len() - 1) as u32)
    }

    /// Applies `f` to the element behind a handle (None when it is not an element).
    fn with_element<R>(
        &self,
        ctx: &Ctx<'_>,
        h: u32,
        f: impl FnOnce(ElementRef<'_>) -> R,
    ) -> rquickjs::Result<Option<R>> {
        let (d, id) = self.get(ctx, h)?;
        Ok(self.docs[d].tree.get(id).and_then(ElementRef::wrap).map(f))
    }

    fn get(&self, ctx: &Ctx<'_>, h: u32) -> rquickjs::Result<(usize, ego_tree::NodeId)> {
        self.handles
            .get(h as usize)
            .copied()
            .ok_or_else(|| invalid(ctx, "stale element handle"))
    }
}

const BLOCK: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "td",
    "th",
    "tr",
    "ul",
    "title",
];

/// Text as jsoup gives it: text nodes in order, block boundaries as spaces, whitespace runs
/// collapsed, trimmed.
fn text_of(el: ElementRef<'_>) -> String {
    let mut out = String::new();
    for edge in el.traverse() {
        match edge {
            ego_tree::iter::Edge::Open(n) => match n.value() {
                Node::Text(t) => out.push_str(t),
                Node::Element(e) if BLOCK.contains(&e.name()) => out.push(' '),
                _ => {}
            },
            ego_tree::iter::Edge::Close(n) => {
                if let Node::Element(e) = n.value() {
                    if BLOCK.contains(&e.name()) {
                        out.push(' ');
                    }
                }
            }
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Copies a parsed fragment's nodes into `tree`, under `parent` (append) or after `sibling`.
fn graft(tree: &mut ego_tree::Tree<Node>, target: ego_tree::NodeId, fragment: &Html, after: bool) {
    fn copy_children(
        tree: &mut ego_tree::Tree<Node>,
        parent: ego_tree::NodeId,
        src: ego_tree::NodeRef<'_, Node>,
    ) {
        for child in src.children() {
            let id = match tree.get_mut(parent) {
                Some(mut p) => p.append(child.value().clone()).id(),
                None => return,
            };
            copy_children(tree, id, child);
        }
    }
    let root = fragment.root_element();
    let mut cursor = target;
    for child in root.children() {
        let id = match tree.get_mut(if after { cursor } else { target }) {
            Some(mut n) if after => n.insert_after(child.value().clone()).id(),
            Some(mut n) => n.append(child.value().clone()).id(),
            None => return,
        };
        copy_children(tree, id, child);
        cursor = id;
    }
}

pub fn host_object<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
    let o = Object::new(ctx.clone())?;
    let st = Rc::new(RefCell::new(State::default()));
    macro_rules! f {
        ($name:expr, $make:expr) => {{
            let st = st.clone();
            #[allow(clippy::redundant_closure_call)]
            o.set($name, Function::new(ctx.clone(), $make(st))?)?;
        }};
    }
    type S = Rc<RefCell<State>>;
    f!("parse", |st: S| move |ctx: Ctx<'js>,
                              text: String|
          -> rquickjs::Result<u32> {
        if text.len() > MAX_HTML_BYTES {
            return Err(invalid(
                &ctx,
                format!(
                    "document is {} bytes, over the {MAX_HTML_BYTES} byte limit",
                    text.len()
                ),
            ));
        }
        st.borrow_mut().charge(&ctx, text.len())?;
        let doc = Html::parse_document(&text);
        let root = doc.root_element().id();
        let mut s = st.borrow_mut();
        s.docs.push(doc);
        let d = s.docs.len() - 1;
        s.handle(&ctx, d, root)
    });
    f!("select", |st: S| move |ctx: Ctx<'js>,
                               h: u32,
                               css: String|
          -> rquickjs::Result<Vec<u32>> {
        let sel = Selector::parse(&css)
            .map_err(|e| invalid(&ctx, format!("bad selector {css:?}: {e}")))?;
        let mut s = st.borrow_mut();
        let (d, id) = s.get(&ctx, h)?;
        let ids: Vec<ego_tree::NodeId> = {
            let node = s.docs[d]
                .tree
                .get(id)
                .ok_or_else(|| invalid(&ctx, "element is gone"))?;
            match ElementRef::wrap(node) {
                // jsoup's select includes the element itself when it matches.
                Some(el) => std::iter::once(el)
                    .filter(|e| sel.matches(e))
                    .chain(el.select(&sel))
                    .map(|e| e.id())
                    .collect(),
                None => Vec::new(),
            }
        };
        ids.into_iter().map(|i| s.handle(&ctx, d, i)).collect()
    });
    f!("text", |st: S| move |ctx: Ctx<'js>,
                             h: u32|
          -> rquickjs::Result<String> {
        Ok(st
            .borrow()
            .with_element(&ctx, h, text_of)?
            .unwrap_or_default())
    });
    f!("attr", |st: S| move |ctx: Ctx<'js>,
                             h: u32,
                             name: String|
          -> rquickjs::Result<String> {
        let value = st
            .borrow()
            .with_element(&ctx, h, |el| match name.strip_prefix("abs:") {
                // No base URI: an absolute URL stays as it is, a relative one resolves to "".
                Some(n) => el
                    .attr(n)
                    .filter(|v| url::Url::parse(v).is_ok())
                    .unwrap_or("")
                    .to_string(),
                None => el.attr(&name).unwrap_or("").to_string(),
            })?;
        Ok(value.unwrap_or_default())
    });
    f!("hasAttr", |st: S| move |ctx: Ctx<'js>,
                                h: u32,
                                name: String|
          -> rquickjs::Result<bool> {
        Ok(st
            .borrow()
            .with_element(&ctx, h, |e| e.attr(&name).is_some())?
            .unwrap_or(false))
    });
    f!("tag", |st: S| move |ctx: Ctx<'js>,
                            h: u32|
          -> rquickjs::Result<String> {
        Ok(st
            .borrow()
            .with_element(&ctx, h, |e| e.value().name().to_string())?
            .unwrap_or_default())
    });
    f!("html", |st: S| move |ctx: Ctx<'js>,
                             h: u32,
                             outer: bool|
          -> rquickjs::Result<String> {
        let html =
            st.borrow()
                .with_element(&ctx, h, |e| if outer { e.html() } else { e.inner_html() })?;
        Ok(html.unwrap_or_default())
    });
    f!("remove", |st: S| move |ctx: Ctx<'js>,
                               h: u32|
          -> rquickjs::Result<()> {
        let mut s = st.borrow_mut();
        let (d, id) = s.get(&ctx, h)?;
        if let Some(mut n) = s.docs[d].tree.get_mut(id) {
            n.detach();
        }
        Ok(())
    });
    f!("insert", |st: S| move |ctx: Ctx<'js>,
                               h: u32,
                               html: String,
                               after: bool|
          -> rquickjs::Result<()> {
        if html.len() > MAX_HTML_BYTES {
            return Err(invalid(&ctx, "fragment too large"));
        }
        st.borrow_mut().charge(&ctx, html.len())?;
        let fragment = Html::parse_fragment(&html);
        let mut s = st.borrow_mut();
        let (d, id) = s.get(&ctx, h)?;
        graft(&mut s.docs[d].tree, id, &fragment, after);
        Ok(())
    });
    f!("children", |st: S| move |ctx: Ctx<'js>,
                                 h: u32|
          -> rquickjs::Result<Vec<u32>> {
        let mut s = st.borrow_mut();
        let (d, id) = s.get(&ctx, h)?;
        let ids: Vec<ego_tree::NodeId> = s.docs[d]
            .tree
            .get(id)
            .map(|n| {
                n.children()
                    .filter(|c| c.value().is_element())
                    .map(|c| c.id())
                    .collect()
            })
            .unwrap_or_default();
        ids.into_iter().map(|i| s.handle(&ctx, d, i)).collect()
    });
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_whitespace_normalised_with_block_breaks() {
        let doc = Html::parse_document("<body><p>a  b</p><p>c<b>d</b></p>\n<div>e</div></body>");
        assert_eq!(text_of(doc.root_element()), "a b cd e");
    }

    #[test]
    fn graft_after_and_append() {
        let mut doc = Html::parse_document("<body><p id=x>1</p></body>");
        let sel = Selector::parse("#x").unwrap_or_else(|_| unreachable!());
        let id = doc
            .select(&sel)
            .next()
            .map(|e| e.id())
            .unwrap_or_else(|| unreachable!());
        graft(
            &mut doc.tree,
            id,
            &Html::parse_fragment("<i>2</i><i>3</i>"),
            true,
        );
        graft(&mut doc.tree, id, &Html::parse_fragment("<b>0</b>"), false);
        let body = Selector::parse("body").unwrap_or_else(|_| unreachable!());
        let html = doc
            .select(&body)
            .next()
            .map(|b| b.inner_html())
            .unwrap_or_default();
        assert_eq!(html, r#"<p id="x">1<b>0</b></p><i>2</i><i>3</i>"#);
    }
}
