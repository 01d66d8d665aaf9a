//! What the kernel leaves to a FUSE daemon under FUSE_HANDLE_KILLPRIV_V2: clearing S_ISUID,
//! S_ISGID and file capabilities when a file is changed (rules in [`crate::privilege`]).

use std::cell::OnceCell;

use compfs_store::{Attr, Error, FileKind, Ino, SetAttr};
use fuser::Request;

use super::CompFs;
use crate::privilege::{self, Caller, Change};

const CAPABILITY_XATTR: &[u8] = b"security.capability";

impl CompFs {
    /// The permission bits `attr` keeps after `changes` by the caller of `req`
    /// ([`privilege::mode_after`]: the kernel leaves this to us under FUSE_HANDLE_KILLPRIV_V2).
    /// `unprivileged`: the kernel already said that the caller lacks CAP_FSETID.
    pub(super) fn killed_perm(
        &self,
        req: &Request,
        attr: &Attr,
        changes: &[Change],
        unprivileged: bool,
    ) -> u16 {
        let caller = OnceCell::new();
        let who = || caller.get_or_init(|| caller_of(req, unprivileged)).clone();
        changes.iter().fold(attr.perm, |perm, &ch| {
            privilege::mode_after(attr.kind, perm, attr.gid, ch, who)
        })
    }

    /// Clears S_ISUID/S_ISGID as `change` by `req`'s caller requires (write and fallocate;
    /// setattr folds the new mode into its own store call).
    pub(super) fn kill_privs(
        &self,
        req: &Request,
        ino: Ino,
        change: Change,
        unprivileged: bool,
    ) -> Result<(), Error> {
        let attr = self.store.getattr(ino)?;
        let perm = self.killed_perm(req, &attr, &[change], unprivileged);
        if perm != attr.perm {
            let set = SetAttr {
                mode: Some(u32::from(perm)),
                ..SetAttr::default()
            };
            self.store.setattr(ino, &set)?;
        }
        self.drop_capability(req, &attr, change, unprivileged)
    }

    /// File capabilities go with the setuid bit: on chown of a non-directory, and on a change
    /// of a regular file by a caller without CAP_FSETID (the kernel's ATTR_KILL_PRIV).
    pub(super) fn drop_capability(
        &self,
        req: &Request,
        attr: &Attr,
        change: Change,
        unprivileged: bool,
    ) -> Result<(), Error> {
        let applies = match change {
            Change::Chown => attr.kind != FileKind::Dir,
            Change::Modify => attr.kind == FileKind::File,
        };
        if !applies || self.store.getxattr(attr.ino, CAPABILITY_XATTR).is_err() {
            return Ok(());
        }
        if change == Change::Modify && caller_of(req, unprivileged).fsetid {
            return Ok(());
        }
        match self.store.removexattr(attr.ino, CAPABILITY_XATTR) {
            Ok(()) | Err(Error::NoXattr) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The credentials of a request's caller for the privilege-bit rules.
fn caller_of(req: &Request, unprivileged: bool) -> Caller {
    let mut c = Caller::of(req.uid(), req.gid(), req.pid());
    if unprivileged {
        c.fsetid = false;
    }
    c
}
