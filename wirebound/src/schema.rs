//! The wire layout of the Kafka messages tidemark decodes, as far as positions and element counts
//! go: which fields each version carries, in which order, and which are tagged. Field values do
//! not matter here, so every integer, boolean and UUID is just a width, and every string, bytes
//! and array may be null. Written from the Kafka message definitions as kafka-protocol 0.18
//! decodes them; `tests/agreement.rs` checks every version against that crate.

/// How a field is laid out.
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    /// A fixed number of bytes: integers, booleans, UUIDs, floats.
    Fixed(usize),
    /// A string: INT16 length, or an unsigned varint length + 1 in flexible versions.
    Str,
    /// Bytes or records: INT32 length, or an unsigned varint length + 1 in flexible versions.
    Bytes,
    /// An array: INT32 count, or an unsigned varint count + 1 in flexible versions.
    Array(&'static Ty),
    /// A nested structure.
    Struct(&'static [Field]),
    /// A nested structure that may be null: INT8 -1 for null, else 1 and the structure.
    NullableStruct(&'static [Field]),
}

/// One field of a structure.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its name, for error messages.
    pub name: &'static str,
    /// The first version that carries it.
    pub from: i16,
    /// The last version that carries it.
    pub to: i16,
    /// Its layout.
    pub ty: Ty,
    /// For a tagged field, its tag; it is then read in the tagged-field section of flexible
    /// versions, and only in `from..=to` (elsewhere the tag is skipped by its size).
    pub tag: Option<u32>,
}

impl Field {
    /// Whether `version` carries this field.
    pub fn in_version(&self, version: i16) -> bool {
        self.from <= version && version <= self.to
    }
}

/// One request or response message.
#[derive(Debug, Clone, Copy)]
pub struct Message {
    /// The API's name.
    pub name: &'static str,
    /// The API key.
    pub key: i16,
    /// The oldest version.
    pub min: i16,
    /// The newest version.
    pub max: i16,
    /// The first flexible version (compact lengths, tagged fields).
    pub flexible: i16,
    /// The top-level fields.
    pub fields: &'static [Field],
}

mod groups;

const ANY: i16 = i16::MAX;
const I8: Ty = Ty::Fixed(1);
const BOOL: Ty = Ty::Fixed(1);
const I16: Ty = Ty::Fixed(2);
const I32: Ty = Ty::Fixed(4);
const I64: Ty = Ty::Fixed(8);
const UUID: Ty = Ty::Fixed(16);
const STR: Ty = Ty::Str;
const BYTES: Ty = Ty::Bytes;

/// A field in every version.
const fn f(name: &'static str, ty: Ty) -> Field {
    v(name, 0, ANY, ty)
}

/// A field in versions `from..=to`.
const fn v(name: &'static str, from: i16, to: i16, ty: Ty) -> Field {
    Field {
        name,
        from,
        to,
        ty,
        tag: None,
    }
}

/// A tagged field, read in versions `from..=to`.
const fn t(name: &'static str, tag: u32, from: i16, to: i16, ty: Ty) -> Field {
    Field {
        name,
        from,
        to,
        ty,
        tag: Some(tag),
    }
}

// Produce (0).
const PRODUCE_PARTITION: &[Field] = &[f("index", I32), f("records", BYTES)];
const PRODUCE_TOPIC: &[Field] = &[
    v("name", 0, 12, STR),
    v("topic_id", 13, ANY, UUID),
    f("partition_data", Ty::Array(&Ty::Struct(PRODUCE_PARTITION))),
];
const PRODUCE_REQUEST: &[Field] = &[
    f("transactional_id", STR),
    f("acks", I16),
    f("timeout_ms", I32),
    f("topic_data", Ty::Array(&Ty::Struct(PRODUCE_TOPIC))),
];
const PRODUCE_RECORD_ERROR: &[Field] = &[
    v("batch_index", 8, ANY, I32),
    v("batch_index_error_message", 8, ANY, STR),
];
const PRODUCE_LEADER: &[Field] = &[
    v("leader_id", 10, ANY, I32),
    v("leader_epoch", 10, ANY, I32),
];
const PRODUCE_NODE: &[Field] = &[
    v("node_id", 10, ANY, I32),
    v("host", 10, ANY, STR),
    v("port", 10, ANY, I32),
    v("rack", 10, ANY, STR),
];
const PRODUCE_PARTITION_RESPONSE: &[Field] = &[
    f("index", I32),
    f("error_code", I16),
    f("base_offset", I64),
    f("log_append_time_ms", I64),
    v("log_start_offset", 5, ANY, I64),
    v(
        "record_errors",
        8,
        ANY,
        Ty::Array(&Ty::Struct(PRODUCE_RECORD_ERROR)),
    ),
    v("error_message", 8, ANY, STR),
    t("current_leader", 0, 10, ANY, Ty::Struct(PRODUCE_LEADER)),
];
const PRODUCE_TOPIC_RESPONSE: &[Field] = &[
    v("name", 0, 12, STR),
    v("topic_id", 13, ANY, UUID),
    f(
        "partition_responses",
        Ty::Array(&Ty::Struct(PRODUCE_PARTITION_RESPONSE)),
    ),
];
const PRODUCE_RESPONSE: &[Field] = &[
    f("responses", Ty::Array(&Ty::Struct(PRODUCE_TOPIC_RESPONSE))),
    f("throttle_time_ms", I32),
    t(
        "node_endpoints",
        0,
        10,
        ANY,
        Ty::Array(&Ty::Struct(PRODUCE_NODE)),
    ),
];

// Fetch (1).
const FETCH_PARTITION: &[Field] = &[
    f("partition", I32),
    v("current_leader_epoch", 9, ANY, I32),
    f("fetch_offset", I64),
    v("last_fetched_epoch", 12, ANY, I32),
    v("log_start_offset", 5, ANY, I64),
    f("partition_max_bytes", I32),
    t("replica_directory_id", 0, 17, ANY, UUID),
    t("high_watermark", 1, 18, ANY, I64),
];
const FETCH_TOPIC: &[Field] = &[
    v("topic", 0, 12, STR),
    v("topic_id", 13, ANY, UUID),
    f("partitions", Ty::Array(&Ty::Struct(FETCH_PARTITION))),
];
const FETCH_FORGOTTEN: &[Field] = &[
    v("topic", 7, 12, STR),
    v("topic_id", 13, ANY, UUID),
    v("partitions", 7, ANY, Ty::Array(&I32)),
];
const FETCH_REPLICA_STATE: &[Field] = &[
    v("replica_id", 15, ANY, I32),
    v("replica_epoch", 15, ANY, I64),
];
const FETCH_REQUEST: &[Field] = &[
    v("replica_id", 0, 14, I32),
    f("max_wait_ms", I32),
    f("min_bytes", I32),
    v("max_bytes", 3, ANY, I32),
    v("isolation_level", 4, ANY, I8),
    v("session_id", 7, ANY, I32),
    v("session_epoch", 7, ANY, I32),
    f("topics", Ty::Array(&Ty::Struct(FETCH_TOPIC))),
    v(
        "forgotten_topics_data",
        7,
        ANY,
        Ty::Array(&Ty::Struct(FETCH_FORGOTTEN)),
    ),
    v("rack_id", 11, ANY, STR),
    t("cluster_id", 0, 12, ANY, STR),
    t("replica_state", 1, 15, ANY, Ty::Struct(FETCH_REPLICA_STATE)),
];
const FETCH_ABORTED: &[Field] = &[f("producer_id", I64), f("first_offset", I64)];
const FETCH_EPOCH_END: &[Field] = &[v("epoch", 12, ANY, I32), v("end_offset", 12, ANY, I64)];
const FETCH_LEADER: &[Field] = &[
    v("leader_id", 12, ANY, I32),
    v("leader_epoch", 12, ANY, I32),
];
const FETCH_SNAPSHOT_ID: &[Field] = &[f("end_offset", I64), f("epoch", I32)];
const FETCH_NODE: &[Field] = &[
    v("node_id", 16, ANY, I32),
    v("host", 16, ANY, STR),
    v("port", 16, ANY, I32),
    v("rack", 16, ANY, STR),
];
const FETCH_PARTITION_DATA: &[Field] = &[
    f("partition_index", I32),
    f("error_code", I16),
    f("high_watermark", I64),
    v("last_stable_offset", 4, ANY, I64),
    v("log_start_offset", 5, ANY, I64),
    v(
        "aborted_transactions",
        4,
        ANY,
        Ty::Array(&Ty::Struct(FETCH_ABORTED)),
    ),
    v("preferred_read_replica", 11, ANY, I32),
    f("records", BYTES),
    t("diverging_epoch", 0, 12, ANY, Ty::Struct(FETCH_EPOCH_END)),
    t("current_leader", 1, 12, ANY, Ty::Struct(FETCH_LEADER)),
    t("snapshot_id", 2, 12, ANY, Ty::Struct(FETCH_SNAPSHOT_ID)),
];
const FETCH_TOPIC_RESPONSE: &[Field] = &[
    v("topic", 0, 12, STR),
    v("topic_id", 13, ANY, UUID),
    f("partitions", Ty::Array(&Ty::Struct(FETCH_PARTITION_DATA))),
];
const FETCH_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 1, ANY, I32),
    v("error_code", 7, ANY, I16),
    v("session_id", 7, ANY, I32),
    f("responses", Ty::Array(&Ty::Struct(FETCH_TOPIC_RESPONSE))),
    t(
        "node_endpoints",
        0,
        16,
        ANY,
        Ty::Array(&Ty::Struct(FETCH_NODE)),
    ),
];

