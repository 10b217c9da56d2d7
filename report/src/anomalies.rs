//! What the report shows of `results.json`: the first entries of each anomaly type, the ops each
//! entry names as proof, and the partition offsets it is about. Entries are read generically
//! (by the field names `docs/history-format.md` and the checkers use), so a new anomaly type shows up
//! with its links without changes here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tidemark_checkers::Results;

/// Entries shown per anomaly type; the rest are counted on the page and are in `results.json`.
pub const MAX_SHOWN: usize = 50;

/// A partition: cluster (empty when the run has no cluster names), topic, partition.
pub type PartKey = (String, String, i64);

/// One anomaly type as shown.
pub struct Kind {
    pub name: String,
    /// Forbidden by the test's guarantees (makes the run invalid).
    pub bad: bool,
    /// Why it is allowed, when it is.
    pub allowed: Option<String>,
    /// How many the checkers found.
    pub count: u64,
    pub entries: Vec<Entry>,
}

/// One anomaly entry as shown.
pub struct Entry {
    pub json: Value,
    /// Op indices the entry names as proof, in the order named.
    pub ops: Vec<u64>,
    /// The partitions and offsets it is about (offset `None` when unknown).
    pub places: Vec<(PartKey, Option<i64>)>,
}

/// Keys whose integer value is the index of an op in the history.
const OP_KEYS: [&str; 5] = ["op_index", "invoke_index", "seen_by_poll", "send", "poll"];

impl Entry {
    fn new(json: Value, default_cluster: &str) -> Self {
        let mut ops = Vec::new();
        collect_ops(&json, &mut ops);
        let mut places = Vec::new();
        collect_places(&json, default_cluster, None, None, &mut places);
        Entry { json, ops, places }
    }

    /// One line naming where the anomaly is, for the entry's heading.
    pub fn headline(&self) -> String {
        let j = &self.json;
        let mut parts = Vec::new();
        if let Some(((c, t, p), _)) = self.places.first() {
            parts.push(if c.is_empty() {
                format!("{t}/{p}")
            } else {
                format!("{c}:{t}/{p}")
            });
        }
        for key in ["offset", "value", "epoch", "high_watermark"] {
            if let Some(v) = j.get(key).filter(|v| !v.is_null()) {
                parts.push(format!("{key} {v}"));
            }
        }
        if let Some(w) = j.get("why").and_then(Value::as_str) {
            parts.push(w.to_owned());
        }
        parts.join(", ")
    }
}

fn collect_ops(v: &Value, out: &mut Vec<u64>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match v.as_u64() {
                    Some(i) if OP_KEYS.contains(&k.as_str()) => {
                        if !out.contains(&i) {
                            out.push(i);
                        }
                    }
                    _ => collect_ops(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_ops(v, out)),
        _ => {}
    }
}

/// Finds every object naming a topic and partition, with the offsets it names. An object
/// without a topic inherits its parent's (e.g. the replicas of a divergence entry).
fn collect_places(
    v: &Value,
    default_cluster: &str,
    parent: Option<&PartKey>,
    parent_offset: Option<i64>,
    out: &mut Vec<(PartKey, Option<i64>)>,
) {
    let Value::Object(m) = v else {
        if let Value::Array(a) = v {
            for x in a {
                collect_places(x, default_cluster, parent, parent_offset, out);
            }
        }
        return;
    };
    let offset = m.get("offset").and_then(Value::as_i64).or(parent_offset);
    let own = match (m.get("topic").and_then(Value::as_str), m.get("partition")) {
        (Some(t), Some(p)) if p.is_i64() => {
            let c = m
                .get("cluster")
                .and_then(Value::as_str)
                .unwrap_or(default_cluster);
            Some((c.to_owned(), t.to_owned(), p.as_i64().unwrap_or_default()))
        }
        // A cluster named under a partition's entry (the sides of a mirror divergence).
        _ => match (parent, m.get("cluster").and_then(Value::as_str)) {
            (Some((_, t, p)), Some(c)) => Some((c.to_owned(), t.clone(), *p)),
            _ => None,
        },
    };
    let key = own.as_ref().or(parent);
    if let Some(key) = key {
        let mut offsets = BTreeSet::new();
        for k in ["offset", "from", "next", "after"] {
            if let Some(o) = m.get(k).and_then(Value::as_i64) {
                offsets.insert(o);
            }
        }
        for k in ["offsets", "skipped"] {
            for o in m.get(k).and_then(Value::as_array).into_iter().flatten() {
                offsets.extend(o.as_i64());
            }
        }
        // Records as [offset, value, epoch], alone or in a list.
        for k in ["record", "records"] {
            match m.get(k) {
                Some(Value::Array(a)) if a.first().is_some_and(Value::is_i64) => {
                    offsets.extend(a[0].as_i64());
                }
                Some(Value::Array(a)) => {
                    for r in a {
                        offsets.extend(r.as_array().and_then(|r| r.first()?.as_i64()));
                    }
                }
                _ => {}
            }
        }
        if offsets.is_empty() {
            offsets.extend(offset);
        }
        if offsets.is_empty() && !out.iter().any(|(k, _)| k == key) {
            out.push((key.clone(), None));
        }
        for o in offsets {
            if !out.iter().any(|(k, x)| k == key && *x == Some(o)) {
                out.push((key.clone(), Some(o)));
            }
        }
    }
    for (k, x) in m {
        if matches!(k.as_str(), "record" | "records" | "skipped" | "offsets") {
            continue;
        }
        if x.is_object() || x.is_array() {
            collect_places(x, default_cluster, key, offset, out);
        }
    }
}

