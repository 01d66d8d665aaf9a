//! The daemon's side of `compfs defrag` on a mount: a `compfs.defrag` setxattr is a request
//! (see [`crate::defrag`] for the channel), checked for write permission and run here.

use compfs_store::{FileKind, Ino};
use fuser::{Errno, Request};

use super::CompFs;
use crate::defrag;

impl CompFs {
    /// A `compfs.defrag` request (see [`crate::defrag`]): permission, then the rewrite.
    pub(super) fn defrag_request(
        &self,
        req: &Request,
        ino: Ino,
        value: &[u8],
    ) -> Result<(), Errno> {
        let target = defrag::parse_request(value).map_err(|_| Errno::EINVAL)?;
        let attr = self.store.getattr(ino).map_err(|e| self.err(&e))?;
        let (caller, groups) = defrag::caller_of(req.pid());
        if !defrag::may_write(&attr, req.uid(), req.gid(), &groups) {
            return Err(Errno::EACCES);
        }
        if attr.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        let r = self
            .store
            .defrag(ino, &target, &mut |r| self.defrag.put(ino, caller, *r))
            .map_err(|e| self.err(&e))?;
        self.defrag.put(ino, caller, r);
        Ok(())
    }
}