// ListOffsets (2).
const LIST_OFFSETS_PARTITION: &[Field] = &[
    f("partition_index", I32),
    v("current_leader_epoch", 4, ANY, I32),
    f("timestamp", I64),
];
const LIST_OFFSETS_TOPIC: &[Field] = &[
    f("name", STR),
    f("partitions", Ty::Array(&Ty::Struct(LIST_OFFSETS_PARTITION))),
];
const LIST_OFFSETS_REQUEST: &[Field] = &[
    f("replica_id", I32),
    v("isolation_level", 2, ANY, I8),
    f("topics", Ty::Array(&Ty::Struct(LIST_OFFSETS_TOPIC))),
    v("timeout_ms", 10, ANY, I32),
];
const LIST_OFFSETS_PARTITION_RESPONSE: &[Field] = &[
    f("partition_index", I32),
    f("error_code", I16),
    v("timestamp", 1, ANY, I64),
    v("offset", 1, ANY, I64),
    v("leader_epoch", 4, ANY, I32),
];
const LIST_OFFSETS_TOPIC_RESPONSE: &[Field] = &[
    f("name", STR),
    f(
        "partitions",
        Ty::Array(&Ty::Struct(LIST_OFFSETS_PARTITION_RESPONSE)),
    ),
];
const LIST_OFFSETS_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 2, ANY, I32),
    f(
        "topics",
        Ty::Array(&Ty::Struct(LIST_OFFSETS_TOPIC_RESPONSE)),
    ),
];

