//! Tests of the dictionary state and its background work (`dict.rs`).

use super::*;
use proptest::prelude::*;

fn spec(s: &str) -> CodecSpec {
    CodecSpec::parse(s).unwrap().spec
}

fn store(pages: u64, algo: &str) -> PageStore {
    PageStore::new(Config {
        size: pages * PAGE as u64,
        algo: spec(algo),
        recomp: vec![spec("zstd:9")],
        mem_limit: 0,
    })
    .unwrap()
}

fn page(kind: u64, seed: u64) -> Vec<u8> {
    // Two families of data, so a dictionary trained on one differs from one of the other.
    if kind == 0 {
        compfs_testdata::text(PAGE, seed)
    } else {
        compfs_testdata::generate(compfs_testdata::Kind::Mixed, PAGE, seed + 1_000_000)
    }
}

/// A dictionary trained on pages of `kind` (trained once per kind and shared).
fn dict_of(kind: u64, level: i32) -> Dictionary {
    static RAW: std::sync::OnceLock<[Vec<u8>; 2]> = std::sync::OnceLock::new();
    let raw = RAW.get_or_init(|| {
        [0, 1].map(|k| {
            let samples: Vec<Vec<u8>> = (0..200).map(|i| page(k, 10_000 + i)).collect();
            Dictionary::train(&samples, 16 << 10, 1)
                .unwrap()
                .raw()
                .to_vec()
        })
    });
    Dictionary::new(raw[kind as usize].clone(), level).unwrap()
}

fn slot_pages(s: &PageStore) -> std::collections::HashMap<u8, u64> {
    let mut m = std::collections::HashMap::new();
    for shard in s.shards.iter() {
        let mut t = lock(shard);
        for (_, e, _) in t.entries_mut() {
            if let Entry::Obj { codec, .. } = *e {
                if codec != RAW && dict_slot(codec) != 0 {
                    *m.entry(dict_slot(codec)).or_insert(0) += 1;
                }
            }
        }
    }
    m
}

/// The per-slot counts equal the entries that name each slot, and only the current
/// dictionary or ones still in use are held.
fn check_counts(s: &PageStore) {
    let d = s.dicts.as_ref().unwrap();
    let used = slot_pages(s);
    let t = read(&d.table);
    for (i, slot) in t.slots.iter().enumerate() {
        let n = used.get(&(i as u8)).copied().unwrap_or(0);
        match slot {
            Some(sl) => {
                assert_eq!(sl.pages.load(Ordering::Relaxed), n, "slot {i}");
                assert!(n > 0 || i == usize::from(t.current), "unused slot {i} kept");
            }
            None => assert_eq!(n, 0, "pages name empty slot {i}"),
        }
    }
}

fn drain(s: &PageStore) {
    for _ in 0..10_000 {
        if !s.dict_maintain().unwrap() {
            return;
        }
    }
    panic!("dictionary work did not finish");
}

#[test]
fn fixed_dictionary_pages_round_trip_and_memory_is_counted() {
    let plain = store(256, "zstd:1");
    let s = store(256, "zstd:1")
        .with_dict(DictSetup::Fixed(dict_of(0, 1)))
        .unwrap();
    for p in 0..256u64 {
        plain.write(p * PAGE as u64, &page(0, p)).unwrap();
        s.write(p * PAGE as u64, &page(0, p)).unwrap();
    }
    let mut buf = vec![0u8; PAGE];
    for p in 0..256u64 {
        s.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, page(0, p));
    }
    let (a, b) = (plain.stats(), s.stats());
    assert!(b.compr_data_size < a.compr_data_size, "{b:?} vs {a:?}");
    let st = s.dict_status().unwrap();
    assert_eq!((st.version, st.dicts, st.pages), (1, 1, 256));
    assert!(b.mem_used_total >= st.bytes && st.bytes > 16 << 10);
    check_counts(&s);
    // Recompression with a secondary codec takes pages off the dictionary.
    s.mark_idle(None);
    s.recompress(PageKind::Idle, 0, 0).unwrap();
    check_counts(&s);
    for p in 0..256u64 {
        s.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, page(0, p));
    }
}

