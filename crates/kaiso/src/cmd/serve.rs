//! `kaiso serve --nfs CONFIG`: serve a store over the embedded NFSv3 server.

use super::mount::{catch_signals, load_config};
use anyhow::{Context, bail};
use kaiso_nfs::{AllowList, NfsServer, ServeOptions, Squash};
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
    #[command(flatten)]
    pub access: NfsAccessArgs,
}

/// Who may use the NFS export and as whom (shared by `kaiso serve --nfs` and
/// `kaiso migrate start --nfs`); see docs/nfs.md.
#[derive(clap::Args, Clone, Debug)]
pub struct NfsAccessArgs {
    /// NFS clients allowed to connect (comma-separated CIDR blocks); others are disconnected.
    #[arg(long, default_value = "127.0.0.0/8,::1", value_name = "CIDRS")]
    pub allow: String,
    /// NFS: answer NFS3ERR_JUKEBOX when an operation takes longer than this (0: always wait).
    #[arg(long, default_value = "500ms", value_name = "DUR")]
    pub jukebox_after: String,
    /// NFS export path clients mount, e.g. nfs://HOST/export.
    #[arg(long, default_value = "/export")]
    pub export: String,
    /// NFS: which callers act as the anonymous user: none, root (exports(5) root_squash) or all.
    #[arg(long, default_value = "root", value_name = "none|root|all")]
    pub squash: String,
    /// NFS: clients whose root is not squashed by --squash root (comma-separated CIDR blocks).
    #[arg(long, default_value = "127.0.0.0/8,::1", value_name = "CIDRS")]
    pub root_trusted: String,
    /// NFS: the anonymous user and group (AUTH_NULL and squashed callers).
    #[arg(long, default_value = "65534:65534", value_name = "UID:GID")]
    pub anon: String,
}

impl NfsAccessArgs {
    /// NFS server options for `listen` from these flags.
    pub(crate) fn options(&self, listen: SocketAddr) -> anyhow::Result<ServeOptions> {
        let allow: AllowList = self
            .allow
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--allow: {e}"))?;
        let root_trusted: AllowList = self
            .root_trusted
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--root-trusted: {e}"))?;
        let squash: Squash = self
            .squash
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--squash: {e}"))?;
        let (anon_uid, anon_gid) = parse_uid_gid(&self.anon).ok_or_else(|| {
            anyhow::anyhow!("--anon {:?}: expected UID:GID, e.g. 65534:65534", self.anon)
        })?;
        let after = kaiso_nfs::parse_duration(&self.jukebox_after)
            .map_err(|e| anyhow::anyhow!("--jukebox-after: {e}"))?;
        Ok(ServeOptions {
            listen,
            allow,
            jukebox_after: (!after.is_zero()).then_some(after),
            export: self.export.clone(),
            squash,
            root_trusted,
            anon_uid,
            anon_gid,
            ..ServeOptions::loopback(0)
        })
    }
}

fn parse_uid_gid(s: &str) -> Option<(u32, u32)> {
    let (u, g) = s.split_once(':')?;
    Some((u.trim().parse().ok()?, g.trim().parse().ok()?))
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
    let opts = a.access.options(listen)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        access: NfsAccessArgs,
    }

    fn options(args: &[&str]) -> anyhow::Result<ServeOptions> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        cli.access.options(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    #[test]
    fn access_flags_reach_the_server_options() {
        let o = options(&[
            "--squash",
            "all",
            "--anon",
            "1000:100",
            "--root-trusted",
            "10.0.0.0/8",
        ])
        .unwrap();
        assert_eq!(o.squash, Squash::All);
        assert_eq!((o.anon_uid, o.anon_gid), (1000, 100));
        assert_eq!(o.root_trusted.to_string(), "10.0.0.0/8");
        let d = options(&[]).unwrap();
        assert_eq!(d.squash, Squash::Root);
        assert_eq!((d.anon_uid, d.anon_gid), (65534, 65534));
    }

    #[test]
    fn bad_access_flags_name_the_flag() {
        for (args, flag) in [
            (&["--squash", "some"][..], "--squash"),
            (&["--anon", "nobody"][..], "--anon"),
            (&["--root-trusted", "10.0.0.0/99"][..], "--root-trusted"),
            (&["--allow", "x"][..], "--allow"),
        ] {
            let e = options(args).unwrap_err().to_string();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }
}
