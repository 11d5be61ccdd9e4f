//! Helpers: a temporary two-tier store served over NFS on 127.0.0.1 (ephemeral port).

#![allow(dead_code)]

use kaiso_nfs::{NfsServer, ServeOptions};
use kaiso_store::{Store, StoreConfig};
use nfs3_client::nfs3_types::nfs3::{Nfs3Result, diropargs3, filename3, nfs_fh3, nfsstat3};
use nfs3_client::nfs3_types::rpc::{auth_flavor, auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::{Opaque, Pack};
use nfs3_client::tokio::{TokioConnector, TokioIo};
use nfs3_client::{Nfs3Client, Nfs3ConnectionBuilder};
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;

pub type Client = Nfs3Client<TokioIo<TcpStream>>;

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
        // No JUKEBOX unless a test asks for it (`|o| o.jukebox_after = Some(..)`): the
        // test clients (nfs3_client, libnfs-utils) do not retry it as a kernel client
        // does, and on a loaded machine any call (a REMOVE's commit) may take longer
        // than the default 500 ms, which would fail tests that are not about JUKEBOX.
        opts.jukebox_after = None;
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

/// A single-threaded tokio runtime for one test.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Mount the export on 127.0.0.1:`port` with credential `cred`; the client and root handle.
pub async fn connect_as(port: u16, cred: opaque_auth<'static>) -> (Client, nfs_fh3) {
    let conn = Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", "/export")
        .connect_from_privileged_port(false)
        .credential(cred)
        .mount_port(port)
        .nfs3_port(port)
        .mount()
        .await
        .expect("mount over NFS");
    let root = conn.root_nfs_fh3();
    (conn.into_nfs3_client(), root)
}

/// The (directory, name) pair most procedures take.
pub fn dirop<'a>(dir: &nfs_fh3, name: &'a str) -> diropargs3<'a> {
    diropargs3 {
        dir: dir.clone(),
        name: filename3(Opaque::borrowed(name.as_bytes())),
    }
}

/// An NFS reply as a `Result`: its value, or its status (the failure attributes dropped).
pub fn status<T, E>(r: Nfs3Result<T, E>) -> Result<T, nfsstat3> {
    match r {
        Nfs3Result::Ok(ok) => Ok(ok),
        Nfs3Result::Err((e, _)) => Err(e),
    }
}
