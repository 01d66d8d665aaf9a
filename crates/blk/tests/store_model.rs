//! Page store against a plain in-memory model, plus zram statistics on crafted pages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use compfs_blk::{BlkError, Config, PageKind, PageState, PageStore, HUGE_THRESHOLD, PAGE};
use compfs_codec::{CodecSpec, Compressor};
use proptest::prelude::*;

fn spec(s: &str) -> CodecSpec {
    CodecSpec::parse(s).unwrap().spec
}

fn store(pages: u64, algo: &str, recomp: &[&str], limit: u64) -> PageStore {
    PageStore::new(Config {
        size: pages * PAGE as u64,
        algo: spec(algo),
        recomp: recomp.iter().map(|s| spec(s)).collect(),
        mem_limit: limit,
    })
    .unwrap()
}

/// Incompressible and text-like pages (the shared generators).
fn random_page(seed: u64) -> Vec<u8> {
    compfs_testdata::random(PAGE, seed)
}

fn text_page(seed: u64) -> Vec<u8> {
    compfs_testdata::text(PAGE, seed)
}

fn read_all(s: &PageStore) -> Vec<u8> {
    let mut v = vec![0u8; s.size() as usize];
    s.read(0, &mut v).unwrap();
    v
}

#[test]
fn crafted_pages_give_hand_computed_stats() {
    let s = store(16, "lz4", &[], 0);
    // page 0: zeros, page 1: repeated word, page 2-3: random, page 4-6: text.
    s.write(0, &[0u8; PAGE]).unwrap();
    let word: Vec<u8> = 0xDEAD_BEEF_0102_0304u64
        .to_ne_bytes()
        .iter()
        .copied()
        .cycle()
        .take(PAGE)
        .collect();
    s.write(PAGE as u64, &word).unwrap();
    s.write(2 * PAGE as u64, &random_page(1)).unwrap();
    s.write(3 * PAGE as u64, &random_page(2)).unwrap();
    let mut c = Compressor::new();
    let mut out = Vec::new();
    let mut expect_compr = 2 * PAGE as u64;
    for p in 4..7u64 {
        let t = text_page(p);
        let n = c.compress(spec("lz4"), &t, &mut out).unwrap();
        assert!(n <= HUGE_THRESHOLD);
        expect_compr += n as u64;
        s.write(p * PAGE as u64, &t).unwrap();
    }
    let st = s.stats();
    assert_eq!(st.orig_data_size, 7 * PAGE as u64);
    assert_eq!(st.same_pages, 2);
    assert_eq!(st.huge_pages, 2);
    assert_eq!(st.huge_pages_since, 2);
    assert_eq!(st.compr_data_size, expect_compr);
    let ratio = st.orig_data_size as f64 / st.compr_data_size as f64;
    assert!((ratio - (7.0 * 4096.0) / expect_compr as f64).abs() < 1e-9);
    // Overwriting a huge page with text drops huge_pages but not huge_pages_since.
    s.write(2 * PAGE as u64, &text_page(9)).unwrap();
    let st = s.stats();
    assert_eq!(st.huge_pages, 1);
    assert_eq!(st.huge_pages_since, 2);
    // Lines in zram's layout: 9, 4 and 3 fields.
    assert_eq!(st.mm_stat().split_whitespace().count(), 9);
    assert_eq!(st.io_stat().split_whitespace().count(), 4);
    assert_eq!(st.bd_stat().split_whitespace().count(), 3);
    let back = compfs_blk::Stats::parse(&st.mm_stat(), &st.io_stat(), &st.bd_stat()).unwrap();
    assert_eq!(back.compr_data_size, st.compr_data_size);
}

#[test]
fn unwritten_reads_zero_and_trim_frees() {
    let s = store(8, "zstd:1", &[], 0);
    assert!(read_all(&s).iter().all(|&b| b == 0));
    let t = text_page(3);
    s.write(PAGE as u64, &t).unwrap();
    s.write(2 * PAGE as u64, &t).unwrap();
    assert!(s.stats().mem_used_total > 0);
    // Trim of 1.5 pages starting mid page 0 frees only page 1.
    s.trim(PAGE as u64 / 2, PAGE as u64 + PAGE as u64 / 2)
        .unwrap();
    let st = s.stats();
    assert_eq!(st.orig_data_size, PAGE as u64);
    assert_eq!(st.notify_free, 1);
    s.trim(0, 8 * PAGE as u64).unwrap();
    let st = s.stats();
    assert_eq!(st.orig_data_size, 0);
    assert_eq!(st.compr_data_size, 0);
    assert_eq!(st.mem_used_total, 0, "every zspage is returned");
    assert!(read_all(&s).iter().all(|&b| b == 0));
}

