//! Latency of a client's fsync of a file under migration (issue 4).
//!
//! A store on a real disk (a temporary directory, or the directory given as the first
//! argument) holds an unlisted directory whose stub filler lists `FILES` partial files
//! and fetches their bytes from a computed pattern. A client opens the first file,
//! fetches its first 64 KiB, then, `ROUNDS` times, rewrites 4 KiB of those present bytes
//! and calls `fsync` (its stub state does not change); meanwhile a "crawler" thread reads
//! the other files through the store, so stub rows keep being committed as in a real
//! migration. Printed: fsync latency percentiles of those rounds, and of rounds that write
//! into a missing range (the stub state changes each time), and of a file that never was
//! a stub (the floor: the data's own fdatasync), for comparison.
//!
//! Run: `cargo run --release -p kaiso-store --example fsync_latency [DIR]`

use kaiso_store::{
    Caller, FileKind, FsResult, Ino, ROOT_INO, Store, StoreConfig, StubEntry, StubFiller, StubState,
};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const FILES: usize = 64;
const SIZE: u64 = 32 << 20;
const ROUNDS: usize = 200;

struct Pattern;

impl StubFiller for Pattern {
    fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        for i in 0..FILES {
            let e = StubEntry {
                kind: FileKind::File,
                perm: 0o644,
                uid: 0,
                gid: 0,
                size: SIZE,
                mtime: t,
                atime: t,
                symlink_target: None,
                rdev: 0,
                unlisted: false,
            };
            store.stub_create(ino, format!("f{i}").as_ref(), &e)?;
        }
        store.stub_dir_listed(ino)
    }

    fn fill_range(
        &self,
        store: &Store,
        ino: Ino,
        _path: &Path,
        offset: u64,
        len: u64,
    ) -> FsResult<()> {
        let data: Vec<u8> = (offset..offset + len).map(|i| (i % 251) as u8).collect();
        store.stub_write(ino, offset, &data)
    }
}

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    let mean = v.iter().map(|d| d.as_secs_f64()).sum::<f64>() / v.len() as f64 * 1e6;
    format!(
        "n={} mean {:.0} us, p50 {:.0} us, p90 {:.0} us, p99 {:.0} us",
        v.len(),
        mean,
        at(0.5),
        at(0.9),
        at(0.99)
    )
}

fn main() -> anyhow::Result<()> {
    let tmp;
    let root = match std::env::args().nth(1) {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(root.join("t0"))?;
    let text = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"8GiB\"\n",
        root.join("state").display(),
        root.join("t0").display()
    );
    let store = Store::open(StoreConfig::from_toml_str(&text, "bench.toml")?)?;
    let dir = store
        .mkdir(ROOT_INO, "mig".as_ref(), 0o755, 0, Caller::ROOT)?
        .ino;
    store.stub_mark(
        dir,
        StubState {
            unlisted_dir: true,
            missing: vec![],
            times: None,
        },
    )?;
    store.set_stub_filler(Arc::new(Pattern));
    let inos: Vec<Ino> = (0..FILES)
        .map(|i| store.lookup(dir, format!("f{i}").as_ref()).map(|a| a.ino))
        .collect::<FsResult<_>>()?;

    // The crawler: fetches the other files 256 KiB at a time, committing stub rows.
    let stop = Arc::new(AtomicBool::new(false));
    let crawler = {
        let (store, stop, inos) = (store.clone(), stop.clone(), inos.clone());
        std::thread::spawn(move || {
            for &ino in &inos[1..] {
                let Ok(o) = store.open_file(ino, libc::O_RDONLY, false) else {
                    continue;
                };
                let mut off = 0;
                while off < SIZE && !stop.load(Ordering::Relaxed) {
                    let _ = store.read(o.fh, off, 256 << 10);
                    off += 256 << 10;
                }
                let _ = store.release(o.fh);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        })
    };

    let o = store.open_file(inos[0], libc::O_RDWR, false)?;
    store.read(o.fh, 0, 64 << 10)?;
    store.fsync(o.fh, true)?;
    let block = vec![7u8; 4096];
    let mut unchanged = Vec::with_capacity(ROUNDS);
    let mut changed = Vec::with_capacity(ROUNDS);
    for r in 0..ROUNDS {
        // Present bytes: the stub state stays as it is.
        store.write(o.fh, (r as u64 % 16) * 4096, &block)?;
        let t = Instant::now();
        store.fsync(o.fh, true)?;
        unchanged.push(t.elapsed());
        // A missing range (fetched, then overwritten): the stub state changes.
        store.write(o.fh, SIZE / 2 + r as u64 * (1 << 20), &block)?;
        let t = Instant::now();
        store.fsync(o.fh, true)?;
        changed.push(t.elapsed());
    }
    // The floor: the same rewrite and fsync of a file that never was a stub.
    let (_, p) = store.create(
        ROOT_INO,
        "plain".as_ref(),
        0o644,
        0,
        libc::O_RDWR,
        Caller::ROOT,
        false,
    )?;
    store.write(p.fh, 0, &vec![1u8; 64 << 10])?;
    let mut plain = Vec::with_capacity(ROUNDS);
    for r in 0..ROUNDS {
        store.write(p.fh, (r as u64 % 16) * 4096, &block)?;
        let t = Instant::now();
        store.fsync(p.fh, true)?;
        plain.push(t.elapsed());
    }
    store.release(p.fh)?;
    stop.store(true, Ordering::Relaxed);
    let _ = crawler.join();
    store.release(o.fh)?;
    println!("fsync, stub state unchanged: {}", percentiles(unchanged));
    println!("fsync, stub state changed:   {}", percentiles(changed));
    println!("fsync, never a stub (floor): {}", percentiles(plain));
    store.shutdown();
    Ok(())
}