// Metadata (3).
const METADATA_TOPIC: &[Field] = &[v("topic_id", 10, ANY, UUID), f("name", STR)];
const METADATA_REQUEST: &[Field] = &[
    f("topics", Ty::Array(&Ty::Struct(METADATA_TOPIC))),
    v("allow_auto_topic_creation", 4, ANY, BOOL),
    v("include_cluster_authorized_operations", 8, 10, BOOL),
    v("include_topic_authorized_operations", 8, ANY, BOOL),
];
const METADATA_BROKER: &[Field] = &[
    f("node_id", I32),
    f("host", STR),
    f("port", I32),
    v("rack", 1, ANY, STR),
];
const METADATA_PARTITION: &[Field] = &[
    f("error_code", I16),
    f("partition_index", I32),
    f("leader_id", I32),
    v("leader_epoch", 7, ANY, I32),
    f("replica_nodes", Ty::Array(&I32)),
    f("isr_nodes", Ty::Array(&I32)),
    v("offline_replicas", 5, ANY, Ty::Array(&I32)),
];
const METADATA_TOPIC_RESPONSE: &[Field] = &[
    f("error_code", I16),
    f("name", STR),
    v("topic_id", 10, ANY, UUID),
    v("is_internal", 1, ANY, BOOL),
    f("partitions", Ty::Array(&Ty::Struct(METADATA_PARTITION))),
    v("topic_authorized_operations", 8, ANY, I32),
];
const METADATA_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 3, ANY, I32),
    f("brokers", Ty::Array(&Ty::Struct(METADATA_BROKER))),
    v("cluster_id", 2, ANY, STR),
    v("controller_id", 1, ANY, I32),
    f("topics", Ty::Array(&Ty::Struct(METADATA_TOPIC_RESPONSE))),
    v("cluster_authorized_operations", 8, 10, I32),
    v("error_code", 13, ANY, I16),
];

