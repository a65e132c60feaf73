//! The listing over the bundled examples: tools found by name as served, pages in the
//! catalog's order, and a caller's pass that leaves the policy's decision cache alone.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::{Action, Policy};
use stsd_profiles::baseline::Config;

fn listing(published: Published, policy: &Arc<Policy>) -> Arc<Listing> {
    Cache::default().get(Sources {
        published: Arc::new(published),
        exposed: None,
        own: true,
        policy: policy.clone(),
    })
}

fn names(tools: &[Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

#[test]
fn tools_are_found_by_name_and_the_first_of_a_name_served_twice_wins() {
    let mut published = crate::catalog::bundled_examples();
    let mut twin = published.tools[2].clone();
    twin.spec.description = "the second of its name".into();
    published.tools.push(twin);
    let order: Vec<String> = published
        .tools
        .iter()
        .map(|t| t.spec.name.clone())
        .collect();
    let policy = Arc::new(Policy::from_config(&Config::default()).unwrap());
    let l = listing(published, &policy);

    assert_eq!(l.len(), 5);
    for name in &order {
        assert_eq!(l.get(name).unwrap().name, name.as_str());
    }
    let first = l.get(&order[2]).unwrap();
    assert_ne!(first.description.as_deref(), Some("the second of its name"));
    assert!(l.get("no-such-tool").is_none());
    assert!(l.get("").is_none());

    // Pages of two, in the catalog's order, each cursor resuming after the last tool given.
    let who = Who::uid(1001, "unix");
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = l.page(&who, cursor.as_deref(), 2).unwrap();
        assert!(page.tools.len() <= 2);
        seen.extend(names(&page.tools));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, order);
    assert!(l.page(&who, Some("zz"), 2).is_err());
}

/// A list pass evaluates its decisions without the policy's cache: through it, a catalog
/// larger than the cache filled it with a decision per tool and then emptied it, calls'
/// decisions with it.
#[test]
fn a_list_pass_leaves_the_policys_decision_cache_alone() {
    let published = crate::catalog::bundled_examples();
    let policy = Arc::new(Policy::from_config(&Config::default()).unwrap());
    let who = Who::uid(1001, "unix");
    let call = ToolAttrs::own(&published.tools[0]);
    assert!(policy.decide(&who, Action::Call, Some(&call)).allowed);
    assert_eq!(policy.decisions_kept(), 1);

    let l = listing(published, &policy);
    let page = l.page(&who, None, 0).unwrap();
    assert_eq!(page.tools.len(), 4);
    assert_eq!(policy.decisions_kept(), 1);
}
