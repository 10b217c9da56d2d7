//! One member of a consumer group, as a Kafka consumer runs it with the classic protocol: find
//! the coordinator, JoinGroup, the leader assigns partitions round-robin, SyncGroup, then
//! OffsetFetch to resume every assigned partition from the group's committed offset (from 0 when
//! none: `auto.offset.reset=earliest`). Heartbeats ride on the member's group ops: a process that
//! stops invoking is expired by the coordinator after the session timeout, as a crashed consumer
//! would be, and a fresh process joins as a new member and resumes from what was committed.
//!
//! Fetching is the queue client's; this module keeps the membership, the positions and the
//! commits. Every step is bounded by the connection's timeout; retrying is the caller's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tidemark_harness::client::ClientContext;
use tidemark_harness::kafka::{
    decode_assignment, decode_subscription, encode_assignment, encode_subscription, error_name,
    Connection, ParseResponseErrorCode, ResponseError,
};

/// The protocol name the members offer: the assignment is the leader's round-robin.
const PROTOCOL: &str = "roundrobin";

/// How long the coordinator keeps a member that does not heartbeat, and waits for members to
/// rejoin a rebalance. The brokers of a group test allow it (`group.min.session.timeout.ms`).
pub const SESSION_TIMEOUT: Duration = Duration::from_millis(3000);

/// How often an op of a member heartbeats at most.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(1000);

/// JoinGroup and SyncGroup rounds one op tries before giving up.
const JOIN_ROUNDS: usize = 4;

/// A member's place in the group: its id, generation and partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The member id the coordinator gave.
    pub member_id: String,
    /// The generation whose assignment this is.
    pub generation: i32,
    /// The partitions assigned to this member, in order.
    pub assignment: Vec<(String, i32)>,
}

/// One process's consumer-group state.
pub struct GroupMember {
    group: String,
    topics: Vec<String>,
    partitions: Vec<(String, i32)>,
    coordinator: Option<Connection>,
    /// The member id to rejoin with (empty for a new member).
    member_id: String,
    joined: Option<Membership>,
    positions: BTreeMap<(String, i32), i64>,
    next: usize,
    last_heartbeat: Instant,
}

/// A group step that failed: why, and whether it may have changed the group's offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupError {
    /// What failed.
    pub error: String,
    /// The request may have been applied (a commit that timed out).
    pub maybe_applied: bool,
}

impl GroupError {
    fn definite(error: impl Into<String>) -> Self {
        GroupError {
            error: error.into(),
            maybe_applied: false,
        }
    }
}

/// Assigns `partitions` round-robin over `members` sorted by id (as Kafka's round-robin
/// assignor does over sorted members and partitions).
pub fn round_robin(
    members: &[String],
    partitions: &[(String, i32)],
) -> BTreeMap<String, Vec<(String, i32)>> {
    let mut members: Vec<&String> = members.iter().collect();
    members.sort();
    members.dedup();
    let mut partitions = partitions.to_vec();
    partitions.sort();
    let mut out: BTreeMap<String, Vec<(String, i32)>> =
        members.iter().map(|m| ((*m).clone(), Vec::new())).collect();
    for (i, tp) in partitions.into_iter().enumerate() {
        if let Some(m) = members.get(i % members.len().max(1)) {
            out.get_mut(*m).expect("every member listed").push(tp);
        }
    }
    out
}

impl GroupMember {
    /// A member of `group` consuming `topics`, whose partitions are `partitions`.
    pub fn new(group: String, topics: Vec<String>, partitions: Vec<(String, i32)>) -> Self {
        GroupMember {
            group,
            topics,
            partitions,
            coordinator: None,
            member_id: String::new(),
            joined: None,
            positions: BTreeMap::new(),
            next: 0,
            last_heartbeat: Instant::now(),
        }
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The current membership, when joined.
    pub fn membership(&self) -> Option<&Membership> {
        self.joined.as_ref()
    }

    /// Forgets the coordinator connection (after an op was cut short mid-request).
    pub fn drop_connection(&mut self) {
        self.coordinator = None;
    }

    /// A connection to the group's coordinator, asking the nodes from `home` on.
    async fn coordinator(
        &mut self,
        cx: &ClientContext,
        home: usize,
        timeout: Duration,
    ) -> Result<&mut Connection, GroupError> {
        if self.coordinator.as_ref().is_some_and(|c| !c.is_broken()) {
            return Ok(self.coordinator.as_mut().expect("checked"));
        }
        let mut last = String::from("no nodes");
        let n = cx.nodes.len();
        for k in 0..n {
            let node = &cx.nodes[(home + k) % n];
            let found = async {
                let mut c = Connection::connect(cx.dialer.clone(), node.addr, timeout).await?;
                c.find_coordinator(&self.group).await
            };
            match found.await {
                Ok(Ok(id)) => {
                    let Some(coord) = cx.node_by_id(id) else {
                        last = format!("coordinator {id} is not a node of the test");
                        continue;
                    };
                    match Connection::connect(cx.dialer.clone(), coord.addr, timeout).await {
                        Ok(c) => {
                            self.coordinator = Some(c);
                            return Ok(self.coordinator.as_mut().expect("set above"));
                        }
                        Err(e) => last = format!("coordinator {}: {e}", coord.name),
                    }
                }
                Ok(Err(code)) => {
                    last = format!("{}: FindCoordinator {}", node.name, error_name(code))
                }
                Err(e) => last = format!("{}: {e}", node.name),
            }
        }
        Err(GroupError::definite(format!("no coordinator: {last}")))
    }

    /// Reacts to a coordinator's error code: forget the coordinator, or the membership (and,
    /// when the coordinator no longer knows the member, its id).
    fn on_group_error(&mut self, code: i16) {
        match code.err() {
            Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
                self.coordinator = None;
                self.joined = None;
            }
            Some(ResponseError::UnknownMemberId) => {
                self.member_id.clear();
                self.joined = None;
            }
            Some(_) => self.joined = None,
            None => {}
        }
    }

