//! The connection to a bucket: blocking calls over the `object_store` crate's S3 client (its
//! own retries with backoff for timeouts, resets and 5xx answers, bounded by a deadline), with
//! request and byte counters.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjPath;
use object_store::{
    ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    UpdateVersion,
};

use crate::error::{Error, Result};

/// `s3://BUCKET/PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    /// Key prefix without leading or trailing slashes (may be empty).
    pub prefix: String,
}

impl S3Url {
    /// Whether `s` names an object store (`s3://…`) rather than a directory.
    pub fn is_s3(s: &str) -> bool {
        s.starts_with("s3://")
    }

    /// The `s3://…` URL the path `p` names, if it names one (an error if it is a malformed
    /// one).
    pub fn from_path(p: &Path) -> Result<Option<S3Url>> {
        match p.to_str() {
            Some(s) if S3Url::is_s3(s) => S3Url::parse(s).map(Some),
            _ => Ok(None),
        }
    }

    pub fn parse(s: &str) -> Result<S3Url> {
        let bad =
            |why: &str| Error::InvalidArgument(format!("{s}: {why} (want s3://BUCKET/PREFIX)"));
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3:// URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
            && !prefix.is_empty()
        {
            return Err(bad("empty, . or .. component in the prefix"));
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            prefix,
        })
    }

    /// The default cache directory of this store: under `/var/cache/compfs/` for root,
    /// `$XDG_CACHE_HOME/compfs/` (or `~/.cache/compfs/`) otherwise.
    pub fn default_cache_dir(&self) -> PathBuf {
        let root = if rustix::process::geteuid().is_root() {
            PathBuf::from("/var/cache/compfs")
        } else if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
            PathBuf::from(x).join("compfs")
        } else {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
                .join(".cache/compfs")
        };
        let esc = |s: &str| s.replace('%', "%25").replace('/', "%2F");
        let p = if self.prefix.is_empty() {
            "%2F".to_string()
        } else {
            esc(&self.prefix)
        };
        root.join(esc(&self.bucket)).join(p)
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// How to reach the bucket.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// A file of `key = value` lines (`aws_access_key_id`, `aws_secret_access_key`,
    /// `aws_endpoint_url`, `aws_region`, `aws_allow_http`, ...), refused unless private to its
    /// owner; the environment's `AWS_*` variables apply otherwise.
    pub credentials: Option<PathBuf>,
    /// How long a request is retried (timeouts, resets, 5xx) before it fails with EIO.
    pub deadline: Duration,
    /// Settings applied after the environment and the credentials file, as in a
    /// credentials file (tests point the store at their own server this way).
    pub settings: Vec<(String, String)>,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            credentials: None,
            deadline: Duration::from_secs(60),
            settings: Vec::new(),
        }
    }
}

/// Requests and bytes sent to the bucket.
#[derive(Debug, Default)]
pub struct RemoteStats {
    pub puts: AtomicU64,
    pub gets: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub put_bytes: AtomicU64,
    pub get_bytes: AtomicU64,
}

/// A snapshot of [`RemoteStats`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RemoteCounts {
    pub puts: u64,
    pub gets: u64,
    pub lists: u64,
    pub deletes: u64,
    pub put_bytes: u64,
    pub get_bytes: u64,
}

/// One store's bucket and prefix.
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    pub url: S3Url,
    rt: tokio::runtime::Runtime,
    pub stats: RemoteStats,
    /// How long a failing request is retried ([`RemoteConfig::deadline`]).
    deadline: Duration,
    /// The writer's lease (set once a read-write open took it): every PUT and DELETE but
    /// those of the lease object itself fails once the lease is lost or its renewal is late.
    gate: std::sync::OnceLock<Arc<super::lease::Gate>>,
}

/// The outcome of a conditional PUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CondPut {
    /// Written; the object's new version (e-tag).
    Done(UpdateVersion),
    /// The condition failed: the object exists (create) or changed (update).
    Conflict,
}

/// Reads a credentials file after checking that only its owner (us) can read it.
fn read_credentials(p: &Path) -> Result<Vec<(String, String)>> {
    let m = std::fs::metadata(p)?;
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(Error::InvalidArgument(format!(
            "credentials file {} must be owned by uid {me} and private to it (chmod 600); it is \
             owned by {} with mode {:o}",
            p.display(),
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    parse_credentials(&std::fs::read_to_string(p)?).map_err(Error::InvalidArgument)
}

/// `key = value` lines (or `KEY=value`, `export KEY=value`); `#` comments and `[section]`
/// lines skipped. Keys are lowercased.
pub fn parse_credentials(text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') || l.starts_with('[') {
            continue;
        }
        let l = l.strip_prefix("export ").unwrap_or(l);
        let Some((k, v)) = l.split_once('=') else {
            return Err(format!("credentials line {}: no '='", n + 1));
        };
        let v = v.trim().trim_matches('"').trim_matches('\'');
        out.push((k.trim().to_ascii_lowercase(), v.to_string()));
    }
    Ok(out)
}

fn io_err(e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, e),
        // Everything else is EIO for the store (`Error::errno`).
        e => io::Error::other(e),
    }
}