#[test]
fn older_dictionaries_stay_readable_and_are_freed_when_unused() {
    let s = store(128, "zstd:1")
        .with_dict(DictSetup::Fixed(dict_of(0, 1)))
        .unwrap();
    for p in 0..128u64 {
        s.write(p * PAGE as u64, &page(0, p)).unwrap();
    }
    let d = s.dicts.as_ref().unwrap();
    let first = d.status().bytes;
    d.install(dict_of(1, 1)).unwrap();
    // Both held: the old one still has pages.
    assert_eq!(d.status().dicts, 2);
    check_counts(&s);
    let mut buf = vec![0u8; PAGE];
    for p in 0..64u64 {
        s.write(p * PAGE as u64, &page(1, p)).unwrap();
    }
    check_counts(&s);
    for p in 0..128u64 {
        s.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, page(if p < 64 { 1 } else { 0 }, p), "page {p}");
    }
    // Trimming the last pages of the old dictionary frees it.
    s.trim(64 * PAGE as u64, 64 * PAGE as u64).unwrap();
    let st = d.status();
    assert_eq!((st.dicts, st.version), (1, 2));
    assert!(st.bytes < first + dict_of(1, 1).memory() as u64);
    check_counts(&s);
}

#[test]
fn background_pass_moves_pages_to_the_newest_and_frees_the_old() {
    let s = store(200, "zstd:1")
        .with_dict(DictSetup::Fixed(dict_of(0, 1)))
        .unwrap();
    for p in 0..200u64 {
        s.write(p * PAGE as u64, &page(p % 2, p)).unwrap();
    }
    let d = s.dicts.as_ref().unwrap();
    d.install(dict_of(1, 1)).unwrap();
    drain(&s);
    check_counts(&s);
    let st = d.status();
    assert!(st.recompressed > 0 && !st.busy, "{st:?}");
    // Every page that still fits moved, so the old dictionary is gone.
    let used = slot_pages(&s);
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!(st.dicts, 1);
    let mut buf = vec![0u8; PAGE];
    for p in 0..200u64 {
        s.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, page(p % 2, p));
    }
}

#[test]
fn auto_trains_retrains_and_recompresses() {
    let n = 2 * FIRST_TRAINING + 64;
    let plain = store(n, "zstd:1");
    let s = store(n, "zstd:1").with_dict(DictSetup::Auto).unwrap();
    assert_eq!(s.dict_status().unwrap().version, 0);
    let mut buf = vec![0u8; PAGE];
    for p in 0..FIRST_TRAINING {
        s.write(p * PAGE as u64, &page(0, p)).unwrap();
        plain.write(p * PAGE as u64, &page(0, p)).unwrap();
    }
    assert!(s.dict_status().unwrap().busy);
    drain(&s);
    let st = s.dict_status().unwrap();
    assert_eq!((st.version, st.trainings), (1, 1), "{st:?}");
    assert!(st.pages > FIRST_TRAINING / 2, "{st:?}");
    // The data doubles with another kind: a second dictionary replaces the first.
    for p in FIRST_TRAINING..n {
        s.write(p * PAGE as u64, &page(1, p)).unwrap();
        plain.write(p * PAGE as u64, &page(1, p)).unwrap();
    }
    drain(&s);
    let st = s.dict_status().unwrap();
    assert_eq!(st.trainings, 2, "{st:?}");
    check_counts(&s);
    for p in 0..n {
        s.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, page(u64::from(p >= FIRST_TRAINING), p), "page {p}");
    }
    assert!(s.stats().compr_data_size < plain.stats().compr_data_size);
}

/// Makes the last write look `secs` old (the quiet rule uses the time since start).
fn age_writes(s: &mut PageStore, secs: u64) {
    let d = s.dicts.as_mut().unwrap();
    d.start = d
        .start
        .checked_sub(Duration::from_secs(secs))
        .unwrap_or(d.start);
    d.last_write_ms.store(0, Ordering::Relaxed);
}

/// Makes writes look ongoing however long the test takes (a slow debug training must not
/// let the quiet rule fire).
fn writes_ongoing(s: &PageStore) {
    let d = s.dicts.as_ref().unwrap();
    d.last_write_ms.store(u64::MAX / 4, Ordering::Relaxed);
}

