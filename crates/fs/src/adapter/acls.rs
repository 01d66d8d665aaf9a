//! POSIX ACLs under `FUSE_POSIX_ACL` (rules in [`crate::acl`]): the kernel enforces the ACLs it
//! reads with GETXATTR, and leaves the rest to the daemon, as a kernel filesystem's own code
//! (ext4_set_acl, ext4_init_acl, posix_acl_chmod) does it:
//! - a new inode's mode and ACLs come from its directory's default ACL, or from the umask when
//!   there is none (the kernel sends the mode unmasked under `FUSE_DONT_MASK`);
//! - chmod updates the access ACL (mask, or group entry without a mask);
//! - setting an access ACL updates the mode (and drops S_ISGID for a caller outside the group
//!   without CAP_FSETID); an ACL the mode says all of is not stored;
//! - with `noacl` the ACL xattrs are refused with EOPNOTSUPP (ext4 -o noacl).
//!
//! The inode and its ACLs are written by separate store commits: after a crash between them a
//! new inode has its final mode but not its ACL, which never grants more than the ACL did.

use compfs_store::{Attr, Error, FileKind, Ino, SetAttr, XattrSet};
use fuser::{Errno, Request};

use super::CompFs;
use crate::acl::{self, Acl, Created, ACCESS_XATTR, DEFAULT_XATTR};
use crate::privilege::Caller;

impl CompFs {
    /// The stored ACL `name` of `ino`, if any. A stored value that does not parse is EIO.
    fn stored_acl(&self, ino: Ino, name: &[u8]) -> Result<Option<Acl>, Errno> {
        match self.store.getxattr(ino, name) {
            Ok(v) => Acl::parse(&v).map(Some).map_err(|e| {
                tracing::error!(
                    "inode {ino}: stored {} is malformed: {e}; returning EIO",
                    String::from_utf8_lossy(name)
                );
                Errno::EIO
            }),
            Err(Error::NoXattr) => Ok(None),
            Err(e) => Err(self.err(&e)),
        }
    }

    /// Owner, group and ACLs of a new inode that `req` creates under `parent` with `mode` and
    /// `umask`: the setgid-directory group rule ([`CompFs::owner_for`]), then the parent's
    /// default ACL or the umask ([`CompFs::new_inode_acls`]).
    pub(super) fn new_inode(
        &self,
        req: &Request,
        parent: Ino,
        mode: u32,
        umask: u32,
        is_dir: bool,
    ) -> Result<(u32, u32, acl::Created), Errno> {
        let (uid, gid, perm) = self.owner_for(req, parent, (mode & 0o7777) as u16, is_dir);
        let acls = self.new_inode_acls(parent, perm, umask, is_dir)?;
        Ok((uid, gid, acls))
    }

    /// Permission bits and ACLs of a new inode in `parent` asked for with `perm` and `umask`
    /// (`posix_acl_create`). Without ACLs, the umask alone (the kernel has applied it already
    /// then; applying it again changes nothing).
    pub(super) fn new_inode_acls(
        &self,
        parent: Ino,
        perm: u16,
        umask: u32,
        is_dir: bool,
    ) -> Result<Created, Errno> {
        let umask = (umask & 0o777) as u16;
        let default = if self.acl {
            self.stored_acl(parent, DEFAULT_XATTR)?
        } else {
            None
        };
        Ok(acl::create(default.as_ref(), perm, umask, is_dir))
    }

