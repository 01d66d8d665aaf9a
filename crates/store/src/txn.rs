//! Metadata transactions and the read-only latch: the crash-safety core. Every change to the
//! metadata goes through [`Inner::write`] or [`Inner::write_batched`]; a durable commit syncs
//! every segment with unsynced bytes first, so durable metadata never references unsynced
//! data; any failed write, sync or commit latches the store read-only.
//!
//! **Batches.** Namespace operations do not commit a transaction each:
//! [`Inner::write_batched`] runs them in one open redb write transaction (the *held batch*),
//! committed non-durably once it holds [`BATCH_OPS`] changes or is [`BATCH_AGE`] old, and
//! always before any other transaction (a durable commit, GC, ...) and before any read that
//! does not look into it ([`Inner::read_txn`]). The lookups, attribute reads, directory
//! listings and xattr reads of the FUSE hot path read through the held batch instead
//! ([`Inner::with_meta`]), so every change is visible to them as soon as its call returns. The
//! batch keeps the tables its bodies opened open until it commits ([`OpenTxn`]). A
//! crash loses what the batch holds exactly as it loses non-durable commits (redb recovers to
//! the last durable commit either way). Flushes run in the batch and commit it at once
//! ([`Inner::write_joined`]): a file's buffered data is dropped after its flush, so that flush
//! must have committed (a batch lost to a storage error would otherwise leave the file without
//! its data until a reopen).

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use redb::{Durability, ReadTransaction, ReadableDatabase, ReadableTable, WriteTransaction};

use crate::attrs::write_patches;
use crate::error::{Error, Result};
use crate::meta::{self, dec, W};
use crate::records::{DirentRec, InodeRec};
use crate::store::{lock, Inner};
use crate::types::Ino;

/// Changes a held batch takes before it is committed (the default of `Tuning::batch_ops`).
pub(crate) const BATCH_OPS: u32 = 256;
/// Age of a held batch at which the next change commits it (an idle batch is committed by the
/// flusher's next tick, by any other transaction or by a read that does not look into it).
pub(crate) const BATCH_AGE: Duration = Duration::from_millis(20);

self_cell::self_cell!(
    /// A write transaction with the tables its bodies opened ([`W`]), kept open from one body
    /// of a held batch to the next: redb's `open_table` and the close that writes the table's
    /// root back cost more than the lookup or insert a namespace operation does with them.
    /// [`OpenTxn::into_owner`] closes the tables and gives back the transaction to commit.
    pub(crate) struct OpenTxn {
        owner: WriteTransaction,
        #[not_covariant]
        dependent: W,
    }
);

impl OpenTxn {
    fn begin(txn: WriteTransaction) -> Result<OpenTxn> {
        OpenTxn::try_new(txn, |t| W::open(t))
    }
}

/// A body run in the held batch (see [`Inner::run_in_batch`]): the batch lock, the
/// transaction with its batch's figures, and what the body did.
struct BatchRun<'a> {
    held: MutexGuard<'a, Option<Held>>,
    txn: OpenTxn,
    ops: u32,
    since: Instant,
    touched: bool,
    reserve_delta: i64,
}

/// What a durable commit leaves to be done once its caller released the batch lock: the
/// [`crate::object::DurableHook`]'s upload (see [`Inner::finish`]).
#[must_use = "the upload of a durable commit must run (Inner::finish)"]
pub(crate) struct AfterCommit(Option<crate::object::AfterLocks>);

/// The held batch: an open write transaction with changes not yet committed.
pub(crate) struct Held {
    txn: OpenTxn,
    ops: u32,
    since: Instant,
}

