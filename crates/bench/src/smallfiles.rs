//! `compfs bench fs --small-files`: issue 16's small-file rows. Each tree is copied with
//! `cp -r` onto a fresh compfs store and onto kernel btrfs (loop image), both mounted with
//! `compress=zstd:3`, then synced; the sizes compared are what each file system spends on disk
//! (compfs: the store directory after unmount, segments plus `meta.redb`; btrfs: the `df` used
//! delta, metadata included, as the issue measures it) and the sum of each file compressed
//! alone at zstd level 3 in a frame like the `zstd -3` command's (content size and checksum).
//! Each file system is then mounted again with cold caches for `tar cf - . | cat`.
//!
//! A tree is a directory, or `gen:N`: N files of 500–5,000 bytes of text cut at line starts
//! from the corpus's text members (dickens, xml, reymont), 1,000 per directory, from a fixed
//! seed (the shape of `scripts/smallfiles.py`; not byte-identical to it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use compfs_store::{CreateOptions, Store};
use serde::Serialize;

use crate::error::{bail, failed, Context, Result};
use crate::mounts::{
    df_used, drop_caches, full_sync, is_root, mkfs_btrfs, read_all, run_tool, CompfsMount,
    KernelMount,
};

/// The trees measured when `--small-files` names none.
pub const DEFAULT_TREES: &str = "/usr/include,/usr/share/doc,gen:100000";

/// One tree on both file systems.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SmallRow {
    pub tree: String,
    /// compfs's mount options (`compress=zstd:3`, plus the `--small-files-vs` ones of an extra
    /// row).
    pub compfs_options: String,
    pub files: u64,
    pub bytes: u64,
    /// The store directory after unmount (apparent sizes of its files).
    pub compfs_bytes: u64,
    pub compfs_segments: u64,
    pub compfs_meta: u64,
    pub compfs_copy_secs: f64,
    pub compfs_read_secs: f64,
    /// `df` used after the copy and sync, minus before.
    pub btrfs_bytes: u64,
    pub btrfs_copy_secs: f64,
    pub btrfs_read_secs: f64,
    /// Each file compressed alone at zstd:3 (`zstd -3` frames).
    pub zstd3_bytes: u64,
}

impl SmallRow {
    fn vs_btrfs(&self) -> f64 {
        self.compfs_bytes as f64 / self.btrfs_bytes.max(1) as f64
    }
    fn vs_zstd(&self) -> f64 {
        self.compfs_bytes as f64 / self.zstd3_bytes.max(1) as f64
    }
}

/// What a `--small-files` entry names.
#[derive(Debug, PartialEq)]
enum Tree {
    Dir(PathBuf),
    Generated(u64),
}

fn parse_tree(s: &str) -> Result<Tree> {
    match s.strip_prefix("gen:") {
        Some(n) => match n.parse::<u64>() {
            Ok(n) if (1..=10_000_000).contains(&n) => Ok(Tree::Generated(n)),
            _ => bail!("--small-files: gen:N takes a file count from 1 to 10000000, not {n:?}"),
        },
        None if s.is_empty() => bail!("--small-files: an empty tree name"),
        None => Ok(Tree::Dir(PathBuf::from(s))),
    }
}

/// SplitMix64: a fixed, portable sequence for the generated tree.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi` (the modulo bias is irrelevant at these sizes).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Where file `i` of a generated tree starts and ends in `text`: a random line start, 500 to
/// 5,000 bytes long (shorter at the end of the text). Pure, so the tree is the same every run.
fn cut(text: &[u8], rng: &mut Rng) -> (usize, usize) {
    let size = rng.range(500, 5000) as usize;
    let from = rng.range(0, text.len().saturating_sub(6000) as u64) as usize;
    let start = text[from..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(from, |p| from + p + 1);
    (start, (start + size).min(text.len()))
}

/// Writes the generated tree of `n` files under `out` from the corpus's text members.
fn generate(corpus: &Path, out: &Path, n: u64) -> Result<()> {
    let mut text = Vec::new();
    for name in ["dickens", "xml", "reymont"] {
        let p = find_file(corpus, name)?
            .ok_or_else(|| failed!("gen:N needs the corpus's {name} (Silesia), not found"))?;
        text.extend(std::fs::read(&p)?);
    }
    if text.len() < 12_000 {
        bail!("the corpus's text members are too short for gen:N");
    }
    let mut rng = Rng(16);
    for i in 0..n {
        let d = out.join(format!("d{:03}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        let (s, e) = cut(&text, &mut rng);
        std::fs::write(d.join(format!("f{i:05}.txt")), &text[s..e])?;
    }
    Ok(())
}

/// The first file named `name` below `dir`.
fn find_file(dir: &Path, name: &str) -> Result<Option<PathBuf>> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_file() && e.file_name() == name {
            return Ok(Some(e.path()));
        }
        if t.is_dir() {
            if let Some(p) = find_file(&e.path(), name)? {
                return Ok(Some(p));
            }
        }
    }
    Ok(None)
}

/// Files, bytes and the sum of `zstd -3` frames of the regular files below `dir` (symbolic
/// links and special files are not followed; unreadable files are skipped, as `cp -r` would
/// fail on them and the bench reports that).
fn tree_sizes(dir: &Path) -> Result<(u64, u64, u64)> {
    let mut c = zstd::bulk::Compressor::new(3)?;
    c.include_checksum(true)?;
    let (mut files, mut bytes, mut z) = (0u64, 0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let data = std::fs::read(e.path())?;
                files += 1;
                bytes += data.len() as u64;
                z += c.compress(&data)?.len() as u64;
            }
        }
    }
    Ok((files, bytes, z))
}

