//! A local S3 server for the length of a test (s3s-fs, started by `scripts/s3-local.sh` on a
//! free port, stopped when the test ends, passing or not), and a fault proxy to put between a
//! store and it.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use compfs_store::object::lease::LEASE_KEY;
use compfs_store::object::{ObjectOptions, Remote, RemoteConfig, S3Url};

pub use proxy::{FaultProxy, Faults, Retry};

/// A local S3 server (its data in a temporary directory).
pub struct Server {
    pub dir: tempfile::TempDir,
    pub settings: Vec<(String, String)>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/s3-local.sh")
}

impl Server {
    pub fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let s = Server {
            dir,
            settings: Vec::new(),
        };
        s.restart()
    }

    /// (Re)starts the server on the same data (on a new port).
    pub fn restart(mut self) -> Server {
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/s3-local.sh start failed (run `scripts/s3-local.sh install`): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.settings = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert!(self.settings.iter().any(|(k, _)| k == "AWS_ENDPOINT_URL"));
        self
    }

    pub fn stop(&self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }

    /// `host:port` the server listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        let url = &self
            .settings
            .iter()
            .find(|(k, _)| k == "AWS_ENDPOINT_URL")
            .unwrap()
            .1;
        url.trim_start_matches("http://").parse().unwrap()
    }

    pub fn options(&self, cache: &Path, cache_size: u64, deadline: Duration) -> ObjectOptions {
        ObjectOptions {
            remote: RemoteConfig {
                credentials: None,
                deadline,
                settings: self.settings.clone(),
            },
            cache_dir: Some(cache.to_path_buf()),
            cache_size,
            ..ObjectOptions::default()
        }
    }

    /// Options reaching the server through `proxy`.
    pub fn options_via(
        &self,
        proxy: &FaultProxy,
        cache: &Path,
        cache_size: u64,
        deadline: Duration,
    ) -> ObjectOptions {
        let mut o = self.options(cache, cache_size, deadline);
        for (k, v) in o.remote.settings.iter_mut() {
            if k == "AWS_ENDPOINT_URL" {
                *v = format!("http://{}", proxy.addr());
            }
        }
        o
    }

    /// The file holding object `key` of the bucket `compfs` (s3s-fs keeps objects as files).
    pub fn object_file(&self, key: &str) -> PathBuf {
        self.dir.path().join("data/compfs").join(key)
    }

    /// Objects under `prefix` in the bucket (their files in the server's directory).
    pub fn objects(&self, prefix: &str) -> Vec<PathBuf> {
        let root = self.object_file(prefix);
        let mut out = Vec::new();
        let mut todo = vec![root];
        while let Some(d) = todo.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd {
                let p = e.unwrap().path();
                if p.is_dir() {
                    todo.push(p);
                } else {
                    out.push(p);
                }
            }
        }
        out.sort();
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A writer lost without unmounting (its handle leaked, its proxy gone) still holds the store's
/// lease until it expires; another machine would wait for that and mount with `--force`. Tests
/// do not wait out a lease timeout: this removes the lost writer's lease object, which is what
/// its expiry amounts to for the next mount.
pub fn expire_lost_writer(url: &S3Url, o: &ObjectOptions) {
    let r = Remote::connect(url, &o.remote).unwrap();
    r.delete(LEASE_KEY).unwrap();
}
