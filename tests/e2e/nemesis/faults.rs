//! Each fault kind against real brokers in network namespaces, asserting its effect: partitions
//! cut TCP and heal (a leader cut off from the controllers alone is replaced), kill and pause act on the process, clock skew shows in a faketime'd
//! process and a strobe flips on its own while the nemesis takes other turns, packet loss drops a measurable share and goes away, a damaged segment is cut by the
//! broker's recovery, a node started or thawed catching up stays out of the ISR until its cap
//! ends by itself, a forced unclean election picks a replica outside the ISR, and a controller
//! voter cut off and healed does not depose the active controller. Every op's
//! record says what was done.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::support::engine::require_root;
use crate::support::nemesis::{Cluster, FAKETIME};
use serde_json::{json, Value};
use tidemark_harness::broker::BrokerConfig;
use tidemark_harness::db::Db;

fn names(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn partitions_cut_tcp_as_the_recorded_grudge_says_and_heal() {
    require_root("partitions_cut_tcp_as_the_recorded_grudge_says_and_heal");
    let c = Cluster::start(3, BrokerConfig::for_replication(3), false);
    c.create_topic("t", 2, 3);

    let done = c.must("start-partition", json!({"kind": "halves"}));
    assert_eq!(done["kind"], "halves");
    // Halves of three: [n1] against [n2 n3].
    assert_eq!(
        done["grudge"],
        json!({"n1": ["n2", "n3"], "n2": ["n1"], "n3": ["n1"]})
    );
    assert!(!c.reaches("n2", "n1") && !c.reaches("n1", "n3"));
    assert!(c.reaches("n2", "n3") && c.reaches("n3", "n2"));
    assert_eq!(c.must("stop-partition", json!({})), json!({}));
    for (a, b) in [("n1", "n2"), ("n2", "n1"), ("n1", "n3"), ("n3", "n1")] {
        assert!(c.reaches(a, b), "{a} -> {b} after heal");
    }

    // A one-way grudge: n1 drops what n2 sends, nothing else is cut.
    let done = c.must("start-partition", json!({"grudge": {"n1": ["n2"]}}));
    assert_eq!(done["kind"], "grudge");
    assert!(!c.reaches("n2", "n1"));
    assert!(c.reaches("n3", "n1") && c.reaches("n1", "n3") && c.reaches("n2", "n3"));
    c.must("stop-partition", json!({}));

    // The current leaders, read from metadata, are cut off each on their own.
    let leaders = c.view().leaders();
    let done = c.must("start-partition", json!({"kind": "leaders"}));
    let isolated: BTreeSet<String> = done["grudge"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, from)| from.as_array().unwrap().len() == 2)
        .map(|(n, _)| n.clone())
        .collect();
    assert!(!isolated.is_empty(), "{done}");
    assert!(
        isolated.is_subset(&leaders),
        "{isolated:?} are not all leaders {leaders:?}"
    );
    assert_eq!(names(&done["leaders"]), leaders);
    let alone = isolated.iter().next().unwrap();
    let other = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| !isolated.contains(*n));
    if let Some(other) = other {
        assert!(!c.reaches(other, alone) && !c.reaches(alone, other));
    }
    c.must("stop-partition", json!({}));
    assert!(c.reaches("n1", "n2") && c.reaches("n2", "n3") && c.reaches("n3", "n1"));

    // One leader cut off from the controllers only: clients and followers still reach it, and
    // the controllers, no longer hearing it, fence it and elect others for what it led.
    c.wait("every partition led", Duration::from_secs(20), |v| {
        v.partitions.iter().all(|p| p.leader.is_some())
    });
    let done = c.must("start-partition", json!({"kind": "leader-control"}));
    assert_eq!(done["kind"], "leader-control");
    assert_eq!(done["ports"], json!([9093]), "{done}");
    let (alone, cut_from) = done["grudge"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, from)| from.as_array().unwrap().len() == 2)
        .map(|(n, from)| (n.clone(), names(from)))
        .unwrap_or_else(|| panic!("one node alone: {done}"));
    assert!(names(&done["leaders"]).contains(&alone), "{done}");
    for other in &cut_from {
        assert!(c.reaches(other, &alone) && c.reaches(&alone, other));
        assert!(!c.reaches_on(other, &alone, 9093) && !c.reaches_on(&alone, other, 9093));
    }
    c.wait(
        "the cut-off leader replaced",
        Duration::from_secs(20),
        |v| {
            v.partitions
                .iter()
                .all(|p| p.leader.as_deref() != Some(alone.as_str()))
        },
    );
    c.must("stop-partition", json!({}));
    c.destroy();
}

