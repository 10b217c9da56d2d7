//! Broker fencing, a duty of the active controller as in KRaft: a broker whose heartbeats stop
//! for the session timeout is fenced (it leads nothing and its leaderships move, by the state
//! machine's own elections), and unfenced once its heartbeats come back. The decision is a pure
//! function of the image and the heartbeats, so it is tested without a quorum.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{ControllerCommand, MetadataQuorum};
use crate::metadata::MetadataImage;
use crate::pause::sleep_or_cancel;

/// How often the active controller looks at the heartbeats.
const ROUND: Duration = Duration::from_millis(200);

/// The fencing commands due at `now`. `beats` maps a broker to its incarnation and last
/// heartbeat; `active_since` is when this controller became active: it heard nobody before, so
/// it fences nobody until a whole session has passed since then.
pub fn fencing_commands(
    image: &MetadataImage,
    beats: &BTreeMap<i32, (u64, Instant)>,
    session: Duration,
    active_since: Instant,
    now: Instant,
) -> Vec<ControllerCommand> {
    let fresh_at = |b: i32, incarnation: u64| {
        beats.get(&b).is_some_and(|(inc, at)| {
            *inc == incarnation && now.saturating_duration_since(*at) < session
        })
    };
    let mut out = Vec::new();
    for b in image.brokers.values() {
        let fresh = fresh_at(b.id, b.incarnation);
        if !b.fenced && !fresh && now.saturating_duration_since(active_since) > session {
            info!(
                broker = b.id,
                "fencing broker: no heartbeat within {session:?}"
            );
            out.push(ControllerCommand::FenceBroker {
                id: b.id,
                incarnation: b.incarnation,
            });
        } else if b.fenced && fresh {
            info!(broker = b.id, "unfencing broker: heartbeats resumed");
            out.push(ControllerCommand::UnfenceBroker {
                id: b.id,
                incarnation: b.incarnation,
            });
        }
    }
    out
}

/// Runs on every controller node until `shutdown`: while this node is the active controller,
/// submits the [`fencing_commands`] every round. Elections follow from the fencing inside the
/// state machine.
pub async fn fence_silent_brokers(
    quorum: Arc<dyn MetadataQuorum>,
    session: Duration,
    shutdown: CancellationToken,
) {
    let mut active_since: Option<Instant> = None;
    loop {
        if sleep_or_cancel(&shutdown, ROUND).await {
            return;
        }
        if !quorum.is_active() {
            active_since = None;
            continue;
        }
        let since = *active_since.get_or_insert_with(Instant::now);
        let image = quorum.image().borrow().clone();
        let due = fencing_commands(&image, &quorum.heartbeats(), session, since, Instant::now());
        for cmd in due {
            if let Err(e) = quorum.submit(cmd).await {
                debug!("fencing decision not committed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::BrokerEndpoint;

    const SESSION: Duration = Duration::from_secs(2);

    fn image(brokers: &[(i32, u64, bool)]) -> MetadataImage {
        let mut image = MetadataImage::default();
        for &(id, incarnation, fenced) in brokers {
            image.brokers.insert(
                id,
                BrokerEndpoint {
                    id,
                    host: "127.0.0.1".into(),
                    port: 9092,
                    incarnation,
                    fenced,
                    shutting_down: false,
                    directory_id: None,
                },
            );
        }
        image
    }

    #[test]
    fn silent_brokers_are_fenced_and_returning_ones_unfenced() {
        let t0 = Instant::now();
        let now = t0 + 3 * SESSION;
        // 1 beats, 2 went silent, 3 is fenced and beats again, 4 beats from an old incarnation.
        let image = image(&[
            (1, 10, false),
            (2, 20, false),
            (3, 30, true),
            (4, 41, false),
        ]);
        let beats = BTreeMap::from([
            (1, (10, now - SESSION / 2)),
            (2, (20, now - 2 * SESSION)),
            (3, (30, now)),
            (4, (40, now)),
        ]);
        assert_eq!(
            fencing_commands(&image, &beats, SESSION, t0, now),
            vec![
                ControllerCommand::FenceBroker {
                    id: 2,
                    incarnation: 20
                },
                ControllerCommand::UnfenceBroker {
                    id: 3,
                    incarnation: 30
                },
                ControllerCommand::FenceBroker {
                    id: 4,
                    incarnation: 41
                },
            ]
        );
    }

    #[test]
    fn a_new_active_controller_waits_a_session_before_fencing() {
        let t0 = Instant::now();
        let image = image(&[(1, 10, false)]);
        let nobody = BTreeMap::new();
        assert!(fencing_commands(&image, &nobody, SESSION, t0, t0 + SESSION / 2).is_empty());
        assert_eq!(
            fencing_commands(&image, &nobody, SESSION, t0, t0 + SESSION * 2),
            vec![ControllerCommand::FenceBroker {
                id: 1,
                incarnation: 10
            }]
        );
    }
}
