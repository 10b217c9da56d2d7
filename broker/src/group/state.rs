//! One consumer group under the classic rebalance protocol, as Kafka's `GroupMetadata` and
//! `GroupCoordinator` keep it: the states Empty → PreparingRebalance → CompletingRebalance →
//! Stable (and Dead once unloaded), member ids handed out by the coordinator (with the v4+
//! MEMBER_ID_REQUIRED round trip), generations, session and rebalance timeouts.
//!
//! No I/O and no clock: every call takes `now`, and JoinGroup/SyncGroup answers that must wait
//! for the rest of the group go out through one-shot channels when the group moves on. Storing
//! the group after the leader's SyncGroup is the caller's job ([`Group::sync`] says when, and
//! [`Group::stored`] hears how it went).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;

/// The classic protocol's group states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    /// The name DescribeGroups and ListGroups report.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A committed offset of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
    /// Where its record is in `__consumer_offsets` (-1 before it is appended): of two
    /// commits acknowledged out of order, the later record wins, as it will on a reload.
    pub log_offset: i64,
}

impl Group {
    /// Takes an acknowledged commit unless a later record of the same partition is already in.
    pub fn apply_commit(&mut self, topic: String, partition: i32, commit: CommittedOffset) {
        let key = (topic, partition);
        if self
            .offsets
            .get(&key)
            .is_none_or(|o| o.log_offset < commit.log_offset)
        {
            self.offsets.insert(key, commit);
        }
    }
}

/// What JoinGroup answers.
#[derive(Debug, Clone, Default)]
pub struct JoinOutcome {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// The members and their metadata for the chosen protocol; only the leader gets them.
    pub members: Vec<(String, Bytes)>,
}

impl JoinOutcome {
    fn error(error: ResponseError, member_id: &str) -> Self {
        JoinOutcome {
            error: error.code(),
            generation: -1,
            member_id: member_id.to_string(),
            ..Default::default()
        }
    }
}

/// What SyncGroup answers.
#[derive(Debug, Clone, Default)]
pub struct SyncOutcome {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncOutcome {
    fn error(error: ResponseError) -> Self {
        SyncOutcome {
            error: error.code(),
            ..Default::default()
        }
    }
}

/// A JoinGroup request as the group sees it.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    /// (name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new member first gets its id with MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
}

/// An answer now, or one that comes when the group moves on.
#[derive(Debug)]
pub enum Reply<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

/// One member of a group.
#[derive(Debug)]
pub struct Member {
    pub id: String,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    pub last_heartbeat: Instant,
    awaiting_join: Option<oneshot::Sender<JoinOutcome>>,
    awaiting_sync: Option<oneshot::Sender<SyncOutcome>>,
}

impl Member {
    /// A member restored from the log: it keeps its place until its session runs out.
    /// `timeouts` are its session and rebalance timeouts.
    pub fn restored(
        id: String,
        client_id: String,
        client_host: String,
        (session_timeout, rebalance_timeout): (Duration, Duration),
        protocols: Vec<(String, Bytes)>,
        assignment: Bytes,
        now: Instant,
    ) -> Self {
        Member {
            id,
            client_id,
            client_host,
            session_timeout,
            rebalance_timeout,
            protocols,
            assignment,
            last_heartbeat: now,
            awaiting_join: None,
            awaiting_sync: None,
        }
    }

    /// The metadata this member gave for `protocol`.
    pub fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    /// Members waiting for a JoinGroup or SyncGroup answer are not expired: the coordinator
    /// owes them a response.
    fn kept_alive(&self) -> bool {
        self.awaiting_join.is_some() || self.awaiting_sync.is_some()
    }
}

/// One group: membership, generation and committed offsets.
#[derive(Debug)]
pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// Ids handed out with MEMBER_ID_REQUIRED, each until its session timeout.
    pending: BTreeMap<String, Instant>,
    /// When the current join phase ends whoever has rejoined.
    join_deadline: Option<Instant>,
    /// An empty group's first rebalance waits until the first instant for more members, never
    /// past the second (Kafka's `InitialDelayedJoin`).
    initial_delay: Option<(Instant, Instant)>,
    /// A generation whose assignment the caller is storing.
    storing: Option<i32>,
    /// The group record changed in a way no request stores (it became Empty).
    pub store_needed: bool,
    pub offsets: BTreeMap<(String, i32), CommittedOffset>,
}

