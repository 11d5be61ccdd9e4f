//! Helpers shared by the FUSE integration tests (each test binary uses part of them).

use kaiso_store::Store;
use std::path::Path;
use std::sync::Arc;

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

/// A store mounted for a test in a temporary directory: unmounted, then shut down, on drop.
#[allow(dead_code)]
pub struct MountedStore {
    pub dir: tempfile::TempDir,
    pub store: Arc<Store>,
    pub mount: Option<kaiso_fuse::Mounted>,
}

impl Drop for MountedStore {
    fn drop(&mut self) {
        if let Some(m) = self.mount.take() {
            let _ = m.unmount();
        }
        self.store.shutdown();
    }
}