#[test]
fn write_zeroes_hole_and_no_hole() {
    let s = store(4, "lz4", &[], 0);
    s.write(0, &text_page(1)).unwrap();
    s.write(PAGE as u64, &text_page(2)).unwrap();
    s.write_zeroes(0, PAGE as u64, false).unwrap();
    s.write_zeroes(PAGE as u64, PAGE as u64, true).unwrap();
    let st = s.stats();
    // Page 0 is a hole now; page 1 is an allocated zero page.
    assert_eq!(st.orig_data_size, PAGE as u64);
    assert_eq!(st.same_pages, 1);
    assert_eq!(st.compr_data_size, 0);
    // Partial zeroing is read-modify-write.
    let t = text_page(5);
    s.write(2 * PAGE as u64, &t).unwrap();
    s.write_zeroes(2 * PAGE as u64 + 100, 50, false).unwrap();
    let mut b = vec![0u8; PAGE];
    s.read(2 * PAGE as u64, &mut b).unwrap();
    let mut want = t.clone();
    want[100..150].fill(0);
    assert_eq!(b, want);
}

#[test]
fn out_of_range_is_refused_and_counted() {
    let s = store(2, "lz4", &[], 0);
    let mut b = [0u8; 10];
    assert!(matches!(
        s.read(2 * PAGE as u64 - 5, &mut b),
        Err(BlkError::OutOfRange { .. })
    ));
    assert!(s.write(u64::MAX - 3, &b).is_err());
    assert!(s.trim(0, 3 * PAGE as u64).is_err());
    assert_eq!(s.stats().invalid_io, 3);
    assert!(PageStore::new(Config {
        size: 1000,
        algo: spec("lz4"),
        recomp: vec![],
        mem_limit: 0
    })
    .is_err());
    assert!(PageStore::new(Config {
        size: 4096,
        algo: spec("lz4"),
        recomp: vec![spec("zstd"); 4],
        mem_limit: 0
    })
    .is_err());
}