impl Group {
    pub fn new(id: &str) -> Self {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            join_deadline: None,
            initial_delay: None,
            storing: None,
            store_needed: false,
            offsets: BTreeMap::new(),
        }
    }

    /// Whether the protocols of a joining member fit the group: the same protocol type and
    /// at least one protocol every member supports.
    fn supports(&self, req: &JoinRequest) -> bool {
        if req.protocol_type.is_empty() || req.protocols.is_empty() {
            return false;
        }
        if self.members.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(req.protocol_type.as_str()) {
            return false;
        }
        req.protocols.iter().any(|(name, _)| {
            self.members
                .values()
                .filter(|m| m.id != req.member_id)
                .all(|m| m.protocols.iter().any(|(n, _)| n == name))
        })
    }

    /// The protocol most members prefer among those all support (Kafka's vote).
    fn select_protocol(&self) -> Option<String> {
        let mut members = self.members.values();
        let first = members.next()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == *n))
            })
            .collect();
        let mut votes: BTreeMap<&String, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(&n)) {
                *votes.entry(n).or_default() += 1;
            }
        }
        // Ties go to the first member's preference, deterministically.
        candidates
            .iter()
            .max_by_key(|c| (votes.get(*c).copied().unwrap_or(0), std::cmp::Reverse(*c)))
            .map(|c| c.to_string())
    }

    fn max_rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default()
    }

    /// The JoinGroup answer of the current generation for `member_id`.
    fn current_join(&self, member_id: &str) -> JoinOutcome {
        let leader = self.leader.clone().unwrap_or_default();
        let protocol = self.protocol.clone().unwrap_or_default();
        JoinOutcome {
            error: 0,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            members: if leader == member_id {
                self.members
                    .values()
                    .map(|m| (m.id.clone(), m.metadata_for(&protocol)))
                    .collect()
            } else {
                Vec::new()
            },
            leader,
            member_id: member_id.to_string(),
        }
    }

    /// JoinGroup. `new_member_id` names a member the coordinator admits.
    pub fn join(
        &mut self,
        req: JoinRequest,
        new_member_id: impl FnOnce() -> String,
        initial_delay: Duration,
        now: Instant,
    ) -> Reply<JoinOutcome> {
        if self.state == GroupState::Dead {
            return Reply::Now(JoinOutcome::error(
                ResponseError::CoordinatorNotAvailable,
                &req.member_id,
            ));
        }
        if !self.supports(&req) {
            return Reply::Now(JoinOutcome::error(
                ResponseError::InconsistentGroupProtocol,
                &req.member_id,
            ));
        }
        if req.member_id.is_empty() {
            let id = new_member_id();
            if req.require_known_member_id {
                self.pending.insert(id.clone(), now + req.session_timeout);
                return Reply::Now(JoinOutcome::error(ResponseError::MemberIdRequired, &id));
            }
            return Reply::Later(self.add_member(id, req, initial_delay, now));
        }
        if self.pending.remove(&req.member_id).is_some() {
            let id = req.member_id.clone();
            return Reply::Later(self.add_member(id, req, initial_delay, now));
        }
        let Some(member) = self.members.get(&req.member_id) else {
            return Reply::Now(JoinOutcome::error(
                ResponseError::UnknownMemberId,
                &req.member_id,
            ));
        };
        let same_protocols = member.protocols == req.protocols;
        let is_leader = self.leader.as_deref() == Some(req.member_id.as_str());
        match self.state {
            GroupState::Empty | GroupState::Dead => Reply::Now(JoinOutcome::error(
                ResponseError::UnknownMemberId,
                &req.member_id,
            )),
            GroupState::CompletingRebalance if same_protocols => {
                Reply::Now(self.current_join(&req.member_id))
            }
            GroupState::Stable if same_protocols && !is_leader => {
                Reply::Now(self.current_join(&req.member_id))
            }
            _ => Reply::Later(self.update_member(req, now)),
        }
    }

    fn add_member(
        &mut self,
        id: String,
        req: JoinRequest,
        initial_delay: Duration,
        now: Instant,
    ) -> oneshot::Receiver<JoinOutcome> {
        let (tx, rx) = oneshot::channel();
        if self.members.is_empty() {
            self.protocol_type = Some(req.protocol_type.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(id.clone());
        }
        let rebalance_timeout = req.rebalance_timeout;
        self.members.insert(
            id.clone(),
            Member {
                id,
                client_id: req.client_id,
                client_host: req.client_host,
                session_timeout: req.session_timeout,
                rebalance_timeout,
                protocols: req.protocols,
                assignment: Bytes::new(),
                last_heartbeat: now,
                awaiting_join: Some(tx),
                awaiting_sync: None,
            },
        );
        if self.state == GroupState::Empty && !initial_delay.is_zero() {
            self.initial_delay = Some((now + initial_delay, now + rebalance_timeout));
        } else if let Some((earliest, cap)) = self.initial_delay {
            // Each newcomer during the initial delay buys the others another delay.
            self.initial_delay = Some(((now + initial_delay).max(earliest).min(cap), cap));
        }
        self.prepare_rebalance(now);
        rx
    }

    fn update_member(&mut self, req: JoinRequest, now: Instant) -> oneshot::Receiver<JoinOutcome> {
        let (tx, rx) = oneshot::channel();
        let member = self
            .members
            .get_mut(&req.member_id)
            .expect("checked by the caller");
        member.protocols = req.protocols;
        member.session_timeout = req.session_timeout;
        member.rebalance_timeout = req.rebalance_timeout;
        member.last_heartbeat = now;
        // A second JoinGroup replaces the first, whose caller hears REBALANCE_IN_PROGRESS.
        member.awaiting_join = Some(tx);
        self.prepare_rebalance(now);
        rx
    }

    /// Enters PreparingRebalance (a no-op when already there): assignments of a generation in
    /// progress are dropped and its SyncGroup waiters told to rejoin.
    fn prepare_rebalance(&mut self, now: Instant) {
        if self.state == GroupState::CompletingRebalance {
            for m in self.members.values_mut() {
                m.assignment = Bytes::new();
                if let Some(tx) = m.awaiting_sync.take() {
                    let _ = tx.send(SyncOutcome::error(ResponseError::RebalanceInProgress));
                }
            }
            self.storing = None;
        }
        if self.state != GroupState::PreparingRebalance {
            self.state = GroupState::PreparingRebalance;
            self.join_deadline = Some(now + self.max_rebalance_timeout());
        }
    }

    /// Ends the join phase: members that did not rejoin are dropped, the generation moves on,
    /// and every waiting member hears the new generation (the leader with every member's
    /// metadata).
    fn complete_join(&mut self, now: Instant) {
        self.members.retain(|_, m| m.awaiting_join.is_some());
        self.join_deadline = None;
        self.initial_delay = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.leader = None;
            self.store_needed = true;
            return;
        }
        self.protocol = self.select_protocol();
        if !self
            .leader
            .as_ref()
            .is_some_and(|l| self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.state = GroupState::CompletingRebalance;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let outcome = self.current_join(&id);
            let m = self.members.get_mut(&id).expect("listed above");
            m.last_heartbeat = now;
            if let Some(tx) = m.awaiting_join.take() {
                let _ = tx.send(outcome);
            }
        }
    }

    /// SyncGroup. `Ok((reply, store))`: when `store` is set the caller must store the group
    /// (its assignments for that generation) and report with [`Group::stored`].
    pub fn sync(
        &mut self,
        member_id: &str,
        generation: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> (Reply<SyncOutcome>, Option<i32>) {
        let now_err = |e| (Reply::Now(SyncOutcome::error(e)), None);
        if !self.members.contains_key(member_id) {
            return now_err(ResponseError::UnknownMemberId);
        }
        if generation != self.generation {
            return now_err(ResponseError::IllegalGeneration);
        }
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != self.protocol.as_deref())
        {
            return now_err(ResponseError::InconsistentGroupProtocol);
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => now_err(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => now_err(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                let m = &self.members[member_id];
                (Reply::Now(self.sync_outcome(m)), None)
            }
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                let m = self.members.get_mut(member_id).expect("checked above");
                m.awaiting_sync = Some(tx);
                m.last_heartbeat = now;
                let is_leader = self.leader.as_deref() == Some(member_id);
                if !is_leader || self.storing.is_some() {
                    return (Reply::Later(rx), None);
                }
                let mut given: BTreeMap<String, Bytes> = assignments.into_iter().collect();
                for m in self.members.values_mut() {
                    m.assignment = given.remove(&m.id).unwrap_or_default();
                }
                self.storing = Some(self.generation);
                (Reply::Later(rx), Some(self.generation))
            }
        }
    }

    fn sync_outcome(&self, m: &Member) -> SyncOutcome {
        SyncOutcome {
            error: 0,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: m.assignment.clone(),
        }
    }

    /// How storing `generation`'s assignment went: on success the group is Stable and every
    /// waiting member gets its assignment; on failure they get `error` and the group rebalances.
    pub fn stored(&mut self, generation: i32, result: Result<(), i16>, now: Instant) {
        if self.storing != Some(generation)
            || self.generation != generation
            || self.state != GroupState::CompletingRebalance
        {
            return;
        }
        self.storing = None;
        match result {
            Ok(()) => {
                self.state = GroupState::Stable;
                let outcomes: Vec<(String, SyncOutcome)> = self
                    .members
                    .values()
                    .map(|m| (m.id.clone(), self.sync_outcome(m)))
                    .collect();
                for (id, outcome) in outcomes {
                    let m = self.members.get_mut(&id).expect("listed above");
                    m.last_heartbeat = now;
                    if let Some(tx) = m.awaiting_sync.take() {
                        let _ = tx.send(outcome);
                    }
                }
            }
            Err(code) => {
                for m in self.members.values_mut() {
                    m.assignment = Bytes::new();
                    if let Some(tx) = m.awaiting_sync.take() {
                        let _ = tx.send(SyncOutcome {
                            error: code,
                            ..Default::default()
                        });
                    }
                }
                self.prepare_rebalance(now);
            }
        }
    }

    /// Heartbeat: NONE, or the error telling the member what to do.
    pub fn heartbeat(&mut self, member_id: &str, generation: i32, now: Instant) -> i16 {
        let error = match self.state {
            GroupState::Dead => ResponseError::CoordinatorNotAvailable,
            GroupState::Empty => ResponseError::UnknownMemberId,
            _ if !self.members.contains_key(member_id) => ResponseError::UnknownMemberId,
            _ if generation != self.generation => ResponseError::IllegalGeneration,
            GroupState::PreparingRebalance => ResponseError::RebalanceInProgress,
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.touch(member_id, now);
                return 0;
            }
        };
        if error == ResponseError::RebalanceInProgress {
            self.touch(member_id, now);
        }
        error.code()
    }

    fn touch(&mut self, member_id: &str, now: Instant) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_heartbeat = now;
        }
    }

    /// LeaveGroup of one member.
    pub fn leave(&mut self, member_id: &str, now: Instant) -> i16 {
        if self.state == GroupState::Dead {
            return ResponseError::CoordinatorNotAvailable.code();
        }
        if self.pending.remove(member_id).is_some() {
            return 0;
        }
        if !self.members.contains_key(member_id) {
            return ResponseError::UnknownMemberId.code();
        }
        self.remove_member(member_id, now);
        0
    }

    fn remove_member(&mut self, member_id: &str, now: Instant) {
        self.members.remove(member_id);
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self.members.keys().next().cloned();
        }
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => self.prepare_rebalance(now),
            GroupState::Empty | GroupState::Dead | GroupState::PreparingRebalance => {}
        }
    }

    /// Whether an OffsetCommit from `member_id` in `generation` may commit now (Kafka's
    /// `validateOffsetCommit`); a commit with generation -1 and no member is a manual one,
    /// allowed while the group is Empty. On success the member's session is renewed.
    pub fn check_commit(&mut self, member_id: &str, generation: i32, now: Instant) -> i16 {
        if self.state == GroupState::Dead {
            return ResponseError::CoordinatorNotAvailable.code();
        }
        if generation < 0 && member_id.is_empty() {
            return if self.state == GroupState::Empty {
                0
            } else {
                ResponseError::IllegalGeneration.code()
            };
        }
        if !self.members.contains_key(member_id) {
            return ResponseError::UnknownMemberId.code();
        }
        if generation != self.generation {
            return ResponseError::IllegalGeneration.code();
        }
        if self.state == GroupState::CompletingRebalance {
            return ResponseError::RebalanceInProgress.code();
        }
        self.touch(member_id, now);
        0
    }

    /// Time passing: sessions and MEMBER_ID_REQUIRED ids run out, and a join phase ends once
    /// every member rejoined (and any initial delay passed) or its deadline came.
    pub fn tick(&mut self, now: Instant) {
        self.pending.retain(|_, until| *until > now);
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.kept_alive() && now.duration_since(m.last_heartbeat) > m.session_timeout)
            .map(|m| m.id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = ?self.id, member = ?id, "member's session expired");
            self.remove_member(&id, now);
        }
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined =
            self.pending.is_empty() && self.members.values().all(|m| m.awaiting_join.is_some());
        let delayed = self
            .initial_delay
            .is_some_and(|(earliest, _)| now < earliest);
        let deadline = self.join_deadline.is_some_and(|d| now >= d);
        if (all_joined && !delayed) || deadline {
            self.complete_join(now);
        }
    }

    /// The coordinator lost the group's partition: every waiting member hears NOT_COORDINATOR.
    pub fn unload(&mut self) {
        self.state = GroupState::Dead;
        for m in self.members.values_mut() {
            if let Some(tx) = m.awaiting_join.take() {
                let _ = tx.send(JoinOutcome::error(ResponseError::NotCoordinator, &m.id));
            }
            if let Some(tx) = m.awaiting_sync.take() {
                let _ = tx.send(SyncOutcome::error(ResponseError::NotCoordinator));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: Duration = Duration::from_secs(10);
    const REBALANCE: Duration = Duration::from_secs(30);

    fn request(member_id: &str, protocols: &[&str]) -> JoinRequest {
        JoinRequest {
            member_id: member_id.to_string(),
            client_id: "c".into(),
            client_host: String::new(),
            session_timeout: SESSION,
            rebalance_timeout: REBALANCE,
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|p| (p.to_string(), Bytes::from(format!("meta-{p}"))))
                .collect(),
            require_known_member_id: true,
        }
    }

    fn now_reply<T: std::fmt::Debug>(r: Reply<T>) -> T {
        match r {
            Reply::Now(t) => t,
            Reply::Later(_) => panic!("expected an answer now"),
        }
    }

    fn later<T>(r: Reply<T>) -> oneshot::Receiver<T> {
        match r {
            Reply::Later(rx) => rx,
            Reply::Now(_) => panic!("expected to wait"),
        }
    }

    /// Joins a new member through the MEMBER_ID_REQUIRED round trip; returns its id and the
    /// receiver of its JoinGroup answer.
    fn join_new(
        g: &mut Group,
        id: &str,
        protocols: &[&str],
        now: Instant,
    ) -> (String, oneshot::Receiver<JoinOutcome>) {
        let first = now_reply(g.join(
            request("", protocols),
            || id.to_string(),
            Duration::ZERO,
            now,
        ));
        assert_eq!(first.error, ResponseError::MemberIdRequired.code());
        assert_eq!(first.member_id, id);
        let rx = later(g.join(
            request(id, protocols),
            || unreachable!(),
            Duration::ZERO,
            now,
        ));
        (id.to_string(), rx)
    }

    /// A group of `ids`, Stable in generation 1 with `ids[0]` leading.
    fn stable(ids: &[&str], now: Instant) -> Group {
        let mut g = Group::new("g");
        let mut rxs: Vec<_> = ids
            .iter()
            .map(|id| join_new(&mut g, id, &["range"], now).1)
            .collect();
        g.tick(now);
        for rx in rxs.iter_mut() {
            assert_eq!(rx.try_recv().unwrap().generation, 1);
        }
        let assignments = ids
            .iter()
            .map(|id| (id.to_string(), Bytes::from(format!("a-{id}"))))
            .collect();
        let (_, store) = g.sync(ids[0], 1, None, None, assignments, now);
        assert_eq!(store, Some(1));
        g.stored(1, Ok(()), now);
        assert_eq!(g.state, GroupState::Stable);
        g
    }

    #[test]
    fn a_rebalance_gives_every_member_the_generation_and_the_leader_every_subscription() {
        let now = Instant::now();
        let mut g = Group::new("g");
        let (a, mut rx_a) = join_new(&mut g, "a", &["range", "roundrobin"], now);
        let (b, mut rx_b) = join_new(&mut g, "b", &["roundrobin", "range"], now);
        assert_eq!(g.state, GroupState::PreparingRebalance);
        g.tick(now);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        let ja = rx_a.try_recv().unwrap();
        let jb = rx_b.try_recv().unwrap();
        assert_eq!((ja.error, ja.generation, jb.generation), (0, 1, 1));
        assert_eq!(ja.leader, a);
        assert_eq!(ja.members.len(), 2, "the leader sees every member");
        assert!(jb.members.is_empty(), "followers see none");
        // One vote each: the tie goes to the name Kafka's ordering prefers, the same on both.
        assert_eq!(ja.protocol_name, jb.protocol_name);
        let (follower, store) = g.sync(&b, 1, None, None, vec![], now);
        assert!(store.is_none());
        let mut follower = later(follower);
        let (leader, store) = g.sync(
            &a,
            1,
            None,
            None,
            vec![(a.clone(), Bytes::from("A")), (b.clone(), Bytes::from("B"))],
            now,
        );
        let mut leader = later(leader);
        assert_eq!(store, Some(1));
        assert!(
            follower.try_recv().is_err(),
            "nothing before the group is stored"
        );
        g.stored(1, Ok(()), now);
        assert_eq!(g.state, GroupState::Stable);
        assert_eq!(leader.try_recv().unwrap().assignment, Bytes::from("A"));
        assert_eq!(follower.try_recv().unwrap().assignment, Bytes::from("B"));
    }

    #[test]
    fn heartbeats_and_commits_are_judged_by_member_and_generation() {
        let now = Instant::now();
        let mut g = stable(&["a", "b"], now);
        assert_eq!(g.heartbeat("a", 1, now), 0);
        assert_eq!(
            g.heartbeat("a", 0, now),
            ResponseError::IllegalGeneration.code()
        );
        assert_eq!(
            g.heartbeat("zz", 1, now),
            ResponseError::UnknownMemberId.code()
        );
        assert_eq!(g.check_commit("b", 1, now), 0);
        assert_eq!(
            g.check_commit("b", 2, now),
            ResponseError::IllegalGeneration.code()
        );
        assert_eq!(
            g.check_commit("zz", 1, now),
            ResponseError::UnknownMemberId.code()
        );
        assert_eq!(
            g.check_commit("", -1, now),
            ResponseError::IllegalGeneration.code(),
            "manual commits only while the group is empty"
        );
        assert_eq!(Group::new("e").check_commit("", -1, now), 0);
    }

    #[test]
    fn a_new_member_sends_the_group_into_a_rebalance_the_others_hear_of() {
        let now = Instant::now();
        let mut g = stable(&["a", "b"], now);
        let (_, mut rx_c) = join_new(&mut g, "c", &["range"], now);
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert_eq!(
            g.heartbeat("a", 1, now),
            ResponseError::RebalanceInProgress.code()
        );
        assert_eq!(
            now_reply(g.sync("a", 1, None, None, vec![], now).0).error,
            ResponseError::RebalanceInProgress.code()
        );
        let mut rx_a = later(g.join(
            request("a", &["range"]),
            || unreachable!(),
            Duration::ZERO,
            now,
        ));
        g.tick(now);
        assert_eq!(
            g.state,
            GroupState::PreparingRebalance,
            "b has not rejoined"
        );
        // b never rejoins: the rebalance timeout drops it.
        g.tick(now + REBALANCE);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(rx_a.try_recv().unwrap().generation, 2);
        assert_eq!(rx_c.try_recv().unwrap().generation, 2);
        assert!(!g.members.contains_key("b"));
    }

    #[test]
    fn a_silent_member_expires_after_its_session_and_the_rest_rebalance() {
        let now = Instant::now();
        let mut g = stable(&["a", "b"], now);
        let later_on = now + SESSION / 2;
        assert_eq!(g.heartbeat("a", 1, later_on), 0);
        g.tick(now + SESSION + Duration::from_millis(1));
        assert!(!g.members.contains_key("b"), "b's session ran out");
        assert!(g.members.contains_key("a"), "a heartbeat half way");
        assert_eq!(g.state, GroupState::PreparingRebalance);
    }

    #[test]
    fn leaving_and_unknown_members() {
        let now = Instant::now();
        let mut g = stable(&["a", "b"], now);
        assert_eq!(g.leave("zz", now), ResponseError::UnknownMemberId.code());
        assert_eq!(g.leave("b", now), 0);
        assert_eq!(g.state, GroupState::PreparingRebalance);
        let mut rx = later(g.join(
            request("a", &["range"]),
            || unreachable!(),
            Duration::ZERO,
            now,
        ));
        g.tick(now);
        assert_eq!(rx.try_recv().unwrap().members.len(), 1);
        assert_eq!(g.leave("a", now), 0);
        // The last member gone, nobody is left to wait for: the group is Empty at once.
        g.tick(now);
        assert_eq!(g.state, GroupState::Empty);
        assert_eq!(g.generation, 3);
        assert!(g.store_needed);
        let unknown = now_reply(g.join(
            request("a", &["range"]),
            || unreachable!(),
            Duration::ZERO,
            now,
        ));
        assert_eq!(unknown.error, ResponseError::UnknownMemberId.code());
    }

    #[test]
    fn protocols_must_match_the_group() {
        let now = Instant::now();
        let mut g = stable(&["a"], now);
        let mut other = request("", &["sticky"]);
        let r = now_reply(g.join(other.clone(), || "x".into(), Duration::ZERO, now));
        assert_eq!(r.error, ResponseError::InconsistentGroupProtocol.code());
        other.protocols = vec![("range".into(), Bytes::new())];
        other.protocol_type = "connect".into();
        let r = now_reply(g.join(other, || "x".into(), Duration::ZERO, now));
        assert_eq!(r.error, ResponseError::InconsistentGroupProtocol.code());
    }

    #[test]
    fn the_initial_delay_holds_an_empty_groups_first_rebalance() {
        let now = Instant::now();
        let delay = Duration::from_secs(3);
        let mut g = Group::new("g");
        let id = now_reply(g.join(request("", &["range"]), || "a".into(), delay, now)).member_id;
        let mut rx = later(g.join(request(&id, &["range"]), || unreachable!(), delay, now));
        g.tick(now + delay / 2);
        assert!(rx.try_recv().is_err(), "still waiting for more members");
        g.tick(now + delay);
        assert_eq!(rx.try_recv().unwrap().generation, 1);
    }

    #[test]
    fn of_two_commits_acknowledged_out_of_order_the_later_record_wins() {
        let commit = |offset, log_offset| CommittedOffset {
            offset,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp: 0,
            log_offset,
        };
        let mut g = Group::new("g");
        g.apply_commit("t".into(), 0, commit(20, 8));
        g.apply_commit("t".into(), 0, commit(10, 7));
        assert_eq!(g.offsets[&("t".to_string(), 0)].offset, 20);
        g.apply_commit("t".into(), 0, commit(30, 9));
        assert_eq!(g.offsets[&("t".to_string(), 0)].offset, 30);
    }

    #[test]
    fn losing_the_partition_answers_every_waiter_not_coordinator() {
        let now = Instant::now();
        let mut g = Group::new("g");
        let (_, mut rx) = join_new(&mut g, "a", &["range"], now);
        g.unload();
        assert_eq!(
            rx.try_recv().unwrap().error,
            ResponseError::NotCoordinator.code()
        );
        assert_eq!(g.state, GroupState::Dead);
    }
}
