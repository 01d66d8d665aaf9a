//! `compfs bench fs --small-files`: a tree of small text files and a generated one, on compfs and
//! kernel btrfs; checks the JSON rows against what the test wrote. Needs root and FUSE (CI has
//! both).
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use fs_common::*;

/// Text with repeated words, so every file compresses.
fn text(seed: u32, lines: u32) -> String {
    (0..lines)
        .map(|i| {
            format!(
                "line {} of the {seed} text, words words words\n",
                i * 7 % 1000
            )
        })
        .collect()
}

#[test]
fn small_file_rows_on_compfs_and_btrfs() {
    require_fuse!();
    let t = TempDir::new("smallrows");
    let corpus = t.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    for (i, name) in ["dickens", "xml", "reymont"].iter().enumerate() {
        std::fs::write(corpus.join(name), text(i as u32, 600)).unwrap();
    }
    let tree = t.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let mut bytes = 0;
    for i in 0..150u32 {
        let body = text(i, 20 + i % 50);
        bytes += body.len() as u64;
        let dir = if i % 2 == 0 { "sub" } else { "" };
        std::fs::write(tree.join(dir).join(format!("f{i}")), body).unwrap();
    }
    let json = t.path().join("rows.json");
    let work = t.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let trees = format!("{},gen:300", tree.display());
    let (ok, out, err) = compfs(&[
        "bench",
        "fs",
        "--corpus",
        corpus.to_str().unwrap(),
        "--small-files",
        &trees,
        "--small-files-vs",
        "dict=nopack",
        "--json",
        json.to_str().unwrap(),
        "--workdir",
        work.to_str().unwrap(),
    ]);
    assert!(
        ok,
        "bench fs --small-files failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v.as_array().unwrap();
    // Each tree: the default row, then the `--small-files-vs` one beside the same btrfs.
    assert_eq!(rows.len(), 4, "{out}");
    assert_eq!(rows[0]["files"], 150);
    assert_eq!(rows[0]["bytes"], bytes);
    assert_eq!(rows[0]["compfs_options"], "compress=zstd:3");
    assert_eq!(rows[1]["files"], 150);
    assert_eq!(rows[1]["compfs_options"], "compress=zstd:3,dict=nopack");
    assert_eq!(rows[1]["btrfs_bytes"], rows[0]["btrfs_bytes"]);
    assert_eq!(rows[2]["files"], 300);
    assert_eq!(rows[2]["tree"], "300 generated text files");
    assert_eq!(rows[3]["tree"], "300 generated text files [dict=nopack]");
    assert_eq!(rows[3]["zstd3_bytes"], rows[2]["zstd3_bytes"]);
    for r in rows {
        let n = |k: &str| r[k].as_u64().unwrap();
        let f = |k: &str| r[k].as_f64().unwrap();
        // Repetitive text: each file alone compresses, and both file systems hold something.
        assert!(n("zstd3_bytes") > 0 && n("zstd3_bytes") < n("bytes"), "{r}");
        assert!(n("compfs_bytes") > 0 && n("btrfs_bytes") > 0, "{r}");
        assert!(
            n("compfs_bytes") >= n("compfs_segments") + n("compfs_meta"),
            "{r}"
        );
        assert!(n("compfs_meta") > 0, "{r}");
        for k in [
            "compfs_copy_secs",
            "compfs_read_secs",
            "btrfs_copy_secs",
            "btrfs_read_secs",
        ] {
            assert!(f(k) > 0.0, "{k}: {r}");
        }
    }
    assert!(out.contains("300 generated text files"), "{out}");
    // Nothing is left mounted or behind in the work directory.
    let left: Vec<_> = std::fs::read_dir(&work).unwrap().collect();
    assert!(left.is_empty(), "left in the work directory: {left:?}");
}
