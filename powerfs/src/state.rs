//! The volatile tree and its durable shadow: every operation the FUSE layer serves lands here.
//!
//! Each inode has a volatile view (what programs see) and a durable one (what survives power
//! loss). A file's durable content is its content at its last fsync; a directory's durable entries
//! are its entries at its last fsync. The backing directory mirrors the durable namespace exactly,
//! so it is updated at each fsync and never otherwise, and a remount after a power loss shows what
//! survived.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// The root directory's inode number (FUSE's).
pub const ROOT: u64 = 1;

/// A failed operation, as the errno FUSE replies with.
pub type Errno = i32;

/// What a power loss did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerLoss {
    /// The seed that chose where writes tore.
    pub seed: u64,
    /// Bytes written since the last fsync of their file and not kept.
    pub bytes_dropped: u64,
    /// Files whose last unsynced write survived in part.
    pub files_torn: Vec<Torn>,
    /// Directory entries created, removed or renamed since their directory's last fsync.
    pub entries_lost: u64,
}

/// A file whose last unsynced write was torn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Torn {
    /// The file's durable path, relative to the mount.
    pub path: String,
    /// Where the write started.
    pub offset: u64,
    /// How long the write was.
    pub len: u64,
    /// How many of its first bytes survived (always fewer than `len`).
    pub kept: u64,
}

/// What a kind of inode holds.
#[derive(Debug)]
pub enum Body {
    /// A regular file.
    File(FileBody),
    /// A directory.
    Dir(DirBody),
}

/// A regular file's volatile and durable content.
#[derive(Debug, Default)]
pub struct FileBody {
    /// What reads see.
    pub data: Vec<u8>,
    /// The content at the last fsync (what the backing files at its durable paths hold).
    durable: Vec<u8>,
    /// The first byte, from which on or in `lost`, that may differ from `durable` (beyond
    /// `durable`'s end only after a failed fsync).
    dirty_from: usize,
    /// The last write since the last fsync: where, and its bytes.
    last_write: Option<(u64, Vec<u8>)>,
    /// Bytes written since the last fsync.
    unsynced: u64,
    /// Ranges whose content a failed fsync dropped (sorted, disjoint): reads see `data`, but an
    /// fsync keeps the durable bytes there (zeros past the durable end) until they are written
    /// again, as Linux marks the pages of a failed writeback clean.
    lost: Vec<(usize, usize)>,
}

/// A directory's volatile and durable entries.
#[derive(Debug, Default)]
pub struct DirBody {
    /// What lookups see.
    pub entries: BTreeMap<OsString, u64>,
    /// The entries at the last fsync of the directory.
    durable: BTreeMap<OsString, u64>,
}

/// An inode.
#[derive(Debug)]
pub struct Inode {
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last access.
    pub atime: SystemTime,
    /// Last modification.
    pub mtime: SystemTime,
    /// Last change.
    pub ctime: SystemTime,
    /// Content.
    pub body: Body,
}

impl Inode {
    fn new(perm: u16, uid: u32, gid: u32, body: Body) -> Self {
        let now = SystemTime::now();
        Inode {
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            body,
        }
    }

    /// The size `stat` reports.
    pub fn size(&self) -> u64 {
        match &self.body {
            Body::File(f) => f.data.len() as u64,
            Body::Dir(d) => d.entries.len() as u64,
        }
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir(_))
    }
}

/// The whole filesystem.
#[derive(Debug)]
pub struct State {
    backing: PathBuf,
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    dead: bool,
    /// The disk fault in force, if any.
    fault: Option<Fault>,
    /// Bytes whose write-back failed fsyncs dropped, since the mount.
    lost_bytes: u64,
    /// Writes and truncates a full disk refused, since the mount.
    refused: u64,
    /// While nearly full: the disk's size, what its files held when the fault began and the
    /// room left then.
    capacity: Option<u64>,
}

/// The room a nearly full disk has left when the fault begins: a few checkpoints and segment
/// appends fit, and then one write fits only in part.
pub const NEARLY_FULL_ROOM: u64 = 4 * 1024;

