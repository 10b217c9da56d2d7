//! The nightly matrix file (`tidemark nightly MATRIX.toml`), parsed once into typed groups, and
//! the cases it expands to: every workload × nemesis set × seed × broker (correct or one injected
//! bug) × runtime of each group. A case is named by those five values and its group's `variant`
//! alone ([`CaseId`]), never by its position, so shards of one night and nights of one store line
//! up.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};

/// The matrix file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// Minutes the night may take: no case starts when its time limit would end past them.
    pub budget_minutes: f64,
    /// `tidemark test` arguments for every case, before each group's own.
    #[serde(default)]
    pub args: Vec<String>,
    /// The groups, each a cross product of its lists.
    #[serde(rename = "group")]
    pub groups: Vec<Group>,
}

/// One `[[group]]`: its cases are the cross product of its lists.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    /// Workload names (`tidemark test --workload`).
    #[serde(deserialize_with = "workloads")]
    pub workloads: Vec<String>,
    /// Nemesis sets, each a `--nemesis` list (`"partition,kill"`, `"none"`).
    #[serde(deserialize_with = "nemeses")]
    pub nemeses: Vec<String>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Whether the correct broker runs (expected valid); default true.
    #[serde(default = "yes")]
    pub correct: bool,
    /// Injected bugs (`--inject-bug`), each a case that must come back invalid.
    #[serde(default)]
    pub bugs: Vec<String>,
    /// Runtimes; default `["netns"]`.
    #[serde(default = "netns_only")]
    pub runtimes: Vec<RuntimeName>,
    /// Every case's main phase, seconds (`--time-limit`).
    pub time_limit_s: f64,
    /// More `tidemark test` arguments for this group's cases (`--nodes-file` for `hosts`).
    #[serde(default)]
    pub args: Vec<String>,
    /// A name for what this group's `args` change (`"min-isr-1"` for `--broker-config
    /// min.insync.replicas=1`), part of every case's name: two groups may then run the same
    /// workloads, faults and seeds under different settings. Letters, digits, `-` and `_`.
    #[serde(default, deserialize_with = "variant")]
    pub variant: Option<String>,
}

fn variant<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = String::deserialize(d)?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(serde::de::Error::custom(format!(
            "variant `{name}`: letters, digits, `-` and `_` only, at least one"
        )));
    }
    Ok(Some(name))
}

fn yes() -> bool {
    true
}

fn netns_only() -> Vec<RuntimeName> {
    vec![RuntimeName::Netns]
}

/// Where a case's nodes come from (`tidemark test --runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeName {
    /// Network namespaces on this machine.
    Netns,
    /// Machines over SSH (the group's `args` name `--nodes-file`).
    Hosts,
    /// A container per node (the image made by `tidemark image build`).
    Docker,
}

impl fmt::Display for RuntimeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuntimeName::Netns => "netns",
            RuntimeName::Hosts => "hosts",
            RuntimeName::Docker => "docker",
        })
    }
}

fn workloads<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    for name in &names {
        if !tidemark_workloads::NAMES.contains(&name.as_str()) {
            return Err(serde::de::Error::custom(format!(
                "unknown workload `{name}`; known: {}",
                tidemark_workloads::NAMES.join(", ")
            )));
        }
    }
    Ok(names)
}

fn nemeses<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let sets = Vec::<String>::deserialize(d)?;
    for set in &sets {
        tidemark_nemesis::parse_kinds(set)
            .map_err(|e| serde::de::Error::custom(format!("nemesis set `{set}`: {e}")))?;
    }
    Ok(sets)
}

