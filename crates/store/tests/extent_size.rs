//! The `compfs.extent_size` property: validation, inheritance, the extent size of new writes
//! (fixed while a file has buffered data), and `defrag` re-chunking files to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use compfs_store::*;
use compfs_testdata::Rng;

const PROP: &[u8] = b"compfs.extent_size";

fn set(s: &Store, ino: Ino, v: &str) -> Result<()> {
    s.setxattr(ino, PROP, v.as_bytes(), XattrSet::Any)
}

fn get(s: &Store, ino: Ino) -> Option<String> {
    match s.getxattr(ino, PROP) {
        Ok(v) => Some(String::from_utf8(v).unwrap()),
        Err(Error::NoXattr) => None,
        Err(e) => panic!("{e}"),
    }
}

fn z1_store(dir: &std::path::Path) -> Store {
    let opts = CreateOptions {
        extent_size: 16384,
        compression: CodecSpec::parse("zstd:1").unwrap().spec,
        ..CreateOptions::default()
    };
    Store::create_tuned(dir, &opts, tuning()).unwrap()
}

/// Extents (distinct) and extent-map entries of one file.
fn extents(s: &Store, ino: Ino) -> (u64, u64) {
    let u = s.usage(&[ino]).unwrap();
    (u.regular_extents, u.refs)
}

#[test]
fn property_is_validated_normalised_inherited_and_removable() {
    let dir = tempfile::tempdir().unwrap();
    let s = z1_store(&dir.path().join("s"));
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    for bad in ["3K", "2K", "2M", "100000", "zstd", "-4K", "4X"] {
        assert!(
            matches!(set(&s, d, bad), Err(Error::InvalidArgument(_))),
            "{bad}"
        );
    }
    assert_eq!(get(&s, d), None);
    for (v, norm) in [
        ("65536", "64K"),
        ("1m", "1M"),
        ("4K", "4K"),
        ("32K\0", "32K"),
    ] {
        set(&s, d, v).unwrap();
        assert_eq!(get(&s, d).as_deref(), Some(norm));
    }
    // Inherited by files and directories created inside, at creation.
    let f = mkfile(&s, d, "f");
    let sub = s.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    let g = mkfile(&s, sub, "g");
    for i in [f, sub, g] {
        assert_eq!(get(&s, i).as_deref(), Some("32K"));
    }
    // Removable, and an empty value clears it too.
    s.removexattr(f, PROP).unwrap();
    assert_eq!(get(&s, f), None);
    set(&s, g, "").unwrap();
    assert_eq!(get(&s, g), None);
    // Files created after a removal inherit nothing.
    s.removexattr(d, PROP).unwrap();
    let h = mkfile(&s, d, "h");
    assert_eq!(get(&s, h), None);
}

#[test]
fn writes_use_the_extent_size_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = z1_store(&dir.path().join("s"));
    let data = pattern(300_000, 3);
    for (prop, ext) in [(None, 16384u64), (Some("4K"), 4096), (Some("64K"), 65536)] {
        let name = format!("d{ext}");
        let d = s.mkdir(ROOT_INO, name.as_bytes(), 0o755, 0, 0).unwrap().ino;
        if let Some(p) = prop {
            set(&s, d, p).unwrap();
        }
        let f = mkfile(&s, d, "f");
        // Written in pieces that do not line up with any extent size.
        for (i, c) in data.chunks(7000).enumerate() {
            s.write(f, (i * 7000) as u64, c).unwrap();
        }
        s.fsync(f, false).unwrap();
        let want = (data.len() as u64).div_ceil(ext);
        assert_eq!(extents(&s, f), (want, want), "extent size {ext}");
        assert_eq!(read_all(&s, f).unwrap(), data);
    }
    s.close().unwrap();
    assert_clean(&dir.path().join("s"));
}

/// A property change while a file has buffered data applies from the next time the file has
/// nothing buffered; extents of both sizes stay readable, also when overwritten in part.
#[test]
fn a_change_applies_once_nothing_is_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let s = z1_store(&dir.path().join("s"));
    let f = mkfile(&s, ROOT_INO, "f");
    set(&s, f, "4K").unwrap();
    let mut model = pattern(40_000, 5);
    s.write(f, 0, &model[..20_000]).unwrap();
    // Changed while 20 000 bytes are buffered in 4 KiB blocks: the buffer keeps 4 KiB.
    set(&s, f, "32K").unwrap();
    s.write(f, 20_000, &model[20_000..]).unwrap();
    assert_eq!(read_all(&s, f).unwrap(), model);
    s.fsync(f, false).unwrap();
    assert_eq!(extents(&s, f), (10, 10));
    // Nothing buffered now: the next writes use 32 KiB blocks. A small write into the 4 KiB
    // extents is laid over them; a whole rewrite replaces them by 32 KiB extents.
    let patch = pattern(3000, 6);
    s.write(f, 5000, &patch).unwrap();
    model[5000..8000].copy_from_slice(&patch);
    assert_eq!(read_all(&s, f).unwrap(), model);
    s.fsync(f, false).unwrap();
    assert_eq!(read_all(&s, f).unwrap(), model);
    let fresh = pattern(70_000, 7);
    s.write(f, 0, &fresh).unwrap();
    s.fsync(f, false).unwrap();
    assert_eq!(extents(&s, f), (3, 3));
    assert_eq!(read_all(&s, f).unwrap(), fresh);
    s.close().unwrap();
    let s = open(&dir.path().join("s"), tuning());
    assert_eq!(read_all(&s, f).unwrap(), fresh);
    s.close().unwrap();
    assert_clean(&dir.path().join("s"));
}

