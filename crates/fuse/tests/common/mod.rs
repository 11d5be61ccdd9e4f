//! Helpers shared by the FUSE integration tests (each test binary uses part of them).

use std::path::Path;

/// Whether this machine can mount FUSE file systems (tests skip otherwise).
pub fn fuse_available() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
}

/// Create, stat and unlink `n` files one after the other in `dir` (a metadata loop: serial
/// requests, so the workers stand by between them).
#[allow(dead_code)]
pub fn metadata_burst(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        let p = dir.join(format!("f{i}"));
        std::fs::File::create(&p).unwrap();
        std::fs::metadata(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
    }
}