/// What names a case, stably across shards and nights.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CaseId {
    /// The workload.
    pub workload: String,
    /// The nemesis set, as the matrix writes it.
    pub nemesis: String,
    /// The seed.
    pub seed: u64,
    /// The injected bug; `None` for the correct broker.
    pub bug: Option<String>,
    /// The runtime.
    pub runtime: RuntimeName,
    /// The group's `variant`; absent from ids of groups without one (and of nights before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl CaseId {
    /// `queue / partition,kill / seed 1 / ack-before-replication / netns`, then ` / ` and the
    /// variant when there is one.
    pub fn label(&self) -> String {
        let mut label = format!(
            "{} / {} / seed {} / {} / {}",
            self.workload,
            self.nemesis,
            self.seed,
            self.bug.as_deref().unwrap_or("correct"),
            self.runtime
        );
        if let Some(v) = &self.variant {
            label += &format!(" / {v}");
        }
        label
    }

    /// The case as a store's test name: letters, digits, `-`, `_` and `+` only.
    pub fn test_name(&self) -> String {
        let nemesis: String = self
            .nemesis
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '+' })
            .collect();
        let mut name = format!(
            "nightly-{}-{}-s{}-{}-{}",
            self.workload,
            nemesis,
            self.seed,
            self.bug.as_deref().unwrap_or("correct"),
            self.runtime
        );
        if let Some(v) = &self.variant {
            name += &format!("-{v}");
        }
        name
    }

    /// The verdict the case must come back with: an injected bug must be caught.
    pub fn expected(&self) -> Expected {
        if self.bug.is_some() {
            Expected::Invalid
        } else {
            Expected::Valid
        }
    }
}

/// The verdict a case must come back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    /// The correct broker.
    Valid,
    /// A broker with an injected bug.
    Invalid,
}

/// One run of the night.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Its name.
    pub id: CaseId,
    /// Its main phase, seconds.
    pub time_limit_s: f64,
    /// Its `tidemark test` arguments beyond those of its id and time limit.
    pub args: Vec<String>,
}

impl Case {
    /// The `tidemark test` arguments of the case, without `--store`.
    pub fn test_args(&self) -> Vec<String> {
        let mut out = vec![
            "--workload".to_string(),
            self.id.workload.clone(),
            "--nemesis".into(),
            self.id.nemesis.clone(),
            "--seed".into(),
            self.id.seed.to_string(),
            "--runtime".into(),
            self.id.runtime.to_string(),
            "--time-limit".into(),
            self.time_limit_s.to_string(),
            "--name".into(),
            self.id.test_name(),
        ];
        if let Some(bug) = &self.id.bug {
            out.extend(["--inject-bug".to_string(), bug.clone()]);
        }
        out.extend(self.args.iter().cloned());
        out
    }
}

impl Matrix {
    /// Parses the matrix in `text`, read from `path`; errors name the file, the line and the
    /// field.
    pub fn parse(path: &Path, text: &str) -> Result<Matrix, String> {
        let at = |span: Option<std::ops::Range<usize>>| match span {
            Some(s) => format!(
                "{}:{}",
                path.display(),
                text[..s.start.min(text.len())].matches('\n').count() + 1
            ),
            None => path.display().to_string(),
        };
        let de = toml::Deserializer::parse(text)
            .map_err(|e| format!("{}: {}", at(e.span()), e.message().trim()))?;
        let matrix: Matrix = serde_path_to_error::deserialize(de).map_err(|e| {
            format!(
                "{}: field `{}`: {}",
                at(e.inner().span()),
                e.path(),
                e.inner().message().trim()
            )
        })?;
        matrix
            .check()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(matrix)
    }

    /// What serde cannot say: positive durations, a case named twice.
    fn check(&self) -> Result<(), String> {
        if !(self.budget_minutes.is_finite() && self.budget_minutes > 0.0) {
            return Err("field `budget_minutes`: must be a positive number of minutes".into());
        }
        if self.groups.is_empty() {
            return Err("no [[group]]: the matrix has no cases".into());
        }
        for (g, group) in self.groups.iter().enumerate() {
            if !(group.time_limit_s.is_finite() && group.time_limit_s > 0.0) {
                return Err(format!(
                    "field `group[{g}].time_limit_s`: must be a positive number of seconds"
                ));
            }
        }
        let mut seen = BTreeMap::new();
        for (g, id) in self
            .groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| group_ids(group).into_iter().map(move |id| (g, id)))
        {
            if let Some(first) = seen.insert(id.clone(), g) {
                return Err(format!(
                    "`group[{g}]` repeats the case {} of `group[{first}]`",
                    id.label()
                ));
            }
        }
        if seen.is_empty() {
            return Err(
                "the groups expand to no case (an empty list, or `correct = false` \
                        without `bugs`)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Every case, in matrix order: group by group, then workload, nemesis set, seed, broker
    /// (the correct one first), runtime.
    pub fn cases(&self) -> Vec<Case> {
        let mut out = Vec::new();
        for group in &self.groups {
            let mut args = self.args.clone();
            args.extend(group.args.iter().cloned());
            for id in group_ids(group) {
                out.push(Case {
                    id,
                    time_limit_s: group.time_limit_s,
                    args: args.clone(),
                });
            }
        }
        out
    }
}

fn group_ids(group: &Group) -> Vec<CaseId> {
    let brokers: Vec<Option<String>> = group
        .correct
        .then_some(None)
        .into_iter()
        .chain(group.bugs.iter().cloned().map(Some))
        .collect();
    let mut out = Vec::new();
    for workload in &group.workloads {
        for nemesis in &group.nemeses {
            for seed in &group.seeds {
                for bug in &brokers {
                    for runtime in &group.runtimes {
                        out.push(CaseId {
                            workload: workload.clone(),
                            nemesis: nemesis.clone(),
                            seed: *seed,
                            bug: bug.clone(),
                            runtime: *runtime,
                            variant: group.variant.clone(),
                        });
                    }
                }
            }
        }
    }
    out
}

/// `--shard I/N`: the I-th of N slices of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 1 to `of`.
    pub index: usize,
    /// How many shards.
    pub of: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("`{s}` is not I/N with 1 <= I <= N (e.g. 2/4)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let shard = Shard {
            index: i.trim().parse().map_err(|_| bad())?,
            of: n.trim().parse().map_err(|_| bad())?,
        };
        if shard.index == 0 || shard.index > shard.of {
            return Err(bad());
        }
        Ok(shard)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.of)
    }
}

