//! Clock faults on the database's wall clock, through its [`FakeClock`] ability (libfaketime: the
//! process re-reads an offset file on every wall-clock read, so offsets change without a
//! restart, and its monotonic clock, which drives its timers, is left alone).
//!
//! - `clock-skew` sets each node's offset (`{"offsets_ms": {"n1": 1500}}`), or draws offsets for
//!   resolved targets: up to about two minutes either way, log-uniform like Jepsen's bumps.
//! - `clock-strobe` flips targets between their offset and offset + `delta_ms` every
//!   `period_ms` for `duration_ms`, then leaves the offset as it was (Jepsen's `strobe-time`).
//!   The op returns once every target shows the flipped offset; the flipping goes on in a
//!   thread of its own, so the single nemesis worker keeps taking turns meanwhile (a strobe
//!   used to hold it for its whole duration, and for seconds more on a loaded machine, which
//!   left short runs with few faults).
//! - `clock-reset` sets offsets back to zero.
//!
//! A skew or reset on a node first stops a strobe still running there (and waits for it, so
//! the strobe's last write cannot undo the new offset); a failure of that strobe is reported
//! on the op that stopped it.
//!
//! [`FakeClock`]: tidemark_harness::db::FakeClock

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rand::RngExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tidemark_harness::db::FakeClock;
use tidemark_harness::remote::{self, escape, Remote};
use tidemark_harness::runtime::Node;

use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::{known_node, NodeSpec, TargetFields, Targets};

/// The longest strobe, so a nemesis op stays short.
const MAX_STROBE_MS: u64 = 60_000;

/// The clock faults; remembers each node's offset so a strobe returns to it, and the strobes
/// still running.
#[derive(Default)]
pub struct Clock {
    offsets: Mutex<BTreeMap<String, i64>>,
    strobes: Mutex<BTreeMap<String, Strobing>>,
}

/// A strobe flipping one node's offset in the background.
struct Strobing {
    remote: Arc<dyn Remote>,
    /// The file whose existence ends the strobe's loop.
    stop_file: String,
    thread: JoinHandle<Result<(), String>>,
}

impl Strobing {
    /// Ends the strobe (within one flip) and waits for it; its error, if it failed.
    fn stop(self, node: &str) -> Option<String> {
        let asked = remote::run(
            self.remote.as_ref(),
            &format!(": > {}", escape(&self.stop_file)),
        );
        let ended = self
            .thread
            .join()
            .unwrap_or_else(|_| Err("the strobe's thread panicked".into()));
        match (asked, ended) {
            (_, Err(e)) => Some(format!("{node}: strobe: {e}")),
            (Err(e), Ok(())) => Some(format!("{node}: stopping the strobe: {e}")),
            (Ok(_), Ok(())) => None,
        }
    }
}

