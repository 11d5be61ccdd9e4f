//! Helpers for store tests: a store over N tier directories in a temporary directory.

#![allow(dead_code)]

use kaiso_store::{Caller, FileAttr, Ino, ROOT_INO, Store, StoreConfig};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct TestStore {
    pub dir: tempfile::TempDir,
    pub cfg_text: String,
    pub store: Option<Arc<Store>>,
}

pub fn config_text(root: &Path, caps: &[&str]) -> String {
    let mut s = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\nmax_rate = \"1GiB\"\n",
        root.join("state").display()
    );
    for (i, c) in caps.iter().enumerate() {
        s.push_str(&format!("[[tier]]\nname = \"t{i}\"\npath = \"{}\"\ncapacity = \"{c}\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n", root.join(format!("t{i}")).display()));
    }
    s
}

/// A loop-mounted ext4 of a test's own (shared with the source tests by path).
#[path = "../../../source/tests/common/loop_ext4.rs"]
pub mod loop_ext4;

impl TestStore {
    pub fn new(caps: &[&str]) -> TestStore {
        Self::new_in(&std::env::temp_dir(), caps)
    }

    /// A store whose state and tier directories are in a new directory under `base`
    /// (a file system the test chose).
    pub fn new_in(base: &Path, caps: &[&str]) -> TestStore {
        let dir = tempfile::tempdir_in(base).unwrap();
        for i in 0..caps.len() {
            std::fs::create_dir(dir.path().join(format!("t{i}"))).unwrap();
        }
        let cfg_text = config_text(dir.path(), caps);
        let mut t = TestStore {
            dir,
            cfg_text,
            store: None,
        };
        t.reopen();
        t
    }

    pub fn reopen(&mut self) -> Arc<Store> {
        if let Some(s) = self.store.take() {
            s.shutdown();
            drop(s);
        }
        let cfg = StoreConfig::from_toml_str(&self.cfg_text, "test.toml").unwrap();
        let s = Store::open(cfg).unwrap();
        self.store = Some(s.clone());
        s
    }

    /// Drop without shutdown: what a crash looks like to the next open.
    pub fn crash_and_reopen(&mut self) -> Arc<Store> {
        if let Some(s) = self.store.take() {
            drop(s);
        }
        let cfg = StoreConfig::from_toml_str(&self.cfg_text, "test.toml").unwrap();
        let s = Store::open(cfg).unwrap();
        self.store = Some(s.clone());
        s
    }

    pub fn s(&self) -> &Arc<Store> {
        self.store.as_ref().unwrap()
    }

    pub fn tier(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("t{i}"))
    }

    /// Create a file with contents at a path (creating directories).
    pub fn put(&self, path: &str, data: &[u8]) -> Ino {
        let s = self.s();
        let mut parent = ROOT_INO;
        let comps: Vec<&str> = path.split('/').collect();
        for c in &comps[..comps.len() - 1] {
            parent = match s.lookup(parent, OsStr::new(c)) {
                Ok(a) => a.ino,
                Err(_) => {
                    s.mkdir(parent, OsStr::new(c), 0o755, 0, Caller::ROOT)
                        .unwrap()
                        .ino
                }
            };
        }
        let (attr, o) = s
            .create(
                parent,
                OsStr::new(comps[comps.len() - 1]),
                0o644,
                0,
                libc::O_RDWR,
                Caller::ROOT,
                false,
            )
            .unwrap();
        if !data.is_empty() {
            assert_eq!(s.write(o.fh, 0, data).unwrap() as usize, data.len());
        }
        s.release(o.fh).unwrap();
        attr.ino
    }

    pub fn lookup_path(&self, path: &str) -> Result<FileAttr, kaiso_store::FsError> {
        let s = self.s();
        let mut parent = ROOT_INO;
        let mut attr = s.getattr(ROOT_INO, None)?;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            attr = s.lookup(parent, OsStr::new(c))?;
            parent = attr.ino;
        }
        Ok(attr)
    }

    pub fn get(&self, path: &str) -> Vec<u8> {
        let s = self.s();
        let a = self.lookup_path(path).unwrap();
        let o = s.open_file(a.ino, libc::O_RDONLY, false).unwrap();
        let mut out = Vec::new();
        loop {
            let b = s.read(o.fh, out.len() as u64, 1 << 20).unwrap();
            if b.is_empty() {
                break;
            }
            out.extend_from_slice(&b);
        }
        s.release(o.fh).unwrap();
        out
    }

    /// Which tiers hold a (non-directory) path.
    pub fn holders(&self, path: &str, n: usize) -> Vec<usize> {
        (0..n)
            .filter(|i| {
                std::fs::symlink_metadata(self.tier(*i).join(path))
                    .map(|m| !m.is_dir())
                    .unwrap_or(false)
            })
            .collect()
    }

    pub fn names(&self, dir: Ino) -> Vec<String> {
        let s = self.s();
        let fh = s.opendir(dir).unwrap();
        let v = s
            .readdir(fh, 0)
            .unwrap()
            .into_iter()
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect();
        s.releasedir(fh).unwrap();
        v
    }
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