// OffsetForLeaderEpoch (23).
const EPOCH_PARTITION: &[Field] = &[
    f("partition", I32),
    v("current_leader_epoch", 2, ANY, I32),
    f("leader_epoch", I32),
];
const EPOCH_TOPIC: &[Field] = &[
    f("topic", STR),
    f("partitions", Ty::Array(&Ty::Struct(EPOCH_PARTITION))),
];
const EPOCH_REQUEST: &[Field] = &[
    v("replica_id", 3, ANY, I32),
    f("topics", Ty::Array(&Ty::Struct(EPOCH_TOPIC))),
];
const EPOCH_END_OFFSET: &[Field] = &[
    f("error_code", I16),
    f("partition", I32),
    v("leader_epoch", 1, ANY, I32),
    f("end_offset", I64),
];
const EPOCH_TOPIC_RESULT: &[Field] = &[
    f("topic", STR),
    f("partitions", Ty::Array(&Ty::Struct(EPOCH_END_OFFSET))),
];
const EPOCH_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 2, ANY, I32),
    f("topics", Ty::Array(&Ty::Struct(EPOCH_TOPIC_RESULT))),
];

// ApiVersions (18).
const API_VERSIONS_REQUEST: &[Field] = &[
    v("client_software_name", 3, ANY, STR),
    v("client_software_version", 3, ANY, STR),
];
const API_VERSION: &[Field] = &[
    f("api_key", I16),
    f("min_version", I16),
    f("max_version", I16),
];
const SUPPORTED_FEATURE: &[Field] = &[
    v("name", 3, ANY, STR),
    v("min_version", 3, ANY, I16),
    v("max_version", 3, ANY, I16),
];
const FINALIZED_FEATURE: &[Field] = &[
    v("name", 3, ANY, STR),
    v("max_version_level", 3, ANY, I16),
    v("min_version_level", 3, ANY, I16),
];
const API_VERSIONS_RESPONSE: &[Field] = &[
    f("error_code", I16),
    f("api_keys", Ty::Array(&Ty::Struct(API_VERSION))),
    v("throttle_time_ms", 1, ANY, I32),
    t(
        "supported_features",
        0,
        3,
        ANY,
        Ty::Array(&Ty::Struct(SUPPORTED_FEATURE)),
    ),
    t("finalized_features_epoch", 1, 3, ANY, I64),
    t(
        "finalized_features",
        2,
        3,
        ANY,
        Ty::Array(&Ty::Struct(FINALIZED_FEATURE)),
    ),
    t("zk_migration_ready", 3, 3, ANY, BOOL),
];

