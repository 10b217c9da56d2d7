//! The run directory: `store/<test>/<UTC time>/` holding `test.json`, `history.jsonl`,
//! `replicas.jsonl`, `results.json` and `nodes/<node>/`, with `store/latest` and
//! `store/<test>/latest` pointing at the newest run (layout fixed by `docs/history-format.md`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde_json::Value;

use crate::db::DumpedReplica;

/// One run's directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `store/<test>/<stamp of now>/` and points the `latest` links at it.
    pub fn create(store: &Path, test: &str, now: SystemTime) -> anyhow::Result<Self> {
        let test_dir = store.join(test);
        let mut stamp = utc_stamp(now);
        let mut path = test_dir.join(&stamp);
        // Two runs in the same millisecond get distinct directories.
        let mut n = 1;
        while path.exists() {
            stamp = format!("{}-{n}", utc_stamp(now));
            path = test_dir.join(&stamp);
            n += 1;
        }
        std::fs::create_dir_all(path.join("nodes"))
            .with_context(|| format!("creating {}", path.display()))?;
        relink(&test_dir.join("latest"), Path::new(&stamp))?;
        relink(&store.join("latest"), &Path::new(test).join(&stamp))?;
        Ok(RunDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `history.jsonl`.
    pub fn history(&self) -> PathBuf {
        self.path.join("history.jsonl")
    }

    /// `replicas.jsonl`.
    pub fn replicas(&self) -> PathBuf {
        self.path.join("replicas.jsonl")
    }

    /// `results.json`.
    pub fn results(&self) -> PathBuf {
        self.path.join("results.json")
    }

    /// `test.json`.
    pub fn test_json(&self) -> PathBuf {
        self.path.join("test.json")
    }

    /// `nodes/<node>/`, created.
    pub fn node_dir(&self, node: &str) -> anyhow::Result<PathBuf> {
        let d = self.path.join("nodes").join(node);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    }

    /// Writes `test.json`.
    pub fn write_test(&self, test: &Value) -> anyhow::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(test)?;
        bytes.push(b'\n');
        std::fs::write(self.test_json(), bytes)
            .with_context(|| format!("writing {}", self.test_json().display()))
    }

    /// Writes `replicas.jsonl`, one replica per line.
    pub fn write_replicas(&self, replicas: &[DumpedReplica]) -> anyhow::Result<()> {
        let path = self.replicas();
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
        );
        for r in replicas {
            serde_json::to_writer(&mut out, r)?;
            out.write_all(b"\n")?;
        }
        out.flush()
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// Replaces the symlink `link` with one pointing at `target`, atomically.
fn relink(link: &Path, target: &Path) -> anyhow::Result<()> {
    let tmp = link.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("linking {}", tmp.display()))?;
    std::fs::rename(&tmp, link).with_context(|| format!("replacing {}", link.display()))
}

/// `yyyyMMddTHHmmss.SSSZ` in UTC, as Jepsen names runs.
pub fn utc_stamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{day:02}T{:02}{:02}{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_are_utc_with_milliseconds() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_251_199_123); // 2024-02-29T23:59:59.123Z
        assert_eq!(utc_stamp(t), "20240229T235959.123Z");
        let t = UNIX_EPOCH + Duration::from_secs(4_102_444_800); // 2100-01-01
        assert_eq!(utc_stamp(t), "21000101T000000.000Z");
    }

    #[test]
    fn runs_get_their_own_directory_and_latest_links() {
        let store = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let a = RunDir::create(store.path(), "queue", now).unwrap();
        let b = RunDir::create(store.path(), "queue", now).unwrap();
        assert_ne!(a.path(), b.path());
        let latest = std::fs::canonicalize(store.path().join("latest")).unwrap();
        assert_eq!(latest, std::fs::canonicalize(b.path()).unwrap());
        let test_latest = std::fs::canonicalize(store.path().join("queue/latest")).unwrap();
        assert_eq!(test_latest, latest);
        assert!(b.path().join("nodes").is_dir());
    }
}