/// Raft's pre-vote: a controller voter cut off from the others starts no elections, so once
/// healed it rejoins under the leader it left instead of deposing it with a higher term.
#[test]
fn a_voter_cut_off_and_healed_leaves_the_active_controller_in_place() {
    require_root("a_voter_cut_off_and_healed_leaves_the_active_controller_in_place");
    let c = Cluster::start(3, BrokerConfig::for_replication(3), false);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (leader, epoch) = loop {
        if let Some(q) = c.quorum() {
            break q;
        }
        assert!(Instant::now() < deadline, "no active controller");
        std::thread::sleep(Duration::from_millis(200));
    };
    let alone = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| c.node(n).id as i32 != leader)
        .unwrap();
    let rest: Vec<&str> = ["n1", "n2", "n3"]
        .into_iter()
        .filter(|n| *n != alone)
        .collect();
    let mut grudge = serde_json::Map::new();
    grudge.insert(alone.into(), json!(rest));
    for r in &rest {
        grudge.insert(r.to_string(), json!([alone]));
    }
    c.must("start-partition", json!({ "grudge": grudge }));
    // Many election timeouts of the one cut off.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        c.quorum(),
        Some((leader, epoch)),
        "the majority kept its leader"
    );
    c.must("stop-partition", json!({}));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        c.quorum(),
        Some((leader, epoch)),
        "{alone} healed deposed the leader:\n{}",
        c.log(alone)
    );
    c.destroy();
}

#[test]
fn kill_pause_and_bounce_act_on_the_broker_process() {
    require_root("kill_pause_and_bounce_act_on_the_broker_process");
    let c = Cluster::start(3, BrokerConfig::for_replication(3), false);
    c.create_topic("t", 1, 3);
    let kill = c.db.as_kill().unwrap();

    let done = c.must("kill", json!({"targets": "one"}));
    assert_eq!(done["targets"], "one");
    let victim = names(&done["nodes"]).into_iter().next().unwrap();
    assert!(!kill.is_running(c.node(&victim)).unwrap());
    assert_eq!(
        c.must("start", json!({"nodes": [victim]})),
        json!({"nodes": [victim]})
    );
    assert!(kill.is_running(c.node(&victim)).unwrap());

    let pid = c.pid("n2").unwrap();
    assert_eq!(
        c.must("pause", json!({"nodes": ["n2"]})),
        json!({"nodes": ["n2"]})
    );
    let threads = Cluster::thread_states(pid);
    assert!(
        threads.len() > 1 && threads.iter().all(|s| *s == 'T'),
        "every thread of a paused broker is stopped when the pause completes: {threads:?}"
    );
    c.must("resume", json!({"nodes": ["n2"]}));
    assert_ne!(Cluster::state(pid), Some('T'));
    assert_eq!(c.pid("n2"), Some(pid), "pause and resume keep the process");

    // Kill leaders with SIGKILL: the pids change and the processes come back.
    c.wait("all serving again", Duration::from_secs(30), |v| {
        v.partitions
            .iter()
            .all(|p| p.leader.is_some() && p.isr.len() == 3)
    });
    let leader = c.view().partition("t", 0).unwrap().leader.clone().unwrap();
    let before = c.pid(&leader).unwrap();
    let done = c.must("bounce", json!({"topic": "t", "partition": 0, "times": 2}));
    let killed: Vec<String> = done["killed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(killed.len(), 2, "{done}");
    assert_eq!(killed[0], leader, "the first bounce hits the leader");
    assert_ne!(
        killed[0], killed[1],
        "the second bounce chases the new leader"
    );
    assert_ne!(c.pid(&leader), Some(before), "{leader} was restarted");
    assert!(
        matches!(Cluster::state(before), None | Some('Z')),
        "the old process is gone"
    );
    for n in &killed {
        assert!(kill.is_running(c.node(n)).unwrap(), "{n} came back");
    }
    c.destroy();
}

#[test]
fn clock_skew_shows_in_a_faketime_process_and_resets() {
    require_root("clock_skew_shows_in_a_faketime_process_and_resets");
    if !std::path::Path::new(FAKETIME).is_file() {
        panic!("{FAKETIME} is missing: install Debian's faketime package");
    }
    let c = Cluster::start(2, BrokerConfig::for_replication(2), true);
    let file = c.node("n1").dir.join("faketime");
    let faked_now = |node: &str| -> i64 {
        let f = c.node(node).dir.join("faketime");
        c.sh(
            node,
            &format!(
                "LD_PRELOAD={FAKETIME} FAKETIME_TIMESTAMP_FILE={} FAKETIME_NO_CACHE=1 \
                 DONT_FAKE_MONOTONIC=1 date +%s",
                f.display()
            ),
        )
        .trim()
        .parse()
        .unwrap()
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };

    let done = c.must("clock-skew", json!({"offsets_ms": {"n1": 3_600_000}}));
    assert_eq!(done, json!({"offsets_ms": {"n1": 3_600_000}}));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "+3600.000");
    assert!((faked_now("n1") - now() - 3600).abs() <= 2);
    assert!((faked_now("n2") - now()).abs() <= 2, "n2 is not skewed");
    // The running broker sees it too, without a restart: what it logs about a new topic is
    // stamped an hour ahead.
    c.create_topic("c", 1, 2);
    let stamps: Vec<i64> = c
        .log("n1")
        .lines()
        .filter(|l| l.contains("became leader") || l.contains("following"))
        .filter_map(|l| unix_time(l.split_whitespace().next()?))
        .collect();
    assert!(
        stamps.iter().any(|t| (t - now() - 3600).abs() <= 30),
        "no log line of n1 about topic c is stamped an hour ahead: {}",
        c.log("n1")
    );

    // Drawn offsets are recorded per node.
    let done = c.must("clock-skew", json!({"targets": "all"}));
    let offsets = done["offsets_ms"].as_object().unwrap();
    assert_eq!(offsets.len(), 2);
    let n2 = offsets["n2"].as_i64().unwrap();
    assert!((16..=131_072).contains(&n2.abs()), "{done}");

    // A strobe is in force when its op returns and flips on by itself: the nemesis takes its
    // next turns (a pause and a resume of n1) while n2's clock still jumps between its offset
    // and a minute later. A strobe used to hold the nemesis for its whole duration.
    let spec = tidemark_nemesis::clock::faketime_spec;
    let n2_file = c.node("n2").dir.join("faketime");
    let seen_within = |d: Duration| {
        let until = Instant::now() + d;
        let mut seen = BTreeSet::new();
        while Instant::now() < until {
            seen.insert(std::fs::read_to_string(&n2_file).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(5));
        }
        seen
    };
    let started = Instant::now();
    let done = c.must(
        "clock-strobe",
        json!({"nodes": ["n2"], "delta_ms": 60_000, "period_ms": 20, "duration_ms": 60_000}),
    );
    assert_eq!(done["nodes"], json!(["n2"]));
    assert_eq!(done["period_ms"], 20);
    let strobed = || BTreeSet::from([spec(n2), spec(n2 + 60_000)]);
    assert_eq!(seen_within(Duration::from_millis(500)), strobed());
    c.must("pause", json!({"nodes": ["n1"]}));
    c.must("resume", json!({"nodes": ["n1"]}));
    assert_eq!(seen_within(Duration::from_millis(500)), strobed());
    // A reset ends the strobe at once (it would run a minute), and nothing flips after it.
    let done = c.must("clock-reset", json!({}));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(done, json!({"offsets_ms": {"n1": 0, "n2": 0}}));
    assert_eq!(
        seen_within(Duration::from_millis(300)),
        BTreeSet::from([spec(0)])
    );
    assert!((faked_now("n1") - now()).abs() <= 2);
    c.destroy();
}