impl Shard {
    /// This shard's cases: the k-th case of the matrix (from 0) goes to shard k mod N + 1, so
    /// every shard of one matrix gets a slice as long as the others, give or take one.
    pub fn slice(&self, cases: Vec<Case>) -> Vec<Case> {
        cases
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % self.of + 1 == self.index)
            .map(|(_, c)| c)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
budget_minutes = 30
args = ["--nodes", "3"]

[[group]]
workloads = ["queue", "tiered"]
nemeses = ["partition"]
seeds = [1, 2]
bugs = ["ack-before-replication"]
time_limit_s = 6
"#;

    fn parse(text: &str) -> Result<Matrix, String> {
        Matrix::parse(Path::new("m.toml"), text)
    }

    #[test]
    fn a_group_expands_to_its_cross_product_in_order() {
        let cases = parse(SMALL).unwrap().cases();
        assert_eq!(cases.len(), 8);
        let labels: Vec<String> = cases.iter().map(|c| c.id.label()).collect();
        assert_eq!(labels[0], "queue / partition / seed 1 / correct / netns");
        assert_eq!(
            labels[1],
            "queue / partition / seed 1 / ack-before-replication / netns"
        );
        assert_eq!(labels[4], "tiered / partition / seed 1 / correct / netns");
        assert_eq!(cases[1].id.expected(), Expected::Invalid);
        assert_eq!(cases[0].id.expected(), Expected::Valid);
        let args = cases[1].test_args();
        assert!(args.ends_with(&[
            "--inject-bug".into(),
            "ack-before-replication".into(),
            "--nodes".into(),
            "3".into()
        ]));
        assert!(args.windows(2).any(|w| w == ["--time-limit", "6"]));
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let bad = SMALL.replace("\"tiered\"", "\"teired\"");
        let e = parse(&bad).unwrap_err();
        assert!(e.starts_with("m.toml:6: field `group[0].workloads`"), "{e}");
        assert!(e.contains("unknown workload `teired`"), "{e}");

        let e = parse(&SMALL.replace("seeds = [1, 2]", "seeds = [1, \"two\"]")).unwrap_err();
        assert!(e.starts_with("m.toml:8: field `group[0].seeds[1]`"), "{e}");

        let e = parse(&SMALL.replace("nemeses = [\"partition\"]", "nemeses = [\"partiton\"]"))
            .unwrap_err();
        assert!(e.starts_with("m.toml:7: field `group[0].nemeses`"), "{e}");
        assert!(e.contains("partiton"), "{e}");

        let e = parse(&SMALL.replace("time_limit_s", "time_limit")).unwrap_err();
        assert!(e.contains("m.toml:") && e.contains("time_limit"), "{e}");

        let e = parse(&format!("{SMALL}\nruntimes = [\"podman\"]\n")).unwrap_err();
        assert!(e.starts_with("m.toml:12: field `group[0].runtimes"), "{e}");

        let e = parse(
            "budget_minutes = 0\n[[group]]\nworkloads=[]\nnemeses=[]\nseeds=[]\ntime_limit_s=1",
        )
        .unwrap_err();
        assert!(e.contains("budget_minutes"), "{e}");
    }

