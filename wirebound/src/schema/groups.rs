//! The group coordinator's requests: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups and DescribeGroups, kept apart from the
//! data-path messages because they belong to one broker module; and the responses a group
//! member decodes (the harness's consumer-group client).

use super::{f, msg, v, Field, Message, Ty, ANY, BOOL, BYTES, I16, I32, I64, I8, STR};

// FindCoordinator (10).
const FIND_COORDINATOR_REQUEST: &[Field] = &[
    v("key", 0, 3, STR),
    v("key_type", 1, ANY, I8),
    v("coordinator_keys", 4, ANY, Ty::Array(&STR)),
];

// JoinGroup (11).
const JOIN_PROTOCOL: &[Field] = &[f("name", STR), f("metadata", BYTES)];
const JOIN_GROUP_REQUEST: &[Field] = &[
    f("group_id", STR),
    f("session_timeout_ms", I32),
    v("rebalance_timeout_ms", 1, ANY, I32),
    f("member_id", STR),
    v("group_instance_id", 5, ANY, STR),
    f("protocol_type", STR),
    f("protocols", Ty::Array(&Ty::Struct(JOIN_PROTOCOL))),
    v("reason", 8, ANY, STR),
];

// SyncGroup (14).
const SYNC_ASSIGNMENT: &[Field] = &[f("member_id", STR), f("assignment", BYTES)];
const SYNC_GROUP_REQUEST: &[Field] = &[
    f("group_id", STR),
    f("generation_id", I32),
    f("member_id", STR),
    v("group_instance_id", 3, ANY, STR),
    v("protocol_type", 5, ANY, STR),
    v("protocol_name", 5, ANY, STR),
    f("assignments", Ty::Array(&Ty::Struct(SYNC_ASSIGNMENT))),
];

// Heartbeat (12).
const HEARTBEAT_REQUEST: &[Field] = &[
    f("group_id", STR),
    f("generation_id", I32),
    f("member_id", STR),
    v("group_instance_id", 3, ANY, STR),
];

// LeaveGroup (13).
const LEAVE_MEMBER: &[Field] = &[
    f("member_id", STR),
    f("group_instance_id", STR),
    v("reason", 5, ANY, STR),
];
const LEAVE_GROUP_REQUEST: &[Field] = &[
    f("group_id", STR),
    v("member_id", 0, 2, STR),
    v("members", 3, ANY, Ty::Array(&Ty::Struct(LEAVE_MEMBER))),
];

// OffsetCommit (8).
const COMMIT_PARTITION: &[Field] = &[
    f("partition_index", I32),
    f("committed_offset", I64),
    v("committed_leader_epoch", 6, ANY, I32),
    f("committed_metadata", STR),
];
const COMMIT_TOPIC: &[Field] = &[
    f("name", STR),
    f("partitions", Ty::Array(&Ty::Struct(COMMIT_PARTITION))),
];
const OFFSET_COMMIT_REQUEST: &[Field] = &[
    f("group_id", STR),
    f("generation_id_or_member_epoch", I32),
    f("member_id", STR),
    v("group_instance_id", 7, ANY, STR),
    v("retention_time_ms", 2, 4, I64),
    f("topics", Ty::Array(&Ty::Struct(COMMIT_TOPIC))),
];

// OffsetFetch (9).
const FETCH_OFFSETS_TOPIC: &[Field] = &[f("name", STR), f("partition_indexes", Ty::Array(&I32))];
const FETCH_OFFSETS_GROUP: &[Field] = &[
    f("group_id", STR),
    v("member_id", 9, ANY, STR),
    v("member_epoch", 9, ANY, I32),
    f("topics", Ty::Array(&Ty::Struct(FETCH_OFFSETS_TOPIC))),
];
const OFFSET_FETCH_REQUEST: &[Field] = &[
    v("group_id", 0, 7, STR),
    v("topics", 0, 7, Ty::Array(&Ty::Struct(FETCH_OFFSETS_TOPIC))),
    v(
        "groups",
        8,
        ANY,
        Ty::Array(&Ty::Struct(FETCH_OFFSETS_GROUP)),
    ),
    v("require_stable", 7, ANY, BOOL),
];

// ListGroups (16).
const LIST_GROUPS_REQUEST: &[Field] = &[
    v("states_filter", 4, ANY, Ty::Array(&STR)),
    v("types_filter", 5, ANY, Ty::Array(&STR)),
];

// DescribeGroups (15).
const DESCRIBE_GROUPS_REQUEST: &[Field] = &[
    f("groups", Ty::Array(&STR)),
    v("include_authorized_operations", 3, ANY, BOOL),
];

// The messages, listed in [`super::REQUESTS`].
pub(super) const OFFSET_COMMIT: Message = msg("OffsetCommit", 8, 2, 9, 8, OFFSET_COMMIT_REQUEST);
pub(super) const OFFSET_FETCH: Message = msg("OffsetFetch", 9, 1, 9, 6, OFFSET_FETCH_REQUEST);
pub(super) const FIND_COORDINATOR: Message =
    msg("FindCoordinator", 10, 0, 6, 3, FIND_COORDINATOR_REQUEST);
