//! Helpers: a temporary two-tier store served over NFS on 127.0.0.1 (ephemeral port).

#![allow(dead_code)]

use kaiso_nfs::{NfsServer, ServeOptions};
use kaiso_store::{Store, StoreConfig};
use nfs3_client::nfs3_types::rpc::{auth_flavor, auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::{Opaque, Pack};
use std::path::Path;
use std::sync::Arc;

pub struct Served {
    pub dir: tempfile::TempDir,
    pub store: Arc<Store>,
    pub server: Option<NfsServer>,
}

pub fn config_text(root: &Path) -> String {
    let mut s = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n",
        root.join("state").display()
    );
    for (i, cap) in ["256MiB", "1GiB"].iter().enumerate() {
        s.push_str(&format!(
            "[[tier]]\nname = \"t{i}\"\npath = \"{}\"\ncapacity = \"{cap}\"\n",
            root.join(format!("t{i}")).display()
        ));
    }
    s
}

impl Served {
    pub fn start(tune: impl FnOnce(&mut ServeOptions)) -> Served {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..2 {
            std::fs::create_dir(dir.path().join(format!("t{i}"))).unwrap();
        }
        let cfg = StoreConfig::from_toml_str(&config_text(dir.path()), "test.toml").unwrap();
        let store = Store::open(cfg).unwrap();
        let mut opts = ServeOptions::loopback(0);
        tune(&mut opts);
        let server = NfsServer::start(store.clone(), opts).unwrap();
        Served {
            dir,
            store,
            server: Some(server),
        }
    }

    pub fn port(&self) -> u16 {
        self.server.as_ref().unwrap().local_addr().port()
    }

    pub fn server(&self) -> &NfsServer {
        self.server.as_ref().unwrap()
    }

    /// A libnfs URL for `path` inside the export.
    pub fn url(&self, path: &str) -> String {
        let p = self.port();
        format!("nfs://127.0.0.1/export{path}?nfsport={p}&mountport={p}&version=3")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
        self.store.shutdown();
    }
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + seed as usize) % 251) as u8)
        .collect()
}

/// An AUTH_SYS (AUTH_UNIX) credential, as a Linux client sends it.
pub fn auth_sys(uid: u32, gid: u32, gids: &[u32]) -> opaque_auth<'static> {
    let a = auth_unix {
        stamp: 1,
        machinename: Opaque::owned(b"kaiso-test".to_vec()),
        uid,
        gid,
        gids: gids.to_vec(),
    };
    let mut body = Vec::new();
    a.pack(&mut body).unwrap();
    opaque_auth {
        flavor: auth_flavor::AUTH_UNIX,
        body: Opaque::owned(body),
    }
}