/// An offset in milliseconds as libfaketime reads it: signed seconds with milliseconds.
pub fn faketime_spec(ms: i64) -> String {
    let sign = if ms < 0 { '-' } else { '+' };
    let a = ms.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

/// The shell command that replaces the offset in `file` atomically (a reader never sees it
/// half written).
fn write_command(file: &str, ms: i64) -> String {
    let f = escape(file);
    let tmp = escape(&format!("{file}.tmp"));
    format!("printf %s {} > {tmp} && mv -f {tmp} {f}", faketime_spec(ms))
}

/// The shell command that puts a strobe in force: clears `stop_file` and writes the flipped
/// offset.
fn strobe_start_command(file: &str, stop_file: &str, base: i64, delta: i64) -> String {
    format!(
        "rm -f {} && {}",
        escape(stop_file),
        write_command(file, base + delta)
    )
}

/// The shell loop that strobes `file` between `base` and `base + delta` for `duration_ms`, or
/// until `stop_file` exists, and ends at `base`.
fn strobe_command(
    file: &str,
    stop_file: &str,
    base: i64,
    delta: i64,
    period_ms: u64,
    duration_ms: u64,
) -> String {
    let flips = (duration_ms / (2 * period_ms.max(1))).max(1);
    let period = format!("{}.{:03}", period_ms / 1000, period_ms % 1000);
    format!(
        "i=0; while [ $i -lt {flips} ] && [ ! -e {stop} ]; do {hi}; sleep {period}; {lo}; \
         sleep {period}; i=$((i+1)); done; {lo}",
        stop = escape(stop_file),
        hi = write_command(file, base + delta),
        lo = write_command(file, base),
    )
}

/// A random skew: ±2^k ms with k uniform in 4..=17 (16 ms to about two minutes).
pub fn random_offset(rng: &mut tidemark_harness::generator::Rng) -> i64 {
    let magnitude = 1i64 << rng.random_range(4..=17);
    if rng.random_bool(0.5) {
        magnitude
    } else {
        -magnitude
    }
}

/// The value of a clock op: offsets per node (`clock-skew`, or a recorded `clock-reset`), or
/// targets, and for `clock-strobe` its delta, period and duration (drawn when absent).
#[derive(Debug, Default, Deserialize)]
struct ClockValue {
    #[serde(default)]
    offsets_ms: Option<BTreeMap<String, i64>>,
    #[serde(default)]
    nodes: Option<Vec<String>>,
    #[serde(default)]
    targets: Option<NodeSpec>,
    #[serde(default)]
    delta_ms: Option<i64>,
    #[serde(default)]
    period_ms: Option<u64>,
    #[serde(default)]
    duration_ms: Option<u64>,
}

/// Which nodes a skew or reset acts on.
#[derive(Debug, PartialEq)]
enum Offsets {
    /// These offsets, in ms.
    Given(BTreeMap<String, i64>),
    /// Offsets drawn for (skew) or zeros on (reset) the resolved targets.
    Of(Targets),
}

/// A parsed clock op.
#[derive(Debug, PartialEq)]
enum ClockOp {
    Skew(Offsets),
    Strobe {
        targets: Targets,
        delta: Option<i64>,
        period: Option<u64>,
        duration: Option<u64>,
    },
    /// A reset records zeros; replaying a recorded reset reads them back as nodes.
    Reset(Offsets),
}

impl ClockOp {
    fn parse(f: &str, value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: ClockValue = parse(value)?;
        if let Some(offsets) = &v.offsets_ms {
            for node in offsets.keys() {
                known_node(node, nodes, &format!("offsets_ms.{node}"))?;
            }
        }
        let fields = TargetFields {
            nodes: v.nodes,
            targets: v.targets,
        };
        match f {
            "clock-skew" => Ok(ClockOp::Skew(match v.offsets_ms {
                Some(o) => Offsets::Given(o),
                None => Offsets::Of(
                    fields
                        .targets(nodes, None)
                        .map_err(|e| format!("{e} (or `offsets_ms`)"))?,
                ),
            })),
            "clock-strobe" => {
                if v.period_ms == Some(0) {
                    return Err("field `period_ms`: must be positive".into());
                }
                if let Some(d) = v.duration_ms.filter(|d| *d > MAX_STROBE_MS) {
                    return Err(format!(
                        "field `duration_ms`: at most {MAX_STROBE_MS} ms, got {d}"
                    ));
                }
                Ok(ClockOp::Strobe {
                    targets: fields.targets(nodes, None)?,
                    delta: v.delta_ms,
                    period: v.period_ms,
                    duration: v.duration_ms,
                })
            }
            _ => Ok(ClockOp::Reset(match v.offsets_ms {
                Some(o) => Offsets::Given(o),
                None => Offsets::Of(fields.targets(nodes, Some(NodeSpec::All))?),
            })),
        }
    }
}

/// A clock op with the fault that remembers offsets.
struct ClockRun<'a> {
    clock: &'a Clock,
    op: ClockOp,
}

impl FaultOp for ClockRun<'_> {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let clock = self.clock;
        match self.op {
            ClockOp::Strobe {
                targets,
                delta,
                period,
                duration,
            } => clock.strobe(env, &targets, delta, period, duration),
            ClockOp::Skew(Offsets::Given(offsets)) => clock.set(env, &offsets),
            ClockOp::Skew(Offsets::Of(targets)) => {
                let offsets = env
                    .resolve(&targets)?
                    .into_iter()
                    .map(|n| (n, random_offset(env.rng)))
                    .collect();
                clock.set(env, &offsets)
            }
            ClockOp::Reset(Offsets::Given(offsets)) => {
                clock.set(env, &offsets.into_keys().map(|n| (n, 0)).collect())
            }
            ClockOp::Reset(Offsets::Of(targets)) => {
                let zeros = env.resolve(&targets)?.into_iter().map(|n| (n, 0)).collect();
                clock.set(env, &zeros)
            }
        }
    }
}

