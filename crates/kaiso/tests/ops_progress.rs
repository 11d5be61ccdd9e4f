//! `kaiso promote|demote` progress for a single large file (issue 2, item 8): the progress
//! lines a non-terminal gets once a second show the bytes copied while the one file is
//! copied, not 0 until it is done. Through the binary, with `--config` (the command opens
//! the store itself) and through a mounted store's control socket.

mod common;

use common::{Store, StoreSpec, TierSpec, kaiso_bin};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;

/// A fast tier and an emulated HDD; copies paced at 16 MiB/s, no background moves.
fn store(tag: &str) -> Store {
    Store::new(
        tag,
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast").capacity(256 * MIB),
            TierSpec::new("slow").capacity(1024 * MIB).device("hdd"),
        ])
        .extra("\n[store.mover]\nenabled = false\nmax_rate = \"16MiB\""),
    )
}

/// Bytes in a size as the progress line prints it (`0 B`, `12.0 MiB`).
fn bytes_of(s: &str) -> Option<u64> {
    let (v, unit) = s.trim().split_once(' ')?;
    let v: f64 = v.parse().ok()?;
    let mult = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => MIB as f64,
        "GiB" => (MIB * 1024) as f64,
        _ => return None,
    };
    Some((v * mult) as u64)
}

/// The (done, total) bytes of each progress line, e.g. `demoting 0/1 files, 16.0 MiB/64.0
/// MiB, 15.9 MiB/s, ETA 3 s`.
fn progress(stderr: &str, verb: &str) -> Vec<(u64, u64)> {
    stderr
        .lines()
        .filter(|l| l.starts_with(verb))
        .filter_map(|l| {
            let sizes = l.split(", ").nth(1)?;
            let (done, total) = sizes.split_once('/')?;
            Some((bytes_of(done)?, bytes_of(total)?))
        })
        .collect()
}

/// Runs kaiso with `args`, stderr not a terminal (plain progress lines).
fn kaiso(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(kaiso_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kaiso")
}

/// Checks the progress lines of one 64 MiB move: at least one strictly between 0 and
/// the total before the last, which says done.
fn check(out: &std::process::Output, verb: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{verb}: {err}");
    let lines = progress(&err, verb);
    let total = 64 * MIB;
    assert!(lines.len() >= 2, "expected several progress lines:\n{err}");
    assert!(
        lines.iter().all(|&(_, t)| t == total),
        "total is not 64 MiB:\n{err}"
    );
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .any(|&(d, _)| d > 0 && d < total),
        "no progress strictly between 0 and 64 MiB while the file was copied:\n{err}"
    );
    assert!(
        lines.windows(2).all(|w| w[0].0 <= w[1].0),
        "progress went back:\n{err}"
    );
    assert_eq!(lines.last().map(|l| l.0), Some(total), "{err}");
    assert!(err.trim_end().ends_with(", done"), "{err}");
}

#[test]
fn demote_of_one_large_file_shows_progress_while_it_is_copied() {
    let store = store("progress-config");
    let data: Vec<u8> = (0..64 * MIB).map(|i| (i % 251) as u8).collect();
    store.seed(0, "big.bin", &data);
    let out = kaiso(&[
        "demote".as_ref(),
        "--config".as_ref(),
        store.config.as_os_str(),
        "big.bin".as_ref(),
    ]);
    check(&out, "demoting");
    assert_eq!(store.tiers_holding("big.bin"), vec![1]);
    assert_eq!(std::fs::read(store.tiers[1].join("big.bin")).unwrap(), data);
}

#[test]
fn promote_through_the_mount_shows_progress_while_it_is_copied() {
    fuse_or_skip!();
    let store = store("progress-mount");
    let data: Vec<u8> = (0..64 * MIB).map(|i| (i % 241) as u8).collect();
    store.seed(1, "big.bin", &data);
    let m = store.mount();
    let p = m.path.join("big.bin");
    let out = kaiso(&["promote".as_ref(), p.as_os_str()]);
    check(&out, "promoting");
    assert!(m.unmount().success());
    assert_eq!(store.tiers_holding("big.bin"), vec![0]);
    assert_eq!(std::fs::read(store.tiers[0].join("big.bin")).unwrap(), data);
}