/// The Unix time of an RFC 3339 stamp such as the broker's log lines start with.
fn unix_time(stamp: &str) -> Option<i64> {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", stamp, "+%s"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// How many of `n` simultaneous TCP connects from `from` to `to` fail within `secs` seconds
/// (half a second fails a connect whose first SYN or SYN-ACK was dropped: the retry is at 1 s).
fn failed_connects_within(c: &Cluster, from: &str, to: &str, n: usize, secs: f64) -> usize {
    let ip = c.node(to).ip;
    let out = c.sh(
        from,
        &format!(
            "for i in $(seq {n}); do (timeout {secs} bash -c 'exec 3<>/dev/tcp/{ip}/9092' \
             2>/dev/null && echo ok || echo fail) & done; wait"
        ),
    );
    out.lines().filter(|l| *l == "fail").count()
}

/// Connects that fail within half a second.
fn failed_connects(c: &Cluster, from: &str, to: &str, n: usize) -> usize {
    failed_connects_within(c, from, to, n, 0.5)
}

/// Connects that fail at all: with no loss, each one must succeed, however slowly a loaded
/// machine starts its hundred shells.
fn refused_connects(c: &Cluster, from: &str, to: &str, n: usize) -> usize {
    failed_connects_within(c, from, to, n, 5.0)
}

#[test]
fn a_node_started_or_thawed_catching_up_is_held_back_by_a_cap_that_ends_by_itself() {
    require_root("a_node_started_or_thawed_catching_up_is_held_back_by_a_cap_that_ends_by_itself");
    let c = Cluster::start(3, BrokerConfig::for_replication(3), false);
    c.create_topic("t", 1, 3);
    let in_isr = |v: &tidemark_nemesis::cluster::ClusterView, n: &str| {
        v.partition("t", 0)
            .is_some_and(|p| p.isr.iter().any(|r| r == n))
    };
    for (down, back) in [("kill", "start"), ("pause", "resume")] {
        c.wait("all in sync", Duration::from_secs(30), |v| {
            v.partition("t", 0)
                .is_some_and(|p| p.leader.is_some() && p.isr.len() == 3)
        });
        let p = c.view().partition("t", 0).unwrap().clone();
        let victim = p
            .replicas
            .iter()
            .find(|r| Some(*r) != p.leader.as_ref())
            .unwrap()
            .clone();
        c.must(down, json!({"nodes": [victim]}));
        c.wait("the node out of the ISR", Duration::from_secs(30), |v| {
            !in_isr(v, &victim)
        });
        // What it misses: far more than 1 kB/s moves in the cap's 6 s.
        let values: Vec<i64> = (0..20_000).collect();
        for chunk in values.chunks(2_000) {
            assert!(c.produce("t", 0, chunk), "the two others acknowledge");
        }
        let catch_up = json!({"bytes_per_s": 1024, "ms": 6000});
        let done = c.must(back, json!({"nodes": [victim], "catch_up": catch_up}));
        assert_eq!(done, json!({"nodes": [victim], "catch_up": catch_up}));
        let set = c.sh(&victim, "nft list set inet tidemark catch_up4");
        assert!(set.contains("timeout 6s"), "{set}");
        // Capped, it cannot catch up, and a correct broker keeps it out of the ISR.
        let started = Instant::now();
        let mut looked = 0;
        while started.elapsed() < Duration::from_millis(2500) {
            if let Some(p) = c.view().partition("t", 0) {
                assert!(
                    !p.isr.contains(&victim),
                    "{back}: {victim} in the ISR while capped"
                );
                looked += 1;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        assert!(looked >= 3, "{back}: the ISR was read {looked} times");
        // The cap ends by itself, and the node catches up.
        c.wait("the node back in the ISR", Duration::from_secs(30), |v| {
            in_isr(v, &victim)
        });
        assert!(
            started.elapsed() >= Duration::from_secs(3),
            "{back}: back in sync {:?} after it was capped for 6 s",
            started.elapsed()
        );
        let set = c.sh(&victim, "nft list set inet tidemark catch_up4");
        assert!(!set.contains("elements"), "{set}");
    }
    c.destroy();
}

#[test]
fn packet_loss_drops_a_share_of_packets_and_is_removed() {
    require_root("packet_loss_drops_a_share_of_packets_and_is_removed");
    let c = Cluster::start(3, BrokerConfig::for_replication(3), false);
    assert_eq!(refused_connects(&c, "n2", "n1", 100), 0);

    let done = c.must("start-loss", json!({"nodes": ["n1"], "probability": 0.4}));
    assert_eq!(done["nodes"], json!(["n1"]));
    assert_eq!(done["probability"], 0.4);
    // This kernel has no netem; elsewhere it would be used.
    let method = done["method"].as_str().unwrap();
    assert!(method == "nftables" || method == "netem", "{done}");
    // A connect needs its SYN and SYN-ACK through: about 64% fail within the half second.
    let failed = failed_connects(&c, "n2", "n1", 200);
    assert!(
        (60..=180).contains(&failed),
        "{failed} of 200 connects failed"
    );
    // Traffic between nodes the fault did not name is untouched.
    assert_eq!(refused_connects(&c, "n2", "n3", 50), 0);
    if method == "nftables" {
        let rules = c.sh("n1", "nft list ruleset");
        assert!(
            rules.contains("numgen random mod 1000 < 400 drop"),
            "{rules}"
        );
    }

    assert_eq!(
        c.must("stop-loss", json!({})),
        json!({"nodes": ["n1", "n2", "n3"]})
    );
    assert_eq!(refused_connects(&c, "n2", "n1", 100), 0);
    let rules = c.sh("n1", "nft list ruleset");
    assert!(
        !rules.contains("loss_in") && !rules.contains("numgen"),
        "{rules}"
    );
    c.destroy();
}

#[test]
fn a_damaged_segment_is_recorded_and_cut_by_the_brokers_recovery() {
    require_root("a_damaged_segment_is_recorded_and_cut_by_the_brokers_recovery");
    let c = Cluster::start(3, BrokerConfig::for_replication(3), false);
    c.create_topic("t", 1, 3);
    for i in 0..40 {
        assert!(c.produce("t", 0, &[i * 2, i * 2 + 1]), "send {i}");
    }
    let kill = c.db.as_kill().unwrap();
    let segment = "t-0/00000000000000000000.log";
    let size = |node: &str| {
        std::fs::metadata(c.node(node).dir.join("data").join(segment))
            .unwrap()
            .len()
    };

    // Truncation, given as a record would give it: three bytes off the end tear the last batch.
    let before = size("n2");
    let done = c.must(
        "corrupt-file",
        json!({"files": [{"node": "n2", "file": segment, "mode": "truncate",
                          "offset": before - 3}]}),
    );
    assert_eq!(done["nodes"], json!(["n2"]));
    assert_eq!(done["files"][0]["offset"], before - 3);
    assert!(
        !kill.is_running(c.node("n2")).unwrap(),
        "the damaged node stays down"
    );
    assert_eq!(size("n2"), before - 3);

    // Bit flips chosen by the nemesis land in CRC-covered bytes of the last batches.
    let before = size("n3");
    let done = c.must("corrupt-file", json!({"nodes": ["n3"], "mode": "bitflip"}));
    let file = &done["files"][0];
    assert_eq!(file["node"], "n3");
    assert_eq!(file["file"], segment);
    assert_eq!(file["size"], before);
    assert!(!file["flips"].as_array().unwrap().is_empty(), "{done}");
    assert!(file["offset"].as_u64().unwrap() < before);
    assert_eq!(size("n3"), before, "a flip changes bytes, not the size");

    c.must("start", json!({"nodes": ["n2", "n3"]}));
    for n in ["n2", "n3"] {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = c.log(n);
            if log.contains("recovery:") && log.contains("cut ") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{n} did not report a recovery cut:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    assert!(
        c.log("n3").contains("crc") || c.log("n3").contains("CRC"),
        "{}",
        c.log("n3")
    );
    // Both recover their tails from the leader.
    c.wait("the ISR regrows", Duration::from_secs(30), |v| {
        v.partition("t", 0).is_some_and(|p| p.isr.len() == 3)
    });
    c.destroy();
}

#[test]
fn a_forced_unclean_election_picks_a_replica_outside_the_isr() {
    require_root("a_forced_unclean_election_picks_a_replica_outside_the_isr");
    let c = Cluster::start(3, BrokerConfig::for_replication(3), false);
    c.create_topic("t", 1, 3);
    // Writes keep landing while the nemesis works; which were acknowledged is kept.
    let acked: Mutex<Vec<i64>> = Mutex::new(Vec::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let done = std::thread::scope(|s| {
        s.spawn(|| {
            let mut v = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if c.produce("t", 0, &[v]) {
                    acked.lock().unwrap().push(v);
                }
                v += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let done = c.invoke("unclean-election", json!({}));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        done
    });
    assert!(done.error.is_none(), "{:?} {}", done.error, done.value);
    let v = &done.value;
    let elected = v["leader"].as_str().unwrap().to_string();
    assert_eq!(v["cluster"], "a");
    assert_eq!(
        (v["topic"].as_str(), v["partition"].as_i64()),
        (Some("t"), Some(0))
    );
    assert_eq!(v["stale"], v["leader"]);
    assert_ne!(v["previous_leader"], v["leader"]);
    assert!(
        !names(&v["isr"]).contains(&elected),
        "{elected} was in the ISR {} when elected",
        v["isr"]
    );
    assert_eq!(
        c.view().partition("t", 0).and_then(|p| p.leader.clone()),
        Some(elected.clone())
    );
    // The rules are gone: every node reaches every other.
    for a in ["n1", "n2", "n3"] {
        let rules = c.sh(a, "nft list ruleset");
        assert!(!rules.contains("unclean_"), "{a}: {rules}");
    }
    // Writes acknowledged by the old ISR after the stale replica fell behind are gone.
    c.wait(
        "the old replicas follow again",
        Duration::from_secs(30),
        |view| view.partition("t", 0).is_some_and(|p| p.isr.len() == 3),
    );
    let replicas =
        c.db.as_replica_dump()
            .unwrap()
            .dump_replicas(c.node(&elected))
            .unwrap();
    let kept: BTreeSet<i64> = replicas[0].state.records.iter().map(|r| r.value).collect();
    let acked = acked.into_inner().unwrap();
    let lost = acked.iter().filter(|a| !kept.contains(a)).count();
    assert!(
        lost > 0,
        "no acknowledged write was lost ({} acked)",
        acked.len()
    );
    c.destroy();
}