    /// Stores the ACLs of the new inode `attr` (entry `name` of `parent`); if that fails the
    /// entry is removed again and the error returned.
    pub(super) fn store_new_acls(
        &self,
        parent: Ino,
        name: &[u8],
        attr: Attr,
        c: &Created,
    ) -> Result<Attr, Errno> {
        if c.access.is_none() && c.default.is_none() {
            return Ok(attr);
        }
        let r = [(ACCESS_XATTR, &c.access), (DEFAULT_XATTR, &c.default)]
            .into_iter()
            .filter_map(|(n, a)| a.as_ref().map(|a| (n, a)))
            .try_for_each(|(n, a)| {
                self.store
                    .setxattr(attr.ino, n, &a.to_bytes(), XattrSet::Any)
            })
            .and_then(|()| self.store.getattr(attr.ino));
        match r {
            Ok(a) => Ok(a),
            Err(e) => {
                let undo = if attr.kind == FileKind::Dir {
                    self.store.rmdir(parent, name)
                } else {
                    self.store.unlink(parent, name)
                };
                if let Err(u) = undo {
                    tracing::error!(
                        "inode {}: ACLs not stored ({e}), not removed: {u}",
                        attr.ino
                    );
                }
                Err(self.err(&e))
            }
        }
    }

    /// After a chmod of `ino` to `perm`: the access ACL follows (`posix_acl_chmod`).
    pub(super) fn chmod_acl(&self, ino: Ino, kind: FileKind, perm: u16) -> Result<(), Errno> {
        if !self.acl || kind == FileKind::Symlink {
            return Ok(());
        }
        let Some(mut a) = self.stored_acl(ino, ACCESS_XATTR)? else {
            return Ok(());
        };
        a.chmod(perm);
        self.store
            .setxattr(ino, ACCESS_XATTR, &a.to_bytes(), XattrSet::Any)
            .map_err(|e| self.err(&e))
    }

    /// setxattr of an ACL xattr (`name` is one): validated, and an access ACL sets the mode.
    pub(super) fn set_acl(
        &self,
        req: &Request,
        ino: Ino,
        name: &[u8],
        value: &[u8],
    ) -> Result<(), Errno> {
        if !self.acl {
            return Err(Errno::EOPNOTSUPP);
        }
        let attr = self.store.getattr(ino).map_err(|e| self.err(&e))?;
        if attr.kind == FileKind::Symlink {
            return Err(Errno::EOPNOTSUPP);
        }
        // The kernel checks this before it calls us (set_posix_acl); checked again here so
        // that the rule does not depend on it. Root stands in for CAP_FOWNER.
        if req.uid() != attr.uid && req.uid() != 0 {
            return Err(Errno::EPERM);
        }
        let parsed = Acl::parse(value).map_err(|e| Errno::from_i32(e.errno()))?;
        let stored = if name == DEFAULT_XATTR {
            if attr.kind != FileKind::Dir {
                return Err(Errno::EACCES);
            }
            self.store
                .setxattr(ino, name, &parsed.to_bytes(), XattrSet::Any)
        } else {
            let caller = Caller::of(req.uid(), req.gid(), req.pid());
            let keep_sgid = caller.fsetid || caller.in_group(attr.gid);
            let (perm, keep) = acl::update_mode(parsed, attr.perm, keep_sgid);
            let r = match keep {
                Some(a) => self
                    .store
                    .setxattr(ino, ACCESS_XATTR, &a.to_bytes(), XattrSet::Any),
                None => match self.store.removexattr(ino, ACCESS_XATTR) {
                    Ok(()) | Err(Error::NoXattr) => Ok(()),
                    Err(e) => Err(e),
                },
            };
            // The mode, and ctime even when the mode stays (ext4_set_acl).
            r.and_then(|()| {
                let set = SetAttr {
                    mode: Some(u32::from(perm)),
                    ..SetAttr::default()
                };
                self.store.setattr(ino, &set).map(|_| ())
            })
        };
        stored.map_err(|e| self.err(&e))
    }

    /// removexattr of an ACL xattr: as ext4, removing an absent ACL succeeds, and the mode
    /// stays (an access ACL's mode bits are the mode already).
    pub(super) fn remove_acl(&self, ino: Ino, name: &[u8]) -> Result<(), Errno> {
        if !self.acl {
            return Err(Errno::EOPNOTSUPP);
        }
        match self.store.removexattr(ino, name) {
            Ok(()) | Err(Error::NoXattr) => Ok(()),
            Err(e) => Err(self.err(&e)),
        }
    }
}
