//! `safety.parser`: csv (RFC 4180), xml (DTDs and so external entities refused) and yaml (a safe
//! loader: tags construct nothing, aliases are expanded within a node budget). Each returns
//! JSON text that the prelude hands to JSON.parse, so results are plain JS values.

use serde_json::{json, Map, Value};

/// Most nodes a yaml or xml document may expand to (aliases included): a billion-laughs
/// document fails fast instead of growing outside the engine's memory limit.
const MAX_NODES: usize = 1_000_000;
/// Deepest nesting of xml elements (yaml-rust2 has its own recursion limit).
const MAX_DEPTH: usize = 256;
/// What one node costs beyond its text, for the memory budget (a serde_json value and its
/// JSON text, roughly).
const NODE_BYTES: usize = 48;

/// Why a parse failed: the input is bad, or what it expands to would not fit the call's
/// memory budget (MEMORY_LIMIT, like the engine's own limit).
#[derive(Debug, PartialEq)]
pub enum Fail {
    Input(String),
    Memory(String),
}

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail::Input(s)
    }
}

fn over_budget(budget: usize) -> Fail {
    Fail::Memory(format!(
        "the result would take more than the call's memory limit of {} MiB",
        budget >> 20
    ))
}

pub fn csv(text: &str, header: bool, delimiter: &str) -> Result<String, Fail> {
    csv_within(text, header, delimiter, super::memory_budget())
}

pub fn csv_within(
    text: &str,
    header: bool,
    delimiter: &str,
    budget: usize,
) -> Result<String, Fail> {
    let delim = match delimiter.as_bytes() {
        [] => b',',
        [b, ..] if b.is_ascii() => *b,
        _ => {
            return Err(Fail::Input(
                "the delimiter must be a single ASCII character".into(),
            ))
        }
    };
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delim)
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut cells = 0usize;
    for r in rdr.records() {
        let r = r.map_err(|e| Fail::Input(e.to_string()))?;
        // Cells are Rust allocations outside the engine's heap limit: budget them.
        cells += r.len().max(1);
        if cells > MAX_NODES {
            return Err(Fail::Input(format!(
                "the document has more than {MAX_NODES} cells"
            )));
        }
        // Commons CSV's DEFAULT format skips empty lines.
        if r.len() == 1 && r.get(0).is_some_and(str::is_empty) {
            continue;
        }
        rows.push(r.iter().map(str::to_string).collect());
    }
    let out = if header {
        let mut it = rows.into_iter();
        let head = it.next().unwrap_or_default();
        // Each row becomes an object with every header key, whatever its own length.
        if head.len().saturating_mul(it.len()) > MAX_NODES {
            return Err(Fail::Input(format!(
                "the document has more than {MAX_NODES} cells"
            )));
        }
        // Every row repeats every key: a wide header times many rows is the real size.
        let keys: usize = head.iter().map(|h| h.len() + NODE_BYTES).sum();
        let body = text.len().saturating_mul(2);
        if keys.saturating_mul(it.len()).saturating_add(body) > budget {
            return Err(over_budget(budget));
        }
        Value::Array(
            it.map(|row| {
                let mut o = Map::new();
                for (i, h) in head.iter().enumerate() {
                    o.insert(
                        h.clone(),
                        Value::String(row.get(i).cloned().unwrap_or_default()),
                    );
                }
                Value::Object(o)
            })
            .collect(),
        )
    } else {
        json!(rows)
    };
    Ok(out.to_string())
}

/// What one xml element costs on the host while it is turned into JSON (its DOM node, its
/// map of name, attributes, text and children, and its JSON text), measured at about 1 KiB.
const XML_NODE_BYTES: usize = 1024;

pub fn xml(text: &str) -> Result<String, Fail> {
    xml_within(text, super::memory_budget())
}

pub fn xml_within(text: &str, budget: usize) -> Result<String, Fail> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: false,
        nodes_limit: MAX_NODES as u32,
        // No resolver: with DTDs refused there are no external entities to resolve anyway.
        entity_resolver: None,
    };
    let doc = roxmltree::Document::parse_with_options(text, opts)
        .map_err(|e| Fail::Input(e.to_string()))?;
    let elements = doc.descendants().filter(|n| n.is_element()).count();
    if elements
        .saturating_mul(XML_NODE_BYTES)
        .saturating_add(text.len().saturating_mul(4))
        > budget
    {
        return Err(over_budget(budget));
    }
    // The name as written (`prefix:local`): the reference parser is not namespace-aware.
    fn qname(node: roxmltree::Node<'_, '_>, name: roxmltree::ExpandedName<'_, '_>) -> String {
        match name.namespace().and_then(|ns| node.lookup_prefix(ns)) {
            Some(p) if !p.is_empty() => format!("{p}:{}", name.name()),
            _ => name.name().to_string(),
        }
    }
    fn element(node: roxmltree::Node<'_, '_>, depth: usize) -> Result<Value, String> {
        // Building and later serialising the tree recurses; a deep document must not overflow
        // the worker's stack.
        if depth > MAX_DEPTH {
            return Err(format!(
                "the document nests deeper than {MAX_DEPTH} elements"
            ));
        }
        let mut attrs = Map::new();
        for a in node.attributes() {
            let name = match a.namespace().and_then(|ns| node.lookup_prefix(ns)) {
                Some(p) if !p.is_empty() => format!("{p}:{}", a.name()),
                _ => a.name().to_string(),
            };
            attrs.insert(name, Value::String(a.value().to_string()));
        }
        let text: String = node
            .children()
            .filter(|c| c.is_text())
            .filter_map(|c| c.text())
            .collect();
        let children = node
            .children()
            .filter(|c| c.is_element())
            .map(|c| element(c, depth + 1))
            .collect::<Result<Vec<Value>, String>>()?;
        Ok(
            json!({"tag": qname(node, node.tag_name()), "attrs": attrs, "text": text.trim(), "children": children}),
        )
    }
    Ok(element(doc.root_element(), 1)?.to_string())
}

