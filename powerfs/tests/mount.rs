//! The filesystem on real FUSE mounts: what survives a power loss, seen through a remount.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tidemark_powerfs::control::{self, Reply, Request};
use tidemark_powerfs::{Fault, PowerLoss};

/// A mounted powerfs over a temporary backing directory.
struct Mount {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

fn mounted(mountpoint: &Path) -> bool {
    let needle = format!(" {} ", mountpoint.display());
    fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().any(|l| l.contains(&needle)))
        .unwrap_or(false)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Mount {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("backing")).unwrap();
        fs::create_dir(dir.path().join("mnt")).unwrap();
        let mut m = Mount { dir, child: None };
        m.start();
        m
    }

    fn start(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_tidemark-powerfs"))
            .arg("mount")
            .arg("--backing")
            .arg(self.backing())
            .arg("--mountpoint")
            .arg(self.mnt())
            .arg("--control")
            .arg(self.control())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let (mnt, control) = (self.mnt(), self.control());
        wait_for("the mount", || mounted(&mnt) && control.exists());
    }

    fn backing(&self) -> PathBuf {
        self.dir.path().join("backing")
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn control(&self) -> PathBuf {
        self.dir.path().join("control.sock")
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt().join(rel)
    }

    fn sync_dir(&self, rel: &str) {
        File::open(self.path(rel)).unwrap().sync_all().unwrap();
    }

    /// Loses power, waits for the unmount, and mounts the backing directory again.
    fn lose_power_and_reboot(&mut self, seed: u64) -> PowerLoss {
        let reply = control::call(&self.control(), &Request::LosePower { seed }).unwrap();
        let Reply::PowerLost(report) = reply else {
            panic!("lose-power failed: {reply:?}")
        };
        let status = self.child.take().unwrap().wait().unwrap();
        assert!(status.success(), "powerfs exited with {status}");
        assert!(!mounted(&self.mnt()));
        self.start();
        report
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(self.mnt())
                .status();
            let _ = child.wait();
        }
    }
}

fn write_new(path: &Path, data: &[u8]) -> File {
    let mut f = File::create(path).unwrap();
    f.write_all(data).unwrap();
    f
}

#[test]
fn fsynced_writes_survive_and_unsynced_ones_are_lost() {
    let mut m = Mount::new();
    let f = write_new(&m.path("log"), b"synced");
    f.sync_all().unwrap();
    m.sync_dir("");
    f.write_all_at(b"!", 6).unwrap();
    assert_eq!(fs::read(m.path("log")).unwrap(), b"synced!");
    drop(f);
    // The seed keeps none of the one-byte write (a tear is always shorter than the write).
    let report = m.lose_power_and_reboot(1);
    assert_eq!(fs::read(m.path("log")).unwrap(), b"synced");
    assert_eq!(report.bytes_dropped, 1);
    assert_eq!(report.files_torn.len(), 1);
    assert_eq!(report.files_torn[0].kept, 0);
}

#[test]
fn a_created_file_needs_its_directory_synced() {
    let mut m = Mount::new();
    fs::create_dir(m.path("d")).unwrap();
    m.sync_dir("");
    write_new(&m.path("d/unlinked"), b"data")
        .sync_all()
        .unwrap();
    write_new(&m.path("d/linked"), b"data").sync_all().unwrap();
    m.sync_dir("d");
    write_new(&m.path("d/late"), b"late").sync_all().unwrap();
    let report = m.lose_power_and_reboot(2);
    let mut names: Vec<String> = fs::read_dir(m.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["linked", "unlinked"]);
    assert_eq!(fs::read(m.path("d/unlinked")).unwrap(), b"data");
    assert_eq!(report.entries_lost, 1);
}

