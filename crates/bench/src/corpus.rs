//! Benchmark inputs: the one corpus unpacker (a directory, a `.tar`, or a zstd-compressed tar)
//! and the readers of a corpus's files. No shell is involved, so any path works.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{bail, Context, Result};

/// Is `path` named like a zstd-compressed file (`.zst`, `.tzst`)?
fn is_zstd(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "zst" || e == "tzst")
}

/// Is `path` named like a tar archive (`.tar`, `.tar.zst`, `.tzst`)?
pub fn is_archive(path: &Path) -> bool {
    let name = path.to_string_lossy();
    name.ends_with(".tar") || name.ends_with(".tar.zst") || name.ends_with(".tzst")
}

/// The corpus at `src` as a directory: `src` itself when it is one, else the tar (plain or
/// zstd-compressed) unpacked into `work/corpus`.
pub fn unpack(src: &Path, work: &Path) -> Result<PathBuf> {
    let md = std::fs::metadata(src)
        .with_context(|| format!("corpus {}: no such file or directory", src.display()))?;
    if md.is_dir() {
        return Ok(src.to_path_buf());
    }
    if !md.is_file() {
        bail!(
            "corpus {} is neither a directory nor a tar file",
            src.display()
        );
    }
    let dest = work.join("corpus");
    std::fs::create_dir_all(&dest)?;
    untar(src, &dest).context("unpacking the corpus (tar must be installed)")?;
    Ok(dest)
}

/// Extracts the tar `src` (zstd-compressed when so named) into `dest` with `tar`; zstd is
/// decompressed here and streamed into tar's standard input.
fn untar(src: &Path, dest: &Path) -> Result<()> {
    let mut tar = Command::new("tar");
    tar.arg("xf").arg("-").arg("-C").arg(dest);
    tar.stdin(Stdio::piped()).stderr(Stdio::piped());
    let mut child = tar.spawn().context("cannot run tar")?;
    let fed = match child.stdin.take() {
        Some(mut stdin) => {
            let input = File::open(src).with_context(|| format!("cannot read {}", src.display()));
            input.and_then(|mut f| {
                let r = if is_zstd(src) {
                    zstd::stream::copy_decode(&mut f, &mut stdin)
                } else {
                    std::io::copy(&mut f, &mut stdin).map(|_| ())
                };
                r.and_then(|()| stdin.flush())
                    .with_context(|| format!("cannot decompress {}", src.display()))
            })
        }
        None => Ok(()),
    };
    let out = child.wait_with_output().context("waiting for tar")?;
    if !out.status.success() {
        bail!(
            "tar could not unpack {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    fed
}

/// `src` as one plain file: itself, or a `.zst` file decompressed into `dir`.
pub fn plain_file(src: &Path, dir: &Path) -> Result<PathBuf> {
    if !is_zstd(src) {
        return Ok(src.to_path_buf());
    }
    let out = dir.join("input.bin");
    let mut input = File::open(src).with_context(|| format!("cannot read {}", src.display()))?;
    let mut f = File::create(&out)?;
    zstd::stream::copy_decode(&mut input, &mut f)
        .with_context(|| format!("zstd could not unpack {}", src.display()))?;
    Ok(out)
}

/// Appends the regular files under `p` to `out`: `p` itself, or a directory's files recursively
/// in name order (symlinks and special files skipped).
pub fn list_files(p: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let md =
        std::fs::symlink_metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
    if md.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .with_context(|| format!("cannot list {}", p.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            list_files(&e, out)?;
        }
    } else if md.is_file() {
        out.push(p.to_path_buf());
    }
    Ok(())
}

/// Reads the files under `paths` (see [`list_files`]) and appends their bytes to `out`.
pub fn concatenate(paths: &[PathBuf], out: &mut Vec<u8>) -> Result<()> {
    for (_, data) in read_files(paths)? {
        out.extend_from_slice(&data);
    }
    Ok(())
}

/// The files under `paths` (see [`list_files`]) as (file name, contents).
pub fn read_files(paths: &[PathBuf]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    for p in paths {
        list_files(p, &mut files)?;
    }
    files
        .into_iter()
        .map(|f| {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let data = std::fs::read(&f).with_context(|| format!("cannot read {}", f.display()))?;
            Ok((name, data))
        })
        .collect()
}

/// Bytes in the regular files under `dir`.
pub fn tree_bytes(dir: &Path) -> Result<u64> {
    let mut files = Vec::new();
    list_files(dir, &mut files)?;
    let mut total = 0;
    for f in files {
        total += std::fs::metadata(&f)
            .with_context(|| format!("{}", f.display()))?
            .len();
    }
    Ok(total)
}

/// Compression threads for a benchmark: `threads`, else one per core.
pub fn threads_or_cores(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    })
}

