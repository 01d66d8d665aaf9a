//! The store's share of a file create as a FUSE daemon sees it: per file, the GETATTR of the
//! directory, the LOOKUP that misses, the default-ACL read, the MKNOD, the open and the release.
use std::time::Instant;

use compfs_store::{CreateOptions, Error, FileKind, Store, ROOT_INO};

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "/dev/shm/nsbench".into()));
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(50_000);
    let _ = std::fs::remove_dir_all(&dir);
    let opts = CreateOptions::default();
    let store = Store::create(&dir, &opts)?;
    let d = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)?.ino;
    for round in 0..3 {
        let t = Instant::now();
        for i in 0..n {
            let name = format!("r{round}f{i:08}");
            store.getattr(d)?;
            match store.lookup(d, name.as_bytes()) {
                Err(Error::NotFound) => {}
                other => panic!("lookup: {other:?}"),
            }
            let _ = store.getxattr(d, b"system.posix_acl_default");
            let a = store.mknod(d, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)?;
            store.open_file(a.ino)?;
            store.release(a.ino)?;
        }
        let el = t.elapsed();
        println!(
            "round {round}: {:.2} µs per file",
            el.as_secs_f64() * 1e6 / n as f64
        );
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