#[test]
fn rename_and_unlink_are_durable_only_after_a_directory_fsync() {
    let mut m = Mount::new();
    write_new(&m.path("a"), b"A").sync_all().unwrap();
    write_new(&m.path("b"), b"B").sync_all().unwrap();
    write_new(&m.path("c"), b"C").sync_all().unwrap();
    m.sync_dir("");
    fs::rename(m.path("a"), m.path("a2")).unwrap();
    fs::remove_file(m.path("b")).unwrap();
    m.lose_power_and_reboot(3);
    assert_eq!(fs::read(m.path("a")).unwrap(), b"A");
    assert!(!m.path("a2").exists());
    assert_eq!(fs::read(m.path("b")).unwrap(), b"B");

    // Write-to-temp then rename over, with the directory synced: the new content is durable.
    write_new(&m.path("c.tmp"), b"C2").sync_all().unwrap();
    fs::rename(m.path("c.tmp"), m.path("c")).unwrap();
    fs::remove_file(m.path("b")).unwrap();
    m.sync_dir("");
    m.lose_power_and_reboot(4);
    assert_eq!(fs::read(m.path("c")).unwrap(), b"C2");
    assert!(!m.path("c.tmp").exists());
    assert!(!m.path("b").exists());
}

#[test]
fn truncate_is_volatile_until_fsync() {
    let mut m = Mount::new();
    let f = write_new(&m.path("t"), b"0123456789");
    f.sync_all().unwrap();
    m.sync_dir("");
    f.set_len(4).unwrap();
    assert_eq!(fs::read(m.path("t")).unwrap(), b"0123");
    drop(f);
    m.lose_power_and_reboot(5);
    assert_eq!(fs::read(m.path("t")).unwrap(), b"0123456789");
    let f = OpenOptions::new().write(true).open(m.path("t")).unwrap();
    f.set_len(4).unwrap();
    f.sync_data().unwrap();
    drop(f);
    m.lose_power_and_reboot(6);
    assert_eq!(fs::read(m.path("t")).unwrap(), b"0123");
}

#[test]
fn appends_tear_at_the_byte_the_seed_chose() {
    // The same seed tears the same place; different seeds tear different places.
    let mut kept = Vec::new();
    for seed in [10, 10, 11, 12, 13] {
        let mut m = Mount::new();
        let mut f = write_new(&m.path("seg"), b"head|");
        f.sync_data().unwrap();
        m.sync_dir("");
        let mut f2 = OpenOptions::new().append(true).open(m.path("seg")).unwrap();
        f2.write_all(b"first-unsynced|").unwrap();
        f2.write_all(b"abcdefghijklmnopqrstuvwxyz").unwrap();
        f.flush().unwrap();
        drop((f, f2));
        let report = m.lose_power_and_reboot(seed);
        let torn = &report.files_torn[0];
        assert_eq!((torn.path.as_str(), torn.offset, torn.len), ("seg", 20, 26));
        let survived = fs::read(m.path("seg")).unwrap();
        if torn.kept == 0 {
            assert_eq!(survived, b"head|");
        } else {
            // The earlier unsynced append is gone (zeros), the last one kept up to the tear.
            let mut expected = b"head|".to_vec();
            expected.extend_from_slice(&[0; 15]);
            expected.extend_from_slice(&b"abcdefghijklmnopqrstuvwxyz"[..torn.kept as usize]);
            assert_eq!(survived, expected);
        }
        assert_eq!(report.bytes_dropped, 15 + 26 - torn.kept);
        kept.push(torn.kept);
    }
    assert_eq!(kept[0], kept[1], "one seed, one tear");
    kept.sort();
    kept.dedup();
    assert!(kept.len() > 2, "seeds chose too few tears: {kept:?}");
}

#[test]
fn a_clean_unmount_keeps_everything() {
    let mut m = Mount::new();
    fs::create_dir(m.path("d")).unwrap();
    write_new(&m.path("d/f"), b"never synced");
    let status = Command::new("fusermount3")
        .arg("-u")
        .arg(m.mnt())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(m.child.take().unwrap().wait().unwrap().success());
    assert_eq!(fs::read(m.backing().join("d/f")).unwrap(), b"never synced");
    m.start();
    assert_eq!(fs::read(m.path("d/f")).unwrap(), b"never synced");
}

