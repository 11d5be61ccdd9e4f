//! A client of the store as the migration tests drive it (no mount): attach a share,
//! resolve paths, read whole files, compare bytes.

use std::ffi::OsStr;
use std::sync::Arc;

use kaiso_store::migrate::{Migration, MigrationConfig, Migrations, Source};
use kaiso_store::{FsResult, Ino, ROOT_INO, Store};

/// Opens (or resumes) a migration of `source` into `store` and registers it as the
/// store's stub filler.
pub fn attach(store: &Arc<Store>, source: Box<dyn Source>, cfg: MigrationConfig) -> Arc<Migration> {
    let m = Migration::open(store, source, cfg).expect("open migration");
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    m
}

/// The inode at `path` (relative, `/`-separated), without keeping a lookup reference.
pub fn lookup(store: &Store, path: &str) -> FsResult<Ino> {
    let mut ino = ROOT_INO;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        let a = store.lookup(ino, OsStr::new(c))?;
        store.forget(a.ino, 1);
        ino = a.ino;
    }
    Ok(ino)
}

/// The parent directory's path and the last component of `path`.
pub fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

/// `parent/name`, or `name` at the root.
pub fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// Every byte of file `ino`, read through a descriptor of its own.
pub fn read_all(store: &Store, ino: Ino) -> FsResult<Vec<u8>> {
    let o = store.open_file(ino, libc::O_RDONLY, false)?;
    let mut out = Vec::new();
    let r = loop {
        match store.read(o.fh, out.len() as u64, 1 << 20) {
            Ok(b) if b.is_empty() => break Ok(()),
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => break Err(e),
        }
    };
    store.release(o.fh)?;
    r.map(|_| out)
}

/// Where two byte strings first differ, for messages (a diff of megabytes says nothing).
pub fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i} (got {}, want {}); sizes {} and {}",
            a[i],
            b[i],
            a.len(),
            b.len()
        ),
        None => format!("sizes {} and {} (one is a prefix)", a.len(), b.len()),
    }
}