#[test]
fn mem_limit_gives_enospc_and_keeps_data() {
    let s = store(256, "lz4", &[], 96 * 1024);
    let mut written = Vec::new();
    let mut failed = false;
    for p in 0..256u64 {
        let page = random_page(p + 100);
        match s.write(p * PAGE as u64, &page) {
            Ok(()) => written.push((p, page)),
            Err(e) => {
                assert!(matches!(e, BlkError::NoSpace { .. }), "{e}");
                assert_eq!(e.errno(), 28);
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the limit must be hit");
    let st = s.stats();
    assert!(st.mem_used_total <= 96 * 1024);
    assert_eq!(st.failed_writes, 1);
    for (p, page) in &written {
        let mut b = vec![0u8; PAGE];
        s.read(p * PAGE as u64, &mut b).unwrap();
        assert_eq!(&b, page);
    }
    // An overwrite that fails leaves the old contents.
    let (p0, old) = &written[0];
    assert!(
        s.write(*p0 * PAGE as u64, &random_page(999)).is_err() || {
            // It may fit in a free slot; then the new data must read back.
            let mut b = vec![0u8; PAGE];
            s.read(*p0 * PAGE as u64, &mut b).unwrap();
            b == random_page(999)
        }
    );
    let mut b = vec![0u8; PAGE];
    s.read(*p0 * PAGE as u64, &mut b).unwrap();
    assert!(b == *old || b == random_page(999));
    // Same pages need no memory and still succeed.
    s.write(255 * PAGE as u64, &[0u8; PAGE]).unwrap();
}

#[test]
fn recompress_idle_and_huge() {
    let s = store(32, "lz4", &["zstd:9"], 0);
    for p in 0..16u64 {
        s.write(p * PAGE as u64, &text_page(p)).unwrap();
    }
    let before = s.stats().compr_data_size;
    // Nothing idle yet: nothing recompressed.
    assert_eq!(s.recompress(PageKind::Idle, 0, 0).unwrap(), 0);
    assert_eq!(s.mark_idle(None), 16);
    // Reading page 0 clears its idle mark.
    let mut b = vec![0u8; PAGE];
    s.read(0, &mut b).unwrap();
    let n = s.recompress(PageKind::Idle, 0, 0).unwrap();
    assert_eq!(n, 15);
    let after = s.stats().compr_data_size;
    assert!(after < before, "{after} < {before}");
    for p in 0..16u64 {
        s.read(p * PAGE as u64, &mut b).unwrap();
        assert_eq!(b, text_page(p));
    }
    // A threshold above every size selects nothing.
    s.mark_idle(None);
    assert_eq!(s.recompress(PageKind::Idle, 4096, 0).unwrap(), 0);
    // Huge random pages stay huge: zstd cannot shrink them, so the result is not kept.
    s.write(20 * PAGE as u64, &random_page(5)).unwrap();
    assert_eq!(s.recompress(PageKind::Huge, 0, 0).unwrap(), 0);
    assert_eq!(s.stats().huge_pages, 1);
    // Without recompression codecs the command is refused.
    assert!(matches!(
        store(1, "lz4", &[], 0).recompress(PageKind::Huge, 0, 0),
        Err(BlkError::NoRecomp)
    ));
}

#[test]
fn writeback_moves_pages_to_file_and_reads_them_back() {
    let dir = std::env::temp_dir().join(format!("compfs-blk-wb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("backing");
    let s = store(16, "lz4", &[], 0).with_backing(&path).unwrap();
    for p in 0..4u64 {
        s.write(p * PAGE as u64, &random_page(p)).unwrap();
    }
    for p in 4..8u64 {
        s.write(p * PAGE as u64, &text_page(p)).unwrap();
    }
    assert_eq!(s.writeback(PageKind::Huge, 0).unwrap(), 4);
    let st = s.stats();
    assert_eq!((st.bd_count, st.bd_writes, st.huge_pages), (4, 4, 0));
    assert_eq!(st.orig_data_size, 4 * PAGE as u64);
    s.mark_idle(None);
    let mut b = vec![0u8; PAGE];
    s.read(4 * PAGE as u64, &mut b).unwrap(); // page 4 is no longer idle
    assert_eq!(s.writeback(PageKind::Idle, 0).unwrap(), 3);
    for p in 0..8u64 {
        s.read(p * PAGE as u64, &mut b).unwrap();
        let want = if p < 4 { random_page(p) } else { text_page(p) };
        assert_eq!(b, want, "page {p}");
    }
    let st = s.stats();
    assert_eq!(st.bd_count, 7);
    assert_eq!(st.bd_reads, 7);
    // Overwrite and trim release backing slots.
    s.write(0, &text_page(0)).unwrap();
    s.trim(PAGE as u64, PAGE as u64).unwrap();
    assert_eq!(s.stats().bd_count, 5);
    assert!(matches!(
        store(1, "lz4", &[], 0).writeback(PageKind::Idle, 0),
        Err(BlkError::NoBacking)
    ));
    s.reset();
    let st = s.stats();
    assert_eq!((st.bd_count, st.bd_reads, st.orig_data_size), (0, 0, 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compact_reclaims_fragmentation_and_memory_tracks_compr_size() {
    let s = store(8192, "lz4", &[], 0);
    for p in 0..8192u64 {
        s.write(p * PAGE as u64, &text_page(p)).unwrap();
    }
    let st = s.stats();
    assert!(
        st.mem_used_total as f64 <= 1.05 * st.compr_data_size as f64,
        "{} vs {}",
        st.mem_used_total,
        st.compr_data_size
    );
    for p in (0..8192u64).filter(|p| p % 3 != 0) {
        s.trim(p * PAGE as u64, PAGE as u64).unwrap();
    }
    let frag = s.stats();
    let freed = s.compact();
    let st = s.stats();
    assert!(freed > 0);
    assert_eq!(st.pages_compacted, freed);
    assert!(st.mem_used_total < frag.mem_used_total);
    // 2731 pages spread over ~20 classes each keep one partly filled zspage (up to 16 KiB), so
    // the bound is looser than on a full device.
    assert!(
        st.mem_used_total as f64 <= 1.15 * st.compr_data_size as f64,
        "{} vs {}",
        st.mem_used_total,
        st.compr_data_size
    );
    let mut b = vec![0u8; PAGE];
    for p in (0..8192u64).step_by(3) {
        s.read(p * PAGE as u64, &mut b).unwrap();
        assert_eq!(b, text_page(p));
    }
    assert!(st.mem_used_max >= frag.mem_used_total);
}

#[test]
fn concurrent_partial_writes_to_one_page_are_not_lost() {
    let s = Arc::new(store(4, "lz4", &[], 0));
    let threads: Vec<_> = (0..2u8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for _round in 0..200u64 {
                    for i in 0..8u64 {
                        // Thread t owns the bytes at offsets with (offset / 64) % 2 == t.
                        let off = (i * 2 + u64::from(t)) * 64;
                        s.write(off, &[t + 1; 64]).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut b = vec![0u8; 1024];
    s.read(0, &mut b).unwrap();
    for (i, chunk) in b.chunks(64).enumerate() {
        assert!(chunk.iter().all(|&x| x == (i % 2) as u8 + 1), "chunk {i}");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        off: u64,
        len: usize,
        seed: u64,
        kind: u8,
    },
    Read {
        off: u64,
        len: usize,
    },
    Trim {
        off: u64,
        len: u64,
    },
    Zero {
        off: u64,
        len: u64,
        no_hole: bool,
    },
    Compact,
    MarkIdle,
    Recompress(bool),
    Writeback(bool),
    Reset,
}

const MODEL_PAGES: u64 = 24;

fn op() -> impl Strategy<Value = Op> {
    let size = MODEL_PAGES * PAGE as u64;
    prop_oneof![
        4 => (0..size, 1usize..3 * PAGE, any::<u64>(), 0u8..4).prop_map(move |(o, l, seed, kind)| {
            let l = l.min((size - o) as usize).max(1);
            Op::Write { off: o.min(size - l as u64), len: l, seed, kind }
        }),
        2 => (0..size, 1usize..3 * PAGE).prop_map(move |(o, l)| {
            let l = l.min((size - o) as usize);
            Op::Read { off: o, len: l }
        }),
        1 => (0..size, 0u64..4 * PAGE as u64).prop_map(move |(o, l)| Op::Trim { off: o, len: l.min(size - o) }),
        1 => (0..size, 0u64..3 * PAGE as u64, any::<bool>())
            .prop_map(move |(o, l, nh)| Op::Zero { off: o, len: l.min(size - o), no_hole: nh }),
        1 => Just(Op::Compact),
        1 => Just(Op::MarkIdle),
        1 => any::<bool>().prop_map(Op::Recompress),
        1 => any::<bool>().prop_map(Op::Writeback),
        1 => Just(Op::Reset),
    ]
}

fn payload(len: usize, seed: u64, kind: u8) -> Vec<u8> {
    match kind {
        0 => vec![(seed % 3) as u8; len],
        1 => random_page(seed)
            .iter()
            .cycle()
            .take(len)
            .copied()
            .collect(),
        _ => text_page(seed).iter().cycle().take(len).copied().collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..40), zstd in any::<bool>()) {
        static CASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let backing = std::env::temp_dir().join(format!(
            "compfs-blk-model-{}-{}",
            std::process::id(),
            CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let s = store(MODEL_PAGES, if zstd { "zstd:1" } else { "lz4" }, &["zstd:5"], 0)
            .with_backing(&backing)
            .unwrap();
        let mut model = vec![0u8; (MODEL_PAGES * PAGE as u64) as usize];
        for op in ops {
            match op {
                Op::Write { off, len, seed, kind } => {
                    let d = payload(len, seed, kind);
                    s.write(off, &d).unwrap();
                    model[off as usize..off as usize + len].copy_from_slice(&d);
                }
                Op::Read { off, len } => {
                    let mut b = vec![0u8; len];
                    s.read(off, &mut b).unwrap();
                    prop_assert_eq!(&b[..], &model[off as usize..off as usize + len]);
                }
                Op::Trim { off, len } => {
                    s.trim(off, len).unwrap();
                    let first = off.div_ceil(PAGE as u64);
                    let end = (off + len) / PAGE as u64;
                    for p in first..end {
                        model[(p * PAGE as u64) as usize..((p + 1) * PAGE as u64) as usize].fill(0);
                    }
                }
                Op::Zero { off, len, no_hole } => {
                    s.write_zeroes(off, len, no_hole).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                Op::Compact => { s.compact(); }
                Op::MarkIdle => { s.mark_idle(None); }
                Op::Recompress(huge) => {
                    s.recompress(if huge { PageKind::Huge } else { PageKind::Idle }, 0, 0).unwrap();
                }
                Op::Writeback(huge) => {
                    s.writeback(if huge { PageKind::Huge } else { PageKind::Idle }, 0).unwrap();
                }
                Op::Reset => {
                    s.reset();
                    model.fill(0);
                }
            }
            let st = s.stats();
            prop_assert!(st.compr_data_size <= st.orig_data_size);
            prop_assert!(st.same_pages * PAGE as u64 <= st.orig_data_size);
        }
        prop_assert_eq!(&read_all(&s), &model);
        // Block status agrees with the bytes: data pages hold a nonzero byte (a page of zeros
        // is always stored same-filled), zero and unwritten pages read as zeros; runs agree.
        for p in 0..MODEL_PAGES {
            let bytes = &model[(p * PAGE as u64) as usize..((p + 1) * PAGE as u64) as usize];
            let st = s.page_state(p);
            prop_assert_eq!(st == PageState::Data, bytes.iter().any(|&b| b != 0), "page {}", p);
            let (run_state, n) = s.page_run(p, MODEL_PAGES - p);
            prop_assert!(n >= 1 && n <= MODEL_PAGES - p);
            for q in p..p + n {
                prop_assert_eq!(s.page_state(q), run_state);
            }
        }
        // Freeing everything returns all memory.
        s.trim(0, s.size()).unwrap();
        s.compact();
        let st = s.stats();
        prop_assert_eq!(st.mem_used_total, 0);
        prop_assert_eq!(st.orig_data_size, 0);
        prop_assert_eq!(st.bd_count, 0);
        drop(s);
        let _ = std::fs::remove_file(&backing);
    }
}

#[test]
fn page_table_is_allocated_as_pages_are_written() {
    let s = store(16 << 20, "lz4", &[], 0); // 64 GiB
    let empty = s.stats().table_bytes;
    assert!(empty < 1 << 20, "{empty}");
    let mut b = vec![0u8; PAGE];
    s.read(12345 * PAGE as u64, &mut b).unwrap();
    assert_eq!(s.stats().table_bytes, empty, "reads allocate nothing");
    s.write(12345 * PAGE as u64, &text_page(1)).unwrap();
    assert_eq!(
        s.stats().table_bytes,
        empty + 512 * (10 + 4),
        "10-byte entries and 4-byte access times"
    );
    s.read(12345 * PAGE as u64, &mut b).unwrap();
    assert_eq!(b, text_page(1));
    s.mark_idle(None);
    assert!(
        s.recompress(PageKind::Idle, 0, 0).is_err(),
        "no recompression codec"
    );
    s.reset();
    assert!(read_all_sparse(&s, 12345));
}

fn read_all_sparse(s: &PageStore, page: u64) -> bool {
    let mut b = vec![1u8; PAGE];
    s.read(page * PAGE as u64, &mut b).unwrap();
    b.iter().all(|&x| x == 0)
}

#[test]
fn page_runs_answer_for_unwritten_128_mib_groups() {
    // 2.5 groups of 32,768 pages (128 MiB each).
    let g = 32_768u64;
    let pages = 2 * g + g / 2;
    let s = store(pages, "lz4", &[], 0);
    assert_eq!(s.page_run(0, u64::MAX), (PageState::Unwritten, g));
    assert_eq!(s.page_run(5, 10), (PageState::Unwritten, 10));
    // The last group is cut at the end of the device; past the end is unwritten.
    assert_eq!(
        s.page_run(2 * g + 1, u64::MAX),
        (PageState::Unwritten, g / 2 - 1)
    );
    assert_eq!(s.page_state(pages), PageState::Unwritten);
    // One page written in group 1: that group is looked at page by page.
    s.write((g + 77) * PAGE as u64, &text_page(1)).unwrap();
    s.write((g + 78) * PAGE as u64, &[0u8; PAGE]).unwrap();
    assert_eq!(s.page_run(g, u64::MAX), (PageState::Unwritten, 1));
    assert_eq!(s.page_run(g + 77, u64::MAX), (PageState::Data, 1));
    assert_eq!(s.page_run(g + 78, u64::MAX), (PageState::Zero, 1));
    assert_eq!(s.page_run(0, u64::MAX), (PageState::Unwritten, g));
    assert_eq!(s.page_run(2 * g, u64::MAX), (PageState::Unwritten, g / 2));
    // Trimmed pages are unwritten again (their chunk stays allocated).
    s.trim((g + 77) * PAGE as u64, PAGE as u64).unwrap();
    assert_eq!(s.page_run(g + 77, u64::MAX), (PageState::Unwritten, 1));
    s.write_zeroes((g + 78) * PAGE as u64, PAGE as u64, false)
        .unwrap();
    assert_eq!(s.page_state(g + 78), PageState::Unwritten);
}