thread_local! {
    /// Set while this thread runs a transaction body (which holds the batch lock).
    static IN_BODY: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as inside a transaction body until dropped.
struct InBody;

impl InBody {
    fn enter() -> InBody {
        IN_BODY.with(|b| b.set(true));
        InBody
    }
}

impl Drop for InBody {
    fn drop(&mut self) {
        IN_BODY.with(|b| b.set(false));
    }
}

fn in_body() -> bool {
    IN_BODY.with(|b| b.get())
}

/// What a hot-path read sees: the held batch, or a read snapshot when there is none.
pub(crate) enum MetaTxn<'a, 't> {
    Read(ReadTransaction),
    /// The held batch's tables (opened once per batch, see [`OpenTxn`]).
    Held(&'a W<'t>),
}

/// Runs `$body` with `$t` bound to table `$def` opened in a read snapshot, or to the held
/// batch's table `$held` (a [`W`] accessor).
macro_rules! on_table {
    ($m:expr, $def:expr, $held:ident, |$t:ident| $body:expr) => {
        match $m {
            MetaTxn::Read(txn) => {
                let $t = txn.open_table($def)?;
                let r = $body;
                r
            }
            MetaTxn::Held(w) => {
                let $t = w.$held()?;
                let r = $body;
                r
            }
        }
    };
}

impl MetaTxn<'_, '_> {
    pub(crate) fn inode(&self, ino: Ino) -> Result<InodeRec> {
        on_table!(self, meta::INODES, inodes, |t| match t.get(ino)? {
            Some(v) => dec(InodeRec::decode(v.value())),
            None => Err(Error::NotFound),
        })
    }

    pub(crate) fn dirent(&self, dir: Ino, name: &[u8]) -> Result<Option<DirentRec>> {
        on_table!(
            self,
            meta::DIRENTS,
            dirents,
            |t| match t.get((dir, name))? {
                Some(v) => Ok(Some(dec(DirentRec::decode(v.value()))?)),
                None => Ok(None),
            }
        )
    }

    pub(crate) fn xattr(&self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        on_table!(self, meta::XATTRS, xattrs, |t| Ok(t
            .get((ino, name))?
            .map(|v| v.value().to_vec())))
    }

    pub(crate) fn xattr_names(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        on_table!(self, meta::XATTRS, xattrs, |t| {
            let mut v = Vec::new();
            for r in t.range((ino, &[][..])..(ino + 1, &[][..]))? {
                v.push(r?.0.value().1.to_vec());
            }
            Ok(v)
        })
    }

    pub(crate) fn is_orphan(&self, ino: Ino) -> Result<bool> {
        on_table!(self, meta::ORPHANS, orphans, |t| Ok(t.get(ino)?.is_some()))
    }

    /// Up to `max` entries of `dir` from sequence number `from`: (sequence, name, entry).
    pub(crate) fn dir_entries(
        &self,
        dir: Ino,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>, DirentRec)>> {
        on_table!(self, meta::DIRINDEX, dirindex, |idx| {
            let mut out = Vec::new();
            for r in idx.range((dir, from)..=(dir, u64::MAX))? {
                if out.len() >= max {
                    break;
                }
                let (k, name) = r?;
                out.push((k.value().1, name.value().to_vec()));
            }
            let mut full = Vec::with_capacity(out.len());
            for (seq, name) in out {
                let de = self.dirent(dir, &name)?.ok_or_else(|| {
                    meta::corrupt(format!("directory index of {dir} names a missing entry"))
                })?;
                full.push((seq, name, de));
            }
            Ok(full)
        })
    }
}

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

    /// Starts a write transaction.
    fn begin(&self) -> Result<WriteTransaction> {
        let mut txn = self.db.begin_write().map_err(|e| self.fail(e.into()))?;
        txn.set_durability(Durability::None)
            .map_err(|e| self.fail(e.into()))?;
        Ok(txn)
    }

    /// Commits the held batch, if any (the caller holds the batch lock). On a store already
    /// latched read-only the batch is dropped instead: nothing further is written.
    fn commit_held_locked(&self, held: &mut Option<Held>) -> Result<()> {
        let Some(h) = held.take() else {
            return Ok(());
        };
        if self.ro_flag.load(Ordering::SeqCst) {
            drop(h);
            return Ok(());
        }
        // Not durable: nothing left for after the lock.
        let AfterCommit(_) = self.commit(h.txn.into_owner(), false, false)?;
        Ok(())
    }

    /// Commits the held batch, if any.
    pub(crate) fn commit_held(&self) -> Result<()> {
        let mut held = lock(&self.held);
        self.commit_held_locked(&mut held)
    }

    /// A read snapshot of the committed metadata, after committing the held batch so that the
    /// snapshot holds every change made so far. Inside a transaction body (which holds the
    /// batch lock) it is a snapshot of what is committed.
    pub(crate) fn read_txn(&self) -> Result<ReadTransaction> {
        if !in_body() {
            self.commit_held()?;
        }
        Ok(self.db.begin_read()?)
    }

    /// Runs a hot-path read `f` on the held batch when there is one (under the batch lock),
    /// else on a read snapshot: either way it sees every change made so far.
    pub(crate) fn with_meta<T>(&self, f: impl FnOnce(&MetaTxn<'_, '_>) -> Result<T>) -> Result<T> {
        if !in_body() {
            let held = lock(&self.held);
            if let Some(h) = held.as_ref() {
                if !self.ro_flag.load(Ordering::SeqCst) {
                    return h.txn.with_dependent(|_, w| f(&MetaTxn::Held(w)));
                }
            }
        }
        let txn = self.db.begin_read()?;
        f(&MetaTxn::Read(txn))
    }

    /// Runs `body` in a write transaction of its own and commits it (durably when `durable`),
    /// after committing the held batch.
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
        let mut held = lock(&self.held);
        self.commit_held_locked(&mut held)?;
        self.bg.note_txn();
        let txn = self.begin()?;
        let (out, reserve_delta) = {
            let mut w = W::open(&txn).map_err(|e| self.fail_storage(e))?;
            let _b = InBody::enter();
            let out = body(&mut w).map_err(|e| self.fail_storage(e))?;
            (out, w.reserve_delta)
        };
        let after = self.commit(txn, durable, periodic)?;
        drop(held);
        // Preallocated bytes added or dropped: the reserve file follows (see `prealloc`).
        self.settle(reserve_delta);
        self.finish(after)?;
        Ok(out)
    }

    /// Runs `body` in the held batch (or a transaction of its own when there is none) and
    /// commits it (durably when `durable`): one commit for the batch and this change. For
    /// flushes, whose bodies only fail on storage errors: a file's buffer is dropped after its
    /// flush returns, so the flush must have committed. Errors as in [`Inner::write_batched`].
    pub(crate) fn write_joined<T>(
        &self,
        durable: bool,
        body: impl FnOnce(&mut W<'_>) -> Result<T>,
    ) -> Result<T> {
        let (b, res) = self.run_in_batch(body)?;
        match res {
            Ok(out) => {
                let after = self.commit(b.txn.into_owner(), durable, false)?;
                drop(b.held);
                self.settle(b.reserve_delta);
                self.finish(after)?;
                Ok(out)
            }
            Err(e) => Err(self.failed_in_batch(b, e)),
        }
    }

    /// The prelude of [`Inner::write_joined`] and [`Inner::write_batched`]: takes the held
    /// batch (dropped first when the store latched read-only meanwhile) or begins a
    /// transaction, and runs `body` in it. The caller commits, holds or fails the batch.
    fn run_in_batch<T>(
        &self,
        body: impl FnOnce(&mut W<'_>) -> Result<T>,
    ) -> Result<(BatchRun<'_>, Result<T>)> {
        self.note_change();
        let mut held = lock(&self.held);
        if self.ro_flag.load(Ordering::SeqCst) {
            // Latched meanwhile: drop the batch, nothing further is written.
            held.take();
        }
        self.bg.note_txn();
        let (mut txn, ops, since) = match held.take() {
            Some(h) => (h.txn, h.ops, h.since),
            None => {
                let txn = OpenTxn::begin(self.begin()?).map_err(|e| self.fail(e))?;
                (txn, 0, Instant::now())
            }
        };
        let (res, touched, reserve_delta) = txn.with_dependent_mut(|_, w| {
            w.start_body();
            let _b = InBody::enter();
            let res = body(w);
            (res, w.touched(), w.reserve_delta)
        });
        let b = BatchRun {
            held,
            txn,
            ops,
            since,
            touched,
            reserve_delta,
        };
        Ok((b, res))
    }

    /// A batched body failed with `e`: keeps the batch when nothing changed and the error
    /// only refuses the operation, else drops it and latches read-only.
    fn failed_in_batch(&self, b: BatchRun<'_>, e: Error) -> Error {
        let BatchRun {
            mut held,
            txn,
            ops,
            since,
            touched,
            ..
        } = b;
        if e.is_storage() {
            drop(txn);
            return self.fail(e);
        }
        if touched {
            drop(txn);
            return self.fail(Error::Io(std::io::Error::other(format!(
                "an operation failed ({e}) after changing a batched transaction"
            ))));
        }
        if ops > 0 {
            *held = Some(Held { txn, ops, since });
        }
        e
    }

    /// Runs `body` in the held batch (opening one if there is none); the batch is committed
    /// (non-durably) once it holds [`BATCH_OPS`] changes or is [`BATCH_AGE`] old.
    ///
    /// Bodies run here must check before they change anything: a body that fails with an
    /// error that only refuses the operation must leave the transaction unchanged, since the
    /// batch it is part of is committed anyway. One that fails after opening a table for
    /// changes cannot be told apart from one that changed it: the batch is dropped and the
    /// store latched read-only, so that a half-done operation is never committed. Storage
    /// errors latch read-only as in [`Inner::write`]; either way the batch's changes are lost,
    /// as a power cut would lose them.
    pub(crate) fn write_batched<T>(&self, body: impl FnOnce(&mut W<'_>) -> Result<T>) -> Result<T> {
        let (b, res) = self.run_in_batch(body)?;
        match res {
            Ok(out) => {
                let BatchRun {
                    mut held,
                    txn,
                    ops,
                    since,
                    reserve_delta,
                    ..
                } = b;
                let ops = ops + 1;
                if reserve_delta != 0
                    || ops >= self.tuning.batch_ops
                    || since.elapsed() >= BATCH_AGE
                {
                    let AfterCommit(_) = self.commit(txn.into_owner(), false, false)?;
                    drop(held);
                    self.settle(reserve_delta);
                } else {
                    *held = Some(Held { txn, ops, since });
                }
                Ok(out)
            }
            Err(e) => Err(self.failed_in_batch(b, e)),
        }
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
    ///
    /// A durable commit of a store with a [`crate::object::DurableHook`] returns the hook's
    /// upload, which the caller runs with [`Inner::finish`] once it released the batch lock.
    pub(crate) fn commit(
        &self,
        mut txn: WriteTransaction,
        durable: bool,
        periodic: bool,
    ) -> Result<AfterCommit> {
        if durable {
            txn.set_durability(Durability::Immediate)
                .map_err(|e| self.fail(e.into()))?;
        }
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
        let mut after = AfterCommit(None);
        if durable {
            if let Some(h) = &self.tuning.after_durable {
                // redb's write lock, held while the hook copies meta.redb: no commit changes
                // the file meanwhile, so the copy is the image of this durable commit. The
                // upload itself comes after the locks (`finish`).
                let hold = self.db.begin_write().map_err(|e| self.fail(e.into()))?;
                let held_at = Instant::now();
                // Every commit that changed something is in the file now (the lock is held).
                let changed = lock(&self.changed).take();
                let r = h.after_durable_commit(periodic, changed);
                hold.abort().map_err(|e| self.fail(e.into()))?;
                after = AfterCommit(r.map_err(|e| self.fail(Error::from_io(e)))?);
                if after.0.is_some() {
                    tracing::debug!(
                        "compfs: redb's write lock held {} us for the metadata snapshot's copy",
                        held_at.elapsed().as_micros()
                    );
                }
            }
            *lock(&self.last_durable) = Instant::now();
        }
        if !pending.is_empty() {
            lock(&self.patches).retire(&pending);
        }
        Ok(after)
    }

    /// Runs what durable commit left for after its locks (the metadata snapshot's upload); a
    /// failure latches read-only as a failed commit does.
    pub(crate) fn finish(&self, after: AfterCommit) -> Result<()> {
        let Some(upload) = after.0 else {
            return Ok(());
        };
        let start = Instant::now();
        upload().map_err(|e| self.fail(Error::from_io(e)))?;
        tracing::debug!(
            "compfs: metadata snapshot uploaded in {} us, after the commit's locks",
            start.elapsed().as_micros()
        );
        Ok(())
    }

    /// A durable (fsync'ing) commit: makes every earlier non-durable commit, and the held
    /// batch, durable. Every segment byte those commits reference was synced before they
    /// committed.
    pub(crate) fn commit_durable(&self) -> Result<()> {
        self.commit_durable_as(false)
    }

    /// The flusher's periodic durable commit (see [`Inner::write_as`]).
    pub(crate) fn commit_durable_periodic(&self) -> Result<()> {
        self.commit_durable_as(true)
    }

    fn commit_durable_as(&self, periodic: bool) -> Result<()> {
        let mut held = lock(&self.held);
        if self.ro_flag.load(Ordering::SeqCst) {
            held.take();
        }
        self.bg.note_txn();
        let txn = match held.take() {
            Some(h) => h.txn.into_owner(),
            None => self.begin()?,
        };
        let after = self.commit(txn, true, periodic)?;
        drop(held);
        self.finish(after)
    }
}

impl crate::store::Store {
    /// Changes in the held batch, not yet committed (tests and diagnostics).
    #[doc(hidden)]
    pub fn batched_changes(&self) -> u32 {
        lock(&self.inner.held).as_ref().map_or(0, |h| h.ops)
    }
}