/// A way for the disk to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Every fsync fails with EIO, dropping what it would have made durable.
    FailFsync,
    /// The disk is full: every write or truncate that would grow a file fails with ENOSPC.
    Full,
    /// The disk has [`NEARLY_FULL_ROOM`] bytes left: files grow until their lengths fill it
    /// (what shrinks or is removed frees room again), a write that does not fit is cut short at
    /// the last byte that does, and growing past it fails with ENOSPC.
    NearlyFull,
}

/// The disk's state: its fault, and what faults have done so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskState {
    /// The fault in force (`null`: the disk works).
    pub fault: Option<Fault>,
    /// Bytes whose write-back failed fsyncs dropped, since the mount: reads still see them, the
    /// disk never gets them unless they are written again.
    pub lost_bytes: u64,
    /// Writes and truncates a full disk refused, since the mount.
    pub refused: u64,
}

fn io_errno(e: &io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl State {
    /// Loads the durable tree in `backing`: everything in it is durable.
    pub fn load(backing: &Path) -> io::Result<Self> {
        let mut state = State {
            backing: backing.to_path_buf(),
            inodes: HashMap::new(),
            next_ino: ROOT + 1,
            dead: false,
            fault: None,
            lost_bytes: 0,
            refused: 0,
            capacity: None,
        };
        let meta = fs::metadata(backing)?;
        let root = state.load_dir(backing)?;
        state.inodes.insert(
            ROOT,
            Inode::new(
                (meta.permissions().mode() & 0o7777) as u16,
                meta.uid(),
                meta.gid(),
                Body::Dir(root),
            ),
        );
        Ok(state)
    }

    fn load_dir(&mut self, dir: &Path) -> io::Result<DirBody> {
        let mut body = DirBody::default();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let path = entry.path();
            let inner = if meta.is_dir() {
                Body::Dir(self.load_dir(&path)?)
            } else if meta.is_file() {
                let data = fs::read(&path)?;
                Body::File(FileBody {
                    dirty_from: data.len(),
                    durable: data.clone(),
                    data,
                    last_write: None,
                    unsynced: 0,
                    lost: Vec::new(),
                })
            } else {
                return Err(io::Error::other(format!(
                    "{}: only regular files and directories are supported",
                    path.display()
                )));
            };
            let ino = self.next_ino;
            self.next_ino += 1;
            let mut inode = Inode::new(
                (meta.permissions().mode() & 0o7777) as u16,
                meta.uid(),
                meta.gid(),
                inner,
            );
            if let Ok(m) = meta.modified() {
                inode.mtime = m;
            }
            self.inodes.insert(ino, inode);
            body.entries.insert(entry.file_name(), ino);
        }
        body.durable = body.entries.clone();
        Ok(body)
    }

    fn check(&self) -> Result<(), Errno> {
        if self.dead {
            Err(libc::EIO)
        } else {
            Ok(())
        }
    }

    /// The inode `ino`.
    pub fn inode(&self, ino: u64) -> Result<&Inode, Errno> {
        self.check()?;
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode, Errno> {
        self.check()?;
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&DirBody, Errno> {
        match &self.inode(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut DirBody, Errno> {
        match &mut self.inode_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileBody, Errno> {
        match &mut self.inode_mut(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    /// The inode called `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?
            .entries
            .get(name)
            .copied()
            .ok_or(libc::ENOENT)
    }

    /// The entries of directory `ino`, in name order.
    pub fn entries(&self, ino: u64) -> Result<Vec<(OsString, u64, bool)>, Errno> {
        let dir = self.dir(ino)?;
        Ok(dir
            .entries
            .iter()
            .map(|(n, &i)| {
                let is_dir = self.inodes.get(&i).is_some_and(Inode::is_dir);
                (n.clone(), i, is_dir)
            })
            .collect())
    }

    /// Creates a file (or, with `dir`, a directory) called `name` in `parent`.
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        perm: u16,
        uid: u32,
        gid: u32,
        dir: bool,
    ) -> Result<u64, Errno> {
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let body = if dir {
            Body::Dir(DirBody::default())
        } else {
            Body::File(FileBody::default())
        };
        self.inodes.insert(ino, Inode::new(perm, uid, gid, body));
        self.dir_mut(parent)?.entries.insert(name.to_owned(), ino);
        self.touch(parent);
        Ok(ino)
    }

    fn touch(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            let now = SystemTime::now();
            i.mtime = now;
            i.ctime = now;
        }
    }

    /// Removes `name` from `parent`: a file unless `dir`, else an empty directory.
    pub fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        match (&self.inode(ino)?.body, dir) {
            (Body::Dir(_), false) => return Err(libc::EISDIR),
            (Body::File(_), true) => return Err(libc::ENOTDIR),
            (Body::Dir(d), true) if !d.entries.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.dir_mut(parent)?.entries.remove(name);
        self.touch(parent);
        Ok(())
    }

    /// Renames `parent/name` to `new_parent/new_name`, replacing what is there unless
    /// `no_replace`.
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        no_replace: bool,
    ) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        self.dir(new_parent)?;
        if let Ok(target) = self.lookup(new_parent, new_name) {
            if target == ino {
                return Ok(());
            }
            if no_replace {
                return Err(libc::EEXIST);
            }
            match (&self.inode(ino)?.body, &self.inode(target)?.body) {
                (Body::File(_), Body::Dir(_)) => return Err(libc::EISDIR),
                (Body::Dir(_), Body::File(_)) => return Err(libc::ENOTDIR),
                (Body::Dir(_), Body::Dir(t)) if !t.entries.is_empty() => {
                    return Err(libc::ENOTEMPTY)
                }
                _ => {}
            }
        }
        self.dir_mut(parent)?.entries.remove(name);
        self.dir_mut(new_parent)?
            .entries
            .insert(new_name.to_owned(), ino);
        self.touch(parent);
        self.touch(new_parent);
        Ok(())
    }

    /// Up to `size` bytes of file `ino` from `offset`.
    pub fn read(&mut self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let inode = self.inode_mut(ino)?;
        let Body::File(f) = &inode.body else {
            return Err(libc::EISDIR);
        };
        let start = (offset as usize).min(f.data.len());
        let end = start.saturating_add(size as usize).min(f.data.len());
        Ok(f.data[start..end].to_vec())
    }

    /// How far file `ino` may grow towards `end` bytes: `end` unless the disk is full, or
    /// nearly full with less room left than that.
    fn room_for(&self, ino: u64, end: usize) -> Result<usize, Errno> {
        let len = match &self.inode(ino)?.body {
            Body::File(f) => f.data.len(),
            Body::Dir(_) => return Err(libc::EISDIR),
        };
        if end <= len {
            return Ok(end);
        }
        Ok(match (self.fault, self.capacity) {
            (Some(Fault::Full), _) => len,
            (Some(Fault::NearlyFull), Some(capacity)) => {
                let free = capacity.saturating_sub(self.used());
                end.min(len.saturating_add(usize::try_from(free).unwrap_or(usize::MAX)))
            }
            _ => end,
        })
    }

    /// What the linked files hold, in bytes.
    fn used(&self) -> u64 {
        let mut used = 0;
        let mut dirs = vec![ROOT];
        while let Some(d) = dirs.pop() {
            let Some(Body::Dir(dir)) = self.inodes.get(&d).map(|i| &i.body) else {
                continue;
            };
            for ino in dir.entries.values() {
                match self.inodes.get(ino).map(|i| &i.body) {
                    Some(Body::File(f)) => used += f.data.len() as u64,
                    Some(Body::Dir(_)) => dirs.push(*ino),
                    None => {}
                }
            }
        }
        used
    }

    /// Writes `data` at `offset` of file `ino` (volatile until fsync); on a nearly full disk,
    /// what fits of it.
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let start = offset as usize;
        let wanted = start.checked_add(data.len()).ok_or(libc::EFBIG)?;
        let end = self.room_for(ino, wanted)?;
        // A full disk refuses any growth; a nearly full one takes what fits.
        let refused = end < wanted && (end <= start || self.fault == Some(Fault::Full));
        if refused && !data.is_empty() {
            self.refused += 1;
            return Err(libc::ENOSPC);
        }
        let data = &data[..end - start];
        let f = self.file_mut(ino)?;
        if f.data.len() < end {
            f.data.resize(end, 0);
        }
        f.data[start..end].copy_from_slice(data);
        f.lost = subtract(&f.lost, start, end);
        f.dirty_from = f.dirty_from.min(start);
        f.last_write = Some((offset, data.to_vec()));
        f.unsynced += data.len() as u64;
        self.touch(ino);
        Ok(data.len() as u32)
    }

    /// Sets file `ino`'s length (volatile until fsync).
    pub fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        if self.room_for(ino, size as usize)? < size as usize {
            self.refused += 1;
            return Err(libc::ENOSPC);
        }
        let f = self.file_mut(ino)?;
        f.data.resize(size as usize, 0);
        f.lost = subtract(&f.lost, size as usize, usize::MAX);
        f.dirty_from = f.dirty_from.min(size as usize);
        self.touch(ino);
        Ok(())
    }

    /// Sets permission bits, owner or group.
    pub fn set_owner_mode(
        &mut self,
        ino: u64,
        perm: Option<u16>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<(), Errno> {
        let i = self.inode_mut(ino)?;
        if let Some(p) = perm {
            i.perm = p;
        }
        if let Some(u) = uid {
            i.uid = u;
        }
        if let Some(g) = gid {
            i.gid = g;
        }
        i.ctime = SystemTime::now();
        Ok(())
    }

    /// Sets the modification time.
    pub fn set_mtime(&mut self, ino: u64, t: SystemTime) -> Result<(), Errno> {
        self.inode_mut(ino)?.mtime = t;
        Ok(())
    }

    /// Every backing path at which `ino` is durably linked.
    fn durable_paths(&self, ino: u64) -> Vec<(PathBuf, String)> {
        let mut found = Vec::new();
        let mut stack = vec![(ROOT, self.backing.clone(), String::new())];
        if ino == ROOT {
            return vec![(self.backing.clone(), String::new())];
        }
        while let Some((dir, path, rel)) = stack.pop() {
            let Some(Inode {
                body: Body::Dir(d), ..
            }) = self.inodes.get(&dir)
            else {
                continue;
            };
            for (name, &child) in &d.durable {
                let child_path = path.join(name);
                let child_rel = if rel.is_empty() {
                    name.to_string_lossy().into_owned()
                } else {
                    format!("{rel}/{}", name.to_string_lossy())
                };
                if child == ino {
                    found.push((child_path.clone(), child_rel.clone()));
                }
                if self.inodes.get(&child).is_some_and(Inode::is_dir) {
                    stack.push((child, child_path, child_rel));
                }
            }
        }
        found
    }

    /// Puts `fault` in force, or with `None` makes the disk work again. Under
    /// [`Fault::FailFsync`] a failed fsync of a file drops what it would have made durable (see
    /// [`FileBody`]'s `lost`), and one of a directory leaves its entries pending for the next.
    pub fn set_fault(&mut self, fault: Option<Fault>) -> DiskState {
        self.fault = fault;
        self.capacity = (fault == Some(Fault::NearlyFull)).then(|| self.used() + NEARLY_FULL_ROOM);
        self.disk()
    }

    /// The disk's state.
    pub fn disk(&self) -> DiskState {
        DiskState {
            fault: self.fault,
            lost_bytes: self.lost_bytes,
            refused: self.refused,
        }
    }

    /// Makes `ino` durable: a file's content, or a directory's entries.
    pub fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
        self.check()?;
        let failing = self.fault == Some(Fault::FailFsync);
        let paths = self.durable_paths(ino);
        if failing {
            if let Body::File(f) = &mut self.inode_mut(ino)?.body {
                let (a, b) = (f.dirty_from, f.data.len());
                if a < b {
                    f.lost = union(&f.lost, (a, b));
                }
                f.dirty_from = b;
                f.last_write = None;
                f.unsynced = 0;
                self.lost_bytes += b.saturating_sub(a) as u64;
            }
            return Err(libc::EIO);
        }
        let (old, new) = match &mut self.inode_mut(ino)?.body {
            Body::File(f) => {
                // Below `dirty_from` the two agree but where a failed fsync dropped bytes (past
                // the durable end it may lie), so the tail from there is written, keeping the
                // durable bytes, or zeros, where bytes were dropped.
                let from = f.dirty_from.min(f.durable.len());
                let mut tail = f.data[from..].to_vec();
                for &(a, b) in &f.lost {
                    for i in a.max(from)..b.min(f.data.len()) {
                        tail[i - from] = f.durable.get(i).copied().unwrap_or(0);
                    }
                }
                for (path, _) in &paths {
                    write_tail(path, from, &tail).map_err(|e| io_errno(&e))?;
                }
                f.durable.truncate(from);
                f.durable.extend_from_slice(&tail);
                f.dirty_from = f.data.len();
                f.last_write = None;
                f.unsynced = 0;
                return Ok(());
            }
            Body::Dir(d) => {
                let old = std::mem::replace(&mut d.durable, d.entries.clone());
                (old, d.durable.clone())
            }
        };
        for (path, _) in &paths {
            for (name, child) in &old {
                if new.get(name) != Some(child) {
                    remove_path(&path.join(name)).map_err(|e| io_errno(&e))?;
                }
            }
            for (name, &child) in &new {
                if old.get(name) != Some(&child) {
                    self.materialize(child, &path.join(name))
                        .map_err(|e| io_errno(&e))?;
                }
            }
        }
        Ok(())
    }

    /// Writes `ino`'s durable state at `path`.
    fn materialize(&self, ino: u64, path: &Path) -> io::Result<()> {
        let Some(inode) = self.inodes.get(&ino) else {
            return Ok(());
        };
        remove_path(path)?;
        match &inode.body {
            Body::File(f) => fs::write(path, &f.durable)?,
            Body::Dir(d) => {
                fs::create_dir(path)?;
                for (name, &child) in &d.durable {
                    self.materialize(child, &path.join(name))?;
                }
            }
        }
        fs::set_permissions(path, fs::Permissions::from_mode(u32::from(inode.perm)))
    }

    /// Makes everything durable, as a clean unmount flushes the page cache: directories first
    /// (from the root down), then files. The disk works again for it (a disk fault ends with the
    /// mount); what failed fsyncs dropped stays dropped.
    pub fn sync_all(&mut self) -> Result<(), Errno> {
        self.fault = None;
        self.capacity = None;
        let mut order = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(dir) = stack.pop() {
            order.push(dir);
            if let Ok(d) = self.dir(dir) {
                stack.extend(
                    d.entries
                        .values()
                        .filter(|c| self.inodes.get(c).is_some_and(Inode::is_dir)),
                );
            }
        }
        for dir in order {
            self.fsync(dir)?;
        }
        let files: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| !i.is_dir())
            .map(|(&n, _)| n)
            .collect();
        for f in files {
            self.fsync(f)?;
        }
        Ok(())
    }

    /// Loses power: every change not yet durable is dropped, except that the last unsynced write
    /// of each durably linked file survives in part, torn at a byte `seed` chooses (bytes beyond
    /// the durable end before it read as zeros, as a disk's allocated but unwritten blocks do).
    /// The backing directory then holds exactly what survived; the filesystem answers EIO from
    /// now on.
    pub fn lose_power(&mut self, seed: u64) -> io::Result<PowerLoss> {
        let mut rng = SplitMix(seed);
        let mut report = PowerLoss {
            seed,
            bytes_dropped: 0,
            files_torn: Vec::new(),
            entries_lost: 0,
        };
        let mut inos: Vec<u64> = self.inodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let paths = self.durable_paths(ino);
            let Some(inode) = self.inodes.get_mut(&ino) else {
                continue;
            };
            match &mut inode.body {
                Body::Dir(d) => {
                    let lost = d
                        .entries
                        .iter()
                        .filter(|(n, i)| d.durable.get(*n) != Some(i))
                        .count()
                        + d.durable
                            .iter()
                            .filter(|(n, i)| d.entries.get(*n) != Some(i))
                            .count();
                    report.entries_lost += lost as u64;
                }
                Body::File(f) => {
                    let mut kept = 0u64;
                    if let (Some((offset, bytes)), Some((_, rel))) = (&f.last_write, paths.first())
                    {
                        kept = rng.below(bytes.len() as u64);
                        if kept > 0 {
                            let start = *offset as usize;
                            let end = start + kept as usize;
                            let mut torn = f.durable.clone();
                            if torn.len() < end {
                                torn.resize(end, 0);
                            }
                            torn[start..end].copy_from_slice(&bytes[..kept as usize]);
                            for (path, _) in &paths {
                                fs::write(path, &torn)?;
                            }
                            f.durable = torn;
                        }
                        report.files_torn.push(Torn {
                            path: rel.clone(),
                            offset: *offset,
                            len: bytes.len() as u64,
                            kept,
                        });
                    }
                    report.bytes_dropped += f.unsynced.saturating_sub(kept);
                }
            }
        }
        self.dead = true;
        Ok(report)
    }

    /// Whether power was lost.
    pub fn is_dead(&self) -> bool {
        self.dead
    }
}

