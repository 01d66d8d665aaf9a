//! Conversions between the store's types and fuser's, and small reply helpers.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use compfs_store::{Attr, FileKind, TimeOrNow as StoreTime, Timestamp};
use fuser::{
    Errno, FileAttr, FileType, INodeNo, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyXattr,
    TimeOrNow,
};

pub(super) fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

pub(super) fn kind_from_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDev,
        libc::S_IFBLK => FileKind::BlockDev,
        _ => return None,
    })
}

pub(super) fn systime(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nsecs)
    } else {
        // secs is negative and nsecs counts forward from it.
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nsecs.into())
    }
}

pub(super) fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: d.as_secs() as i64,
            nsecs: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (secs, nsecs) = if d.subsec_nanos() == 0 {
                (-(d.as_secs() as i64), 0)
            } else {
                (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
            };
            Timestamp { secs, nsecs }
        }
    }
}

pub(super) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: systime(a.atime),
        mtime: systime(a.mtime),
        ctime: systime(a.ctime),
        crtime: systime(a.crtime),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

pub(super) fn name(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

pub(super) fn time_or_now(t: TimeOrNow) -> StoreTime {
    match t {
        TimeOrNow::Now => StoreTime::Now,
        TimeOrNow::SpecificTime(t) => StoreTime::Time(timestamp(t)),
    }
}

/// Replies to a getxattr/listxattr with the value or its size, as the protocol asks.
pub(super) fn reply_xattr(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        match u32::try_from(value.len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(Errno::E2BIG),
        }
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for t in [
            Timestamp { secs: 0, nsecs: 0 },
            Timestamp {
                secs: 1_700_000_000,
                nsecs: 123_456_789,
            },
            Timestamp {
                secs: -1,
                nsecs: 500_000_000,
            },
            Timestamp {
                secs: -100,
                nsecs: 0,
            },
        ] {
            assert_eq!(timestamp(systime(t)), t, "{t:?}");
        }
    }

    #[test]
    fn modes_map_to_kinds() {
        assert_eq!(kind_from_mode(libc::S_IFREG | 0o644), Some(FileKind::File));
        assert_eq!(kind_from_mode(0o644), Some(FileKind::File));
        assert_eq!(kind_from_mode(libc::S_IFIFO | 0o600), Some(FileKind::Fifo));
        assert_eq!(kind_from_mode(libc::S_IFBLK), Some(FileKind::BlockDev));
        assert_eq!(kind_from_mode(0o170000), None);
    }
}

/// The reply types that carry no data on success.
pub(super) trait Finish {
    fn done(self);
    fn fail(self, e: Errno);
}

macro_rules! impl_finish {
    ($($t:ty),*) => {$(
        impl Finish for $t {
            fn done(self) {
                self.ok()
            }
            fn fail(self, e: Errno) {
                self.error(e)
            }
        }
    )*};
}

impl_finish!(ReplyEmpty, ReplyDirectory, ReplyDirectoryPlus);
