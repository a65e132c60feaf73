//! `safety.parser`: csv (RFC 4180), xml (DTDs and so external entities refused) and yaml (a safe
//! loader: tags construct nothing, aliases are expanded within a node budget). Each returns
//! JSON text that the prelude hands to JSON.parse, so results are plain JS values.

use serde_json::{json, Map, Value};

/// Most nodes a yaml or xml document may expand to (aliases included): a billion-laughs
/// document fails fast instead of growing outside the engine's memory limit.
const MAX_NODES: usize = 1_000_000;
/// Deepest nesting of xml elements (yaml-rust2 has its own recursion limit).
const MAX_DEPTH: usize = 256;

pub fn csv(text: &str, header: bool, delimiter: &str) -> Result<String, String> {
    let delim = match delimiter.as_bytes() {
        [] => b',',
        [b, ..] if b.is_ascii() => *b,
        _ => return Err("the delimiter must be a single ASCII character".into()),
    };
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delim)
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut cells = 0usize;
    for r in rdr.records() {
        let r = r.map_err(|e| e.to_string())?;
        // Cells are Rust allocations outside the engine's heap limit: budget them.
        cells += r.len().max(1);
        if cells > MAX_NODES {
            return Err(format!("the document has more than {MAX_NODES} cells"));
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
            return Err(format!("the document has more than {MAX_NODES} cells"));
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

pub fn xml(text: &str) -> Result<String, String> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: false,
        nodes_limit: MAX_NODES as u32,
        // No resolver: with DTDs refused there are no external entities to resolve anyway.
        entity_resolver: None,
    };
    let doc = roxmltree::Document::parse_with_options(text, opts).map_err(|e| e.to_string())?;
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
    error: Option<String>,
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
    fn push_value(&mut self, v: Value, anchor: usize) {
        self.nodes += count(&v);
        if self.nodes > MAX_NODES {
            self.error = Some(format!(
                "the document expands to more than {MAX_NODES} nodes (aliases included)"
            ));
            return;
        }
        if anchor > 0 {
            // The anchor keeps a copy: it counts against the budget too.
            self.nodes += count(&v);
            if self.nodes > MAX_NODES {
                self.error = Some(format!(
                    "the document expands to more than {MAX_NODES} nodes (aliases included)"
                ));
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
                    })
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
            Event::Scalar(s, style, anchor, _tag) => self.push_value(scalar(s, style), anchor),
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
                    self.push_value(v, anchor);
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(v) => self.push_value(v, 0),
                None => self.error = Some(format!("unknown alias {id}")),
            },
            _ => {}
        }
    }
}

pub fn yaml(text: &str) -> Result<String, String> {
    let mut b = YamlBuilder {
        stack: Vec::new(),
        anchors: Default::default(),
        docs: Vec::new(),
        nodes: 0,
        error: None,
    };
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    parser.load(&mut b, true).map_err(|e| e.to_string())?;
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
        assert!(e.as_ref().is_err_and(|m| m.contains("more than")), "{e:?}");
    }

    #[test]
    fn deep_xml_and_wide_csv_are_refused_not_crashes() {
        let deep = format!("{}{}", "<a>".repeat(5000), "</a>".repeat(5000));
        assert!(xml(&deep).is_err_and(|e| e.contains("deeper")));
        let wide = format!("{}\n{}", vec!["h"; 100_000].join(","), "x\n".repeat(50));
        assert!(csv(&wide, true, ",").is_err_and(|e| e.contains("cells")));
    }
}
