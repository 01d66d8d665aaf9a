//! One segment file of a store in a bucket ([`SegFile`]): reads through the block cache with
//! ranged GETs and readahead, appends kept in memory until `sync_data` uploads them.

use super::*;

pub(super) struct ObjectSegFile {
    pub(super) shared: Arc<Shared>,
    pub(super) id: u64,
}

impl ObjectSegFile {
    /// Bytes `off..off + buf.len()` of chunk `start` (of `clen` bytes), through the cache.
    /// The blocks missing are fetched by parallel ranged GETs (those another thread is
    /// fetching already are waited for); a miss right after the previous block along the
    /// segment starts a readahead of the next blocks in the background.
    fn read_chunk(&self, start: u64, clen: u64, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let key = chunk_key(self.id, start, clen);
        let Some(cache) = &self.shared.cache else {
            let b = self
                .shared
                .remote
                .get_range(&key, off..off + buf.len() as u64)?;
            buf.copy_from_slice(&b);
            return Ok(());
        };
        // Cached blocks first; the others: (block, offset in it, buffer position, length).
        let mut missing = Vec::new();
        let mut at = 0usize;
        for (b, o, n) in block_spans(off, buf.len() as u64, BLOCK) {
            let n = n as usize;
            if !cache.read((self.id, start, b), o, &mut buf[at..at + n]) {
                missing.push((b, o, at, n));
            }
            at += n;
        }
        let Some(&(first, ..)) = missing.first() else {
            return Ok(());
        };
        self.maybe_readahead(cache, start, first, missing.last().map_or(first, |m| m.0));
        let inflight = &self.shared.inflight;
        let mut claims = Vec::new();
        let mut waits = Vec::new();
        for m in missing {
            match inflight.claim((self.id, start, m.0)) {
                // Unless a readahead brought it in since the cache was looked at.
                Some(c) if !cache.contains(c.key) => claims.push((c, m)),
                _ => waits.push(m),
            }
        }
        if !claims.is_empty() {
            let reqs: Vec<(String, std::ops::Range<u64>)> = claims
                .iter()
                .map(|(_, (b, ..))| (key.clone(), b * BLOCK..((b + 1) * BLOCK).min(clen)))
                .collect();
            let got = self.shared.remote.get_ranges(&reqs);
            for ((c, (_, o, at, n)), data) in claims.into_iter().zip(got) {
                let data = data?;
                let o = o as usize;
                buf[at..at + n].copy_from_slice(&data[o..o + n]);
                cache.put(c.key, data);
            }
        }
        for (b, o, at, n) in waits {
            let k = (self.id, start, b);
            inflight.wait(k);
            let dst = &mut buf[at..at + n];
            // Fetched meanwhile, unless that fetch failed or the block was evicted already.
            if !cache.read(k, o, dst) {
                let lo = b * BLOCK;
                let data = self
                    .shared
                    .remote
                    .get_range(&key, lo..(lo + BLOCK).min(clen))?;
                dst.copy_from_slice(&data[o as usize..o as usize + n]);
                cache.put(k, data);
            }
        }
        Ok(())
    }

    /// Starts fetching the blocks after `last` in the background when the miss at block
    /// `first` of chunk `start` follows a block already cached (a sequential reader) or is
    /// the first block of the segment.
    fn maybe_readahead(&self, cache: &BlockCache, start: u64, first: u64, last: u64) {
        let n = readahead::window(cache.cap(), BLOCK);
        if n == 0 {
            return;
        }
        let plan = {
            let segs = lock(&self.shared.segs);
            let Some(s) = segs.get(&self.id) else {
                return;
            };
            let sequential = match readahead::previous(&s.chunks, start, first, BLOCK) {
                Some((c, b)) => cache.contains((self.id, c, b)),
                None => true,
            };
            if !sequential {
                return;
            }
            let mut p = readahead::plan(&s.chunks, start, last, n, BLOCK);
            p.retain(|(c, _, _)| !s.local.contains(c));
            p
        };
        self.queue_blocks(cache, plan);
    }

