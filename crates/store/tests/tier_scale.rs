//! Cost of the tier scans on a large tree (release build; ignored by default, they take
//! a while in debug builds):
//! `cargo test --release -p kaiso-store --test tier_scale -- --ignored --nocapture`.
//! `Store::open` walks every tier; a tier whose root directory returns is walked again
//! by `Store::reattach_tier`. Both must index every file exactly once.

use kaiso_store::{Store, StoreConfig};
use std::time::Instant;

const DIRS: usize = 1000;
const PER_DIR: usize = 100;

fn config(root: &std::path::Path) -> StoreConfig {
    let mut s = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n",
        root.join("state").display()
    );
    for i in 0..2 {
        s.push_str(&format!(
            "[[tier]]\nname = \"t{i}\"\npath = \"{}\"\ncapacity = \"1TiB\"\n",
            root.join(format!("t{i}")).display()
        ));
    }
    StoreConfig::from_toml_str(&s, "scale.toml").unwrap()
}

#[test]
#[ignore = "timing on 100k files; run with --release -- --ignored"]
fn open_and_reattach_of_100k_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("t0")).unwrap();
    for d in 0..DIRS {
        let p = root.join("t1").join(format!("d{d:04}"));
        std::fs::create_dir_all(&p).unwrap();
        for f in 0..PER_DIR {
            std::fs::write(p.join(format!("f{f:03}")), b"x").unwrap();
        }
    }
    let files = (DIRS * PER_DIR) as u64;
    // First open: every file is new (inode numbers assigned, directories recorded).
    let t = Instant::now();
    let s = Store::open(config(root)).unwrap();
    let first = t.elapsed();
    assert_eq!(s.status().files, files);
    s.shutdown();
    drop(s);
    // Reopen: the state database knows the tree.
    let t = Instant::now();
    let s = Store::open(config(root)).unwrap();
    let reopen = t.elapsed();
    assert_eq!(s.status().files, files);
    // A tier that returns is walked once more; nothing is new.
    let t = Instant::now();
    let r = s.reattach_tier(1);
    let reattach = t.elapsed();
    assert_eq!(r.entries, files + DIRS as u64, "{r:?}");
    assert_eq!((r.reattached, r.shadowed), (0, 0), "{r:?}");
    assert_eq!(s.status().files, files);
    eprintln!(
        "{files} files in {DIRS} directories: first open {:.2} s, reopen {:.2} s, \
         reattach of the tier {:.2} s",
        first.as_secs_f64(),
        reopen.as_secs_f64(),
        reattach.as_secs_f64()
    );
    s.shutdown();
}
