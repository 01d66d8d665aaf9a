//! Several processes writing, reading and renaming in one tree at once; contents verified.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::fs;
use std::process::Command;

use compfs_store::Mode;
use fs_common::*;

/// What `seq FROM 20000` prints.
fn seq_output(from: u32) -> Vec<u8> {
    let mut s = String::new();
    for i in from..=20000 {
        s.push_str(&i.to_string());
        s.push('\n');
    }
    s.into_bytes()
}

#[test]
fn processes_write_read_rename_concurrently() {
    require_fuse!();
    let t = TempDir::new("conc");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "compress=zstd:1");
    let root = m.path("work");
    fs::create_dir(&root).unwrap();
    let writers = 4;
    let files = 40;
    let mut procs = Vec::new();
    for w in 0..writers {
        // Each writer creates files through a temp name and renames them into place, appends a
        // log line, and moves files between two subdirectories.
        let script = format!(
            "set -e; cd '{root}'; mkdir -p w{w}/a w{w}/b; \
             for i in $(seq 1 {files}); do \
               seq $i 20000 > w{w}/a/.tmp$i; mv w{w}/a/.tmp$i w{w}/a/f$i; \
               echo w{w}-$i >> shared.log; \
               if [ $((i % 3)) -eq 0 ]; then mv w{w}/a/f$i w{w}/b/f$i; fi; \
             done",
            root = root.display()
        );
        procs.push(Command::new("sh").arg("-c").arg(script).spawn().unwrap());
    }
    for _ in 0..2 {
        // Readers stream whatever exists meanwhile.
        let script = format!(
            "cd '{root}'; for k in $(seq 1 30); do cat w*/a/f* w*/b/f* > /dev/null 2>&1 || true; ls -lR > /dev/null 2>&1 || true; done",
            root = root.display()
        );
        procs.push(Command::new("sh").arg("-c").arg(script).spawn().unwrap());
    }
    for mut p in procs {
        assert!(p.wait().unwrap().success());
    }
    let check = |root: &std::path::Path| {
        for w in 0..writers {
            for i in 1..=files {
                let sub = if i % 3 == 0 { "b" } else { "a" };
                let p = root.join(format!("w{w}/{sub}/f{i}"));
                assert_eq!(fs::read(&p).unwrap(), seq_output(i), "{}", p.display());
                let other = root.join(format!("w{w}/{}/f{i}", if sub == "a" { "b" } else { "a" }));
                assert!(!other.exists());
            }
            assert!(!root.join(format!("w{w}/a/.tmp1")).exists());
        }
        let log = fs::read_to_string(root.join("shared.log")).unwrap();
        let mut lines: Vec<&str> = log.lines().collect();
        assert_eq!(
            lines.len(),
            writers * files as usize,
            "appends lost or torn"
        );
        lines.sort();
        lines.dedup();
        assert_eq!(lines.len(), writers * files as usize);
    };
    check(&root);
    let (store_dir, mnt) = (m.store.clone(), m.mnt.clone());
    assert!(m.unmount().success());
    let m = Mount::new(&store_dir, &mnt, "");
    check(&m.path("work"));
}