/// A copy of the mount in another mount namespace (as every `ip netns exec` started after the
/// mount holds) keeps the FUSE session open after `fusermount3 -u` here, so the filesystem never
/// hears of the unmount; an unmount asked on the control socket writes everything back and ends
/// the process anyway.
#[test]
fn an_unmount_asked_for_keeps_everything_while_another_namespace_holds_a_copy() {
    let uid = Command::new("id").arg("-u").output().expect("id -u");
    assert!(
        String::from_utf8_lossy(&uid.stdout).trim() == "0",
        "this test makes a mount namespace (unshare --mount), which needs root: run the tests \
         as root, as the README says"
    );
    let mut m = Mount::new();
    fs::create_dir(m.path("d")).unwrap();
    write_new(&m.path("d/f"), b"never synced");
    let mut holder = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sleep", "60"])
        .spawn()
        .unwrap();
    let needle = format!(" {} ", m.mnt().display());
    let copy = format!("/proc/{}/mountinfo", holder.id());
    wait_for("the copy of the mount", || {
        fs::read_to_string(&copy).is_ok_and(|t| t.contains(&needle))
    });
    let reply = control::call(&m.control(), &Request::Unmount).unwrap();
    assert_eq!(reply, Reply::Unmounted);
    let mut child = m.child.take().unwrap();
    let mut status = None;
    wait_for("the filesystem to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(status.unwrap().success());
    assert!(!mounted(&m.mnt()));
    assert_eq!(fs::read(m.backing().join("d/f")).unwrap(), b"never synced");
    m.start();
    assert_eq!(fs::read(m.path("d/f")).unwrap(), b"never synced");
}

/// A failing disk through the kernel: fsync answers EIO and drops what it would have made
/// durable, reads still see it, and after the disk is healed a later fsync succeeds without it,
/// so a power loss shows a hole where the program believed its first write durable.
#[test]
fn a_failed_fsync_leaves_a_hole_that_the_next_fsync_does_not_fill() {
    let mut m = Mount::new();
    let f = write_new(&m.path("log"), b"kept");
    f.sync_all().unwrap();
    m.sync_dir("");
    let disk = |fault: Option<Fault>| match control::call(&m.control(), &Request::Disk { fault }) {
        Ok(Reply::Disk(state)) => state,
        other => panic!("disk request failed: {other:?}"),
    };
    assert_eq!(disk(Some(Fault::FailFsync)).fault, Some(Fault::FailFsync));
    f.write_all_at(b"-dropped", 4).unwrap();
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(fs::read(m.path("log")).unwrap(), b"kept-dropped");
    let healed = disk(None);
    assert_eq!(healed.fault, None);
    assert_eq!(healed.lost_bytes, 8);
    f.write_all_at(b"+after", 12).unwrap();
    f.sync_data().unwrap();
    drop(f);
    m.lose_power_and_reboot(1);
    let mut expected = b"kept".to_vec();
    expected.extend_from_slice(&[0; 8]);
    expected.extend_from_slice(b"+after");
    assert_eq!(fs::read(m.path("log")).unwrap(), expected);
}

/// Through the kernel, a nearly full disk cuts the write that fills it short (the caller sees
/// how much went in) and refuses the rest; what fits is there, and healed it has room again.
#[test]
fn a_nearly_full_disk_takes_what_fits_of_a_write_and_refuses_the_rest() {
    let m = Mount::new();
    let disk = |fault: Option<Fault>| match control::call(&m.control(), &Request::Disk { fault }) {
        Ok(Reply::Disk(state)) => state,
        other => panic!("disk request failed: {other:?}"),
    };
    disk(Some(Fault::NearlyFull));
    let room = tidemark_powerfs::state::NEARLY_FULL_ROOM as usize;
    let mut f = write_new(&m.path("log"), &[]);
    let n = f.write(&vec![7; room + 100]).unwrap();
    assert_eq!(n, room, "a short write of what fits");
    let e = f.write(&[8; 10]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(fs::read(m.path("log")).unwrap(), vec![7; room]);
    assert_eq!(disk(None).refused, 1);
    f.write_all(&[9; 100]).unwrap();
    assert_eq!(
        fs::metadata(m.path("log")).unwrap().len(),
        (room + 100) as u64
    );
}