/// A benchmark's work directory (removed when dropped): in `dir` when given, else in the
/// system's temporary directory, named after the benchmark `name`.
pub fn work_dir(dir: Option<&Path>, name: &str) -> Result<tempfile::TempDir> {
    match dir {
        Some(d) => tempfile::Builder::new()
            .prefix("compfs-bench-")
            .tempdir_in(d)
            .with_context(|| format!("cannot create a directory in {}", d.display())),
        None => tempfile::Builder::new()
            .prefix(&format!("compfs-bench-{name}-"))
            .tempdir()
            .context("cannot create a temporary directory"),
    }
}

/// The corpus's files in memory (an archive or directory is unpacked into `work` first); an
/// empty corpus is an error.
pub fn load(corpus: &Path, work: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let root = if corpus.is_dir() || is_archive(corpus) {
        unpack(corpus, work)?
    } else {
        corpus.to_path_buf()
    };
    let files = read_files(&[root])?;
    if files.is_empty() {
        bail!("no files in the corpus {}", corpus.display());
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of a directory whose file and directory names hold quotes and spaces.
    fn awkward_tree(root: &Path) -> PathBuf {
        let src = root.join("it's a \"corpus\"");
        std::fs::create_dir_all(src.join("sub dir")).unwrap();
        std::fs::write(src.join("a'b.txt"), b"hello").unwrap();
        std::fs::write(src.join("sub dir").join("c"), vec![7u8; 3000]).unwrap();
        src
    }

    #[test]
    fn unpacks_tar_and_tar_zst_with_quotes_in_paths() {
        let t = tempfile::tempdir().unwrap();
        let src = awkward_tree(t.path());
        let tar = t.path().join("o'dd name.tar");
        let st = Command::new("tar")
            .arg("cf")
            .arg(&tar)
            .arg("-C")
            .arg(&src)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
        let zst = t.path().join("o'dd \"name\".tar.zst");
        let mut out = File::create(&zst).unwrap();
        zstd::stream::copy_encode(File::open(&tar).unwrap(), &mut out, 3).unwrap();
        for (i, archive) in [&tar, &zst].into_iter().enumerate() {
            let work = t.path().join(format!("work '{i}'"));
            std::fs::create_dir_all(&work).unwrap();
            let dir = unpack(archive, &work).unwrap();
            assert_eq!(tree_bytes(&dir).unwrap(), 3005);
            let files = read_files(&[dir]).unwrap();
            let names: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
            assert_eq!(names, ["a'b.txt", "c"]);
        }
        // A directory is used as it is.
        assert_eq!(unpack(&src, t.path()).unwrap(), src);
    }

    #[test]
    fn a_broken_archive_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let bad = t.path().join("bad.tar.zst");
        std::fs::write(&bad, b"not zstd at all").unwrap();
        assert!(unpack(&bad, t.path()).is_err());
        assert!(unpack(&t.path().join("missing"), t.path()).is_err());
        let bad = t.path().join("bad.tar");
        std::fs::write(&bad, b"not a tar").unwrap();
        assert!(unpack(&bad, t.path()).is_err());
    }

    #[test]
    fn plain_file_decompresses_zst() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("x.bin.zst");
        std::fs::write(&f, zstd::encode_all(&b"data data"[..], 1).unwrap()).unwrap();
        let p = plain_file(&f, t.path()).unwrap();
        assert_eq!(std::fs::read(p).unwrap(), b"data data");
        let plain = t.path().join("y.bin");
        assert_eq!(plain_file(&plain, t.path()).unwrap(), plain);
    }
}
