//! Retention: which of a replica's oldest segments may go, as Kafka's
//! `UnifiedLog.deleteOldSegments` decides. A segment is deleted whole, oldest first, never the
//! active one, and only once everything in it is below the high watermark (a consumer may still
//! need what is not yet committed). Time retention judges a segment by its newest record; size
//! retention deletes while the log without the segment is still at least `retention.bytes`.
//! Pure, so the rule is tested on literal segment lists; `Partition` applies it.

use crate::log::SegmentSummary;

/// The retention settings of one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// -1: no time limit.
    pub retention_ms: i64,
    /// -1: no size limit.
    pub retention_bytes: i64,
}

/// How many of the oldest `segments` (oldest first, the last one active) retention deletes at
/// wall-clock time `now_ms`, given the replica's high watermark.
pub fn segments_to_delete(
    segments: &[SegmentSummary],
    high_watermark: i64,
    policy: RetentionPolicy,
    now_ms: i64,
) -> usize {
    let Some((_, closed)) = segments.split_last() else {
        return 0;
    };
    let mut excess = if policy.retention_bytes >= 0 {
        segments.iter().map(|s| s.size as i64).sum::<i64>() - policy.retention_bytes
    } else {
        0
    };
    let mut count = 0;
    for s in closed {
        // Kafka's upper bound: the next segment's base, i.e. this one's end, within the HW.
        if s.next_offset > high_watermark {
            break;
        }
        let expired = policy.retention_ms >= 0
            && s.max_timestamp >= 0
            && now_ms - s.max_timestamp > policy.retention_ms;
        let oversized = policy.retention_bytes >= 0 && excess >= s.size as i64;
        if !expired && !oversized {
            break;
        }
        excess -= s.size as i64;
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(base: i64, next: i64, size: u64, ts: i64) -> SegmentSummary {
        SegmentSummary {
            base_offset: base,
            next_offset: next,
            size,
            max_timestamp: ts,
        }
    }

    const NONE: RetentionPolicy = RetentionPolicy {
        retention_ms: -1,
        retention_bytes: -1,
    };

    fn log() -> Vec<SegmentSummary> {
        vec![
            seg(0, 10, 100, 1_000),
            seg(10, 20, 100, 2_000),
            seg(20, 30, 100, 3_000),
            seg(30, 35, 50, 4_000),
        ]
    }

    #[test]
    fn nothing_without_limits() {
        assert_eq!(segments_to_delete(&log(), 35, NONE, 1_000_000), 0);
    }

    #[test]
    fn time_deletes_expired_segments_but_never_the_active_one() {
        let by_time = |ms| RetentionPolicy {
            retention_ms: ms,
            ..NONE
        };
        assert_eq!(segments_to_delete(&log(), 35, by_time(1_500), 3_600), 2);
        assert_eq!(segments_to_delete(&log(), 35, by_time(0), 1_000_000), 3);
        // A segment with no timestamp (-1) is never judged expired.
        let mut l = log();
        l[0].max_timestamp = -1;
        assert_eq!(segments_to_delete(&l, 35, by_time(0), 1_000_000), 0);
    }

    #[test]
    fn size_deletes_while_the_rest_is_still_at_least_the_limit() {
        let by_size = |b| RetentionPolicy {
            retention_bytes: b,
            ..NONE
        };
        // 350 bytes; deleting 100 leaves 250 ≥ 200, deleting another leaves 150 < 200.
        assert_eq!(segments_to_delete(&log(), 35, by_size(200), 0), 1);
        assert_eq!(segments_to_delete(&log(), 35, by_size(150), 0), 2);
        assert_eq!(segments_to_delete(&log(), 35, by_size(0), 0), 3);
    }

    #[test]
    fn never_past_the_high_watermark() {
        let all = RetentionPolicy {
            retention_ms: 0,
            retention_bytes: 0,
        };
        assert_eq!(segments_to_delete(&log(), 19, all, 1_000_000), 1);
        assert_eq!(segments_to_delete(&log(), 20, all, 1_000_000), 2);
        assert_eq!(segments_to_delete(&log(), 0, all, 1_000_000), 0);
    }
}
