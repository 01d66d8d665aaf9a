//! Metadata transactions and the read-only latch: the crash-safety core. Every change to the
//! metadata goes through [`Inner::write`] (or [`Inner::begin`] + [`Inner::commit`]); a durable
//! commit syncs every segment with unsynced bytes first, so durable metadata never references
//! unsynced data; any failed write, sync or commit latches the store read-only.

use std::sync::atomic::Ordering;
use std::time::Instant;

use redb::Durability;

use crate::attrs::write_patches;
use crate::error::{Error, Result};
use crate::meta::W;
use crate::store::{lock, Inner};

impl Inner {
    /// Fails with [`Error::ReadOnly`] if the store takes no more changes.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.read_only_open {
            return Err(Error::ReadOnly("opened read-only".into()));
        }
        if self.ro_flag.load(Ordering::SeqCst) {
            let why = lock(&self.ro).clone().unwrap_or_default();
            return Err(Error::ReadOnly(why));
        }
        Ok(())
    }

    /// Notes that a commit is about to change the metadata (see [`Inner::changed`]).
    fn note_change(&self) {
        lock(&self.changed).get_or_insert_with(Instant::now);
    }

    /// Latches the store read-only after a failed write, sync or commit, and passes the error on.
    pub(crate) fn fail(&self, e: Error) -> Error {
        if !self.ro_flag.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "compfs store {}: {e}; refusing further writes until reopened",
                self.dir.display()
            );
            *lock(&self.ro) = Some(format!("an earlier write or sync failed: {e}"));
        }
        e
    }

    /// Starts a write transaction with non-durable commit semantics.
    fn begin(&self, durable: bool) -> Result<redb::WriteTransaction> {
        let mut txn = self.db.begin_write().map_err(|e| self.fail(e.into()))?;
        txn.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(|e| self.fail(e.into()))?;
        Ok(txn)
    }

    /// Runs `body` in a write transaction and commits it (durably when `durable`).
    ///
    /// A storage error inside the body (redb I/O, a full disk, damaged metadata) latches the
    /// store read-only exactly like a failed begin or commit, as btrfs aborts a transaction:
    /// redb may already have written some of the transaction's pages, and the device is failing.
    /// Errors that only refuse the operation (`NotFound`, `Exists`, ...) leave it writable.
    pub(crate) fn write<T>(
        &self,
        durable: bool,
        body: impl FnOnce(&mut W<'_>) -> Result<T>,
    ) -> Result<T> {
        self.note_change();
        self.write_as(durable, false, body)
    }

    /// [`Inner::write`]; `periodic`: a durable commit of the flusher rather than one asked for
    /// (fsync, sync, unmount, GC), which the [`crate::object::DurableHook`] is told.
    fn write_as<T>(
        &self,
        durable: bool,
        periodic: bool,
        body: impl FnOnce(&mut W<'_>) -> Result<T>,
    ) -> Result<T> {
        self.bg.note_txn();
        let txn = self.begin(durable)?;
        let (out, reserve_delta) = {
            let mut w = W::open(&txn).map_err(|e| self.fail_storage(e))?;
            let out = body(&mut w).map_err(|e| self.fail_storage(e))?;
            (out, w.reserve_delta)
        };
        self.commit(txn, durable, periodic)?;
        // Preallocated bytes added or dropped: the reserve file follows (see `prealloc`).
        self.settle(reserve_delta);
        Ok(out)
    }

    /// Latches read-only when `e` is a storage error (see [`Error::is_storage`]).
    fn fail_storage(&self, e: Error) -> Error {
        if e.is_storage() {
            self.fail(e)
        } else {
            e
        }
    }

    /// Commits; a failure latches read-only. A durable commit first syncs every segment with
    /// unsynced bytes: the transaction holds redb's write lock, so every earlier (non-durable)
    /// commit that this one makes durable appended its bytes before now, and they are synced
    /// before the metadata referencing them becomes durable.
    ///
    /// Every commit also writes the pending attribute patches (see `attrs`); they are retired
    /// once the commit succeeded.
    ///
    /// `periodic`: the flusher's durable commit (see [`Inner::write_as`]).
    pub(crate) fn commit(
        &self,
        txn: redb::WriteTransaction,
        durable: bool,
        periodic: bool,
    ) -> Result<()> {
        let pending = {
            let p = lock(&self.patches);
            if p.is_empty() {
                Vec::new()
            } else {
                p.snapshot()
            }
        };
        if !pending.is_empty() {
            self.note_change();
            write_patches(&txn, &pending).map_err(|e| self.fail(e))?;
        }
        if durable {
            self.sync_segments()?;
        }
        txn.commit().map_err(|e| self.fail(e.into()))?;
        if durable {
            if let Some(h) = &self.tuning.after_durable {
                // redb's write lock, held while the hook copies meta.redb: no commit changes
                // the file meanwhile, so the copy is the image of this durable commit.
                let hold = self.db.begin_write().map_err(|e| self.fail(e.into()))?;
                // Every commit that changed something is in the file now (the lock is held).
                let changed = lock(&self.changed).take();
                let r = h.after_durable_commit(periodic, changed);
                hold.abort().map_err(|e| self.fail(e.into()))?;
                r.map_err(|e| self.fail(Error::from_io(e)))?;
            }
            *lock(&self.last_durable) = Instant::now();
        }
        if !pending.is_empty() {
            lock(&self.patches).retire(&pending);
        }
        Ok(())
    }

    /// A durable (fsync'ing) commit: makes every earlier non-durable commit durable. Every
    /// segment byte those commits reference was synced before they committed.
    pub(crate) fn commit_durable(&self) -> Result<()> {
        self.write_as(true, false, |_| Ok(()))
    }

    /// The flusher's periodic durable commit (see [`Inner::write_as`]).
    pub(crate) fn commit_durable_periodic(&self) -> Result<()> {
        self.write_as(true, true, |_| Ok(()))
    }
}