// CreateTopics (19).
const CREATE_ASSIGNMENT: &[Field] = &[f("partition_index", I32), f("broker_ids", Ty::Array(&I32))];
const CREATE_CONFIG: &[Field] = &[f("name", STR), f("value", STR)];
const CREATE_TOPIC: &[Field] = &[
    f("name", STR),
    f("num_partitions", I32),
    f("replication_factor", I16),
    f("assignments", Ty::Array(&Ty::Struct(CREATE_ASSIGNMENT))),
    f("configs", Ty::Array(&Ty::Struct(CREATE_CONFIG))),
];
const CREATE_TOPICS_REQUEST: &[Field] = &[
    f("topics", Ty::Array(&Ty::Struct(CREATE_TOPIC))),
    f("timeout_ms", I32),
    v("validate_only", 1, ANY, BOOL),
];
const CREATE_RESULT_CONFIG: &[Field] = &[
    v("name", 5, ANY, STR),
    v("value", 5, ANY, STR),
    v("read_only", 5, ANY, BOOL),
    v("config_source", 5, ANY, I8),
    v("is_sensitive", 5, ANY, BOOL),
];
const CREATE_RESULT: &[Field] = &[
    f("name", STR),
    v("topic_id", 7, ANY, UUID),
    f("error_code", I16),
    v("error_message", 1, ANY, STR),
    v("num_partitions", 5, ANY, I32),
    v("replication_factor", 5, ANY, I16),
    v(
        "configs",
        5,
        ANY,
        Ty::Array(&Ty::Struct(CREATE_RESULT_CONFIG)),
    ),
    t("topic_config_error_code", 0, 5, ANY, I16),
];
const CREATE_TOPICS_RESPONSE: &[Field] = &[
    v("throttle_time_ms", 2, ANY, I32),
    f("topics", Ty::Array(&Ty::Struct(CREATE_RESULT))),
];

// DeleteTopics (20).
const DELETE_TOPIC: &[Field] = &[v("name", 6, ANY, STR), v("topic_id", 6, ANY, UUID)];
const DELETE_TOPICS_REQUEST: &[Field] = &[
    v("topics", 6, ANY, Ty::Array(&Ty::Struct(DELETE_TOPIC))),
    v("topic_names", 0, 5, Ty::Array(&STR)),
    f("timeout_ms", I32),
];

// DescribeConfigs (32).
const DESCRIBE_RESOURCE: &[Field] = &[
    f("resource_type", I8),
    f("resource_name", STR),
    f("configuration_keys", Ty::Array(&STR)),
];
const DESCRIBE_CONFIGS_REQUEST: &[Field] = &[
    f("resources", Ty::Array(&Ty::Struct(DESCRIBE_RESOURCE))),
    v("include_synonyms", 1, ANY, BOOL),
    v("include_documentation", 3, ANY, BOOL),
];

const DESCRIBE_SYNONYM: &[Field] = &[f("name", STR), f("value", STR), f("source", I8)];
const DESCRIBE_CONFIG: &[Field] = &[
    f("name", STR),
    f("value", STR),
    f("read_only", BOOL),
    v("is_default", 0, 0, BOOL),
    v("config_source", 1, ANY, I8),
    f("is_sensitive", BOOL),
    v("synonyms", 1, ANY, Ty::Array(&Ty::Struct(DESCRIBE_SYNONYM))),
    v("config_type", 3, ANY, I8),
    v("documentation", 3, ANY, STR),
];
const DESCRIBE_RESULT: &[Field] = &[
    f("error_code", I16),
    f("error_message", STR),
    f("resource_type", I8),
    f("resource_name", STR),
    f("configs", Ty::Array(&Ty::Struct(DESCRIBE_CONFIG))),
];
const DESCRIBE_CONFIGS_RESPONSE: &[Field] = &[
    f("throttle_time_ms", I32),
    f("results", Ty::Array(&Ty::Struct(DESCRIBE_RESULT))),
];