/// Random writes, punches, truncations and property changes against a byte model: every
/// layout of mixed extent sizes reads back right, and defrag leaves it whole.
#[test]
fn mixed_extent_sizes_match_a_byte_model() {
    let dir = tempfile::tempdir().unwrap();
    let s = z1_store(&dir.path().join("s"));
    let f = mkfile(&s, ROOT_INO, "f");
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng::new(15);
    let sizes = ["4K", "8K", "32K", "64K", ""];
    for step in 0..400 {
        match rng.below(10) {
            0 => set(&s, f, sizes[rng.below(sizes.len())]).unwrap(),
            1 => {
                let off = rng.below(300_000) as u64;
                let len = rng.below(70_000) as u64;
                s.punch_hole(f, off, len).unwrap();
                let end = ((off + len) as usize).min(model.len());
                if (off as usize) < end {
                    model[off as usize..end].fill(0);
                }
            }
            2 => {
                let size = rng.below(300_000);
                let set_size = SetAttr {
                    size: Some(size as u64),
                    ..SetAttr::default()
                };
                s.setattr(f, &set_size).unwrap();
                model.resize(size, 0);
            }
            3 => s.fsync(f, false).unwrap(),
            _ => {
                let off = rng.below(300_000);
                let len = 1 + rng.below(50_000);
                let data = if rng.below(3) == 0 {
                    random(len, step)
                } else {
                    pattern(len, step)
                };
                s.write(f, off as u64, &data).unwrap();
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
            }
        }
        if step % 25 == 0 {
            assert_eq!(read_all(&s, f).unwrap(), model, "step {step}");
        }
    }
    s.fsync(f, false).unwrap();
    assert_eq!(read_all(&s, f).unwrap(), model);
    let t = DefragTarget {
        extent_size: Some(16384),
        ..DefragTarget::default()
    };
    s.defrag(f, &t, &mut |_| {}).unwrap();
    assert_eq!(read_all(&s, f).unwrap(), model);
    let again = s.defrag(f, &t, &mut |_| {}).unwrap();
    assert_eq!(again.extents_rewritten, 0, "{again:?}");
    s.close().unwrap();
    assert_clean(&dir.path().join("s"));
}

#[test]
fn defrag_rechunks_to_the_extent_size_and_then_skips() {
    let dir = tempfile::tempdir().unwrap();
    let s = z1_store(&dir.path().join("s"));
    let f = mkfile(&s, ROOT_INO, "f");
    let r = mkfile(&s, ROOT_INO, "r");
    let data = pattern(500_000, 9);
    let noise = random(200_000, 10);
    s.write(f, 0, &data).unwrap();
    s.write(r, 0, &noise).unwrap();
    s.sync().unwrap();
    assert_eq!(extents(&s, f).0, 31);
    let keep = DefragTarget::default();
    // Same codec, level and size: nothing to do.
    for ino in [f, r] {
        assert_eq!(
            s.defrag(ino, &keep, &mut |_| {}).unwrap().extents_rewritten,
            0
        );
    }
    // The property changes the size defrag cuts to, codec and level staying the same; raw
    // extents are re-cut too.
    for (ino, len) in [(f, data.len()), (r, noise.len())] {
        set(&s, ino, "64K").unwrap();
        let rep = s.defrag(ino, &keep, &mut |_| {}).unwrap();
        assert!(rep.extents_rewritten > 0, "{rep:?}");
        let want = (len as u64).div_ceil(65536);
        assert_eq!(extents(&s, ino), (want, want));
        let again = s.defrag(ino, &keep, &mut |_| {}).unwrap();
        assert_eq!(again.extents_rewritten, 0, "{again:?}");
    }
    // --extent-size overrides the property.
    let small = DefragTarget {
        extent_size: Some(8192),
        ..DefragTarget::default()
    };
    s.defrag(f, &small, &mut |_| {}).unwrap();
    assert_eq!(extents(&s, f).0, (data.len() as u64).div_ceil(8192));
    assert_eq!(
        s.defrag(f, &small, &mut |_| {}).unwrap().extents_rewritten,
        0
    );
    // And back to the property's size, at another level: both at once.
    let z3 = DefragTarget {
        spec: Some(CodecSpec::parse("zstd:3").unwrap().spec),
        ..DefragTarget::default()
    };
    s.defrag(f, &z3, &mut |_| {}).unwrap();
    assert_eq!(extents(&s, f).0, (data.len() as u64).div_ceil(65536));
    assert!(s.usage(&[f]).unwrap().per_level.contains_key("zstd:3"));
    assert_eq!(read_all(&s, f).unwrap(), data);
    assert_eq!(read_all(&s, r).unwrap(), noise);
    s.close().unwrap();
    assert_clean(&dir.path().join("s"));
}
