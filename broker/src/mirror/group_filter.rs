//! Which source groups a mirror syncs offsets for: the `mirror.groups.include` and
//! `mirror.groups.exclude` configs of a CreateClusterMirror, checked once and kept in the mirror's
//! registration in the metadata. A leaf module, so the metadata can hold it without depending on
//! the mirroring that reads it.

use std::collections::BTreeMap;

use regex_automata::meta::Regex;
use serde::{Deserialize, Serialize};

pub const GROUPS_INCLUDE: &str = "mirror.groups.include";
pub const GROUPS_EXCLUDE: &str = "mirror.groups.exclude";

/// Which of the source's groups have their offsets synced: KIP-1279's `mirror.groups.include`
/// (default `.*`) and `mirror.groups.exclude` (default empty), each a comma-separated list of
/// regular expressions matched against the whole group id, as MirrorMaker 2's group filters
/// are. An excluded group is not synced even when included. Kept as the operator wrote it;
/// [`GroupFilter::from_configs`] has checked that it compiles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupFilter {
    pub include: String,
    pub exclude: String,
}

impl Default for GroupFilter {
    fn default() -> Self {
        GroupFilter {
            include: ".*".into(),
            exclude: String::new(),
        }
    }
}

impl GroupFilter {
    /// The filter a CreateClusterMirror's configs ask for; an unknown key or a pattern that
    /// does not compile is refused, naming it.
    pub fn from_configs(configs: &BTreeMap<String, String>) -> Result<GroupFilter, String> {
        let mut filter = GroupFilter::default();
        for (key, value) in configs {
            match key.as_str() {
                GROUPS_INCLUDE => filter.include = value.clone(),
                GROUPS_EXCLUDE => filter.exclude = value.clone(),
                _ => {
                    return Err(format!(
                        "unknown mirror config `{key}` (known: {GROUPS_INCLUDE}, {GROUPS_EXCLUDE})"
                    ))
                }
            }
        }
        filter.matcher()?;
        Ok(filter)
    }

    /// The compiled patterns.
    pub fn matcher(&self) -> Result<GroupMatcher, String> {
        Ok(GroupMatcher {
            include: patterns(GROUPS_INCLUDE, &self.include)?,
            exclude: patterns(GROUPS_EXCLUDE, &self.exclude)?,
        })
    }
}

/// A comma-separated list of regular expressions, each anchored to match a whole group id.
fn patterns(key: &str, list: &str) -> Result<Vec<Regex>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            Regex::new(&format!("^(?:{p})$"))
                .map_err(|e| format!("{key}: `{p}` is not a regular expression: {e}"))
        })
        .collect()
}

/// A [`GroupFilter`] ready to judge group ids.
pub struct GroupMatcher {
    include: Vec<Regex>,
    exclude: Vec<Regex>,
}

impl GroupMatcher {
    pub fn syncs(&self, group: &str) -> bool {
        self.include.iter().any(|r| r.is_match(group))
            && !self.exclude.iter().any(|r| r.is_match(group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(configs: &[(&str, &str)]) -> Result<GroupFilter, String> {
        GroupFilter::from_configs(
            &configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn synced(f: &GroupFilter, groups: &[&str]) -> Vec<String> {
        let m = f.matcher().unwrap();
        groups
            .iter()
            .filter(|g| m.syncs(g))
            .map(|g| g.to_string())
            .collect()
    }

    #[test]
    fn by_default_every_group_is_synced() {
        let f = filter(&[]).unwrap();
        assert_eq!(synced(&f, &["g", "", "app.1"]), ["g", "", "app.1"]);
    }

    #[test]
    fn patterns_match_whole_ids_and_exclusion_wins() {
        let f = filter(&[
            (GROUPS_INCLUDE, "app\\..*, billing"),
            (GROUPS_EXCLUDE, "app\\.test.*"),
        ])
        .unwrap();
        assert_eq!(
            synced(
                &f,
                &["app.web", "app.test1", "billing", "billing2", "xapp.web"]
            ),
            ["app.web", "billing"]
        );
    }

    #[test]
    fn an_empty_include_syncs_nothing() {
        let f = filter(&[(GROUPS_INCLUDE, "")]).unwrap();
        assert!(synced(&f, &["g"]).is_empty());
    }

    #[test]
    fn unknown_keys_and_bad_patterns_are_refused() {
        let e = filter(&[("mirror.group.include", "g")]).unwrap_err();
        assert!(
            e.contains("unknown mirror config `mirror.group.include`"),
            "{e}"
        );
        let e = filter(&[(GROUPS_EXCLUDE, "g,(")]).unwrap_err();
        assert!(e.contains("mirror.groups.exclude: `(`"), "{e}");
    }
}