    /// Queues for the readahead worker `blocks` of this segment (chunk start, chunk length,
    /// block) that are neither cached nor being fetched.
    fn queue_blocks(&self, cache: &BlockCache, blocks: Vec<(u64, u64, u64)>) {
        let items: Vec<Ahead> = blocks
            .into_iter()
            .map(|(c, cl, b)| ((self.id, c, b), cl))
            .filter(|&(k, _)| !cache.contains(k) && !self.shared.inflight.contains(k))
            .collect();
        if !items.is_empty() {
            self.shared.queue_ahead(&items);
        }
    }
}

impl SegFile for ObjectSegFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut pos = offset;
        let end = offset + buf.len() as u64;
        while pos < end {
            let at = (pos - offset) as usize;
            // Pending bytes first (an append not uploaded yet), else the chunk holding `pos`.
            let chunk = {
                let segs = lock(&self.shared.segs);
                let s = segs
                    .get(&self.id)
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
                if let Some((&s0, b)) = s.pending.range(..=pos).next_back() {
                    let bend = s0 + b.len() as u64;
                    if pos < bend {
                        let n = (bend.min(end) - pos) as usize;
                        let from = (pos - s0) as usize;
                        buf[at..at + n].copy_from_slice(&b[from..from + n]);
                        pos += n as u64;
                        continue;
                    }
                }
                match s.chunks.range(..=pos).next_back() {
                    Some((&c0, &cl)) if pos < c0 + cl => {
                        // Still in the upload queue: its file, opened under the lock (the
                        // uploader deletes it only after taking this lock).
                        let local = match (&self.shared.writeback, s.local.contains(&c0)) {
                            (Some(wb), true) => Some(std::fs::File::open(
                                wb.dir.join(queue::file_name(self.id, c0, cl)),
                            )?),
                            _ => None,
                        };
                        (c0, cl, local)
                    }
                    _ => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("segment {} has no byte at {pos} in the bucket", self.id),
                        ))
                    }
                }
            };
            let (c0, cl, local) = chunk;
            let n = ((c0 + cl).min(end) - pos) as usize;
            match local {
                Some(f) => queue::read_at(&f, &mut buf[at..at + n], pos - c0)?,
                None => self.read_chunk(c0, cl, pos - c0, &mut buf[at..at + n])?,
            }
            pos += n as u64;
        }
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut segs = lock(&self.shared.segs);
        let s = segs
            .get_mut(&self.id)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        s.pending.insert(offset, buf.to_vec());
        drop(segs);
        let total = self
            .shared
            .pending_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed)
            + buf.len() as u64;
        // The dirty limit: a bound on appends held in memory while uploads lag (a slow or
        // unreachable server). The writer uploads them itself and waits (behind an upload
        // under way, then through its own PUTs' retries, up to the deadline: then EIO).
        if total > self.shared.dirty_limit {
            self.shared.sync_all()?;
        }
        Ok(())
    }

    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        self.write_all_at(&parts.concat(), offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.shared.sync_segment(self.id)
    }

    fn size(&self) -> io::Result<u64> {
        let segs = lock(&self.shared.segs);
        Ok(segs.get(&self.id).map_or(0, |s| s.end()))
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "segments in a bucket are not truncated",
        ))
    }

    /// Queues the blocks holding `offset..offset + len` that are neither cached nor being
    /// fetched; a worker fetches them in the background.
    fn prefetch(&self, offset: u64, len: u64) {
        let Some(cache) = &self.shared.cache else {
            return;
        };
        let blocks = {
            let segs = lock(&self.shared.segs);
            let Some(s) = segs.get(&self.id) else {
                return;
            };
            let mut b = readahead::blocks_in(&s.chunks, offset, len, BLOCK);
            // Chunks still in the upload queue are read from their files, not fetched.
            b.retain(|(c, _, _)| !s.local.contains(c));
            // At most a quarter of the cache, so that fetching ahead never pushes out what is
            // being read (a small cache gets no file readahead at all).
            b.truncate(readahead::prefetch_limit(cache.cap(), BLOCK));
            b
        };
        self.queue_blocks(cache, blocks);
    }
}