/// Apparent size of every file below `p`.
fn dir_bytes(p: &Path) -> Result<u64> {
    let mut sum = 0;
    if p.is_file() {
        return Ok(std::fs::metadata(p)?.len());
    }
    for e in std::fs::read_dir(p)? {
        let e = e?;
        let m = e.metadata()?;
        sum += if m.is_dir() {
            dir_bytes(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(sum)
}

fn copy_tree(src: &Path, mnt: &Path) -> Result<f64> {
    let t = Instant::now();
    run_tool(Command::new("cp").arg("-r").arg(src).arg(mnt.join("t")))?;
    full_sync(mnt)?;
    Ok(t.elapsed().as_secs_f64())
}

/// The compfs columns of `row`: `tree` copied onto a fresh store mounted with `options`.
fn measure_compfs(tree: &Path, work: &Path, options: &str, row: &mut SmallRow) -> Result<()> {
    let mnt = work.join("mnt");
    let store = work.join("store");
    if store.exists() {
        std::fs::remove_dir_all(&store)?;
    }
    Store::create(&store, &CreateOptions::default())?.close()?;
    let m = CompfsMount::new(&store, &mnt, options)?;
    row.compfs_options = options.to_string();
    row.compfs_copy_secs = copy_tree(tree, &mnt)?;
    m.unmount()?;
    row.compfs_bytes = dir_bytes(&store)?;
    row.compfs_segments = dir_bytes(&store.join("segments"))?;
    row.compfs_meta = dir_bytes(&store.join("meta.redb"))?;
    drop_caches();
    let m = CompfsMount::new(&store, &mnt, "")?;
    row.compfs_read_secs = read_all(&mnt)?;
    m.unmount()?;
    std::fs::remove_dir_all(&store)?;
    Ok(())
}

/// The rows of one tree: compfs with `compress=zstd:3`, then one row per `vs` entry (those
/// options added), each beside the same btrfs and `zstd -3` figures.
fn measure(tree: &Path, label: &str, work: &Path, vs: &[String]) -> Result<Vec<SmallRow>> {
    let (files, bytes, zstd3_bytes) = tree_sizes(tree)?;
    let mut row = SmallRow {
        tree: label.into(),
        files,
        bytes,
        zstd3_bytes,
        ..SmallRow::default()
    };
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt)?;
    measure_compfs(tree, work, "compress=zstd:3", &mut row)?;
    let mut extra = Vec::new();
    for o in vs {
        let mut r = SmallRow {
            tree: format!("{label} [{o}]"),
            ..row.clone()
        };
        measure_compfs(tree, work, &format!("compress=zstd:3,{o}"), &mut r)?;
        extra.push(r);
    }
    // btrfs
    let img = work.join("btrfs.img");
    mkfs_btrfs(&img, (bytes * 3).max(4 << 30))?;
    let m = KernelMount::new("btrfs", &img, &mnt, "compress=zstd:3")?;
    let before = df_used(&mnt);
    row.btrfs_copy_secs = copy_tree(tree, &mnt)?;
    row.btrfs_bytes = df_used(&mnt).saturating_sub(before);
    m.unmount()?;
    drop_caches();
    let m = KernelMount::new("btrfs", &img, &mnt, "")?;
    row.btrfs_read_secs = read_all(&mnt)?;
    m.unmount()?;
    std::fs::remove_file(&img)?;
    let mut rows = vec![row.clone()];
    for mut r in extra {
        r.btrfs_bytes = row.btrfs_bytes;
        r.btrfs_copy_secs = row.btrfs_copy_secs;
        r.btrfs_read_secs = row.btrfs_read_secs;
        rows.push(r);
    }
    Ok(rows)
}

/// Runs the small-file rows for the comma-separated `trees`; `vs`: more compfs mount options,
/// each measured as a row of its own beside the default one (a before/after in one run).
pub fn run(trees: &str, corpus: &Path, work: &Path, vs: &[String]) -> Result<Vec<SmallRow>> {
    if !is_root() {
        bail!("--small-files needs root (kernel btrfs on a loop device, dropping caches)");
    }
    let parsed = trees
        .split(',')
        .map(|t| parse_tree(t.trim()))
        .collect::<Result<Vec<_>>>()?;
    let mut rows = Vec::new();
    for (t, name) in parsed.iter().zip(trees.split(',')) {
        let name = name.trim();
        let (dir, label) = match t {
            Tree::Dir(d) => (d.clone(), name.to_string()),
            Tree::Generated(n) => {
                let out = work.join(format!("gen{n}"));
                generate(corpus, &out, *n)
                    .with_context(|| format!("generating {n} small files"))?;
                (out, format!("{n} generated text files"))
            }
        };
        if !dir.is_dir() {
            bail!("--small-files: {} is not a directory", dir.display());
        }
        eprintln!("small files: {label} ...");
        let r = measure(&dir, &label, work, vs)?;
        if matches!(t, Tree::Generated(_)) {
            std::fs::remove_dir_all(&dir)?;
        }
        rows.extend(r);
    }
    print_table(&rows);
    Ok(rows)
}

fn print_table(rows: &[SmallRow]) {
    println!(
        "{:<28} {:>7} {:>7} | {:>8} {:>7} {:>6} | {:>8} {:>8} | {:>6} {:>6} | {:>7} {:>7} | {:>7} {:>7}",
        "tree", "files", "MB", "compfs", "meta", "segs", "btrfs", "zstd -3", "c/bt", "c/z", "cp cf", "cp bt", "rd cf", "rd bt"
    );
    for r in rows {
        let mb = |b: u64| b as f64 / 1e6;
        println!(
            "{:<28} {:>7} {:>7.1} | {:>8.1} {:>7.1} {:>6.1} | {:>8.1} {:>8.1} | {:>5.3}x {:>5.3}x | {:>7.2} {:>7.2} | {:>7.2} {:>7.2}",
            r.tree,
            r.files,
            mb(r.bytes),
            mb(r.compfs_bytes),
            mb(r.compfs_meta),
            mb(r.compfs_segments),
            mb(r.btrfs_bytes),
            mb(r.zstd3_bytes),
            r.vs_btrfs(),
            r.vs_zstd(),
            r.compfs_copy_secs,
            r.btrfs_copy_secs,
            r.compfs_read_secs,
            r.btrfs_read_secs,
        );
    }
    println!(
        "(MB = 10^6 bytes; compfs = store directory after unmount, meta = meta.redb, segs = segments; \
         btrfs = df used delta; zstd -3 = each file compressed alone; c/bt, c/z = compfs over them; \
         cp = cp -r + sync s, rd = cold tar c | cat s; targets: c/bt <= 0.5 and c/z <= 1.0 for \
         source and documentation trees, c/bt <= 0.35 for 100,000 small text files)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_parse() {
        assert_eq!(parse_tree("gen:10").unwrap(), Tree::Generated(10));
        assert_eq!(
            parse_tree("/usr/include").unwrap(),
            Tree::Dir("/usr/include".into())
        );
        assert!(parse_tree("gen:0").is_err());
        assert!(parse_tree("gen:x").is_err());
        assert!(parse_tree("").is_err());
    }

    #[test]
    fn cuts_start_at_lines_and_stay_in_the_text() {
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let mut rng = Rng(16);
        for _ in 0..1000 {
            let (s, e) = cut(&text, &mut rng);
            assert!(s < e && e <= text.len());
            assert!(s == 0 || text[s - 1] == b'\n');
            assert!((1..=5000).contains(&(e - s)));
        }
        // The same seed, the same tree.
        let (mut a, mut b) = (Rng(16), Rng(16));
        assert_eq!(cut(&text, &mut a), cut(&text, &mut b));
    }

    #[test]
    fn sizes_count_files_and_zstd_frames() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("a"), b"hello hello hello hello").unwrap();
        std::fs::write(d.path().join("sub/b"), vec![7u8; 10_000]).unwrap();
        let (files, bytes, z) = tree_sizes(d.path()).unwrap();
        assert_eq!((files, bytes), (2, 23 + 10_000));
        // Frames with a checksum: header, block and the 4-byte checksum each, far below 10 KB.
        assert!(z > 2 * 12 && z < 200, "{z}");
    }
}