#[test]
fn samples_are_released_when_no_training_is_due_and_sampling_restarts() {
    let n = 2 * FIRST_TRAINING + 512;
    let mut s = store(n, "zstd:1").with_dict(DictSetup::Auto).unwrap();
    for p in 0..FIRST_TRAINING {
        s.write(p * PAGE as u64, &page(0, p)).unwrap();
    }
    writes_ongoing(&s);
    drain(&s);
    let st = s.dict_status().unwrap();
    assert_eq!(
        (st.trainings, st.samples),
        (1, SAMPLE_PAGES as u64),
        "{st:?}"
    );
    // Writes go on: the samples stay and nothing is pending.
    assert!(!st.busy, "{st:?}");
    let before = s.stats().mem_used_total;
    age_writes(&mut s, 5);
    assert!(s.dict_status().unwrap().busy, "a due release shows as busy");
    drain(&s);
    let st = s.dict_status().unwrap();
    assert_eq!(st.samples, 0, "{st:?}");
    assert_eq!(st.samples_released, SAMPLE_PAGES as u64);
    assert!(!st.busy, "{st:?}");
    let cur = s.dicts.as_ref().unwrap().get(1).unwrap();
    assert_eq!(
        st.bytes,
        cur.dict.memory() as u64,
        "only the dictionary is left"
    );
    assert!(s.stats().mem_used_total < before);
    // New writes refill the reservoir from zero; doubling the data retrains on them.
    for p in FIRST_TRAINING..n {
        s.write(p * PAGE as u64, &page(1, p)).unwrap();
    }
    let st = s.dict_status().unwrap();
    assert_eq!(st.samples, (n - FIRST_TRAINING).min(SAMPLE_PAGES as u64));
    drain(&s);
    let st = s.dict_status().unwrap();
    assert_eq!(st.trainings, 2, "{st:?}");
    check_counts(&s);
    let mut buf = vec![0u8; PAGE];
    for p in 0..n {
        s.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, page(u64::from(p >= FIRST_TRAINING), p), "page {p}");
    }
}

#[test]
fn dictionaries_need_zstd_and_a_sound_file() {
    assert!(matches!(
        store(8, "lz4").with_dict(DictSetup::Auto),
        Err(BlkError::DictNeedsZstd(_))
    ));
    let dir = std::env::temp_dir().join(format!("compfs-blk-dict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dict_of(0, 3);
    let cases: [(&str, Vec<u8>); 3] = [
        ("garbage", b"not a dictionary at all".to_vec()),
        ("truncated", good.raw()[..100].to_vec()),
        ("empty", vec![]),
    ];
    for (name, bytes) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let e = load_dict(&p, 3).unwrap_err();
        assert!(matches!(e, BlkError::DictFile { .. }), "{name}: {e}");
    }
    let p = dir.join("good");
    std::fs::write(&p, good.raw()).unwrap();
    assert_eq!(load_dict(&p, 3).unwrap().id(), good.id());
    assert!(matches!(
        load_dict(&dir.join("missing"), 3),
        Err(BlkError::Io { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64, u64, u64),
    Partial(u64, u16, u8),
    Trim(u64),
    Install(u64),
    Maintain,
    Recompress,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..32u64, 0..2u64, 0..1000u64).prop_map(|(p, k, s)| Op::Write(p, k, s)),
        1 => (0..32u64, 0..4000u16, any::<u8>()).prop_map(|(p, o, b)| Op::Partial(p, o, b)),
        1 => (0..32u64).prop_map(Op::Trim),
        1 => (0..2u64).prop_map(Op::Install),
        2 => Just(Op::Maintain),
        1 => Just(Op::Recompress),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any sequence of writes, trims, new dictionaries, background steps and
    /// recompressions reads back as the model and keeps the per-dictionary counts exact.
    #[test]
    fn store_with_dictionaries_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        let dicts = [dict_of(0, 1), dict_of(1, 1)];
        let s = store(32, "zstd:1").with_dict(DictSetup::Fixed(dict_of(0, 1))).unwrap();
        let mut model = vec![vec![0u8; PAGE]; 32];
        for o in ops {
            match o {
                Op::Write(p, k, seed) => {
                    let d = page(k, seed);
                    s.write(p * PAGE as u64, &d).unwrap();
                    model[p as usize] = d;
                }
                Op::Partial(p, off, b) => {
                    s.write(p * PAGE as u64 + u64::from(off), &[b; 7]).unwrap();
                    model[p as usize][usize::from(off)..usize::from(off) + 7].fill(b);
                }
                Op::Trim(p) => {
                    s.trim(p * PAGE as u64, PAGE as u64).unwrap();
                    model[p as usize].fill(0);
                }
                Op::Install(k) => {
                    let raw = dicts[k as usize].raw().to_vec();
                    s.dicts.as_ref().unwrap().install(Dictionary::new(raw, 1).unwrap());
                }
                Op::Maintain => {
                    s.dict_maintain().unwrap();
                }
                Op::Recompress => {
                    s.mark_idle(None);
                    s.recompress(PageKind::Idle, 0, 0).unwrap();
                }
            }
            check_counts(&s);
        }
        let mut buf = vec![0u8; PAGE];
        for (p, want) in model.iter().enumerate() {
            s.read(p as u64 * PAGE as u64, &mut buf).unwrap();
            prop_assert_eq!(&buf, want, "page {}", p);
        }
    }
}