/// Builds JSON from yaml events. Tags are ignored (nothing is constructed from them); anchors
/// are remembered and aliases copied, every copied node counted against the budget.
struct YamlBuilder {
    stack: Vec<(Value, Option<String>, usize)>, // container, pending map key, anchor
    anchors: std::collections::HashMap<usize, Value>,
    docs: Vec<Value>,
    nodes: usize,
    /// Bytes the result holds so far (text of every string and key, plus a per-node cost),
    /// aliases counted at every copy.
    bytes: usize,
    budget: usize,
    error: Option<Fail>,
}

fn weight(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + NODE_BYTES,
        Value::Array(a) => NODE_BYTES + a.iter().map(weight).sum::<usize>(),
        Value::Object(o) => NODE_BYTES + o.iter().map(|(k, x)| k.len() + weight(x)).sum::<usize>(),
        _ => NODE_BYTES,
    }
}

fn count(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(count).sum::<usize>(),
        Value::Object(o) => 1 + o.values().map(count).sum::<usize>(),
        _ => 1,
    }
}

fn scalar(s: String, style: yaml_rust2::scanner::TScalarStyle) -> Value {
    use yaml_rust2::scanner::TScalarStyle;
    if style != TScalarStyle::Plain {
        return Value::String(s);
    }
    match s.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ => {
            if let Ok(i) = s.parse::<i64>() {
                Value::from(i)
            } else if let Some(f) = s
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .and_then(serde_json::Number::from_f64)
            {
                Value::Number(f)
            } else {
                Value::String(s)
            }
        }
    }
}

impl YamlBuilder {
    fn push_value(&mut self, v: Value, anchor: usize, copied: bool) {
        self.nodes += count(&v);
        if self.nodes > MAX_NODES {
            self.error = Some(Fail::Input(format!(
                "the document expands to more than {MAX_NODES} nodes (aliases included)"
            )));
            return;
        }
        // A scalar or a copied alias adds its whole weight; a closed container only itself
        // (its children were added as they came).
        self.bytes = self.bytes.saturating_add(match (&v, copied) {
            (_, true) | (Value::String(_), _) => weight(&v),
            _ => NODE_BYTES,
        });
        if self.bytes > self.budget {
            self.error = Some(over_budget(self.budget));
            return;
        }
        if anchor > 0 {
            // The anchor keeps a copy: it counts against the budget too.
            self.nodes += count(&v);
            if self.nodes > MAX_NODES {
                self.error = Some(Fail::Input(format!(
                    "the document expands to more than {MAX_NODES} nodes (aliases included)"
                )));
                return;
            }
            self.bytes = self.bytes.saturating_add(weight(&v));
            if self.bytes > self.budget {
                self.error = Some(over_budget(self.budget));
                return;
            }
            self.anchors.insert(anchor, v.clone());
        }
        match self.stack.last_mut() {
            None => self.docs.push(v),
            Some((Value::Array(a), _, _)) => a.push(v),
            Some((Value::Object(o), key, _)) => match key.take() {
                None => {
                    *key = Some(match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    });
                    if let Some(k) = key {
                        self.bytes = self.bytes.saturating_add(k.len());
                    }
                }
                Some(k) => {
                    o.insert(k, v);
                }
            },
            Some(_) => {}
        }
    }
}