/// The anomaly types of `results`, in its order, with their first [`MAX_SHOWN`] entries.
pub fn shown(results: &Results, default_cluster: &str) -> Vec<Kind> {
    results
        .anomaly_types
        .iter()
        .map(|name| {
            let entries = results.anomalies.get(name).map_or(&[][..], |e| &e[..]);
            let count = results
                .anomaly_counts
                .get(name)
                .copied()
                .unwrap_or(entries.len() as u64);
            Kind {
                name: name.clone(),
                bad: results.bad_anomaly_types.contains(name),
                allowed: results.allowed.get(name).cloned(),
                count,
                entries: entries
                    .iter()
                    .take(MAX_SHOWN)
                    .map(|e| Entry::new(e.clone(), default_cluster))
                    .collect(),
            }
        })
        .collect()
}

/// Every op index the shown entries name.
pub fn referenced_ops(kinds: &[Kind]) -> BTreeSet<u64> {
    kinds
        .iter()
        .flat_map(|k| &k.entries)
        .flat_map(|e| e.ops.iter().copied())
        .collect()
}

/// The partitions the shown entries are about, with the offsets they name.
pub fn focus(kinds: &[Kind]) -> BTreeMap<PartKey, BTreeSet<i64>> {
    let mut out: BTreeMap<PartKey, BTreeSet<i64>> = BTreeMap::new();
    for (key, offset) in kinds
        .iter()
        .flat_map(|k| &k.entries)
        .flat_map(|e| &e.places)
    {
        let offsets = out.entry(key.clone()).or_default();
        offsets.extend(*offset);
    }
    // An entry without a cluster (a mirror divergence) names the partition on every cluster;
    // its sides name the clusters, which are the partitions that exist.
    let named: BTreeSet<(String, i64)> = out
        .keys()
        .filter(|(c, _, _)| !c.is_empty())
        .map(|(_, t, p)| (t.clone(), *p))
        .collect();
    out.retain(|(c, t, p), _| !c.is_empty() || !named.contains(&(t.clone(), *p)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ops_and_places_of_checker_entries() {
        let lost = json!({"value": 17, "cluster": "a", "topic": "t", "partition": 0,
            "offset": 42, "op_index": 311, "invoke_index": 300, "seen_by_poll": null,
            "final_log": {"node": "n1", "high_watermark": 50}});
        let e = Entry::new(lost, "");
        assert_eq!(e.ops, vec![300, 311]);
        assert_eq!(e.places, vec![(("a".into(), "t".into(), 0), Some(42))]);

        let inc = json!({"cluster": "a", "topic": "t", "partition": 1, "offset": 5,
            "values": [{"value": 1, "seen_by": {"send": 7}},
                       {"value": 2, "seen_by": {"poll": 9}},
                       {"value": 3, "seen_by": {"final_log": {"cluster": "a", "node": "n2"}}}]});
        let e = Entry::new(inc, "");
        assert_eq!(e.ops, vec![7, 9]);
        assert_eq!(e.places, vec![(("a".into(), "t".into(), 1), Some(5))]);

        let dup = json!({"value": 4, "places": [
            {"cluster": "a", "topic": "t", "partition": 0, "offset": 1, "seen_by": {"send": 3}},
            {"cluster": "a", "topic": "t", "partition": 0, "offset": 8, "seen_by": {"poll": 12}}]});
        let e = Entry::new(dup, "");
        assert_eq!(e.ops, vec![3, 12]);
        let offsets: Vec<_> = e.places.iter().map(|p| p.1).collect();
        assert_eq!(offsets, vec![Some(1), Some(8)]);

        let regress = json!({"cluster": "a", "node": "n1", "topic": "t", "partition": 0,
            "records": [[4, 9, 3], [5, 10, 2]], "why": "x"});
        let e = Entry::new(regress, "");
        let offsets: Vec<_> = e.places.iter().map(|p| p.1).collect();
        assert_eq!(offsets, vec![Some(4), Some(5)]);

        let mirror = json!({"topic": "t", "partition": 0, "offset": 3, "clusters": [
            {"cluster": "a", "node": "n1", "record": [3, 1, 0]},
            {"cluster": "b", "node": "n4", "record": null}]});
        let e = Entry::new(mirror, "");
        assert_eq!(e.places[0], (("".into(), "t".into(), 0), Some(3)));
        assert!(e.places.contains(&(("b".into(), "t".into(), 0), Some(3))));
    }
}