    /// Heartbeats when one is due, and rejoins when the coordinator asks for it.
    pub async fn heartbeat_if_due(
        &mut self,
        cx: &ClientContext,
        home: usize,
        timeout: Duration,
    ) -> Result<(), GroupError> {
        let Some(m) = self.joined.clone() else {
            return Ok(());
        };
        if self.last_heartbeat.elapsed() < HEARTBEAT_EVERY {
            return Ok(());
        }
        let group = self.group.clone();
        let conn = self.coordinator(cx, home, timeout).await?;
        match conn.heartbeat(&group, m.generation, &m.member_id).await {
            Ok(0) => {
                self.last_heartbeat = Instant::now();
                Ok(())
            }
            Ok(code) => {
                self.on_group_error(code);
                Ok(())
            }
            Err(e) => {
                self.coordinator = None;
                Err(GroupError::definite(format!("heartbeat: {e}")))
            }
        }
    }

    /// Joins (or rejoins) until this member has an assignment, then resumes each assigned
    /// partition from the group's committed offset.
    pub async fn ensure_joined(
        &mut self,
        cx: &ClientContext,
        home: usize,
        timeout: Duration,
    ) -> Result<(), GroupError> {
        let mut last = String::new();
        for _ in 0..JOIN_ROUNDS {
            if self.joined.is_some() {
                return Ok(());
            }
            match self.join_once(cx, home, timeout).await {
                Ok(()) => {}
                Err(e) => last = e.error,
            }
        }
        match self.joined {
            Some(_) => Ok(()),
            None => Err(GroupError::definite(format!("not joined: {last}"))),
        }
    }

    async fn join_once(
        &mut self,
        cx: &ClientContext,
        home: usize,
        timeout: Duration,
    ) -> Result<(), GroupError> {
        let group = self.group.clone();
        let subscription = encode_subscription(&self.topics).map_err(GroupError::definite)?;
        let member_id = self.member_id.clone();
        let conn = self.coordinator(cx, home, timeout).await?;
        let join = conn
            .join_group(
                &group,
                &member_id,
                SESSION_TIMEOUT,
                SESSION_TIMEOUT,
                PROTOCOL,
                subscription,
            )
            .await;
        let join = match join {
            Ok(j) => j,
            Err(e) => {
                self.coordinator = None;
                return Err(GroupError::definite(format!("JoinGroup: {e}")));
            }
        };
        if join.error_code.err() == Some(ResponseError::MemberIdRequired) {
            self.member_id = join.member_id;
            return Err(GroupError::definite("JoinGroup: MemberIdRequired"));
        }
        if join.error_code != 0 {
            self.on_group_error(join.error_code);
            return Err(GroupError::definite(format!(
                "JoinGroup: {}",
                error_name(join.error_code)
            )));
        }
        self.member_id = join.member_id.clone();
        let assignments = if join.leader == join.member_id {
            let mut subscribed: Vec<String> = Vec::new();
            for (member, metadata) in &join.members {
                decode_subscription(metadata.clone()).map_err(GroupError::definite)?;
                subscribed.push(member.clone());
            }
            round_robin(&subscribed, &self.partitions)
                .into_iter()
                .map(|(m, parts)| encode_assignment(&parts).map(|a| (m, a)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(GroupError::definite)?
        } else {
            Vec::new()
        };
        let conn = self.coordinator(cx, home, timeout).await?;
        let (code, assignment) = match conn
            .sync_group(&group, join.generation, &join.member_id, assignments)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                self.coordinator = None;
                return Err(GroupError::definite(format!("SyncGroup: {e}")));
            }
        };
        if code != 0 {
            self.on_group_error(code);
            return Err(GroupError::definite(format!(
                "SyncGroup: {}",
                error_name(code)
            )));
        }
        let assignment = decode_assignment(assignment).map_err(GroupError::definite)?;
        let conn = self.coordinator(cx, home, timeout).await?;
        let (code, committed) = match conn.fetch_offsets(&group, &assignment).await {
            Ok(r) => r,
            Err(e) => {
                self.coordinator = None;
                return Err(GroupError::definite(format!("OffsetFetch: {e}")));
            }
        };
        if let Some(bad) = Some(code)
            .filter(|c| *c != 0)
            .or_else(|| committed.iter().map(|c| c.error_code).find(|c| *c != 0))
        {
            self.on_group_error(bad);
            return Err(GroupError::definite(format!(
                "OffsetFetch: {}",
                error_name(bad)
            )));
        }
        self.positions.clear();
        for tp in &assignment {
            let offset = committed
                .iter()
                .find(|c| c.topic == tp.0 && c.partition == tp.1)
                .map_or(-1, |c| c.offset);
            self.positions.insert(tp.clone(), offset.max(0));
        }
        self.last_heartbeat = Instant::now();
        self.next = 0;
        self.joined = Some(Membership {
            member_id: join.member_id,
            generation: join.generation,
            assignment,
        });
        Ok(())
    }

