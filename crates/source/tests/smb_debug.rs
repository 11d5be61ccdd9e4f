mod common;
#[test]
fn smb_debug_connect() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("trace")
        .with_writer(std::io::stderr)
        .try_init();
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::write(share.path().join("x"), b"x").unwrap();
    let server = common::Samba::start(share.path());
    eprintln!(
        "samba on {} dir {}",
        server.port,
        server.dir.path().display()
    );
    let cfg = server.config();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = kaiso_source::SmbSource::connect(cfg).map(|_| ());
        let _ = tx.send(format!("{:?}", r.err()));
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(20));
    eprintln!("RESULT {r:?}");
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("tail -50 {}/log/*", server.dir.path().display()))
        .status();
}

#[test]
fn nfs_debug_nobody() {
    if std::env::var_os("KAISO_NFS_DEBUG").is_none() {
        return;
    }
    let mut c = kaiso_source::NfsConfig::new("127.0.0.1", "/kaiso_src");
    c.nfs_port = Some(20490);
    c.mount_port = Some(20048);
    c.uid = 65534;
    c.gid = 65534;
    let s = kaiso_source::NfsSource::connect(c).unwrap();
    use kaiso_store::migrate::{Source, SourcePath};
    let r = s.read(&SourcePath::parse(b"secret").unwrap(), 0, 10);
    eprintln!("NOBODY READ {r:?}");
}