pub(super) const JOIN_GROUP: Message = msg("JoinGroup", 11, 0, 9, 6, JOIN_GROUP_REQUEST);
pub(super) const HEARTBEAT: Message = msg("Heartbeat", 12, 0, 4, 4, HEARTBEAT_REQUEST);
pub(super) const LEAVE_GROUP: Message = msg("LeaveGroup", 13, 0, 5, 4, LEAVE_GROUP_REQUEST);
pub(super) const SYNC_GROUP: Message = msg("SyncGroup", 14, 0, 5, 4, SYNC_GROUP_REQUEST);
pub(super) const DESCRIBE_GROUPS: Message =
    msg("DescribeGroups", 15, 0, 6, 5, DESCRIBE_GROUPS_REQUEST);
pub(super) const LIST_GROUPS: Message = msg("ListGroups", 16, 0, 5, 3, LIST_GROUPS_REQUEST);

// The responses a group member decodes.
const COORDINATOR: &[Field] = &[
    f("key", STR),
    f("node_id", I32),
    f("host", STR),
    f("port", I32),
    f("error_code", I16),
    f("error_message", STR),
];
const FIND_COORDINATOR_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 1, ANY, I32),
    v("error_code", 0, 3, I16),
    v("error_message", 1, 3, STR),
    v("node_id", 0, 3, I32),
    v("host", 0, 3, STR),
    v("port", 0, 3, I32),
    v("coordinators", 4, ANY, Ty::Array(&Ty::Struct(COORDINATOR))),
];
const JOIN_MEMBER: &[Field] = &[
    f("member_id", STR),
    v("group_instance_id", 5, ANY, STR),
    f("metadata", BYTES),
];
const JOIN_GROUP_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 2, ANY, I32),
    f("error_code", I16),
    f("generation_id", I32),
    v("protocol_type", 7, ANY, STR),
    f("protocol_name", STR),
    f("leader", STR),
    v("skip_assignment", 9, ANY, BOOL),
    f("member_id", STR),
    f("members", Ty::Array(&Ty::Struct(JOIN_MEMBER))),
];
const SYNC_GROUP_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 1, ANY, I32),
    f("error_code", I16),
    v("protocol_type", 5, ANY, STR),
    v("protocol_name", 5, ANY, STR),
    f("assignment", BYTES),
];
const HEARTBEAT_RESPONSE: &[Field] = &[v("throttle_time_ms", 1, ANY, I32), f("error_code", I16)];
const COMMIT_PARTITION_RESPONSE: &[Field] = &[f("partition_index", I32), f("error_code", I16)];
const COMMIT_TOPIC_RESPONSE: &[Field] = &[
    f("name", STR),
    f(
        "partitions",
        Ty::Array(&Ty::Struct(COMMIT_PARTITION_RESPONSE)),
    ),
];
const OFFSET_COMMIT_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 3, ANY, I32),
    f("topics", Ty::Array(&Ty::Struct(COMMIT_TOPIC_RESPONSE))),
];
const FETCHED_OFFSET: &[Field] = &[
    f("partition_index", I32),
    f("committed_offset", I64),
    v("committed_leader_epoch", 5, ANY, I32),
    f("metadata", STR),
    f("error_code", I16),
];
const FETCHED_TOPIC: &[Field] = &[
    f("name", STR),
    f("partitions", Ty::Array(&Ty::Struct(FETCHED_OFFSET))),
];
const FETCHED_GROUP: &[Field] = &[
    f("group_id", STR),
    f("topics", Ty::Array(&Ty::Struct(FETCHED_TOPIC))),
    f("error_code", I16),
];
const OFFSET_FETCH_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 3, ANY, I32),
    v("topics", 0, 7, Ty::Array(&Ty::Struct(FETCHED_TOPIC))),
    v("error_code", 2, 7, I16),
    v("groups", 8, ANY, Ty::Array(&Ty::Struct(FETCHED_GROUP))),
];

pub(super) const OFFSET_COMMIT_RESPONSE_MSG: Message =
    msg("OffsetCommit", 8, 2, 9, 8, OFFSET_COMMIT_RESPONSE);
pub(super) const OFFSET_FETCH_RESPONSE_MSG: Message =
    msg("OffsetFetch", 9, 1, 9, 6, OFFSET_FETCH_RESPONSE);
pub(super) const FIND_COORDINATOR_RESPONSE_MSG: Message =
    msg("FindCoordinator", 10, 0, 6, 3, FIND_COORDINATOR_RESPONSE);
pub(super) const JOIN_GROUP_RESPONSE_MSG: Message =
    msg("JoinGroup", 11, 0, 9, 6, JOIN_GROUP_RESPONSE);
pub(super) const HEARTBEAT_RESPONSE_MSG: Message =
    msg("Heartbeat", 12, 0, 4, 4, HEARTBEAT_RESPONSE);
pub(super) const SYNC_GROUP_RESPONSE_MSG: Message =
    msg("SyncGroup", 14, 0, 5, 4, SYNC_GROUP_RESPONSE);
