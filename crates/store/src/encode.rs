//! Compression of buffered blocks: the encoder run by the worker pool, its output buffers, and
//! the grouping of encode jobs.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use compfs_codec::{worth_it, ExtentOutcome, ExtentPolicy, RawReason};

use crate::dict::DictCtx;
use crate::error::{Error, Result};
use crate::file::Dirty;
use crate::meta::{self};
use crate::read::inode_in;
use crate::records::Inline;
use crate::span;
use crate::store::{lock, Inner};
use crate::types::*;

/// A compressed block and its uncompressed bytes.
pub(crate) type EncodedBlock = (Encoded, Arc<Vec<u8>>);

pub(crate) enum Out {
    Hole,
    Inline(Inline),
    /// `stored: None` = stored raw (the block itself). `crc`: crc32c of the stored bytes,
    /// computed by the compression worker.
    Extent {
        codec: u8,
        level: i8,
        stored: Option<Vec<u8>>,
        reason: Option<RawReason>,
        crc: u32,
        /// Dictionary the bytes were compressed with (0 = none).
        dict: u16,
    },
}

pub(crate) struct Encoded {
    pub(crate) block: u64,
    /// Offset of the data within the block (0 for whole blocks).
    pub(crate) off: usize,
    pub(crate) len: usize,
    /// A whole block (replaces the block's range) or a written range of a partial block.
    pub(crate) full: bool,
    pub(crate) out: Out,
}

pub(crate) type EncodeJob =
    Box<dyn FnOnce(&mut compfs_codec::ExtentEncoder) -> EncodedBlock + Send>;

/// Map entries within one block beyond which a partially written block is rewritten whole.
const MAX_BLOCK_PIECES: usize = 16;