impl yaml_rust2::parser::EventReceiver for YamlBuilder {
    fn on_event(&mut self, ev: yaml_rust2::parser::Event) {
        use yaml_rust2::parser::Event;
        if self.error.is_some() {
            return;
        }
        match ev {
            Event::Scalar(s, style, anchor, _tag) => {
                self.push_value(scalar(s, style), anchor, false)
            }
            Event::SequenceStart(anchor, _) => {
                self.stack.push((Value::Array(Vec::new()), None, anchor))
            }
            Event::MappingStart(anchor, _) => {
                self.stack.push((Value::Object(Map::new()), None, anchor))
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((v, _, anchor)) = self.stack.pop() {
                    // Its children were counted already; count the container itself.
                    self.nodes = self.nodes.saturating_sub(count(&v) - 1);
                    self.push_value(v, anchor, false);
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(v) => self.push_value(v, 0, true),
                None => self.error = Some(Fail::Input(format!("unknown alias {id}"))),
            },
            _ => {}
        }
    }
}

pub fn yaml(text: &str) -> Result<String, Fail> {
    yaml_within(text, super::memory_budget())
}

pub fn yaml_within(text: &str, budget: usize) -> Result<String, Fail> {
    let mut b = YamlBuilder {
        stack: Vec::new(),
        anchors: Default::default(),
        docs: Vec::new(),
        nodes: 0,
        bytes: 0,
        budget,
        error: None,
    };
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    parser
        .load(&mut b, true)
        .map_err(|e| Fail::Input(e.to_string()))?;
    if let Some(e) = b.error {
        return Err(e);
    }
    Ok(match b.docs.len() {
        0 => Value::Null,
        1 => b.docs.remove(0),
        _ => Value::Array(b.docs),
    }
    .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_and_without_header() {
        assert_eq!(
            csv("a,b\n1,\"x,y\"\n\n2,3", true, ","),
            Ok(r#"[{"a":"1","b":"x,y"},{"a":"2","b":"3"}]"#.into())
        );
        assert_eq!(
            csv("1;2\n3;4", false, ";"),
            Ok(r#"[["1","2"],["3","4"]]"#.into())
        );
    }

    #[test]
    fn xml_shape_and_refused_dtd() {
        let v =
            xml(r#"<feed xmlns:a="urn:x"><a:entry id="1"> hi <![CDATA[there]]></a:entry></feed>"#)
                .unwrap_or_default();
        assert_eq!(
            v,
            r#"{"tag":"feed","attrs":{},"text":"","children":[{"tag":"a:entry","attrs":{"id":"1"},"text":"hi there","children":[]}]}"#
        );
        let laughs = r#"<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;">]><l>&b;</l>"#;
        assert!(xml(laughs).is_err());
        let xxe = r#"<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><d>&x;</d>"#;
        assert!(xml(xxe).is_err());
    }

    #[test]
    fn yaml_is_safe_and_bounded() {
        assert_eq!(
            yaml("a: 1\nb: [x, true, ~]\n").unwrap_or_default(),
            r#"{"a":1,"b":["x",true,null]}"#
        );
        // A tag that would construct an object elsewhere is only data here.
        assert_eq!(
            yaml("x: !!python/object:os.system ls\n").unwrap_or_default(),
            r#"{"x":"ls"}"#
        );
        let mut laughs = String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        let mut prev = 'a';
        for c in 'b'..='j' {
            laughs.push_str(&format!(
                "{c}: &{c} [{}]\n",
                vec![format!("*{prev}"); 10].join(",")
            ));
            prev = c;
        }
        let e = yaml(&laughs);
        assert!(
            matches!(&e, Err(Fail::Input(m)) if m.contains("more than")),
            "{e:?}"
        );
    }

    #[test]
    fn aliases_of_a_large_anchor_and_wide_headers_hit_the_memory_budget() {
        // 250 aliases of a 4 MB string: few nodes, 1 GB of text.
        let big = "x".repeat(4 << 20);
        let doc = format!("a: &a \"{big}\"\nb: [{}]\n", vec!["*a"; 250].join(","));
        let e = yaml_within(&doc, 128 << 20);
        assert!(
            matches!(&e, Err(Fail::Memory(_))),
            "{:?}",
            e.as_ref().map(|s| s.len())
        );
        // Under the budget the same shape works.
        let small = format!("a: &a \"xyz\"\nb: [{}]\n", vec!["*a"; 250].join(","));
        assert!(yaml_within(&small, 128 << 20).is_ok());
        // 200 header keys of 10 KB each over 100 rows: every row repeats every key.
        let head: Vec<String> = (0..200)
            .map(|i| format!("{i}{}", "k".repeat(10_000)))
            .collect();
        let csv_text = format!("{}\n{}", head.join(","), "1\n".repeat(100));
        let e = csv_within(&csv_text, true, ",", 128 << 20);
        assert!(
            matches!(&e, Err(Fail::Memory(_))),
            "{:?}",
            e.as_ref().map(|s| s.len())
        );
        assert!(csv_within(&csv_text, false, ",", 128 << 20).is_ok());
        // 400,000 small elements: about 400 MiB on the host.
        let many = format!(
            "<r>{}</r>",
            "<p a=\"1\"><b>x</b><i>y</i></p>".repeat(100_000)
        );
        assert!(matches!(xml_within(&many, 128 << 20), Err(Fail::Memory(_))));
        assert!(xml_within(&many, 1 << 30).is_ok());
    }

    #[test]
    fn deep_xml_and_wide_csv_are_refused_not_crashes() {
        let deep = format!("{}{}", "<a>".repeat(5000), "</a>".repeat(5000));
        assert!(matches!(xml(&deep), Err(Fail::Input(e)) if e.contains("deeper")));
        let wide = format!("{}\n{}", vec!["h"; 100_000].join(","), "x\n".repeat(50));
        assert!(matches!(csv(&wide, true, ","), Err(Fail::Input(e)) if e.contains("cells")));
    }
}