    /// The next assigned partition to read, round-robin, and its position.
    pub fn next_partition(&mut self) -> Option<((String, i32), i64)> {
        let m = self.joined.as_ref()?;
        if m.assignment.is_empty() {
            return None;
        }
        let tp = m.assignment[self.next % m.assignment.len()].clone();
        self.next = self.next.wrapping_add(1);
        let at = self.positions.get(&tp).copied().unwrap_or(0);
        Some((tp, at))
    }

    /// Moves a partition's position after a read (only forward, and only while assigned).
    pub fn advance(&mut self, tp: &(String, i32), to: i64) {
        if let Some(p) = self.positions.get_mut(tp) {
            *p = (*p).max(to);
        }
    }

    /// Commits every assigned partition's position in the current generation. Returns the
    /// membership and what was committed.
    pub async fn commit(
        &mut self,
        cx: &ClientContext,
        home: usize,
        timeout: Duration,
    ) -> Result<(Membership, Vec<(String, i32, i64)>), GroupError> {
        let Some(m) = self.joined.clone() else {
            return Err(GroupError::definite("not a member of the group"));
        };
        let offsets: Vec<(String, i32, i64)> = m
            .assignment
            .iter()
            .filter_map(|tp| self.positions.get(tp).map(|o| (tp.0.clone(), tp.1, *o)))
            .collect();
        if offsets.is_empty() {
            return Err(GroupError::definite("no partitions assigned"));
        }
        let group = self.group.clone();
        let conn = self.coordinator(cx, home, timeout).await?;
        let answers = match conn
            .commit_offsets(&group, m.generation, &m.member_id, &offsets)
            .await
        {
            Ok(a) => a,
            Err(e) => {
                self.coordinator = None;
                return Err(GroupError {
                    error: format!("OffsetCommit: {e}"),
                    maybe_applied: e.maybe_sent(),
                });
            }
        };
        let codes: Vec<i16> = offsets
            .iter()
            .map(|(t, p, _)| {
                answers
                    .iter()
                    .find(|(at, ap, _)| at == t && ap == p)
                    .map_or(-1, |a| a.2)
            })
            .collect();
        match codes.iter().find(|c| **c != 0) {
            None => Ok((m, offsets)),
            Some(&code) => {
                self.on_group_error(code);
                // Refusals the coordinator makes before writing anything; a partial answer or
                // any other error leaves the outcome open.
                let refused = codes.iter().all(|c| *c == code)
                    && matches!(
                        code.err(),
                        Some(
                            ResponseError::IllegalGeneration
                                | ResponseError::UnknownMemberId
                                | ResponseError::RebalanceInProgress
                                | ResponseError::NotCoordinator
                                | ResponseError::CoordinatorNotAvailable
                                | ResponseError::CoordinatorLoadInProgress
                                | ResponseError::UnknownTopicOrPartition
                        )
                    );
                Err(GroupError {
                    error: format!("OffsetCommit: {}", error_name(code)),
                    maybe_applied: !refused,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_spreads_sorted_partitions_over_sorted_members() {
        let parts: Vec<(String, i32)> = [("t1", 0), ("t0", 1), ("t0", 0), ("t1", 1)]
            .iter()
            .map(|(t, p)| (t.to_string(), *p))
            .collect();
        let a = round_robin(&["m2".into(), "m1".into(), "m3".into()], &parts);
        assert_eq!(a["m1"], vec![("t0".into(), 0), ("t1".into(), 1)]);
        assert_eq!(a["m2"], vec![("t0".into(), 1)]);
        assert_eq!(a["m3"], vec![("t1".into(), 0)]);
        let alone = round_robin(&["m".into()], &parts);
        assert_eq!(alone["m"].len(), 4);
    }
}