impl Clock {
    fn fake_clock<'e>(env: &Env<'e>) -> Result<&'e dyn FakeClock, Failed> {
        env.cx.db.as_fake_clock().ok_or_else(|| {
            Failed::nothing("the database has no fake clock: start it under libfaketime")
        })
    }

    /// Stops the strobes running on `nodes`; the errors of those that failed.
    fn stop_strobes(&self, nodes: &[String]) -> Vec<String> {
        let stopping: Vec<(String, Strobing)> = {
            let mut strobes = self.strobes.lock().unwrap_or_else(|p| p.into_inner());
            nodes
                .iter()
                .filter_map(|n| strobes.remove(n).map(|s| (n.clone(), s)))
                .collect()
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = stopping
                .into_iter()
                .map(|(n, strobe)| s.spawn(move || strobe.stop(&n)))
                .collect();
            handles
                .into_iter()
                .filter_map(|h| {
                    h.join()
                        .unwrap_or(Some("stopping a strobe panicked".into()))
                })
                .collect()
        })
    }

    fn set(&self, env: &Env<'_>, offsets: &BTreeMap<String, i64>) -> Result<Value, Failed> {
        let clock = Self::fake_clock(env)?;
        let names: Vec<String> = offsets.keys().cloned().collect();
        let stopped = self.stop_strobes(&names);
        let (done, mut errors) = env.on_each(&names, |n: &Node| {
            let file = clock.offset_file(n).display().to_string();
            remote::run(n.remote.as_ref(), &write_command(&file, offsets[&n.name]))?;
            Ok(())
        });
        let applied: BTreeMap<String, i64> = done.iter().map(|n| (n.clone(), offsets[n])).collect();
        self.offsets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(applied.clone());
        errors.extend(stopped);
        Failed::partly(json!({ "offsets_ms": applied }), &errors)
    }

    fn strobe(
        &self,
        env: &mut Env<'_>,
        targets: &Targets,
        delta: Option<i64>,
        period: Option<u64>,
        duration: Option<u64>,
    ) -> Result<Value, Failed> {
        let clock = Self::fake_clock(env)?;
        let nodes = env.resolve(targets)?;
        let delta = delta.unwrap_or_else(|| random_offset(env.rng));
        let period = period.unwrap_or_else(|| env.rng.random_range(10..=200));
        let duration = duration
            .unwrap_or_else(|| env.rng.random_range(1_000..=5_000))
            .min(MAX_STROBE_MS);
        let base = self
            .offsets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut errors = self.stop_strobes(&nodes);
        let (done, failed) = env.on_each(&nodes, |n: &Node| {
            let file = clock.offset_file(n).display().to_string();
            let stop_file = format!("{file}.stop-strobe");
            let from = base.get(&n.name).copied().unwrap_or(0);
            remote::run(
                n.remote.as_ref(),
                &strobe_start_command(&file, &stop_file, from, delta),
            )?;
            let remote = n.remote.clone();
            let command = strobe_command(&file, &stop_file, from, delta, period, duration);
            let thread = std::thread::Builder::new()
                .name(format!("strobe-{}", n.name))
                .spawn(move || {
                    remote::run(remote.as_ref(), &command)
                        .map(drop)
                        .map_err(|e| format!("{e:#}"))
                })?;
            self.strobes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    n.name.clone(),
                    Strobing {
                        remote: n.remote.clone(),
                        stop_file,
                        thread,
                    },
                );
            Ok(())
        });
        errors.extend(failed);
        let mut record = json!({"nodes": done, "delta_ms": delta, "period_ms": period,
                                "duration_ms": duration});
        if let Some(spec) = targets.spec_name() {
            record["targets"] = json!(spec);
        }
        Failed::partly(record, &errors)
    }
}

impl Drop for Clock {
    /// No strobe outlives the nemesis.
    fn drop(&mut self) {
        let nodes: Vec<String> = self
            .strobes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        self.stop_strobes(&nodes);
    }
}