/// Writes `tail` at `from` in the file at `path` and cuts the file after it.
fn write_tail(path: &Path, from: usize, tail: &[u8]) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.write_all_at(tail, from as u64)?;
    file.set_len((from + tail.len()) as u64)
}

/// `ranges` (sorted, disjoint) with `[a, b)` added.
fn union(ranges: &[(usize, usize)], (a, b): (usize, usize)) -> Vec<(usize, usize)> {
    let mut all = ranges.to_vec();
    all.push((a, b));
    all.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (a, b) in all {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// `ranges` (sorted, disjoint) without `[a, b)`.
fn subtract(ranges: &[(usize, usize)], a: usize, b: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(x, y) in ranges {
        if x < a {
            out.push((x, y.min(a)));
        }
        if y > b {
            out.push((x.max(b), y));
        }
    }
    out
}

fn remove_path(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A small seeded generator (splitmix64), so a seed names the same tears on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    #[test]
    fn the_backing_directory_changes_only_at_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::load(dir.path()).unwrap();
        let f = s.create(ROOT, name("a"), 0o644, 0, 0, false).unwrap();
        s.write(f, 0, b"hello").unwrap();
        assert!(!dir.path().join("a").exists());
        s.fsync(f).unwrap();
        assert!(
            !dir.path().join("a").exists(),
            "not linked until the dir is synced"
        );
        s.fsync(ROOT).unwrap();
        assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"hello");
        s.write(f, 5, b" world").unwrap();
        assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"hello");
        s.fsync(f).unwrap();
        assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"hello world");
    }

    #[test]
    fn a_torn_write_keeps_a_prefix_the_seed_chooses_and_drops_earlier_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::load(dir.path()).unwrap();
        let f = s.create(ROOT, name("log"), 0o644, 0, 0, false).unwrap();
        s.write(f, 0, b"durable").unwrap();
        s.fsync(f).unwrap();
        s.fsync(ROOT).unwrap();
        s.write(f, 7, b"-lost-").unwrap();
        s.write(f, 13, b"0123456789").unwrap();
        let seed = 7;
        let kept = SplitMix(seed).below(10);
        let report = s.lose_power(seed).unwrap();
        assert_eq!(
            report.files_torn,
            vec![Torn {
                path: "log".into(),
                offset: 13,
                len: 10,
                kept
            }]
        );
        assert_eq!(report.bytes_dropped, 16 - kept);
        let mut expected = b"durable".to_vec();
        if kept > 0 {
            expected.extend_from_slice(&[0; 6]);
            expected.extend_from_slice(&b"0123456789"[..kept as usize]);
        }
        assert_eq!(fs::read(dir.path().join("log")).unwrap(), expected);
        assert_eq!(s.inode(f).unwrap_err(), libc::EIO);
    }

    #[test]
    fn a_failed_fsync_drops_what_it_would_have_made_durable_until_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::load(dir.path()).unwrap();
        let f = s.create(ROOT, name("log"), 0o644, 0, 0, false).unwrap();
        s.write(f, 0, b"0123").unwrap();
        s.fsync(f).unwrap();
        s.fsync(ROOT).unwrap();
        s.write(f, 2, b"ab").unwrap();
        s.write(f, 4, b"AAAA").unwrap();
        assert_eq!(
            s.set_fault(Some(Fault::FailFsync)),
            DiskState {
                fault: Some(Fault::FailFsync),
                lost_bytes: 0,
                refused: 0
            }
        );
        assert_eq!(s.fsync(f), Err(libc::EIO));
        assert_eq!(s.fsync(ROOT), Err(libc::EIO));
        // Reads still see the dropped bytes; the disk has what it had.
        assert_eq!(s.read(f, 0, 100).unwrap(), b"01abAAAA");
        assert_eq!(fs::read(dir.path().join("log")).unwrap(), b"0123");
        assert_eq!(s.set_fault(None).lost_bytes, 6);
        // A later fsync succeeds, and writes only what was written since: the dropped bytes keep
        // the durable content, or read as zeros past its old end, unless written again.
        s.write(f, 8, b"BB").unwrap();
        s.write(f, 5, b"x").unwrap();
        s.fsync(f).unwrap();
        assert_eq!(s.read(f, 0, 100).unwrap(), b"01abAxAABB");
        assert_eq!(fs::read(dir.path().join("log")).unwrap(), b"0123\0x\0\0BB");
        // Nor does a clean unmount write them back.
        s.sync_all().unwrap();
        assert_eq!(fs::read(dir.path().join("log")).unwrap(), b"0123\0x\0\0BB");
        // Truncating below them forgets them.
        s.truncate(f, 1).unwrap();
        s.write(f, 1, b"yz").unwrap();
        s.fsync(f).unwrap();
        assert_eq!(fs::read(dir.path().join("log")).unwrap(), b"0yz");
    }

    #[test]
    fn a_failed_directory_fsync_leaves_its_entries_for_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::load(dir.path()).unwrap();
        let f = s.create(ROOT, name("a"), 0o644, 0, 0, false).unwrap();
        s.write(f, 0, b"x").unwrap();
        s.fsync(f).unwrap();
        s.set_fault(Some(Fault::FailFsync));
        assert_eq!(s.fsync(ROOT), Err(libc::EIO));
        assert!(!dir.path().join("a").exists());
        // Ending the mount ends the fault.
        s.sync_all().unwrap();
        assert_eq!(s.disk().fault, None);
        assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"x");
    }

    #[test]
    fn a_full_disk_refuses_growing_a_file_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::load(dir.path()).unwrap();
        let f = s.create(ROOT, name("log"), 0o644, 0, 0, false).unwrap();
        s.write(f, 0, b"0123").unwrap();
        s.set_fault(Some(Fault::Full));
        assert_eq!(s.write(f, 4, b"x"), Err(libc::ENOSPC));
        assert_eq!(s.write(f, 3, b"ab"), Err(libc::ENOSPC));
        assert_eq!(s.truncate(f, 10), Err(libc::ENOSPC));
        // Overwrites in place, shrinking, fsyncs and new names still work.
        assert_eq!(s.write(f, 1, b"ab"), Ok(2));
        s.truncate(f, 3).unwrap();
        s.fsync(f).unwrap();
        s.create(ROOT, name("other"), 0o644, 0, 0, false).unwrap();
        s.fsync(ROOT).unwrap();
        assert_eq!(fs::read(dir.path().join("log")).unwrap(), b"0ab");
        assert_eq!(s.set_fault(None).refused, 3);
        assert_eq!(s.write(f, 3, b"c"), Ok(1));
    }

    #[test]
    fn a_nearly_full_disk_cuts_the_write_that_fills_it_short_and_frees_what_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::load(dir.path()).unwrap();
        let log = s.create(ROOT, name("log"), 0o644, 0, 0, false).unwrap();
        s.write(log, 0, &[1; 100]).unwrap();
        let room = NEARLY_FULL_ROOM as usize;
        s.set_fault(Some(Fault::NearlyFull));
        // Another file takes all but 10 bytes of the room; the log's next write gets those.
        let other = s.create(ROOT, name("other"), 0o644, 0, 0, false).unwrap();
        assert_eq!(
            s.write(other, 0, &vec![2; room - 10]),
            Ok((room - 10) as u32)
        );
        assert_eq!(s.write(log, 100, &[3; 30]), Ok(10));
        assert_eq!(s.write(log, 110, &[3; 20]), Err(libc::ENOSPC));
        assert_eq!(s.truncate(log, 111), Err(libc::ENOSPC));
        // Overwrites in place still work; shrinking or removing a file frees its room.
        assert_eq!(s.write(log, 0, &[4; 50]), Ok(50));
        s.truncate(other, 0).unwrap();
        assert_eq!(s.write(log, 110, &[5; 20]), Ok(20));
        s.remove(ROOT, name("log"), false).unwrap();
        assert_eq!(s.write(other, 0, &vec![6; room]), Ok(room as u32));
        assert_eq!(s.disk().refused, 2);
        // Healed, it has room again.
        s.set_fault(None);
        assert_eq!(s.write(other, room as u64, &[7; 64]), Ok(64));
    }
}
