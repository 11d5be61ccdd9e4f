//! `kaiso serve --nfs CONFIG`: serve a store over the embedded NFSv3 server.

use super::mount::{catch_signals, load_config};
use anyhow::{Context, bail};
use kaiso_nfs::{AllowList, NfsServer, ServeOptions};
use kaiso_store::Store;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Serve over NFSv3 (with MOUNT v3 and portmap on the same port). Store configuration (TOML).
    #[arg(long = "nfs", value_name = "CONFIG")]
    pub nfs: Option<PathBuf>,
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:20490", value_name = "ADDR:PORT")]
    pub listen: String,
    /// Client addresses allowed to connect (comma-separated CIDR blocks); others are disconnected.
    #[arg(long, default_value = "127.0.0.0/8,::1", value_name = "CIDRS")]
    pub allow: String,
    /// Answer NFS3ERR_JUKEBOX when an operation takes longer than this (0: always wait).
    #[arg(long, default_value = "500ms", value_name = "DUR")]
    pub jukebox_after: String,
    /// Export path clients mount, e.g. nfs://HOST/export.
    #[arg(long, default_value = "/export")]
    pub export: String,
}

/// NFS server options from the `--allow`, `--jukebox-after` and `--export` flags
/// (shared by `kaiso serve --nfs` and `kaiso migrate start --nfs`).
pub(crate) fn nfs_options(
    listen: SocketAddr,
    allow: &str,
    jukebox_after: &str,
    export: String,
) -> anyhow::Result<ServeOptions> {
    let allow: AllowList = allow
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--allow: {e}"))?;
    let after = kaiso_nfs::parse_duration(jukebox_after)
        .map_err(|e| anyhow::anyhow!("--jukebox-after: {e}"))?;
    Ok(ServeOptions {
        listen,
        allow,
        jukebox_after: (!after.is_zero()).then_some(after),
        export,
        ..ServeOptions::loopback(0)
    })
}

pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let Some(config) = a.nfs else {
        bail!("nothing to serve: give --nfs CONFIG");
    };
    let listen: SocketAddr = a.listen.parse().map_err(|_| {
        anyhow::anyhow!(
            "bad --listen {:?}: expected ADDR:PORT, e.g. 127.0.0.1:20490 or [::1]:20490",
            a.listen
        )
    })?;
    let opts = nfs_options(listen, &a.allow, &a.jukebox_after, a.export)?;
    let cfg = load_config(&config)?;
    super::migrate::refuse_if_migrating(&cfg.state_dir, &config, &format!("--nfs {}", a.listen))?;
    // kaiso sets every mode explicitly; the process umask must not interfere.
    unsafe { libc::umask(0) };
    let store = Store::open(cfg)?;
    let background = store.start_background();
    let sock =
        kaiso_store::control::serve(store.clone()).context("cannot start the control socket")?;
    if let Some(addr) = &store.config().metrics {
        let bound = kaiso_store::metrics::serve(store.clone(), addr)
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        eprintln!("kaiso: metrics on http://{bound}/metrics");
    }
    let allow = opts.allow.clone();
    let export = format!("/{}", opts.export.trim_matches('/'));
    let signalled = catch_signals();
    let server = match NfsServer::start(store.clone(), opts) {
        Ok(s) => s,
        Err(e) => {
            drop(background);
            store.shutdown();
            let _ = std::fs::remove_file(&sock);
            return Err(e);
        }
    };
    let bound = server.local_addr();
    println!(
        "kaiso: serving {} over NFSv3 on {bound} (export {export}, allow {allow}); e.g. nfs-ls 'nfs://{}{export}?nfsport={port}&mountport={port}&version=3'",
        config.display(),
        bound.ip(),
        port = bound.port()
    );
    while !signalled.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    server.stop();
    drop(background);
    store.shutdown();
    let _ = std::fs::remove_file(&sock);
    eprintln!("kaiso: NFS server stopped");
    Ok(())
}
