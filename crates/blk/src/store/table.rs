//! The page table: one 10-byte entry and a 4-byte access time per page, in chunks allocated on
//! first store.

use crate::pool::ObjRef;

pub(super) const FLAG_IDLE: u8 = 1;

/// Recompression found nothing smaller: skip the page next time (zram's ZRAM_INCOMPRESSIBLE).
pub(super) const FLAG_NO_RECOMP: u8 = 2;

/// The background dictionary pass could not improve the page: leave it until rewritten.
pub(super) const FLAG_NO_DICT: u8 = 4;

/// Recompression or writeback decoded the page and works on it without the shard lock; a
/// write, trim or move replaces the entry and so clears this, telling it to drop its result.
pub(super) const FLAG_PENDING: u8 = 8;

/// Codec index of a raw (huge) page.
pub(super) const RAW: u8 = u8::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    Empty,
    Same {
        /// The repeated word as stored (native byte order); bytes rather than a u64 so the
        /// entry needs no 8-byte alignment.
        word: [u8; 8],
        flags: u8,
    },
    Obj {
        obj: ObjRef,
        len: u16,
        /// Index into the store's codec list (0 primary, 1..=3 recompression), or RAW.
        codec: u8,
        flags: u8,
    },
    Backed {
        /// Slot in the backing file, native byte order (bytes: no 4-byte alignment).
        slot: [u8; 4],
        flags: u8,
    },
}

impl Entry {
    pub(super) fn flags(&self) -> Option<u8> {
        match self {
            Entry::Empty => None,
            Entry::Same { flags, .. } | Entry::Obj { flags, .. } | Entry::Backed { flags, .. } => {
                Some(*flags)
            }
        }
    }

    pub(super) fn flags_mut(&mut self) -> Option<&mut u8> {
        match self {
            Entry::Empty => None,
            Entry::Same { flags, .. } | Entry::Obj { flags, .. } | Entry::Backed { flags, .. } => {
                Some(flags)
            }
        }
    }
}

/// Entries per table chunk (512 × 10 bytes, see the size assertion below), allocated on the
/// first write into it.
pub(super) const CHUNK_ENTRIES: usize = 512;

pub(super) static EMPTY: Entry = Entry::Empty;

// One entry per stored page: keep it at 10 bytes (16 with an aligned u64 or ObjRef inside).
const _: () = assert!(std::mem::size_of::<Entry>() == 10);

/// One chunk of a table: the entries and, beside them, each page's last access (seconds since
/// the store started, as zram's `ac_time` with CONFIG_ZRAM_TRACK_ENTRY_ACTIME) for
/// `mark-idle --age` and the memory policy.
#[derive(Debug)]
struct Chunk {
    entries: [Entry; CHUNK_ENTRIES],
    atime: [u32; CHUNK_ENTRIES],
}

/// One shard's page table. Chunks are allocated when a page in them is first stored, so a large
/// device that is mostly unwritten costs a pointer per 512 pages (zram allocates its whole
/// table at `disksize`).
#[derive(Debug)]
pub(super) struct Table {
    chunks: Vec<Option<Box<Chunk>>>,
    len: usize,
    allocated: usize,
}

impl Table {
    pub(super) fn new(len: usize) -> Table {
        Table {
            chunks: (0..len.div_ceil(CHUNK_ENTRIES)).map(|_| None).collect(),
            len,
            allocated: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The entry, without allocating (None for a page in an unallocated chunk: it is Empty).
    pub(super) fn get_mut(&mut self, idx: usize) -> Option<&mut Entry> {
        self.chunks
            .get_mut(idx / CHUNK_ENTRIES)?
            .as_mut()
            .map(|c| &mut c.entries[idx % CHUNK_ENTRIES])
    }

    /// Records an access to page `idx` at `now` (no-op for a page in an unallocated chunk).
    pub(super) fn touch(&mut self, idx: usize, now: u32) {
        if let Some(Some(c)) = self.chunks.get_mut(idx / CHUNK_ENTRIES) {
            c.atime[idx % CHUNK_ENTRIES] = now;
        }
    }

    /// Every entry of the allocated chunks, with its index and access time.
    pub(super) fn entries_mut(&mut self) -> impl Iterator<Item = (usize, &mut Entry, u32)> {
        self.chunks
            .iter_mut()
            .enumerate()
            .filter_map(|(ci, c)| c.as_mut().map(|c| (ci, c)))
            .flat_map(|(ci, c)| {
                c.entries
                    .iter_mut()
                    .zip(c.atime.iter())
                    .enumerate()
                    .map(move |(i, (e, at))| (ci * CHUNK_ENTRIES + i, e, *at))
            })
    }

    /// Whether chunk `chunk` has never been allocated (all its pages are then Empty).
    pub(super) fn chunk_unallocated(&self, chunk: usize) -> bool {
        matches!(self.chunks.get(chunk), Some(None) | None)
    }

    pub(super) fn bytes(&self) -> u64 {
        (self.allocated * std::mem::size_of::<Chunk>()
            + self.chunks.capacity() * std::mem::size_of::<Option<Box<Chunk>>>()) as u64
    }
}

impl std::ops::Index<usize> for Table {
    type Output = Entry;
    fn index(&self, idx: usize) -> &Entry {
        match self.chunks.get(idx / CHUNK_ENTRIES) {
            Some(Some(c)) => &c.entries[idx % CHUNK_ENTRIES],
            _ => &EMPTY,
        }
    }
}

impl std::ops::IndexMut<usize> for Table {
    /// Allocates the chunk if needed: only used to store an entry.
    fn index_mut(&mut self, idx: usize) -> &mut Entry {
        let slot = &mut self.chunks[idx / CHUNK_ENTRIES];
        if slot.is_none() {
            self.allocated += 1;
        }
        let c = slot.get_or_insert_with(|| {
            Box::new(Chunk {
                entries: [Entry::Empty; CHUNK_ENTRIES],
                atime: [0; CHUNK_ENTRIES],
            })
        });
        &mut c.entries[idx % CHUNK_ENTRIES]
    }
}

/// Highest dictionary slot a page entry can name (6 bits; 63 with codec 3 would spell RAW).
pub(super) const MAX_DICT_SLOT: u8 = 62;

/// The codec byte of a compressed entry: the codec index in the low 2 bits, the dictionary
/// slot (0: none) in the high 6 bits. `RAW` (all ones) stays reserved for huge pages.
pub(super) fn pack_codec(codec: usize, slot: u8) -> u8 {
    debug_assert!(codec < 4 && slot <= MAX_DICT_SLOT);
    (slot << 2) | (codec as u8 & 3)
}

/// The codec index of a packed codec byte (not RAW).
pub(super) fn codec_index(b: u8) -> usize {
    usize::from(b & 3)
}

/// The dictionary slot of a packed codec byte (0: none; not RAW).
pub(super) fn dict_slot(b: u8) -> u8 {
    b >> 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_byte_packing_round_trips_and_never_spells_raw() {
        for codec in 0..4usize {
            for slot in 0..=MAX_DICT_SLOT {
                let b = pack_codec(codec, slot);
                assert_ne!(b, RAW);
                assert_eq!((codec_index(b), dict_slot(b)), (codec, slot));
            }
        }
    }
}
