//! When reading updates atime: the kernel's `relatime` (the default), `strictatime`, `noatime`
//! and `nodiratime` (fs/inode.c `atime_needs_update`, `relatime_need_update`).
//!
//! FUSE inodes are S_NOATIME (fs/fuse/inode.c `fuse_iget`): the kernel never stamps atime and
//! instead drops its cached atime after each READ, READDIR and READLINK it sends, so the daemon
//! updates atime on those. Reads served from the page cache never reach the daemon and leave
//! atime alone.

use compfs_store::Timestamp;

/// How reads update atime (mount options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeMode {
    /// `relatime`: only when atime is not after mtime or ctime, or is a day old.
    #[default]
    Relatime,
    /// `strictatime`: on every access.
    Strict,
    /// `noatime`: never.
    Never,
}

/// The mount's atime rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtimePolicy {
    pub mode: AtimeMode,
    /// `nodiratime`: directories never.
    pub nodiratime: bool,
}

/// A day, relatime's longest interval between updates.
const DAY_SECS: i64 = 24 * 60 * 60;

impl AtimePolicy {
    /// Does an access at `now` update the atime of an inode with these times?
    pub fn due(
        &self,
        is_dir: bool,
        atime: Timestamp,
        mtime: Timestamp,
        ctime: Timestamp,
        now: Timestamp,
    ) -> bool {
        if is_dir && self.nodiratime {
            return false;
        }
        match self.mode {
            AtimeMode::Never => false,
            AtimeMode::Strict => atime != now,
            AtimeMode::Relatime => {
                mtime >= atime || ctime >= atime || now.secs - atime.secs >= DAY_SECS
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp { secs, nsecs: 0 }
    }

    #[test]
    fn relatime_updates_after_a_change_or_a_day() {
        let p = AtimePolicy::default();
        // atime not after mtime / ctime: update
        assert!(p.due(false, t(100), t(100), t(50), t(200)));
        assert!(p.due(false, t(100), t(50), t(150), t(200)));
        // atime after both, recent: no update
        assert!(!p.due(false, t(150), t(100), t(100), t(200)));
        // a day old: update
        assert!(p.due(false, t(150), t(100), t(100), t(150 + DAY_SECS)));
        assert!(!p.due(false, t(150), t(100), t(100), t(149 + DAY_SECS)));
    }

    #[test]
    fn strict_never_and_nodiratime() {
        let strict = AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: false,
        };
        assert!(strict.due(true, t(150), t(100), t(100), t(151)));
        let never = AtimePolicy {
            mode: AtimeMode::Never,
            nodiratime: false,
        };
        assert!(!never.due(false, t(1), t(100), t(100), t(151)));
        let nodir = AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: true,
        };
        assert!(!nodir.due(true, t(1), t(100), t(100), t(151)));
        assert!(nodir.due(false, t(1), t(100), t(100), t(151)));
    }
}
