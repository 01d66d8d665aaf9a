//! Small files (issue 16): the byte-granular worth-it rule, compressed and checksummed inline
//! data, and the format version they need.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use compfs_store::*;

fn store_with(dir: &std::path::Path, inline_max: u32, min_saving: MinSaving) -> Store {
    let t = Tuning {
        inline_max,
        ..tuning()
    };
    let s = create(dir, 131072, t.clone());
    s.close().unwrap();
    let o = OpenOptions {
        min_saving,
        ..OpenOptions::default()
    };
    Store::open_tuned(dir, &o, t).unwrap()
}

fn put(s: &Store, name: &[u8], data: &[u8]) -> Ino {
    let f = s
        .mknod(ROOT_INO, name, FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(f.ino, 0, data).unwrap();
    f.ino
}

/// A 3,000-byte text file in an extent: kept compressed under the byte rule (it saves bytes,
/// not a 4 KiB sector), stored raw under the sector rule; both read back exactly.
#[test]
fn byte_rule_compresses_what_the_sector_rule_stores_raw() {
    let text = pattern(3000, 16);
    let t = tempfile::tempdir().unwrap();
    for (name, rule, want_codec) in [
        ("bytes", MinSaving::Bytes(1), "zstd"),
        ("sector", MinSaving::Sectors(1), "none"),
    ] {
        let dir = t.path().join(name);
        let s = store_with(&dir, 0, rule);
        let ino = put(&s, b"f", &text);
        s.sync().unwrap();
        let u = s.usage(&[ino]).unwrap();
        assert_eq!((u.inline, u.regular_extents), (0, 1), "{name}: {u:?}");
        assert_eq!(
            u.per_codec.keys().collect::<Vec<_>>(),
            [want_codec],
            "{name}"
        );
        let disk = u.total.disk;
        if want_codec == "zstd" {
            assert!(disk < 3000, "{name}: {disk}");
        } else {
            assert_eq!(disk, 3000, "{name}");
        }
        assert_eq!(read_all(&s, ino).unwrap(), text);
        s.close().unwrap();
        let s = open(&dir, tuning());
        assert_eq!(read_all(&s, ino).unwrap(), text);
        s.close().unwrap();
        let r = fsck(&dir, false, &mut |_, _| {}).unwrap();
        assert!(r.is_clean(), "{name}: {:#?}", r.problems);
    }
}
