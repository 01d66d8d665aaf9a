//! zram's newer controls (idle by age, recompress and writeback limits, incompressible pages,
//! the writeback budget and batch size) and the built-in memory policy, on the page store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use compfs_blk::store::PolicyConfig;
use compfs_blk::{Config, PageKind, PageStore, PAGE};
use compfs_codec::CodecSpec;

fn spec(s: &str) -> CodecSpec {
    CodecSpec::parse(s).unwrap().spec
}

/// A store with lz4, zstd:9 for recompression and a backing file (removed on drop).
struct Fixture {
    s: PageStore,
    backing: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.backing);
    }
}

fn fixture(name: &str, pages: u64) -> Fixture {
    let backing = std::env::temp_dir().join(format!(
        "compfs-blk-policy-{name}-{}.img",
        std::process::id()
    ));
    let s = PageStore::new(Config {
        size: pages * PAGE as u64,
        algo: spec("lz4"),
        recomp: vec![spec("zstd:9")],
        mem_limit: 0,
    })
    .unwrap()
    .with_backing(&backing)
    .unwrap();
    Fixture { s, backing }
}

fn text(seed: u64) -> Vec<u8> {
    compfs_testdata::text(PAGE, seed)
}

fn random(seed: u64) -> Vec<u8> {
    compfs_testdata::random(PAGE, seed)
}

fn read(s: &PageStore, p: u64) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    s.read(p * PAGE as u64, &mut b).unwrap();
    b
}

#[test]
fn writeback_budget_limits_and_refills_and_batches_round_trip() {
    let f = fixture("budget", 64);
    let s = &f.s;
    for p in 0..40u64 {
        s.write(p * PAGE as u64, &text(p)).unwrap();
    }
    // 8 pages per period of 0 (no refill): 8 pages go out, then none.
    s.set_writeback_limit(8 * PAGE as u64, 0);
    assert_eq!(s.writeback_limit().left, 8 * PAGE as u64);
    s.mark_idle(None);
    assert_eq!(s.writeback(PageKind::Idle, 0).unwrap(), 8);
    assert_eq!(s.writeback_limit().left, 0);
    assert_eq!(s.writeback(PageKind::Idle, 0).unwrap(), 0);
    // Setting the limit again tops it up; --max-pages bounds one call.
    s.set_writeback_limit(100 * PAGE as u64, 0);
    assert_eq!(s.writeback(PageKind::Idle, 5).unwrap(), 5);
    assert_eq!(s.writeback_limit().left, 95 * PAGE as u64);
    // Batch sizes outside 1..=4096 are refused; odd sizes write correctly.
    assert!(s.set_writeback_batch_size(0).is_err());
    assert!(s.set_writeback_batch_size(4097).is_err());
    s.set_writeback_batch_size(3).unwrap();
    assert_eq!(s.writeback_limit().batch, 3);
    s.set_writeback_limit(0, 0);
    assert_eq!(s.writeback(PageKind::Idle, 0).unwrap(), 40 - 13);
    assert_eq!(s.stats().bd_count, 40);
    for p in 0..40u64 {
        assert_eq!(read(s, p), text(p), "page {p}");
    }
    // Pages read back are no longer idle; rewritten pages leave the backing file.
    s.write(0, &text(1000)).unwrap();
    assert_eq!(s.stats().bd_count, 39);
    assert_eq!(read(s, 0), text(1000));
}

#[test]
fn budget_refills_after_its_period() {
    let f = fixture("refill", 16);
    let s = &f.s;
    for p in 0..16u64 {
        s.write(p * PAGE as u64, &text(p)).unwrap();
    }
    s.set_writeback_limit(2 * PAGE as u64, 1);
    s.mark_idle(None);
    assert_eq!(s.writeback(PageKind::Idle, 0).unwrap(), 2);
    assert_eq!(s.writeback(PageKind::Idle, 0).unwrap(), 0);
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(s.writeback(PageKind::Idle, 0).unwrap(), 2);
}

#[test]
fn incompressible_pages_are_flagged_by_recompress_and_written_back() {
    let f = fixture("incompressible", 32);
    let s = &f.s;
    for p in 0..8u64 {
        s.write(p * PAGE as u64, &random(p)).unwrap();
        s.write((8 + p) * PAGE as u64, &text(p)).unwrap();
    }
    // Nothing is incompressible before recompression has tried.
    assert_eq!(s.writeback(PageKind::Incompressible, 0).unwrap(), 0);
    // zstd:9 cannot shrink random pages: they are flagged; max_pages bounds the tries.
    assert_eq!(s.recompress(PageKind::Huge, 0, 3).unwrap(), 0);
    assert_eq!(s.writeback(PageKind::Incompressible, 0).unwrap(), 3);
    assert_eq!(s.recompress(PageKind::Huge, 0, 0).unwrap(), 0);
    assert_eq!(s.writeback(PageKind::Incompressible, 0).unwrap(), 5);
    assert_eq!(s.stats().bd_count, 8);
    // Text pages recompress; once on the last codec they are not tried again.
    s.mark_idle(None);
    assert_eq!(s.recompress(PageKind::Idle, 0, 0).unwrap(), 8);
    assert_eq!(s.recompress(PageKind::Idle, 0, 0).unwrap(), 0);
    assert_eq!(s.writeback(PageKind::Incompressible, 0).unwrap(), 0);
    for p in 0..8u64 {
        assert_eq!(read(s, p), random(p));
        assert_eq!(read(s, 8 + p), text(p));
    }
}