// IncrementalAlterConfigs (44).
const ALTERABLE_CONFIG: &[Field] = &[f("name", STR), f("config_operation", I8), f("value", STR)];
const ALTER_RESOURCE: &[Field] = &[
    f("resource_type", I8),
    f("resource_name", STR),
    f("configs", Ty::Array(&Ty::Struct(ALTERABLE_CONFIG))),
];
const INCREMENTAL_ALTER_CONFIGS_REQUEST: &[Field] = &[
    f("resources", Ty::Array(&Ty::Struct(ALTER_RESOURCE))),
    f("validate_only", BOOL),
];
const ALTER_RESOURCE_RESPONSE: &[Field] = &[
    f("error_code", I16),
    f("error_message", STR),
    f("resource_type", I8),
    f("resource_name", STR),
];
const INCREMENTAL_ALTER_CONFIGS_RESPONSE: &[Field] = &[
    f("throttle_time_ms", I32),
    f("responses", Ty::Array(&Ty::Struct(ALTER_RESOURCE_RESPONSE))),
];

// InitProducerId (22).
const INIT_PRODUCER_ID_REQUEST: &[Field] = &[
    f("transactional_id", STR),
    f("transaction_timeout_ms", I32),
    v("producer_id", 3, ANY, I64),
    v("producer_epoch", 3, ANY, I16),
];
const INIT_PRODUCER_ID_RESPONSE: &[Field] = &[
    f("throttle_time_ms", I32),
    f("error_code", I16),
    f("producer_id", I64),
    f("producer_epoch", I16),
];

// DescribeTopicPartitions (75), flexible from v0.
const DESCRIBE_TOPIC_PARTITIONS_TOPIC: &[Field] = &[f("name", STR)];
const DESCRIBE_TOPIC_PARTITIONS_CURSOR: &[Field] =
    &[f("topic_name", STR), f("partition_index", I32)];
const DESCRIBE_TOPIC_PARTITIONS_REQUEST: &[Field] = &[
    f(
        "topics",
        Ty::Array(&Ty::Struct(DESCRIBE_TOPIC_PARTITIONS_TOPIC)),
    ),
    f("response_partition_limit", I32),
    f(
        "cursor",
        Ty::NullableStruct(DESCRIBE_TOPIC_PARTITIONS_CURSOR),
    ),
];
const DESCRIBE_TOPIC_PARTITIONS_PARTITION: &[Field] = &[
    f("error_code", I16),
    f("partition_index", I32),
    f("leader_id", I32),
    f("leader_epoch", I32),
    f("replica_nodes", Ty::Array(&I32)),
    f("isr_nodes", Ty::Array(&I32)),
    f("eligible_leader_replicas", Ty::Array(&I32)),
    f("last_known_elr", Ty::Array(&I32)),
    f("offline_replicas", Ty::Array(&I32)),
];
const DESCRIBE_TOPIC_PARTITIONS_TOPIC_RESPONSE: &[Field] = &[
    f("error_code", I16),
    f("name", STR),
    f("topic_id", UUID),
    f("is_internal", BOOL),
    f(
        "partitions",
        Ty::Array(&Ty::Struct(DESCRIBE_TOPIC_PARTITIONS_PARTITION)),
    ),
    f("topic_authorized_operations", I32),
];
const DESCRIBE_TOPIC_PARTITIONS_RESPONSE: &[Field] = &[
    f("throttle_time_ms", I32),
    f(
        "topics",
        Ty::Array(&Ty::Struct(DESCRIBE_TOPIC_PARTITIONS_TOPIC_RESPONSE)),
    ),
    f(
        "next_cursor",
        Ty::NullableStruct(DESCRIBE_TOPIC_PARTITIONS_CURSOR),
    ),
];