thread_local! {
    static ENCODER: RefCell<compfs_codec::ExtentEncoder> = RefCell::new(compfs_codec::ExtentEncoder::new());
    /// Compression output buffer of this thread; a compressed extent leaves in it, and a
    /// pooled one (see `OUT_BUFS`) takes its place.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Output of the compression with the store's dictionary, swapped with `SCRATCH` when it
    /// is the shorter one.
    static DICT_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Compressed-extent buffers, passed from the compression workers to the committing thread and
/// back: a steady write reuses the same memory instead of allocating (and page-faulting) one
/// per extent in a worker and freeing it in another thread. Holds at most [`OUT_BUFS_BYTES`]
/// of capacity (shared by every store of the process); trimmed when idle.
static OUT_BUFS: Mutex<OutBufs> = Mutex::new(OutBufs {
    bufs: Vec::new(),
    bytes: 0,
});

/// Most capacity [`OUT_BUFS`] keeps: what the default dirty limit can have in flight.
const OUT_BUFS_BYTES: usize = 64 << 20;

struct OutBufs {
    pub(crate) bufs: Vec<Vec<u8>>,
    /// Sum of the capacities of `bufs`.
    pub(crate) bytes: usize,
}

fn take_out_buf() -> Vec<u8> {
    let mut p = lock(&OUT_BUFS);
    match p.bufs.pop() {
        Some(v) => {
            p.bytes -= v.capacity();
            v
        }
        None => Vec::new(),
    }
}

pub(crate) fn give_out_buf(mut v: Vec<u8>) {
    v.clear();
    let mut p = lock(&OUT_BUFS);
    if p.bytes + v.capacity() <= OUT_BUFS_BYTES {
        p.bytes += v.capacity();
        p.bufs.push(v);
    }
}

/// Frees pooled output buffers beyond `keep` (the background flusher calls it when idle).
pub(crate) fn trim_out_bufs(keep: usize) {
    let mut p = lock(&OUT_BUFS);
    while p.bufs.len() > keep {
        if let Some(v) = p.bufs.pop() {
            p.bytes -= v.capacity();
        }
    }
}

/// The whole blocks among `results`, kept until their commit succeeded.
pub(crate) fn whole_blocks(results: &[EncodedBlock]) -> Vec<(u64, Arc<Vec<u8>>)> {
    results
        .iter()
        .filter(|(en, _)| en.full)
        .map(|(en, a)| (en.block, a.clone()))
        .collect()
}

/// Encodes one block (or written range of a block: `dx` then offers no sample) as inline data
/// or an extent, with the store's dictionary `dx` when that is shorter (see `dict`).
pub(crate) fn encode_block(
    enc: &mut compfs_codec::ExtentEncoder,
    policy: &ExtentPolicy,
    block: u64,
    src: &[u8],
    inline: bool,
    dx: &DictCtx,
) -> Encoded {
    let len = src.len();
    if src.iter().all(|&b| b == 0) {
        return Encoded {
            block,
            off: 0,
            full: true,
            len,
            out: Out::Hole,
        };
    }
    if block == 0 {
        dx.offer(policy.spec, src);
    }
    let dict = dx.for_len(policy.spec, len, inline);
    if inline {
        if !policy.spec.is_none() {
            let mut dst = Vec::new();
            let mut best: Option<Inline> = None;
            if let Ok(n) = enc.compressor.compress(policy.spec, src, &mut dst) {
                if n < len {
                    dst.truncate(n);
                    best = Some(Inline::new(
                        policy.spec.algorithm().id(),
                        policy.spec.level() as i8,
                        len as u32,
                        std::mem::take(&mut dst),
                    ));
                }
            }
            if let Some(d) = dict {
                if let Ok(n) = enc.compressor.compress_dict(&d.dict, src, &mut dst) {
                    if n < best.as_ref().map_or(len, |b| b.bytes.len()) {
                        dst.truncate(n);
                        best = Some(
                            Inline::new(
                                policy.spec.algorithm().id(),
                                d.dict.level() as i8,
                                len as u32,
                                dst,
                            )
                            .with_dict(d.id),
                        );
                    }
                }
            }
            if let Some(i) = best {
                return Encoded {
                    block,
                    off: 0,
                    full: true,
                    len,
                    out: Out::Inline(i),
                };
            }
        }
        return Encoded {
            block,
            off: 0,
            full: true,
            len,
            out: Out::Inline(Inline::new(0, 0, len as u32, src.to_vec())),
        };
    }
    let mut used_dict: Option<(u16, i8)> = None;
    // A pack is compressed with the dictionary alone: it came out shorter than without on
    // 809 of 810 packs of /usr/include and 316 of 335 of /usr/share/doc, and trying both cost
    // twice the CPU for 21 and 76 bytes in all (docs/benchmarks.md, issue 16).
    let alone = dict.filter(|_| dx.pack);
    let (outcome, dst) = SCRATCH.with(|scratch| {
        let mut dst = scratch.borrow_mut();
        let encoded = match alone {
            Some(d) => enc.encode_dict(policy, src, &mut dst, &d.dict),
            None => enc.encode(policy, src, &mut dst),
        };
        let mut outcome = match encoded {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("compfs: compressor failed ({e}); storing extent raw");
                ExtentOutcome::Raw(RawReason::NotWorthIt)
            }
        };
        if let (Some(d), ExtentOutcome::Compressed { .. }) = (alone, outcome) {
            used_dict = Some((d.id, d.dict.level() as i8));
        }
        // The dictionary is tried where plain compression was (or would have been, if the
        // extent had been long enough to pass the rule): not when the codec is `none` or the
        // heuristic predicted incompressible data.
        let tried = alone.is_none()
            && matches!(
                outcome,
                ExtentOutcome::Compressed { .. } | ExtentOutcome::Raw(RawReason::NotWorthIt)
            );
        if let (Some(d), true) = (dict, tried) {
            DICT_SCRATCH.with(|ds| {
                let mut ds = ds.borrow_mut();
                if let Ok(n) = enc.compressor.compress_dict(&d.dict, src, &mut ds) {
                    let plain = match outcome {
                        ExtentOutcome::Compressed { len } => len,
                        ExtentOutcome::Raw(_) => len,
                    };
                    if n < plain && worth_it(len, n, policy.min_saving) {
                        ds.truncate(n);
                        std::mem::swap(&mut *dst, &mut *ds);
                        outcome = ExtentOutcome::Compressed { len: n };
                        used_dict = Some((d.id, d.dict.level() as i8));
                    }
                }
            });
        }
        let out = match outcome {
            // Hand the scratch buffer itself over (the committing thread returns it to the
            // pool once written) and continue with a pooled one: no copy, no allocation.
            ExtentOutcome::Compressed { len: n } => {
                let mut v = std::mem::replace(&mut *dst, take_out_buf());
                v.truncate(n);
                v
            }
            ExtentOutcome::Raw(_) => Vec::new(),
        };
        (outcome, out)
    });
    let out = match outcome {
        ExtentOutcome::Compressed { .. } => Out::Extent {
            codec: policy.spec.algorithm().id(),
            level: used_dict.map_or(policy.spec.level() as i8, |(_, l)| l),
            crc: crc32c::crc32c(&dst),
            stored: Some(dst),
            reason: None,
            dict: used_dict.map_or(0, |(id, _)| id),
        },
        ExtentOutcome::Raw(r) => Out::Extent {
            codec: 0,
            level: 0,
            stored: None,
            reason: Some(r),
            crc: crc32c::crc32c(src),
            dict: 0,
        },
    };
    Encoded {
        block,
        off: 0,
        full: true,
        len,
        out,
    }
}

impl Inner {
    /// Queues jobs on the pool in a few groups (about two per worker), so that a batch costs a
    /// few thread wake-ups instead of one per extent. Returns the channel and group count.
    pub(crate) fn submit_grouped(
        &self,
        jobs: Vec<EncodeJob>,
    ) -> (std::sync::mpsc::Receiver<(usize, Vec<EncodedBlock>)>, usize) {
        self.submit_grouped_on(&self.pool, jobs)
    }