impl Remote {
    /// Connects to the bucket of `url` (no request is made yet).
    pub fn connect(url: &S3Url, cfg: &RemoteConfig) -> Result<Remote> {
        // Our timeouts first: `with_client_options` replaces every client option, so the ones
        // of the environment and the settings (AWS_ALLOW_HTTP, ...) are applied after it.
        let client = ClientOptions::new()
            .with_timeout(cfg.deadline.min(Duration::from_secs(30)))
            .with_connect_timeout(Duration::from_secs(5));
        let mut b = AmazonS3Builder::new().with_client_options(client);
        for (k, v) in std::env::vars() {
            if k.starts_with("AWS_") {
                if let Ok(key) = k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                    b = b.with_config(key, v);
                }
            }
        }
        b = b.with_bucket_name(&url.bucket);
        let mut settings = match &cfg.credentials {
            Some(p) => read_credentials(p)?
                .into_iter()
                .map(|(k, v)| (k, v, p.display().to_string()))
                .collect(),
            None => Vec::new(),
        };
        for (k, v) in &cfg.settings {
            settings.push((k.to_ascii_lowercase(), v.clone(), "settings".into()));
        }
        for (k, v, from) in settings {
            let key: AmazonS3ConfigKey = k
                .parse()
                .map_err(|_| Error::InvalidArgument(format!("{from}: unknown key {k}")))?;
            b = b.with_config(key, v);
        }
        let retry = RetryConfig {
            max_retries: 100,
            retry_timeout: cfg.deadline,
            ..RetryConfig::default()
        };
        b = b.with_retry(retry);
        let store = b
            .build()
            .map_err(|e| Error::InvalidArgument(format!("{url}: {e}")))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("compfs-s3")
            .enable_all()
            .build()?;
        Ok(Remote {
            store: Arc::new(store),
            prefix: url.prefix.clone(),
            url: url.clone(),
            rt,
            stats: RemoteStats::default(),
            deadline: cfg.deadline,
            gate: std::sync::OnceLock::new(),
        })
    }

    /// How long a failing request is retried before it fails (`-o timeout=`).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Makes every later PUT and DELETE (except [`Remote::put_cond`]) check `gate` first.
    pub fn set_gate(&self, gate: Arc<super::lease::Gate>) {
        let _ = self.gate.set(gate);
    }

    fn check_gate(&self) -> io::Result<()> {
        match self.gate.get() {
            Some(g) => g.check(),
            None => Ok(()),
        }
    }

    /// GETs a whole object with its version; `None` when there is none.
    pub fn get_versioned(&self, name: &str) -> io::Result<Option<(Vec<u8>, UpdateVersion)>> {
        let p = self.path(name);
        let r = self.rt.block_on(async {
            let r = self.store.get(&p).await?;
            let v = UpdateVersion {
                e_tag: r.meta.e_tag.clone(),
                version: r.meta.version.clone(),
            };
            Ok::<_, object_store::Error>((r.bytes().await?, v))
        });
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok((b, v)) => {
                self.stats
                    .get_bytes
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                Ok(Some((b.to_vec(), v)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(io_err(e)),
        }
    }

    /// A conditional PUT (`If-None-Match: *` when `over` is `None`, else `If-Match` on its
    /// e-tag). Not subject to the gate: the lease itself is written this way.
    pub fn put_cond(
        &self,
        name: &str,
        data: Vec<u8>,
        over: Option<UpdateVersion>,
    ) -> io::Result<CondPut> {
        let n = data.len() as u64;
        let p = self.path(name);
        let mode = match over {
            None => PutMode::Create,
            Some(v) => PutMode::Update(v),
        };
        let r = self.rt.block_on(self.store.put_opts(
            &p,
            PutPayload::from(data),
            PutOptions::from(mode),
        ));
        self.stats.puts.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(r) => {
                self.stats.put_bytes.fetch_add(n, Ordering::Relaxed);
                Ok(CondPut::Done(UpdateVersion {
                    e_tag: r.e_tag,
                    version: r.version,
                }))
            }
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(CondPut::Conflict),
            Err(e) => Err(io_err(e)),
        }
    }

    fn path(&self, name: &str) -> ObjPath {
        ObjPath::from(super::layout::join(&self.prefix, name))
    }

    pub fn counts(&self) -> RemoteCounts {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RemoteCounts {
            puts: l(&s.puts),
            gets: l(&s.gets),
            lists: l(&s.lists),
            deletes: l(&s.deletes),
            put_bytes: l(&s.put_bytes),
            get_bytes: l(&s.get_bytes),
        }
    }

    /// PUTs object `name` (below the prefix): returns once the PUT completed.
    pub fn put(&self, name: &str, data: Vec<u8>) -> io::Result<()> {
        self.check_gate()?;
        let n = data.len() as u64;
        let p = self.path(name);
        self.rt
            .block_on(self.store.put(&p, PutPayload::from(data)))
            .map_err(io_err)?;
        self.stats.puts.fetch_add(1, Ordering::Relaxed);
        self.stats.put_bytes.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// GETs a whole object; `None` when there is none.
    pub fn get(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let p = self.path(name);
        // An answer cut off while its body is read is not retried by the client: here.
        let r = super::retry::retry_until(self.deadline, || {
            self.rt.block_on(async {
                let r = self.store.get(&p).await?;
                r.bytes().await
            })
        });
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(b) => {
                self.stats
                    .get_bytes
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                Ok(Some(b.to_vec()))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(io_err(e)),
        }
    }

    /// GETs bytes `range` of an object (a ranged GET); fails unless all of them came. The
    /// client's buffer is handed over as it is (no copy).
    pub fn get_range(&self, name: &str, range: std::ops::Range<u64>) -> io::Result<bytes::Bytes> {
        let p = self.path(name);
        let r = super::retry::retry_until(self.deadline, || {
            self.rt.block_on(self.store.get_range(&p, range.clone()))
        });
        self.ranged_result(name, range, r)
    }

    /// Ranged GETs of several (object, range) pairs, sent in parallel; one result each, in
    /// order, each failing unless all of its bytes came.
    pub fn get_ranges(
        &self,
        reqs: &[(String, std::ops::Range<u64>)],
    ) -> Vec<io::Result<bytes::Bytes>> {
        let paths: Vec<ObjPath> = reqs.iter().map(|(n, _)| self.path(n)).collect();
        let futs = paths
            .iter()
            .zip(reqs)
            .map(|(p, (_, r))| self.store.get_range(p, r.clone()));
        let out = self.rt.block_on(futures::future::join_all(futs));
        out.into_iter()
            .zip(reqs)
            .map(|(r, (n, range))| match r {
                // Cut off while its body was read: again, alone, with the retries of one.
                Err(e) if super::retry::retryable(&e) => self.get_range(n, range.clone()),
                r => self.ranged_result(n, range.clone(), r),
            })
            .collect()
    }

    fn ranged_result(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
        r: object_store::Result<bytes::Bytes>,
    ) -> io::Result<bytes::Bytes> {
        let want = range.end - range.start;
        let b = r.map_err(io_err)?;
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        self.stats
            .get_bytes
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        if b.len() as u64 != want {
            return Err(io::Error::other(format!(
                "object {name}: {} bytes where {want} were asked for",
                b.len()
            )));
        }
        Ok(b)
    }

    /// Keys (below the prefix) and sizes of every object under `folder`.
    pub fn list(&self, folder: &str) -> io::Result<Vec<(String, u64)>> {
        let p = self.path(folder);
        // A listing cut off while its body is read is not retried by the client: here.
        let v: Vec<object_store::ObjectMeta> = super::retry::retry_until(self.deadline, || {
            self.rt.block_on(self.store.list(Some(&p)).try_collect())
        })
        .map_err(io_err)?;
        self.stats.lists.fetch_add(1, Ordering::Relaxed);
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        Ok(v.into_iter()
            .filter_map(|m| {
                let k = m.location.as_ref();
                k.strip_prefix(&strip).map(|k| (k.to_string(), m.size))
            })
            .collect())
    }

    /// Deletes an object (no error when it is already gone).
    pub fn delete(&self, name: &str) -> io::Result<()> {
        self.check_gate()?;
        let p = self.path(name);
        match self.rt.block_on(self.store.delete(&p)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                self.stats.deletes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(io_err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_parse_and_bad_ones_are_refused() {
        let u = S3Url::parse("s3://b/p/q/").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("b", "p/q"));
        assert_eq!(S3Url::parse("s3://b").unwrap().prefix, "");
        for bad in ["s3:///x", "/tmp/x", "s3://b/p//q", "s3://b/../x"] {
            assert!(S3Url::parse(bad).is_err(), "{bad}");
        }
        let d = S3Url::parse("s3://b/p/q").unwrap().default_cache_dir();
        assert!(d.ends_with("b/p%2Fq"), "{}", d.display());
    }

    #[test]
    fn credentials_files_parse_and_must_be_private() {
        let v = parse_credentials(
            "[default]\n# c\nAWS_ACCESS_KEY_ID=a\naws_secret_access_key = \"s\"\nexport AWS_REGION=r\n",
        )
        .unwrap();
        assert_eq!(
            v,
            vec![
                ("aws_access_key_id".into(), "a".into()),
                ("aws_secret_access_key".into(), "s".into()),
                ("aws_region".into(), "r".into())
            ]
        );
        assert!(parse_credentials("junk").is_err());
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("c");
        std::fs::write(&f, "aws_region=x\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_credentials(&f).unwrap_err().to_string();
        assert!(e.contains("private"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_credentials(&f).unwrap().len(), 1);
    }
}
