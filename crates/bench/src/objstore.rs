//! `compfs bench fs --object-store s3://BUCKET/PREFIX`: the copy and cold-read workloads of
//! `bench fs` on a store in a bucket (the server named by the `AWS_*` variables, e.g. the local
//! one of `scripts/s3-local.sh`) against the same store on the local disk, in one run: copy of
//! N corpus copies + `sync DIR` (MB/s), cold read from an empty cache directory (MB/s), ratio,
//! and the PUT and GET requests per GiB written and read (what a cloud bill counts). With
//! `rclone` installed, the peer row: rclone's `compress` remote copying the corpus to the same
//! server.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use compfs_codec::{human, CodecSpec, Mode};
use compfs_store::{CreateOptions, Store};

use crate::error::{bail, Context, Result};
use crate::fs::{compfs_ratio, drop_caches, full_sync, read_all, run_tool, CompfsMount};

/// One row of the object-store table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ObjRow {
    pub target: String,
    pub write_mbs: f64,
    pub read_mbs: f64,
    pub ratio: f64,
    pub puts_per_gib: f64,
    pub gets_per_gib: f64,
}

/// Requests a mount left in its cache directory
/// ([`compfs_store::object::write_request_counts`]).
fn requests(cache_dir: &Path) -> Result<(u64, u64)> {
    let s = std::fs::read_to_string(cache_dir.join(compfs_store::object::REQUESTS_FILE))
        .with_context(|| format!("no request counts in {}", cache_dir.display()))?;
    let w: Vec<&str> = s.split_whitespace().collect();
    let get = |k: &str| -> u64 {
        w.iter()
            .position(|x| *x == k)
            .and_then(|i| w.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok((get("puts"), get("gets")))
}

fn copy_in(corpus: &Path, mnt: &Path, copies: u32) -> Result<f64> {
    let t = Instant::now();
    for i in 0..copies {
        run_tool(
            Command::new("cp")
                .arg("-r")
                .arg(corpus)
                .arg(mnt.join(format!("copy{i}"))),
        )?;
    }
    full_sync(mnt)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Copy, unmount, cold read through a mount of `store` (a directory or an s3:// URL);
/// `opts(i)` gives the mount options of the i-th mount (0: copy, 1: read).
fn measure(
    store: &Path,
    mnt: &Path,
    corpus: &Path,
    bytes: u64,
    copies: u32,
    opts: impl Fn(u32) -> String,
) -> Result<(f64, f64, f64)> {
    let m = CompfsMount::new(store, mnt, &opts(0))?;
    let w = copy_in(corpus, mnt, copies)?;
    let (ratio, _) = compfs_ratio(mnt)?;
    m.unmount()?;
    drop_caches();
    let m = CompfsMount::new(store, mnt, &opts(1))?;
    let r = read_all(mnt)?;
    m.unmount()?;
    let mb = bytes as f64 / 1e6;
    Ok((mb / w, mb / r, ratio))
}

/// Runs the object-store rows; `url` names the bucket and prefix (a fresh sub-prefix is used).
pub fn run(
    url: &str,
    work: &Path,
    corpus: &Path,
    corpus_bytes: u64,
    copies: u32,
    method: &str,
) -> Result<Vec<ObjRow>> {
    if std::env::var_os("AWS_ENDPOINT_URL").is_none() {
        eprintln!(
            "warning: AWS_ENDPOINT_URL is not set (for a local server: eval \"$(scripts/s3-local.sh start DIR)\")"
        );
    }
    let spec = CodecSpec::parse(method)
        .map_err(|e| crate::error::failed!("{method}: {e}"))?
        .spec;
    let bytes = corpus_bytes * copies as u64;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let mnt = work.join("mnt-s3");
    std::fs::create_dir_all(&mnt)?;
    let mut rows = Vec::new();

    // The same store on the local disk.
    let local = work.join("store-local");
    let opts = CreateOptions {
        compression: spec,
        mode: Mode::Force,
        ..CreateOptions::default()
    };
    Store::create(&local, &opts)?.close()?;
    let o = format!("compress-force={method}");
    let (w, r, ratio) = measure(&local, &mnt, corpus, bytes, copies, |_| o.clone())?;
    rows.push(ObjRow {
        target: "local disk".into(),
        write_mbs: w,
        read_mbs: r,
        ratio,
        puts_per_gib: 0.0,
        gets_per_gib: 0.0,
    });
    std::fs::remove_dir_all(&local)?;

    // In the bucket: copy with one cache directory, cold read from an empty one.
    let target = format!("{}/bench-{}", url.trim_end_matches('/'), std::process::id());
    let exe = std::env::current_exe()?;
    run_tool(
        Command::new(&exe)
            .args(["mkfs", &target, "--compress-force", method])
            .arg("--force"),
    )?;
    let caches: Vec<PathBuf> = (0..2).map(|i| work.join(format!("cache{i}"))).collect();
    let store = PathBuf::from(&target);
    let (w, r, ratio) = measure(&store, &mnt, corpus, bytes, copies, |i| {
        format!(
            "compress-force={method},cache_dir={},cache_size=1G",
            caches[i as usize].display()
        )
    })?;
    let (puts, _) = requests(&caches[0])?;
    let (_, gets) = requests(&caches[1])?;
    rows.push(ObjRow {
        target: format!("bucket ({target})"),
        write_mbs: w,
        read_mbs: r,
        ratio,
        puts_per_gib: puts as f64 / gib,
        gets_per_gib: gets as f64 / gib,
    });

    // The peer: rclone's compress remote over the same server.
    match rclone_row(corpus, corpus_bytes, url, work) {
        Ok(Some(row)) => rows.push(row),
        Ok(None) => eprintln!("rclone not installed (scripts/deps.sh installs it): no peer row"),
        Err(e) => eprintln!("rclone row failed: {e}"),
    }
    print_rows(&rows, copies, human(bytes));
    Ok(rows)
}

/// Bucket and key prefix of an `s3://BUCKET/PREFIX` URL.
fn bucket_and_prefix(url: &str) -> (&str, &str) {
    let rest = url.trim_start_matches("s3://").trim_matches('/');
    rest.split_once('/').unwrap_or((rest, ""))
}

/// The rclone filter selecting every object under `prefix` when the bucket's root is listed.
fn include_filter(prefix: &str) -> String {
    format!("/{}/**", prefix.trim_matches('/'))
}

fn rclone_row(corpus: &Path, corpus_bytes: u64, url: &str, work: &Path) -> Result<Option<ObjRow>> {
    if Command::new("rclone").arg("version").output().is_err() {
        return Ok(None);
    }
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let (bucket, prefix) = bucket_and_prefix(url);
    let prefix = format!("{prefix}/rclone-{}", std::process::id());
    let prefix = prefix.trim_start_matches('/');
    let rclone = || {
        let mut c = Command::new("rclone");
        // A CA bundle of the environment makes rclone's S3 client refuse its own transport;
        // the endpoint is plain HTTP anyway.
        c.env_remove("AWS_CA_BUNDLE")
            .env("RCLONE_CONFIG_S3_TYPE", "s3")
            .env("RCLONE_CONFIG_S3_PROVIDER", "Other")
            .env("RCLONE_CONFIG_S3_ENDPOINT", env("AWS_ENDPOINT_URL"))
            .env("RCLONE_CONFIG_S3_ACCESS_KEY_ID", env("AWS_ACCESS_KEY_ID"))
            .env(
                "RCLONE_CONFIG_S3_SECRET_ACCESS_KEY",
                env("AWS_SECRET_ACCESS_KEY"),
            )
            .env("RCLONE_CONFIG_S3_REGION", env("AWS_REGION"))
            .env("RCLONE_CONFIG_S3_FORCE_PATH_STYLE", "true")
            .env("RCLONE_CONFIG_COMP_TYPE", "compress")
            .env("RCLONE_CONFIG_COMP_REMOTE", format!("s3:{bucket}"))
            .arg("-q");
        c
    };
    let t = Instant::now();
    let st = rclone()
        .arg("copy")
        .arg(corpus)
        .arg(format!("comp:{prefix}"))
        .status()
        .context("rclone copy")?;
    if !st.success() {
        bail!("rclone copy failed: {st}");
    }
    let write_secs = t.elapsed().as_secs_f64();
    // The stored bytes: objects and rclone's metadata files. The compress remote wraps the
    // bucket's root, and reads list it with a filter, because s3s-fs answers a HEAD of a key
    // that is a directory on its disk with 500, which rclone retries for minutes before it
    // lists `s3:BUCKET/PREFIX` (and then finds nothing to size).
    let out = rclone()
        .args(["size", "--json", &format!("s3:{bucket}")])
        .args(["--include", &include_filter(prefix)])
        .output()
        .context("rclone size")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let stored = v["bytes"].as_u64().unwrap_or(0);
    if stored == 0 {
        eprintln!("rclone size s3:{bucket} found no objects under {prefix}: ratio unknown");
    }
    // Cold read: the page cache dropped (the server's files too), then rclone copies the
    // corpus back out of its compress remote, decompressing it.
    let back = work.join("rclone-read");
    let _ = std::fs::remove_dir_all(&back);
    drop_caches();
    let t = Instant::now();
    let st = rclone()
        .arg("copy")
        .arg("comp:")
        .arg(&back)
        .args(["--include", &include_filter(prefix)])
        .status()
        .context("rclone copy back")?;
    let read_secs = t.elapsed().as_secs_f64();
    let got = crate::corpus::tree_bytes(&back);
    let _ = std::fs::remove_dir_all(&back);
    if !st.success() {
        bail!("rclone copy back failed: {st}");
    }
    let got = got?;
    if got != corpus_bytes {
        bail!("rclone copied back {got} bytes of the corpus's {corpus_bytes}");
    }
    let mb = corpus_bytes as f64 / 1e6;
    Ok(Some(ObjRow {
        target: "rclone compress remote (gzip), 1 copy".into(),
        write_mbs: mb / write_secs,
        read_mbs: mb / read_secs,
        ratio: if stored == 0 {
            f64::NAN
        } else {
            corpus_bytes as f64 / stored as f64
        },
        puts_per_gib: 0.0,
        gets_per_gib: 0.0,
    }))
}

fn print_rows(rows: &[ObjRow], copies: u32, total: String) {
    println!("object store ({copies} corpus copies, {total}):");
    println!(
        "{:<44} {:>9} {:>9} {:>7} {:>10} {:>10}",
        "target", "write MB/s", "read MB/s", "ratio", "PUT/GiB", "GET/GiB"
    );
    for r in rows {
        println!(
            "{:<44} {:>9.1} {:>9.1} {:>7.2} {:>10.0} {:>10.0}",
            r.target, r.write_mbs, r.read_mbs, r.ratio, r.puts_per_gib, r.gets_per_gib
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_bucket_and_prefix() {
        assert_eq!(bucket_and_prefix("s3://compfs/b"), ("compfs", "b"));
        assert_eq!(bucket_and_prefix("s3://compfs/a/b/"), ("compfs", "a/b"));
        assert_eq!(bucket_and_prefix("s3://compfs"), ("compfs", ""));
        assert_eq!(include_filter("b/rclone-7"), "/b/rclone-7/**");
        assert_eq!(include_filter("/b/"), "/b/**");
    }
}
