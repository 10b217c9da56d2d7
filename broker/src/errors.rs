//! Kafka error codes the broker returns, by their protocol names.

pub const NONE: i16 = 0;
pub const UNKNOWN_SERVER_ERROR: i16 = -1;
pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const CORRUPT_MESSAGE: i16 = 2;
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub const LEADER_NOT_AVAILABLE: i16 = 5;
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
pub const REQUEST_TIMED_OUT: i16 = 7;
pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
pub const NOT_ENOUGH_REPLICAS: i16 = 19;
pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
pub const INVALID_REQUIRED_ACKS: i16 = 21;
pub const UNSUPPORTED_VERSION: i16 = 35;
pub const TOPIC_ALREADY_EXISTS: i16 = 36;
pub const INVALID_PARTITIONS: i16 = 37;
pub const INVALID_REPLICATION_FACTOR: i16 = 38;
pub const INVALID_CONFIG: i16 = 40;
pub const NOT_CONTROLLER: i16 = 41;
pub const INVALID_REQUEST: i16 = 42;
pub const KAFKA_STORAGE_ERROR: i16 = 56;
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
pub const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
pub const FENCED_LEADER_EPOCH: i16 = 74;
pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
pub const ELIGIBLE_LEADERS_NOT_AVAILABLE: i16 = 83;
pub const ELECTION_NOT_NEEDED: i16 = 84;
pub const INVALID_RECORD: i16 = 87;
pub const INVALID_UPDATE_VERSION: i16 = 95;
pub const UNKNOWN_TOPIC_ID: i16 = 100;
pub const INELIGIBLE_REPLICA: i16 = 107;

// KIP-1279's codes, provisional like its API keys.
pub const READ_ONLY_TOPIC: i16 = 134;
pub const CLUSTER_MIRROR_ALREADY_EXISTS: i16 = 136;
pub const UNKNOWN_CLUSTER_MIRROR: i16 = 137;
pub const TOPIC_ALREADY_IN_CLUSTER_MIRROR: i16 = 138;
pub const TOPIC_NOT_IN_CLUSTER_MIRROR: i16 = 139;
pub const CLUSTER_MIRROR_NOT_EMPTY: i16 = 143;
pub const INVALID_CLUSTER_MIRROR_STATES: i16 = 145;

/// A Kafka error code with a message for the log and, where the API has one, the response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: i16,
    pub message: String,
}

impl ApiError {
    pub fn new(code: i16, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }
}
