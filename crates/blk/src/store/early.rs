//! Whole-page writes acknowledged before they are compressed.
//!
//! At one request in flight (fio iodepth 1, a VM's synchronous writes) the client waits for
//! every reply, and a compressing server spends most of a write's time compressing: about
//! 9 µs of a 4 KiB page's 18 µs with lz4 here, a cost `nbdkit memory` never pays.
//! [`PageStore::write_early`] sends the reply first and compresses while the reply travels
//! and the client prepares its next request, so the two overlap.
//!
//! Nothing acknowledged may be lost, so the reply goes out only once storing the page can no
//! longer fail:
//! - a spare raw slot (one page in the pool, taken from the store's reserve or allocated now)
//!   is held before the reply; if compressing or allocating the compressed copy then fails,
//!   the page is stored raw in that slot, which cannot fail, and the spare is not returned;
//! - the page's shard lock is held from before the reply until the page is stored, so any
//!   request ordered after the reply (on this connection or another) sees the new data;
//! - with a memory limit (`mem_limit`) the early path is not taken: the spare would count
//!   against the limit and could turn a write that fits into an ENOSPC.
//!
//! The reserve holds at most one spare per thread that is acknowledging at that moment (in
//! practice one or two pages: they are counted in `mem_used_total`, as the pool's memory).

use super::stats::add;
use super::table::{Entry, RAW};
use super::{lock, with_ctx, PageStore};
use crate::error::BlkError;
use crate::pool::{ObjRef, PAGE};

impl PageStore {
    /// Stores one whole page at `offset` and calls `ack` (which sends the success reply) as
    /// soon as the write can no longer fail, before the page is compressed. Returns `Ok(false)`
    /// without calling `ack` when the early path does not apply (not one aligned page, a
    /// memory limit, an offset out of range, or no spare slot to be had): the caller then
    /// writes with [`PageStore::write`] and replies as usual. An error from `ack` is returned
    /// after the page has been stored.
    pub fn write_early(
        &self,
        offset: u64,
        data: &[u8],
        ack: impl FnOnce() -> Result<(), BlkError>,
    ) -> Result<bool, BlkError> {
        if data.len() != PAGE
            || offset % PAGE as u64 != 0
            || self.pool.limit() != 0
            || self.check_range(offset, PAGE as u64).is_err()
        {
            return Ok(false);
        }
        let Some(spare) = self.take_spare(data) else {
            return Ok(false);
        };
        let page = offset / PAGE as u64;
        let (shard, idx) = self.shard(page);
        let mut t = lock(shard);
        let acked = ack();
        let (new, spare_used) = match with_ctx(|ctx| self.encode(ctx, data, 0)) {
            Ok(new) => (new, false),
            Err(e) => {
                tracing::warn!(
                    "page {page}: compressing an acknowledged write failed ({e}); stored raw"
                );
                (self.install_spare(spare, data), true)
            }
        };
        let old = t[idx];
        t[idx] = new;
        t.touch(idx, self.now());
        self.free_entry(old);
        drop(t);
        if !spare_used {
            lock(&self.spares).push(spare);
        }
        acked.map(|()| true)
    }

    /// A raw slot from the reserve, or a new one holding `data` (its content does not matter
    /// until [`Self::install_spare`] fills it). `None` if the pool cannot grow.
    fn take_spare(&self, data: &[u8]) -> Option<ObjRef> {
        if let Some(s) = lock(&self.spares).pop() {
            return Some(s);
        }
        self.pool.alloc(data).ok()
    }

    /// Makes a spare slot the raw entry of `data`, counted as any raw page is.
    pub(super) fn install_spare(&self, spare: ObjRef, data: &[u8]) -> Entry {
        // The slot exists and holds a page: filling it cannot fail.
        let filled = self.pool.fill(spare, data);
        debug_assert!(filled);
        add(&self.c.pages_stored, 1);
        add(&self.c.compr_data_size, PAGE as u64);
        add(&self.c.huge_pages, 1);
        add(&self.c.huge_pages_since, 1);
        Entry::Obj {
            obj: spare,
            len: PAGE as u16,
            codec: RAW,
            flags: 0,
        }
    }

    /// Frees the reserve's spare slots (they hold no data).
    pub(super) fn drop_spares(&self) {
        for s in lock(&self.spares).drain(..) {
            self.pool.free(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Config;
    use compfs_codec::CodecSpec;

    fn store(mem_limit: u64) -> PageStore {
        PageStore::new(Config {
            size: 64 * PAGE as u64,
            algo: CodecSpec::parse("lz4").unwrap().spec,
            recomp: Vec::new(),
            mem_limit,
        })
        .unwrap()
    }

    fn text_page(seed: u8) -> Vec<u8> {
        (0..PAGE)
            .map(|i| b"compfs early ack "[(i + seed as usize) % 17])
            .collect()
    }

    #[test]
    fn an_early_write_is_acknowledged_once_and_reads_back() {
        let s = store(0);
        let data = text_page(3);
        let mut acks = 0;
        assert!(s
            .write_early(5 * PAGE as u64, &data, || {
                acks += 1;
                Ok(())
            })
            .unwrap());
        assert_eq!(acks, 1);
        let mut back = vec![0u8; PAGE];
        s.read(5 * PAGE as u64, &mut back).unwrap();
        assert_eq!(back, data);
        // Overwrite: the old entry is freed, the spare goes back to the reserve.
        let data2 = text_page(9);
        assert!(s.write_early(5 * PAGE as u64, &data2, || Ok(())).unwrap());
        s.read(5 * PAGE as u64, &mut back).unwrap();
        assert_eq!(back, data2);
        let st = s.stats();
        assert_eq!(st.orig_data_size, PAGE as u64);
        assert_eq!(lock(&s.spares).len(), 1);
    }

    #[test]
    fn the_early_path_declines_what_it_cannot_guarantee() {
        let s = store(0);
        let page = text_page(1);
        let never = || -> Result<(), BlkError> { panic!("acknowledged") };
        assert!(!s.write_early(1, &page, never).unwrap(), "unaligned");
        assert!(
            !s.write_early(0, &page[..512], never).unwrap(),
            "partial page"
        );
        assert!(
            !s.write_early(64 * PAGE as u64, &page, never).unwrap(),
            "past the end"
        );
        let limited = store(1 << 20);
        assert!(
            !limited.write_early(0, &page, never).unwrap(),
            "memory limit"
        );
    }

    #[test]
    fn a_failed_reply_still_stores_the_page() {
        let s = store(0);
        let data = text_page(4);
        let r = s.write_early(0, &data, || Err(BlkError::Protocol("reply failed".into())));
        assert!(r.is_err());
        let mut back = vec![0u8; PAGE];
        s.read(0, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_spare_installed_raw_reads_back_and_is_counted() {
        let s = store(0);
        let data = text_page(7);
        let spare = s.take_spare(&[0u8; PAGE]).unwrap();
        let e = s.install_spare(spare, &data);
        {
            let (shard, idx) = s.shard(2);
            lock(shard)[idx] = e;
        }
        let mut back = vec![0u8; PAGE];
        s.read(2 * PAGE as u64, &mut back).unwrap();
        assert_eq!(back, data);
        let st = s.stats();
        assert_eq!((st.orig_data_size, st.huge_pages), (PAGE as u64, 1));
        assert_eq!(st.compr_data_size, PAGE as u64);
    }
}