    #[test]
    fn a_case_named_twice_is_refused() {
        let twice = format!(
            "{SMALL}\n[[group]]\nworkloads = [\"queue\"]\nnemeses = [\"partition\"]\n\
             seeds = [2]\ncorrect = false\nbugs = [\"ack-before-replication\"]\ntime_limit_s = 9\n"
        );
        let e = parse(&twice).unwrap_err();
        assert!(e.contains("`group[1]` repeats the case queue / partition / seed 2 / ack-before-replication / netns of `group[0]`"), "{e}");
    }

    #[test]
    fn the_example_matrix_parses() {
        let text = include_str!("../../examples/nightly.toml");
        let cases = parse(text).unwrap().cases();
        assert!(cases
            .iter()
            .any(|c| c.id.variant.as_deref() == Some("min-isr-1")));
        assert!(cases.iter().any(|c| c.id.nemesis == "disk,power"
            && c.id.variant.as_deref() == Some("flush-per-message")));
    }

    #[test]
    fn a_variant_runs_the_same_cases_apart_under_its_args() {
        let again = format!(
            "{SMALL}\n[[group]]\nworkloads = [\"queue\"]\nnemeses = [\"partition\"]\n\
             seeds = [2]\ncorrect = false\nbugs = [\"ack-before-replication\"]\ntime_limit_s = 9\n\
             variant = \"min-isr-1\"\nargs = [\"--broker-config\", \"min.insync.replicas=1\"]\n"
        );
        let cases = parse(&again).unwrap().cases();
        let varied: Vec<&Case> = cases.iter().filter(|c| c.id.variant.is_some()).collect();
        assert_eq!(varied.len(), 1);
        let c = varied[0];
        assert_eq!(
            c.id.label(),
            "queue / partition / seed 2 / ack-before-replication / netns / min-isr-1"
        );
        assert!(c.test_args().ends_with(&[
            "--broker-config".to_string(),
            "min.insync.replicas=1".to_string()
        ]));
        assert!(c
            .test_args()
            .contains(&"nightly-queue-partition-s2-ack-before-replication-netns-min-isr-1".into()));
        // Ids without a variant read and write as before it existed.
        let plain = cases.iter().find(|c| c.id.variant.is_none()).unwrap();
        let json = serde_json::to_value(&plain.id).unwrap();
        assert!(json.get("variant").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<CaseId>(json).unwrap(), plain.id);

        let bad = format!(
            "{SMALL}\n[[group]]\nworkloads = [\"queue\"]\nnemeses = [\"partition\"]\n\
             seeds = [2]\ntime_limit_s = 9\nvariant = \"min isr\"\n"
        );
        let e = parse(&bad).unwrap_err();
        assert!(
            e.contains("group[1].variant")
                && e.contains("`min isr`")
                && e.contains("-` and `_` only"),
            "{e}"
        );
    }

    #[test]
    fn shards_split_the_cases_into_disjoint_slices_that_cover_them() {
        let cases = parse(SMALL).unwrap().cases();
        let shards: Vec<Vec<Case>> = (1..=3)
            .map(|i| Shard { index: i, of: 3 }.slice(cases.clone()))
            .collect();
        assert_eq!(shards.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 2]);
        let mut all: Vec<CaseId> = shards.concat().into_iter().map(|c| c.id).collect();
        all.sort();
        let mut want: Vec<CaseId> = cases.into_iter().map(|c| c.id).collect();
        want.sort();
        assert_eq!(all, want);
        assert_eq!("2/3".parse::<Shard>(), Ok(Shard { index: 2, of: 3 }));
        for bad in ["0/3", "4/3", "3", "a/b"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn test_names_are_safe_in_a_store() {
        let id = CaseId {
            workload: "queue".into(),
            nemesis: "partition,kill".into(),
            seed: 3,
            bug: None,
            runtime: RuntimeName::Netns,
            variant: None,
        };
        assert_eq!(
            id.test_name(),
            "nightly-queue-partition+kill-s3-correct-netns"
        );
        let id = CaseId {
            variant: Some("min-isr-1".into()),
            ..id
        };
        assert_eq!(
            id.test_name(),
            "nightly-queue-partition+kill-s3-correct-netns-min-isr-1"
        );
    }
}