impl Fault for Clock {
    fn fs(&self) -> &'static [&'static str] {
        &["clock-skew", "clock-strobe", "clock-reset"]
    }

    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(ClockRun {
            clock: self,
            op: ClockOp::parse(f, value, nodes)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_harness::generator::rng;
    use tidemark_harness::remote::{run, Local};

    #[test]
    fn offsets_are_written_as_signed_seconds_with_milliseconds() {
        assert_eq!(faketime_spec(0), "+0.000");
        assert_eq!(faketime_spec(1500), "+1.500");
        assert_eq!(faketime_spec(-500), "-0.500");
        assert_eq!(faketime_spec(-120_042), "-120.042");
    }

    #[test]
    fn random_offsets_stay_within_two_minutes_either_way() {
        let mut r = rng(3);
        let drawn: Vec<i64> = (0..200).map(|_| random_offset(&mut r)).collect();
        assert!(drawn.iter().all(|o| (16..=131_072).contains(&o.abs())));
        assert!(drawn.iter().any(|o| *o < 0) && drawn.iter().any(|o| *o > 0));
    }

    #[test]
    fn the_shell_commands_leave_the_intended_offset_behind() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("faketime").display().to_string();
        run(&Local::host(), &write_command(&file, -2250)).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "-2.250");
        let stop = format!("{file}.stop");
        run(
            &Local::host(),
            &strobe_start_command(&file, &stop, 1000, 500),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "+1.500");
        run(
            &Local::host(),
            &strobe_command(&file, &stop, 1000, 500, 10, 60),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "+1.000");
        assert!(!std::path::Path::new(&format!("{file}.tmp")).exists());
        // A stop file ends a long strobe at its next flip, at the base offset.
        std::fs::write(&stop, "").unwrap();
        let started = std::time::Instant::now();
        run(
            &Local::host(),
            &strobe_command(&file, &stop, 0, 500, 10, 60_000),
        )
        .unwrap();
        assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "+0.000");
    }

    #[test]
    fn parsing_names_the_bad_field() {
        let nodes: Vec<String> = ["n1", "n2"].map(String::from).to_vec();
        let parse = |f: &str, v: Value| ClockOp::parse(f, &v, &nodes);
        assert_eq!(
            parse("clock-skew", json!({"offsets_ms": {"n1": -40}})),
            Ok(ClockOp::Skew(Offsets::Given(BTreeMap::from([(
                "n1".to_string(),
                -40
            )]))))
        );
        assert_eq!(
            parse("clock-skew", json!({"targets": "one"})),
            Ok(ClockOp::Skew(Offsets::Of(Targets::Spec(NodeSpec::One))))
        );
        assert_eq!(
            parse("clock-reset", json!({})),
            Ok(ClockOp::Reset(Offsets::Of(Targets::Spec(NodeSpec::All))))
        );
        assert!(matches!(
            parse("clock-reset", json!({"offsets_ms": {"n2": 0}})),
            Ok(ClockOp::Reset(Offsets::Given(_)))
        ));
        let e = parse("clock-skew", json!({"offsets_ms": {"n1": 1.5}})).unwrap_err();
        assert!(e.starts_with("field `offsets_ms.n1`"), "{e}");
        let e = parse("clock-skew", json!({"offsets_ms": {"n5": 1}})).unwrap_err();
        assert!(e.starts_with("field `offsets_ms.n5`: unknown node"), "{e}");
        let e = parse("clock-skew", json!({})).unwrap_err();
        assert!(e.contains("`offsets_ms`"), "{e}");
        let e = parse("clock-strobe", json!({"nodes": ["n1"], "period_ms": 0})).unwrap_err();
        assert!(e.contains("`period_ms`"), "{e}");
        let e = parse(
            "clock-strobe",
            json!({"targets": "all", "duration_ms": 3_600_000}),
        )
        .unwrap_err();
        assert!(e.contains("`duration_ms`"), "{e}");
        let e = parse("clock-strobe", json!({"targets": "all", "delta_ms": "x"})).unwrap_err();
        assert!(e.starts_with("field `delta_ms`"), "{e}");
    }
}
