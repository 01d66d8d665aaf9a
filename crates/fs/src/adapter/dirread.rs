//! Directory reads that end: a handle's reads stop at the entries that existed when it was
//! opened or rewound, whatever renames do meanwhile (btrfs 9b378f6ad48c fixed the same
//! endless-readdir problem).

use compfs_store::{DirEntry, Error, Ino};
use fuser::FileHandle;

use super::convert::Finish;
use super::{CompFs, READDIR_BATCH};

impl CompFs {
    /// The cookie that reads of directory handle `fh` stop at: entries renamed or created
    /// after the handle was opened (or rewound) are not returned, so none comes twice and a
    /// read ends whatever renames do meanwhile.
    pub(super) fn dir_end(&self, dir: Ino, fh: FileHandle, offset: u64) -> Result<u64, Error> {
        let mut ends = match self.dir_ends.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if offset == 0 {
            let end = self.store.dir_end_cookie(dir)?;
            if let Some(e) = ends.get_mut(&fh.0) {
                *e = end;
            }
            return Ok(end);
        }
        Ok(ends.get(&fh.0).copied().unwrap_or(u64::MAX))
    }

    /// Feeds the entries of `dir` from cookie `offset` on to `add` until it says the reply
    /// buffer is full (returns true) or the directory ends (at cookie `end`).
    pub(super) fn fill_dir(
        &self,
        dir: Ino,
        mut offset: u64,
        end: u64,
        mut add: impl FnMut(&DirEntry) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        loop {
            let entries = self.store.readdir(dir, offset, READDIR_BATCH)?;
            if entries.is_empty() {
                return Ok(());
            }
            for e in &entries {
                if e.offset >= end {
                    return Ok(());
                }
                if add(e)? {
                    return Ok(());
                }
                offset = e.offset;
            }
        }
    }

    /// A readdir or readdirplus of handle `fh` of `dir` from `offset`: `add` puts each entry
    /// into `reply` (true when it is full), then the reply is sent and the access noted.
    pub(super) fn serve_dir<R: Finish>(
        &self,
        dir: Ino,
        fh: FileHandle,
        offset: u64,
        mut reply: R,
        mut add: impl FnMut(&mut R, &DirEntry) -> Result<bool, Error>,
    ) {
        let r = self
            .dir_end(dir, fh, offset)
            .and_then(|end| self.fill_dir(dir, offset, end, |e| add(&mut reply, e)));
        if r.is_ok() {
            self.accessed(dir);
        }
        self.finish(r, reply)
    }
}
