//! `kaiso status | head`: a reader that stops early must not make kaiso report a crash.
//! No mount needed: `status` and `fsck` read an unmounted store from its configuration.

mod common;

use common::{Store, StoreSpec, kaiso_bin};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

/// Runs `kaiso ARGS` with stdout a pipe whose reading end is already closed.
fn run_into_closed_pipe(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(kaiso_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run kaiso");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_pipe_ends_kaiso_quietly() {
    let store = Store::new("closed-pipe", StoreSpec::tiers(2));
    store.seed(0, "a", b"some data");
    let config = store.config.to_str().unwrap();

    // A report command dies of SIGPIPE, as `ls | head` does.
    let (status, stderr) = run_into_closed_pipe(&["status", config]);
    assert!(!stderr.contains("panicked"), "status: {stderr}");
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "status: {status:?}");

    // A command that keeps SIGPIPE ignored (it may hold mounts or copies) fails, but
    // without a panic report.
    let (status, stderr) = run_into_closed_pipe(&["fsck", config]);
    assert!(!stderr.contains("panicked"), "fsck: {stderr}");
    assert!(!stderr.contains("Broken pipe"), "fsck: {stderr}");
    assert!(!status.success(), "fsck: {status:?}");
}
