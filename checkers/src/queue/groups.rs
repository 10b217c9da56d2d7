//! Consumer groups: what a group's commits promise. A commit of offset `c` for a partition says
//! the group consumed everything before `c`, so (1) within one generation, where one member owns
//! the partition and only moves forward, a commit never goes below one acknowledged before it
//! was invoked (`commit-regression`), and (2) every record the committed log holds below the
//! highest acknowledged commit was returned by some `group-poll` of that group (`commit-skip`).
//! And (3) the coordinator takes commits only from the group's current generation, so once an
//! op of the group completed in generation `g`, no commit invoked later in an older generation
//! is acknowledged (`zombie-commit`: a member the group moved on without, fenced in Kafka by
//! ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID, would otherwise move the group's offsets). And (4) an
//! acknowledged commit lasts: a member's first read of a partition in a generation starts where
//! the group's OffsetFetch put it when the member joined, so it starts no lower than the last
//! commit acknowledged before the member could have joined, unless another commit may have
//! landed after that one (`commit-lost`: a coordinator that lost what it acknowledged).
//!
//! Fed the `group-poll` completions (the offsets they returned) and the `ok` `commit`s as they
//! stream past; the skips are decided at the end, against the final log.

use std::collections::BTreeSet;

use rustc_hash::{FxHashMap, FxHashSet};
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

/// A member's first `group-poll` of a partition in a generation: it read from where the group's
/// OffsetFetch put it when the member joined, which happened after op `joined_after`.
#[derive(Debug, Clone)]
pub(crate) struct Resume {
    pub group: u32,
    pub pk: u32,
    pub generation: i64,
    pub member: Option<String>,
    pub from: i64,
    pub joined_after: u64,
    pub op: u64,
}

/// Where one process's `ok` group ops stand: the newest generation it showed, and the last op
/// that completed in an older one (what a read in the newest generation joined after).
#[derive(Debug, Clone, Copy)]
struct ProcessGenerations {
    newest: i64,
    last_in_newest: u64,
    last_before: Option<u64>,
}

impl ProcessGenerations {
    /// The last op of this process that completed in a generation below `generation`, when it
    /// can be told: not for a generation below the newest, whose ops are not kept.
    fn last_below(&self, generation: i64) -> Option<u64> {
        if generation > self.newest {
            Some(self.last_in_newest.max(self.last_before.unwrap_or(0)))
        } else if generation == self.newest {
            self.last_before
        } else {
            None
        }
    }
}

/// An acknowledged commit, invoked at op `invoked`.
#[derive(Debug, Clone)]
pub(crate) struct Landed {
    pub invoked: u64,
    pub commit: Commit,
}

/// A member resumed below the last commit acknowledged before it joined.
#[derive(Debug, Clone)]
pub(crate) struct LostCommit {
    pub resume: Resume,
    pub last: Landed,
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
    /// Per (group, partition): every acknowledged commit, in completion order.
    landed: FxHashMap<(u32, u32), Vec<Landed>>,
    /// Per group: (invocation, completion) of each commit whose answer was lost.
    unknown: FxHashMap<u32, Vec<(u64, u64)>>,
    /// Per process: the invocation of its first group op, and where its `ok` group ops stand.
    first_op: FxHashMap<u64, u64>,
    generations: FxHashMap<u64, ProcessGenerations>,
    resumed: FxHashSet<(u64, i64, u32)>,
    resumes: Vec<Resume>,
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

    /// Process `process` invoked a group op at op `invoked`.
    pub fn group_op(&mut self, process: u64, invoked: u64) {
        self.first_op.entry(process).or_insert(invoked);
    }

    /// Process `process` completed an `ok` group op in `generation` at op `op`.
    pub fn in_generation(&mut self, process: u64, generation: i64, op: u64) {
        let g = self
            .generations
            .entry(process)
            .or_insert(ProcessGenerations {
                newest: generation,
                last_in_newest: op,
                last_before: None,
            });
        if generation > g.newest {
            g.last_before = g.last_below(generation);
            g.newest = generation;
            g.last_in_newest = op;
        } else if generation == g.newest {
            g.last_in_newest = op;
        } else {
            // A commit of an older generation completing late.
            g.last_before = Some(g.last_before.map_or(op, |b| b.max(op)));
        }
    }

    /// An `ok` `group-poll` of `pk` by `process` in `generation` from `from`, completed at op
    /// `op`: kept when it is the process's first read of `pk` in that generation. Call before
    /// [`Self::in_generation`] for the same op.
    #[allow(clippy::too_many_arguments)]
    pub fn read_from(
        &mut self,
        group: u32,
        pk: u32,
        process: u64,
        generation: i64,
        member: Option<String>,
        from: i64,
        op: u64,
    ) {
        if !self.resumed.insert((process, generation, pk)) {
            return;
        }
        // The member joined this generation in an op invoked after its last op of an older
        // one completed (or, new, after its first group op was invoked); a read in a generation
        // below one the process has shown is not judged.
        let joined_after = match self.generations.get(&process) {
            Some(g) if generation < g.newest => return,
            Some(g) => g.last_below(generation),
            None => None,
        };
        let Some(joined_after) = joined_after.or_else(|| self.first_op.get(&process).copied())
        else {
            return;
        };
        self.resumes.push(Resume {
            group,
            pk,
            generation,
            member,
            from,
            joined_after,
            op,
        });
    }

    /// A `commit` of `group` whose answer was lost, invoked at `invoked`, given up at `op`.
    pub fn commit_unknown(&mut self, group: u32, invoked: u64, op: u64) {
        self.unknown.entry(group).or_default().push((invoked, op));
    }

    /// Resumes below the last commit acknowledged before the member joined, where no commit
    /// that may have landed after that one (acknowledged ones overlapping it or in flight at the
    /// read, and any whose answer was lost meanwhile) could have set the lower offset.
    pub fn lost_commits(&self) -> Vec<LostCommit> {
        let mut out = Vec::new();
        for r in &self.resumes {
            let Some(landed) = self.landed.get(&(r.group, r.pk)) else {
                continue;
            };
            // In completion order: the last one acknowledged by then ends a prefix.
            let done = landed.partition_point(|l| l.commit.op <= r.joined_after);
            let Some(last) = done.checked_sub(1).map(|i| &landed[i]) else {
                continue;
            };
            let may_follow = landed
                .iter()
                .filter(|l| l.commit.op != last.commit.op)
                .filter(|l| l.commit.op > last.invoked && l.invoked < r.op)
                .any(|l| l.commit.offset <= r.from);
            let unknown = self.unknown.get(&r.group).is_some_and(|u| {
                u.iter()
                    .any(|&(invoked, gave_up)| invoked < r.op && gave_up > last.invoked)
            });
            if r.from < last.commit.offset && !may_follow && !unknown {
                out.push(LostCommit {
                    resume: r.clone(),
                    last: last.clone(),
                });
            }
        }
        out
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
        self.landed.entry((group, pk)).or_default().push(Landed {
            invoked,
            commit: commit.clone(),
        });
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