    /// [`Inner::submit_grouped`] on another pool (background recompression's idle workers).
    pub(crate) fn submit_grouped_on(
        &self,
        pool: &crate::pool::Pool,
        jobs: Vec<EncodeJob>,
    ) -> (std::sync::mpsc::Receiver<(usize, Vec<EncodedBlock>)>, usize) {
        let groups = (pool.threads * 2).clamp(1, jobs.len().max(1));
        let per = jobs.len().div_ceil(groups).max(1);
        let mut grouped: Vec<Vec<EncodeJob>> = Vec::new();
        let mut it = jobs.into_iter().peekable();
        while it.peek().is_some() {
            grouped.push(it.by_ref().take(per).collect());
        }
        let n = grouped.len();
        let rx = pool.submit(
            grouped
                .into_iter()
                .map(|g| {
                    move |enc: &mut compfs_codec::ExtentEncoder| {
                        g.into_iter().map(|j| j(enc)).collect::<Vec<EncodedBlock>>()
                    }
                })
                .collect(),
        );
        (rx, n)
    }

    /// Compresses the buffered blocks and written ranges of partial blocks of `d` under
    /// `policy`, taking the blocks out of the buffer (callers put them back from the results
    /// if the commit fails): one job on this thread, more on the worker pool.
    pub(crate) fn encode_dirty(
        &self,
        ino: Ino,
        d: &mut Dirty,
        policy: ExtentPolicy,
    ) -> Result<Vec<EncodedBlock>> {
        let e = d.block;
        let inline_ok = d.size <= self.inline_limit(e);
        // Partial blocks whose map is already fragmented, or that hold inline data, are
        // rewritten whole; this bounds the extents one block can pin.
        let parts: Vec<u64> = d.partial.keys().copied().collect();
        if !parts.is_empty() {
            let mut promote = Vec::new();
            {
                let txn = self.read_txn()?;
                let rec = inode_in(&txn, ino)?;
                let map = txn.open_table(meta::EXTMAP)?;
                for &b in &parts {
                    let n = map.range((ino, b * e)..(ino, b * e + e))?.count();
                    if n >= MAX_BLOCK_PIECES || (b == 0 && rec.inline.is_some()) {
                        promote.push(b);
                    }
                }
            }
            for b in promote {
                self.load_block(ino, d, b, false, false)?;
            }
        }
        let live = d.live_blocks(e);
        let dx = self.dict_ctx(&policy);
        let mut jobs: Vec<EncodeJob> = Vec::with_capacity(live.len());
        for b in live {
            let Some(src) = d.blocks.remove(&b) else {
                continue;
            };
            let src = Arc::new(src);
            let len = span::block_len_in_file(d.size, b, e);
            let inline = inline_ok && b == 0;
            let dx = dx.clone();
            jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                (encode_block(enc, &policy, b, &src[..len], inline, &dx), src)
            }));
        }
        for (&b, p) in &d.partial {
            let blen = span::block_len_in_file(d.size, b, e);
            for &(rs, re) in &p.ranges {
                let re = re.min(blen);
                if rs >= re {
                    continue;
                }
                let src = p.data.clone();
                let dx = dx.no_sample();
                jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                    let mut en = encode_block(enc, &policy, b, &src[rs..re], false, &dx);
                    en.off = rs;
                    en.full = false;
                    (en, src)
                }));
            }
        }
        let results: Vec<EncodedBlock> = if jobs.len() == 1 {
            // One block: compress on this thread, no hand-off.
            jobs.into_iter()
                .map(|j| ENCODER.with(|enc| j(&mut enc.borrow_mut())))
                .collect()
        } else {
            let (rx, n) = self.submit_grouped(jobs);
            let mut v = Vec::new();
            for _ in 0..n {
                match rx.recv() {
                    Ok((_, r)) => v.extend(r),
                    Err(_) => {
                        return Err(Error::Io(std::io::Error::other("compression worker lost")))
                    }
                }
            }
            v
        };
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The output-buffer pool keeps at most its byte budget, whatever the buffers' sizes, and
    /// a trim frees down to the count asked.
    #[test]
    fn output_buffer_pool_is_bounded_in_bytes() {
        for _ in 0..100 {
            give_out_buf(Vec::with_capacity(1 << 20));
        }
        {
            let p = lock(&OUT_BUFS);
            assert!(p.bytes <= OUT_BUFS_BYTES, "{} bytes pooled", p.bytes);
            let sum: usize = p.bufs.iter().map(|v| v.capacity()).sum();
            assert_eq!(sum, p.bytes);
        }
        let v = take_out_buf();
        assert!(v.capacity() >= 1 << 20 && v.is_empty());
        give_out_buf(v);
        trim_out_bufs(3);
        let p = lock(&OUT_BUFS);
        assert!(p.bufs.len() <= 3);
        assert_eq!(p.bufs.iter().map(|v| v.capacity()).sum::<usize>(), p.bytes);
    }
}