#[test]
fn mark_idle_by_age_spares_recently_used_pages() {
    let f = fixture("age", 32);
    let s = &f.s;
    for p in 0..16u64 {
        s.write(p * PAGE as u64, &text(p)).unwrap();
    }
    // Access times are whole seconds: after 3.1 s the pages written at the start are at least
    // 2 s old wherever the second boundaries fell.
    std::thread::sleep(Duration::from_millis(3100));
    // Pages 0..4 read and 4..6 rewritten now: younger than 2 s.
    for p in 0..4u64 {
        read(s, p);
    }
    for p in 4..6u64 {
        s.write(p * PAGE as u64, &text(p + 100)).unwrap();
    }
    assert_eq!(s.mark_idle(Some(2)), 10);
    assert_eq!(s.mark_idle(Some(1000)), 0);
    assert_eq!(s.mark_idle(None), 16);
}

/// The policy on a moving working set: pages left alone for the idle age are recompressed,
/// those left for twice as long are written back, coldest first and within the budget, while
/// the pages in use stay in memory with the primary codec.
#[test]
fn policy_moves_cold_pages_out_and_keeps_the_working_set() {
    let f = fixture("policy", 256);
    let s = &f.s;
    // Access times are whole seconds: an idle age of 2 keeps a page read less than a second
    // ago busy wherever the second boundaries fall.
    let cfg = PolicyConfig { idle_age: 2 };
    // Set A (pages 0..64) is written first, then set B (64..128) is the working set.
    for p in 0..128u64 {
        s.write(p * PAGE as u64, &text(p)).unwrap();
    }
    let full = s.stats();
    // Reads B for `ms` milliseconds, ending with a pass over it.
    let use_b = |ms: u64| {
        let t = std::time::Instant::now();
        loop {
            for p in 64..128u64 {
                read(s, p);
            }
            if t.elapsed() >= Duration::from_millis(ms) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // A budget below one page: nothing may be written back at the first step whatever the
    // timing.
    s.set_writeback_limit(PAGE as u64 - 1, 0);
    use_b(3100);
    // A is idle (>= 2 s): recompressed, nothing written.
    assert!(s.policy_step(&cfg).unwrap());
    let st = s.policy_status();
    assert_eq!(
        (st.steps, st.recompressed, st.written),
        (1, 64, 0),
        "{st:?}"
    );
    assert!(s.stats().compr_data_size < full.compr_data_size);
    // Later A is cold (>= 4 s): 40 of its pages go out (the budget), the oldest first.
    s.set_writeback_limit(40 * PAGE as u64, 0);
    use_b(2000);
    s.policy_step(&cfg).unwrap();
    let st = s.policy_status();
    assert_eq!((st.written, st.idle), (40, 64), "{st:?}");
    let after = s.stats();
    assert_eq!(after.bd_count, 40);
    assert!(after.mem_used_total < full.mem_used_total, "memory falls");
    // B was never idle: every B page is still in memory (reading it costs no backing read).
    let bd_reads = s.stats().bd_reads;
    for p in 64..128u64 {
        assert_eq!(read(s, p), text(p));
    }
    assert_eq!(s.stats().bd_reads, bd_reads);
    for p in 0..64u64 {
        assert_eq!(read(s, p), text(p));
    }
    assert_eq!(s.stats().bd_reads, bd_reads + 40);
}

/// With the policy on, a page read again after it was recompressed or written back is stored
/// with the primary codec again, and its backing slot freed.
#[test]
fn pages_in_use_again_return_to_the_primary_codec() {
    let backing = std::env::temp_dir().join(format!(
        "compfs-blk-policy-promote-{}.img",
        std::process::id()
    ));
    let s = PageStore::new(Config {
        size: 16 * PAGE as u64,
        algo: spec("lz4"),
        recomp: vec![spec("zstd:9")],
        mem_limit: 0,
    })
    .unwrap()
    .with_backing(&backing)
    .unwrap()
    .with_policy(PolicyConfig { idle_age: 1 });
    for p in 0..8u64 {
        s.write(p * PAGE as u64, &text(p)).unwrap();
    }
    let primary = s.stats().compr_data_size;
    s.mark_idle(None);
    assert_eq!(s.recompress(PageKind::Idle, 0, 0).unwrap(), 8);
    s.mark_idle(None);
    assert_eq!(s.writeback(PageKind::Idle, 4).unwrap(), 4);
    for p in 0..8u64 {
        assert_eq!(read(&s, p), text(p));
    }
    let st = s.stats();
    assert_eq!(
        (st.bd_count, st.bd_reads),
        (0, 4),
        "written-back pages came back"
    );
    assert_eq!(st.compr_data_size, primary, "all on lz4 again");
    assert_eq!(s.policy_status().promoted, 8);
    // A second read decodes from memory with the primary codec and changes nothing.
    read(&s, 0);
    assert_eq!(s.policy_status().promoted, 8);
    drop(s);
    let _ = std::fs::remove_file(&backing);
}
