use compfs_codec::{CodecSpec, Mode};
use compfs_store::*;
use std::time::Instant;
fn main() {
    let spec = CodecSpec::parse("zstd:1").unwrap().spec;
    let copies: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(5);
    let mut files = Vec::new();
    for e in std::fs::read_dir("/tmp/silesia").unwrap() {
        let e = e.unwrap();
        files.push((e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap()));
    }
    let total: usize = files.iter().map(|f| f.1.len()).sum();
    let dir = std::path::PathBuf::from("/var/tmp/storeprof");
    let _ = std::fs::remove_dir_all(&dir);
    let s = Store::create_tuned(&dir, &CreateOptions { compression: spec, mode: Mode::Force, ..CreateOptions::default() }, Tuning::default()).unwrap();
    s.close().unwrap();
    let fb: usize = std::env::var("FB").ok().map(|v| v.parse().unwrap()).unwrap_or(16);
    let s = Store::open_tuned(&dir, &OpenOptions::default(), Tuning { flush_blocks: fb, ..Tuning::default() }).unwrap();
    let cpu = || { let mut u: libc::rusage = unsafe { std::mem::zeroed() }; unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }; u.ru_utime.tv_sec as f64 + u.ru_utime.tv_usec as f64 / 1e6 + u.ru_stime.tv_sec as f64 + u.ru_stime.tv_usec as f64 / 1e6 };
    let c0 = cpu();
    let t = Instant::now();
    for c in 0..copies {
        for (name, data) in &files {
            let n = format!("{c}-{name}");
            let ino = s.mknod(ROOT_INO, n.as_bytes(), FileKind::File, 0o644, 0, 0, 0).unwrap().ino;
            s.open_file(ino).unwrap();
            for (i, ch) in data.chunks(128 << 10).enumerate() {
                s.write(ino, (i as u64) << 17, ch).unwrap();
            }
            s.release(ino).unwrap();
        }
    }
    s.sync().unwrap();
    println!("{:.1} MB/s cores {:.2}", (total * copies) as f64 / 1e6 / t.elapsed().as_secs_f64(), (cpu() - c0) / t.elapsed().as_secs_f64());
    s.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