// DeleteRecords (21).
const DELETE_RECORDS_PARTITION: &[Field] = &[f("partition_index", I32), f("offset", I64)];
const DELETE_RECORDS_TOPIC: &[Field] = &[
    f("name", STR),
    f(
        "partitions",
        Ty::Array(&Ty::Struct(DELETE_RECORDS_PARTITION)),
    ),
];
const DELETE_RECORDS_REQUEST: &[Field] = &[
    f("topics", Ty::Array(&Ty::Struct(DELETE_RECORDS_TOPIC))),
    f("timeout_ms", I32),
];
const DELETE_RECORDS_PARTITION_RESULT: &[Field] = &[
    f("partition_index", I32),
    f("low_watermark", I64),
    f("error_code", I16),
];
const DELETE_RECORDS_TOPIC_RESULT: &[Field] = &[
    f("name", STR),
    f(
        "partitions",
        Ty::Array(&Ty::Struct(DELETE_RECORDS_PARTITION_RESULT)),
    ),
];
const DELETE_RECORDS_RESPONSE: &[Field] = &[
    f("throttle_time_ms", I32),
    f(
        "topics",
        Ty::Array(&Ty::Struct(DELETE_RECORDS_TOPIC_RESULT)),
    ),
];

// ElectLeaders (43).
const ELECT_TOPIC: &[Field] = &[f("topic", STR), f("partitions", Ty::Array(&I32))];
const ELECT_LEADERS_REQUEST: &[Field] = &[
    v("election_type", 1, ANY, I8),
    f("topic_partitions", Ty::Array(&Ty::Struct(ELECT_TOPIC))),
    f("timeout_ms", I32),
];
const ELECT_PARTITION_RESULT: &[Field] = &[
    f("partition_id", I32),
    f("error_code", I16),
    f("error_message", STR),
];
const ELECT_RESULT: &[Field] = &[
    f("topic", STR),
    f(
        "partition_result",
        Ty::Array(&Ty::Struct(ELECT_PARTITION_RESULT)),
    ),
];
const ELECT_LEADERS_RESPONSE: &[Field] = &[
    f("throttle_time_ms", I32),
    v("error_code", 1, ANY, I16),
    f(
        "replica_election_results",
        Ty::Array(&Ty::Struct(ELECT_RESULT)),
    ),
];

// DescribeQuorum (55), the versions the broker serves.
const QUORUM_PARTITION: &[Field] = &[f("partition_index", I32)];
const QUORUM_TOPIC: &[Field] = &[
    f("topic_name", STR),
    f("partitions", Ty::Array(&Ty::Struct(QUORUM_PARTITION))),
];
const DESCRIBE_QUORUM_REQUEST: &[Field] = &[f("topics", Ty::Array(&Ty::Struct(QUORUM_TOPIC)))];
const QUORUM_REPLICA: &[Field] = &[
    f("replica_id", I32),
    v("replica_directory_id", 2, ANY, UUID),
    f("log_end_offset", I64),
    v("last_fetch_timestamp", 1, ANY, I64),
    v("last_caught_up_timestamp", 1, ANY, I64),
];
const QUORUM_PARTITION_DATA: &[Field] = &[
    f("partition_index", I32),
    f("error_code", I16),
    v("error_message", 2, ANY, STR),
    f("leader_id", I32),
    f("leader_epoch", I32),
    f("high_watermark", I64),
    f("current_voters", Ty::Array(&Ty::Struct(QUORUM_REPLICA))),
    f("observers", Ty::Array(&Ty::Struct(QUORUM_REPLICA))),
];
const QUORUM_TOPIC_DATA: &[Field] = &[
    f("topic_name", STR),
    f("partitions", Ty::Array(&Ty::Struct(QUORUM_PARTITION_DATA))),
];
const DESCRIBE_QUORUM_RESPONSE: &[Field] = &[
    f("error_code", I16),
    v("error_message", 2, ANY, STR),
    f("topics", Ty::Array(&Ty::Struct(QUORUM_TOPIC_DATA))),
];

const fn msg(
    name: &'static str,
    key: i16,
    min: i16,
    max: i16,
    flexible: i16,
    fields: &'static [Field],
) -> Message {
    Message {
        name,
        key,
        min,
        max,
        flexible,
        fields,
    }
}

