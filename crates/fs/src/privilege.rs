//! The privilege-bit rules: when S_ISUID and S_ISGID are cleared.
//!
//! Under `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves clearing them to the daemon on write,
//! truncate, fallocate and chown (fs/fuse/dir.c `fuse_setattr` drops `ATTR_KILL_SUID`/
//! `ATTR_KILL_SGID`). [`mode_after`] applies the rules of fs/attr.c as a kernel filesystem
//! gets them from the VFS:
//!
//! - chown/chgrp of a non-directory (`chown_common`), by anyone, root included: S_ISUID always
//!   goes; S_ISGID goes when group-executable, or when the caller is neither in the file's
//!   (old) group nor holds CAP_FSETID (`setattr_should_drop_sgid`). Directories keep both.
//! - write, truncate and fallocate (allocate, punch, zero) of a regular file by a caller without
//!   CAP_FSETID (`setattr_should_drop_suidgid`): the same two rules.
//! - chmod by a caller neither in the file's group nor holding CAP_FSETID drops S_ISGID; the
//!   kernel does that before the request reaches us (`setattr_prepare`), so it is not here.
//!
//! FUSE passes the caller's uid, gid and pid only (the pid as the daemon's pid namespace sees
//! it); its supplementary groups and capabilities come from `/proc/PID/status` (read only when
//! the file has a bit to lose). If that process is gone, or the daemon cannot see it, uid 0
//! stands in for CAP_FSETID and the primary gid for the groups.

use crate::procstatus::ProcStatus;
use compfs_store::FileKind;

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;
/// Bit of CAP_FSETID in the capability sets.
const CAP_FSETID: u32 = 4;

/// What is being done to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// chown/chgrp (including `chown(f, -1, -1)`).
    Chown,
    /// write, truncate or fallocate.
    Modify,
}

/// The caller's credentials as far as these rules need them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Holds CAP_FSETID in its effective set.
    pub fsetid: bool,
}

impl Caller {
    /// The credentials of process `pid` (uid/gid as FUSE reported them).
    pub fn of(uid: u32, gid: u32, pid: u32) -> Caller {
        let st = ProcStatus::read(pid);
        match (st.groups, st.cap_eff) {
            (Some(groups), Some(capeff)) => Caller {
                uid,
                gid,
                groups,
                fsetid: capeff & (1 << CAP_FSETID) != 0,
            },
            _ => Caller {
                uid,
                gid,
                groups: Vec::new(),
                fsetid: uid == 0,
            },
        }
    }

    /// Is `gid` the caller's primary or a supplementary group?
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// Does `change` possibly clear a bit of `perm`? (Cheap test before looking up the caller.)
pub fn may_clear(kind: FileKind, perm: u16, change: Change) -> bool {
    let applies = match change {
        Change::Chown => kind != FileKind::Dir,
        Change::Modify => kind == FileKind::File,
    };
    applies && perm & (S_ISUID | S_ISGID) != 0
}

/// The permission bits of a file (`perm`, group `gid`, of `kind`) after `change` by `caller`.
/// `caller` is only called when a bit may be lost.
pub fn mode_after(
    kind: FileKind,
    perm: u16,
    gid: u32,
    change: Change,
    caller: impl FnOnce() -> Caller,
) -> u16 {
    if !may_clear(kind, perm, change) {
        return perm;
    }
    let c = caller();
    if change == Change::Modify && c.fsetid {
        return perm;
    }
    let mut out = perm & !S_ISUID;
    if perm & S_ISGID != 0 && (perm & S_IXGRP != 0 || !(c.fsetid || c.in_group(gid))) {
        out &= !S_ISGID;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(groups: &[u32]) -> Caller {
        Caller {
            uid: 1000,
            gid: 1000,
            groups: groups.to_vec(),
            fsetid: false,
        }
    }

    fn root() -> Caller {
        Caller {
            uid: 0,
            gid: 0,
            groups: vec![],
            fsetid: true,
        }
    }

    #[test]
    fn chown_of_non_directories_clears_setuid_for_everyone() {
        for k in [FileKind::File, FileKind::Fifo, FileKind::CharDev] {
            assert_eq!(mode_after(k, 0o6755, 1000, Change::Chown, root), 0o755);
            assert_eq!(
                mode_after(k, 0o6755, 1000, Change::Chown, || user(&[])),
                0o755
            );
            assert_eq!(mode_after(k, 0o4644, 5, Change::Chown, root), 0o644);
        }
        assert_eq!(
            mode_after(FileKind::Dir, 0o6755, 5, Change::Chown, || user(&[])),
            0o6755
        );
    }

    #[test]
    fn setgid_without_group_exec_goes_only_for_outsiders() {
        // in the file's group (primary or supplementary): kept
        assert_eq!(
            mode_after(FileKind::File, 0o2745, 1000, Change::Chown, || user(&[])),
            0o2745
        );
        assert_eq!(
            mode_after(FileKind::File, 0o2666, 7, Change::Modify, || user(&[7])),
            0o2666
        );
        // outsider: cleared
        assert_eq!(
            mode_after(FileKind::File, 0o2745, 7, Change::Chown, || user(&[8])),
            0o745
        );
        assert_eq!(
            mode_after(FileKind::File, 0o2666, 7, Change::Modify, || user(&[])),
            0o666
        );
        // CAP_FSETID keeps it on chown
        assert_eq!(
            mode_after(FileKind::File, 0o2745, 7, Change::Chown, root),
            0o2745
        );
    }

    #[test]
    fn modification_clears_bits_of_regular_files_without_cap_fsetid() {
        let u = || user(&[1000]);
        assert_eq!(
            mode_after(FileKind::File, 0o6777, 1000, Change::Modify, u),
            0o777
        );
        assert_eq!(
            mode_after(FileKind::File, 0o2676, 1000, Change::Modify, u),
            0o676
        );
        assert_eq!(
            mode_after(FileKind::File, 0o6777, 1000, Change::Modify, root),
            0o6777
        );
        assert_eq!(
            mode_after(FileKind::Fifo, 0o6777, 1000, Change::Modify, u),
            0o6777
        );
    }

    #[test]
    fn the_caller_is_looked_up_only_when_a_bit_may_go() {
        let never = || -> Caller { panic!("looked up") };
        assert_eq!(
            mode_after(FileKind::File, 0o755, 0, Change::Chown, never),
            0o755
        );
        assert_eq!(
            mode_after(FileKind::Dir, 0o2755, 0, Change::Modify, never),
            0o2755
        );
    }

    #[test]
    fn caller_of_this_process() {
        let me = Caller::of(0, 0, std::process::id());
        assert_eq!(me.uid, 0);
        let gone = Caller::of(1000, 1000, 0);
        assert!(!gone.fsetid && gone.groups.is_empty());
    }
}
