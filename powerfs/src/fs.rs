//! The FUSE side: each request becomes a call on the shared [`State`].

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::state::{Inode, State};

/// Attributes are not cached by the kernel: every stat sees the current volatile state.
const TTL: Duration = Duration::ZERO;

/// The mounted filesystem.
pub struct PowerFs {
    state: Arc<Mutex<State>>,
}

impl PowerFs {
    /// Serves `state`.
    pub fn new(state: Arc<Mutex<State>>) -> Self {
        PowerFs { state }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn attr(ino: u64, i: &Inode) -> FileAttr {
    let size = i.size();
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        crtime: i.ctime,
        kind: if i.is_dir() {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: i.perm,
        nlink: if i.is_dir() { 2 } else { 1 },
        uid: i.uid,
        gid: i.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl PowerFs {
    fn entry(&self, s: &State, ino: u64, reply: ReplyEntry) {
        match s.inode(ino) {
            Ok(i) => reply.entry(&TTL, &attr(ino, i), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for PowerFs {
    fn destroy(&mut self) {
        let mut s = self.state();
        if !s.is_dead() {
            if let Err(e) = s.sync_all() {
                eprintln!("tidemark-powerfs: syncing at unmount failed: errno {e}");
            }
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = self.state();
        match s.lookup(parent.0, name) {
            Ok(ino) => self.entry(&s, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().inode(ino.0) {
            Ok(i) => reply.attr(&TTL, &attr(ino.0, i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.state();
        let mut result = s.set_owner_mode(ino.0, mode.map(|m| (m & 0o7777) as u16), uid, gid);
        if let (Ok(()), Some(size)) = (result, size) {
            result = s.truncate(ino.0, size);
        }
        if let (Ok(()), Some(t)) = (result, mtime) {
            result = s.set_mtime(
                ino.0,
                match t {
                    TimeOrNow::SpecificTime(t) => t,
                    TimeOrNow::Now => SystemTime::now(),
                },
            );
        }
        match result.and_then(|()| s.inode(ino.0)) {
            Ok(i) => reply.attr(&TTL, &attr(ino.0, i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = self.state();
        let perm = (mode & !umask & 0o7777) as u16;
        match s.create(parent.0, name, perm, req.uid(), req.gid(), true) {
            Ok(ino) => self.entry(&s, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            reply.error(Errno::EPERM);
            return;
        }
        let mut s = self.state();
        let perm = (mode & !umask & 0o7777) as u16;
        match s.create(parent.0, name, perm, req.uid(), req.gid(), false) {
            Ok(ino) => self.entry(&s, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.state();
        let perm = (mode & !umask & 0o7777) as u16;
        let created = s
            .create(parent.0, name, perm, req.uid(), req.gid(), false)
            .and_then(|ino| s.inode(ino).map(|i| attr(ino, i)));
        match created {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.state().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.state().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            reply.error(Errno::EINVAL);
            return;
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        match self
            .state()
            .rename(parent.0, name, newparent.0, newname, no_replace)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().inode(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.state().read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.state().write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() makes nothing durable.
        match self.state().inode(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.state().fsync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().inode(ino.0) {
            Ok(i) if i.is_dir() => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.state().entries(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        let all = [(".".into(), ino.0, true), ("..".into(), ino.0, true)]
            .into_iter()
            .chain(entries);
        for (i, (name, child, is_dir)) in all.enumerate().skip(offset as usize) {
            let kind = if is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.state().fsync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        match self.state().inode(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        let mut s = self.state();
        let end = offset.saturating_add(length);
        let grown = match s.inode(ino.0) {
            Ok(i) if i.size() < end => s.truncate(ino.0, end),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        match grown {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }
}