/// Every request the broker decodes.
pub const REQUESTS: &[Message] = &[
    msg("Produce", 0, 3, 13, 9, PRODUCE_REQUEST),
    msg("Fetch", 1, 4, 18, 12, FETCH_REQUEST),
    msg("ListOffsets", 2, 1, 10, 6, LIST_OFFSETS_REQUEST),
    msg("Metadata", 3, 0, 13, 9, METADATA_REQUEST),
    groups::OFFSET_COMMIT,
    groups::OFFSET_FETCH,
    groups::FIND_COORDINATOR,
    groups::JOIN_GROUP,
    groups::HEARTBEAT,
    groups::LEAVE_GROUP,
    groups::SYNC_GROUP,
    groups::DESCRIBE_GROUPS,
    groups::LIST_GROUPS,
    msg("ApiVersions", 18, 0, 4, 3, API_VERSIONS_REQUEST),
    msg("CreateTopics", 19, 2, 7, 5, CREATE_TOPICS_REQUEST),
    msg("DeleteTopics", 20, 1, 6, 4, DELETE_TOPICS_REQUEST),
    msg("InitProducerId", 22, 0, 5, 2, INIT_PRODUCER_ID_REQUEST),
    msg("DeleteRecords", 21, 0, 2, 2, DELETE_RECORDS_REQUEST),
    msg("OffsetForLeaderEpoch", 23, 2, 4, 4, EPOCH_REQUEST),
    msg("DescribeConfigs", 32, 1, 4, 4, DESCRIBE_CONFIGS_REQUEST),
    msg("ElectLeaders", 43, 0, 2, 2, ELECT_LEADERS_REQUEST),
    msg("DescribeQuorum", 55, 0, 1, 0, DESCRIBE_QUORUM_REQUEST),
    msg(
        "IncrementalAlterConfigs",
        44,
        0,
        1,
        1,
        INCREMENTAL_ALTER_CONFIGS_REQUEST,
    ),
    msg(
        "DescribeTopicPartitions",
        75,
        0,
        0,
        0,
        DESCRIBE_TOPIC_PARTITIONS_REQUEST,
    ),
];

/// Every response a tidemark client decodes.
pub const RESPONSES: &[Message] = &[
    msg("Produce", 0, 3, 13, 9, PRODUCE_RESPONSE),
    msg("Fetch", 1, 4, 18, 12, FETCH_RESPONSE),
    msg("ListOffsets", 2, 1, 10, 6, LIST_OFFSETS_RESPONSE),
    msg("Metadata", 3, 0, 13, 9, METADATA_RESPONSE),
    groups::OFFSET_COMMIT_RESPONSE_MSG,
    groups::OFFSET_FETCH_RESPONSE_MSG,
    groups::FIND_COORDINATOR_RESPONSE_MSG,
    groups::JOIN_GROUP_RESPONSE_MSG,
    groups::HEARTBEAT_RESPONSE_MSG,
    groups::SYNC_GROUP_RESPONSE_MSG,
    msg("ApiVersions", 18, 0, 4, 3, API_VERSIONS_RESPONSE),
    msg("CreateTopics", 19, 2, 7, 5, CREATE_TOPICS_RESPONSE),
    msg("InitProducerId", 22, 0, 5, 2, INIT_PRODUCER_ID_RESPONSE),
    msg("DeleteRecords", 21, 0, 2, 2, DELETE_RECORDS_RESPONSE),
    msg("OffsetForLeaderEpoch", 23, 2, 4, 4, EPOCH_RESPONSE),
    msg("DescribeConfigs", 32, 1, 4, 4, DESCRIBE_CONFIGS_RESPONSE),
    msg("ElectLeaders", 43, 0, 2, 2, ELECT_LEADERS_RESPONSE),
    msg("DescribeQuorum", 55, 0, 1, 0, DESCRIBE_QUORUM_RESPONSE),
    msg(
        "IncrementalAlterConfigs",
        44,
        0,
        1,
        1,
        INCREMENTAL_ALTER_CONFIGS_RESPONSE,
    ),
    msg(
        "DescribeTopicPartitions",
        75,
        0,
        0,
        0,
        DESCRIBE_TOPIC_PARTITIONS_RESPONSE,
    ),
];
