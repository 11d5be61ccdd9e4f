//! Client CPU and wall time per GiB of the SMB source's `read_into` against a local
//! Samba: a measurement, not a check (ignored; run it in release mode):
//!
//! ```text
//! KAISO_SMB_CPU_MIB=1024 cargo test --release -p kaiso-source --test smb_read_cpu \
//!     -- --ignored --nocapture
//! ```
//!
//! Eight threads read one file in 10 MiB units (the engine's unit) into buffers of their
//! own; CPU is this process's (every thread: callers, the crate's tasks) from getrusage.
//! `KAISO_SMB_CPU_FILE_KIB=N` reads files of N KiB instead (as many as make the total),
//! each in one call. `KAISO_SMB_CPU_URL_SIGN=1` signs every message (`sign=1`): reads then
//! go through the `smb2` crate, as before session 9 (the "before" of an A/B).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use kaiso_source::SmbSource;
use kaiso_store::migrate::{Source, SourcePath};

fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

#[test]
#[ignore = "a measurement: run in release mode with --ignored --nocapture"]
fn smb_read_into_cpu_per_gib() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let mib: usize = std::env::var("KAISO_SMB_CPU_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let rounds: usize = std::env::var("KAISO_SMB_CPU_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let file_kib: usize = std::env::var("KAISO_SMB_CPU_FILE_KIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let share = tempfile::tempdir().expect("tempdir");
    let len = mib << 20;
    let data = Arc::new(common::content(11, len));
    // (name, offset in `data`, length) of each file; one file unless file_kib is set.
    let file_len = if file_kib == 0 { len } else { file_kib << 10 };
    let files: Arc<Vec<(String, usize, usize)>> = Arc::new(
        (0..len / file_len)
            .map(|i| (format!("f{i:05}"), i * file_len, file_len))
            .collect(),
    );
    for (name, off, n) in files.iter() {
        std::fs::write(share.path().join(name), &data[*off..off + n]).unwrap();
    }
    let server = common::Samba::start(share.path());
    let mut config = server.config();
    config.sign = std::env::var("KAISO_SMB_CPU_URL_SIGN").is_ok_and(|v| v == "1");
    let source = Arc::new(SmbSource::connect(config).expect("connect"));
    let unit = 10 << 20;
    // Work items: (file, offset in the file).
    let work: Arc<Vec<(usize, usize)>> = Arc::new(
        files
            .iter()
            .enumerate()
            .flat_map(|(i, (_, _, n))| (0..*n).step_by(unit).map(move |o| (i, o)))
            .collect(),
    );
    for round in 0..rounds {
        let next = Arc::new(AtomicUsize::new(0));
        let (cpu0, t0) = (cpu_seconds(), Instant::now());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (source, next, data) = (source.clone(), next.clone(), data.clone());
                let (files, work) = (files.clone(), work.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; unit];
                    let mut ok = true;
                    loop {
                        let w = next.fetch_add(1, Ordering::SeqCst);
                        let Some(&(f, off)) = work.get(w) else {
                            break ok;
                        };
                        let (name, start, flen) = &files[f];
                        let p = SourcePath::parse(name.as_bytes()).unwrap();
                        let want = unit.min(flen - off);
                        let (n, _) = source.read_into(&p, off as u64, &mut buf).unwrap();
                        ok &= n == want && buf[..n] == data[start + off..start + off + n];
                    }
                })
            })
            .collect();
        // The comparison costs CPU too; it is small next to the transfer (memcmp).
        for t in threads {
            assert!(t.join().unwrap(), "wrong bytes");
        }
        let (cpu, wall) = (cpu_seconds() - cpu0, t0.elapsed().as_secs_f64());
        let gib = len as f64 / (1u64 << 30) as f64;
        println!(
            "round {round}: {mib} MiB in {} files, client CPU {:.3} s/GiB, wall {:.3} s/GiB ({:.0} MiB/s); {:?}",
            files.len(),
            cpu / gib,
            wall / gib,
            mib as f64 / wall,
            source.stats()
        );
    }
}
