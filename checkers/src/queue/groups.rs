//! Consumer groups: what a group's commits promise. A commit of offset `c` for a partition says
//! the group consumed everything before `c`, so (1) within one generation, where one member owns
//! the partition and only moves forward, a commit never goes below one acknowledged before it
//! was invoked (`commit-regression`), and (2) every record the committed log holds below the
//! highest acknowledged commit was returned by some `group-poll` of that group (`commit-skip`).
//! And (3) the coordinator takes commits only from the group's current generation, so once an
//! op of the group completed in generation `g`, no commit invoked later in an older generation
//! is acknowledged (`zombie-commit`: a member the group moved on without, fenced in Kafka by
//! ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID, would otherwise move the group's offsets).
//!
//! Fed the `group-poll` completions (the offsets they returned) and the `ok` `commit`s as they
//! stream past; the skips are decided at the end, against the final log.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;
use serde::Deserialize;

/// A `commit`'s `ok` completion value.
#[derive(Debug, Deserialize)]
pub(crate) struct CommitBody {
    pub group: String,
    #[serde(default)]
    pub member: Option<String>,
    pub generation: i64,
    pub offsets: Vec<CommitOffset>,
}

/// One partition of a commit.
#[derive(Debug, Deserialize)]
pub(crate) struct CommitOffset {
    pub topic: String,
    pub partition: i64,
    pub offset: i64,
}

/// The group fields of a `group-poll`'s completion (its poll fields are read as a poll's).
#[derive(Debug, Deserialize)]
pub(crate) struct GroupPollBody {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub member: Option<String>,
    #[serde(default)]
    pub generation: Option<i64>,
}

/// An `ok` group op that showed a generation higher than every one before it.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    pub generation: i64,
    pub op: u64,
    pub f: &'static str,
    pub member: Option<String>,
}

/// A commit acknowledged in a generation older than one an op of its group had shown before
/// the commit was invoked.
#[derive(Debug, Clone)]
pub(crate) struct Zombie {
    pub group: u32,
    pub cluster: u32,
    pub generation: i64,
    pub member: Option<String>,
    pub op: u64,
    pub invoked: u64,
    /// (topic, partition, offset) of every partition it committed.
    pub offsets: Vec<(String, i64, i64)>,
    /// The first op of the group that showed a newer generation.
    pub later: Shown,
}

/// An acknowledged commit of one partition.
#[derive(Debug, Clone)]
pub(crate) struct Commit {
    pub offset: i64,
    pub op: u64,
    pub member: Option<String>,
}

/// One commit that went below an earlier one of its generation.
#[derive(Debug, Clone)]
pub(crate) struct Regression {
    pub group: u32,
    pub generation: i64,
    pub pk: u32,
    pub commit: Commit,
    pub earlier: Commit,
}

/// The groups' observations, by group id (`u32`) and partition key.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub names: Vec<String>,
    ids: FxHashMap<String, u32>,
    /// Offsets some `group-poll` of the group returned.
    pub polled: FxHashMap<(u32, u32), BTreeSet<i64>>,
    /// The highest acknowledged commit of each (group, partition).
    pub highest: FxHashMap<(u32, u32), Commit>,
    /// Per (group, generation, partition): acknowledged commits in completion order, each with
    /// the highest commit acknowledged up to it.
    by_generation: FxHashMap<(u32, i64, u32), Vec<(u64, Commit)>>,
    pub regressions: Vec<Regression>,
    /// Per (group, cluster): completions that raised the highest generation shown, in order.
    shown: FxHashMap<(u32, u32), Vec<Shown>>,
    pub zombies: Vec<Zombie>,
}

impl Groups {
    /// The id of group `name`.
    pub fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        id
    }

    /// An `ok` op `f` of `group` on `cluster`, completed at op `op`, ran in `generation`.
    pub fn shown(
        &mut self,
        group: u32,
        cluster: u32,
        generation: i64,
        member: Option<String>,
        f: &'static str,
        op: u64,
    ) {
        let shown = self.shown.entry((group, cluster)).or_default();
        if shown.last().is_none_or(|s| generation > s.generation) {
            shown.push(Shown {
                generation,
                op,
                f,
                member,
            });
        }
    }

    /// The first op of `group` on `cluster` that showed a generation above `generation` and
    /// completed before op `invoked`, if any: a commit in `generation` invoked then is a
    /// zombie's.
    pub fn newer_before(
        &self,
        group: u32,
        cluster: u32,
        generation: i64,
        invoked: u64,
    ) -> Option<&Shown> {
        let shown = self.shown.get(&(group, cluster))?;
        let before = &shown[..shown.partition_point(|s| s.op < invoked)];
        before.iter().find(|s| s.generation > generation)
    }

    /// A `group-poll` of `group` returned records at `offsets` of partition `pk`.
    pub fn polled(&mut self, group: u32, pk: u32, offsets: impl Iterator<Item = i64>) {
        self.polled.entry((group, pk)).or_default().extend(offsets);
    }

    /// An acknowledged commit of `offset` for `pk` in `generation`, invoked at op `invoked`
    /// and completed at op `op`.
    #[allow(clippy::too_many_arguments)]
    pub fn committed(
        &mut self,
        group: u32,
        generation: i64,
        pk: u32,
        offset: i64,
        member: Option<String>,
        invoked: u64,
        op: u64,
    ) {
        let commit = Commit { offset, op, member };
        let seen = self
            .by_generation
            .entry((group, generation, pk))
            .or_default();
        // The highest commit acknowledged before this one was invoked: commits that overlap
        // it in time may land in either order.
        let before = seen.partition_point(|(done, _)| *done < invoked);
        if let Some((_, earlier)) = before.checked_sub(1).map(|i| &seen[i]) {
            if offset < earlier.offset {
                self.regressions.push(Regression {
                    group,
                    generation,
                    pk,
                    commit: commit.clone(),
                    earlier: earlier.clone(),
                });
            }
        }
        let best = match seen.last() {
            Some((_, top)) if top.offset >= offset => top.clone(),
            _ => commit.clone(),
        };
        seen.push((op, best));
        let highest = self.highest.entry((group, pk)).or_insert(commit.clone());
        if offset > highest.offset {
            *highest = commit;
        }
    }
}
