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
//! each in one call (`KAISO_SMB_CPU_FILE_BYTES=N`: of N bytes). `KAISO_SMB_CPU_URL_SIGN=1` signs every message (`sign=1`): reads then
//! go through the `smb2` crate, as before session 9 (the "before" of an A/B).
//! `KAISO_SMB_CPU_READ_KIB=N` and `KAISO_SMB_CPU_PARALLEL=N` set the READ size and the
//! READs in flight per call. Each round also gives smbd's CPU (every process of its
//! group, from /proc), the server's side of the same transfer. `KAISO_SMB_CPU_LIST=1`
//! lists the share and asks every file's metadata first, as a crawl does (then small
//! files are read in one compound each), and gives that pass's CPU per file.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use kaiso_source::SmbSource;
use kaiso_store::migrate::{Source, SourcePath};

/// CPU seconds (user + system) of every live process in the process group led by a
/// child of this process named `smbd` (smbd leads a group of its own and forks a process
/// per connection), plus what the leader's reaped children used.
fn smbd_cpu_seconds() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let tick = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    // (pid, comm, fields after the comm) of every process.
    let procs: Vec<(u32, String, Vec<String>)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (open, close) = (stat.find('(')?, stat.rfind(')')?);
            let rest = stat
                .get(close + 2..)?
                .split(' ')
                .map(String::from)
                .collect();
            Some((pid, stat[open + 1..close].to_string(), rest))
        })
        .collect();
    // Fields after the comm: 0 state, 1 ppid, 2 pgrp, 11 utime, 12 stime, 13 cutime,
    // 14 cstime.
    let field = |f: &[String], i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let me = std::process::id() as f64;
    let leaders: Vec<u32> = procs
        .iter()
        .filter(|(_, comm, f)| comm == "smbd" && field(f, 1) == Some(me))
        .map(|p| p.0)
        .collect();
    let mut ticks = 0.0;
    for (pid, _, f) in &procs {
        if leaders.iter().any(|l| field(f, 2) == Some(*l as f64)) {
            // The leader's reaped children count too (connections that ended).
            let last = if leaders.contains(pid) { 14 } else { 12 };
            ticks += (11..=last).filter_map(|i| field(f, i)).sum::<f64>();
        }
    }
    ticks / tick
}

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
    let file_len = match std::env::var("KAISO_SMB_CPU_FILE_BYTES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(b) => b.max(1),
        None if file_kib == 0 => len,
        None => file_kib << 10,
    };
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
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    if let Some(kib) = env("KAISO_SMB_CPU_READ_KIB") {
        config.read_size = kib << 10;
        config.data_read_size = kib << 10;
    }
    if let Some(n) = env("KAISO_SMB_CPU_PARALLEL") {
        config.parallel_reads = n;
    }
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
        if std::env::var("KAISO_SMB_CPU_LIST").is_ok_and(|v| v == "1") {
            // As a crawl does: the listing (size and EA hints, metadata fetched ahead),
            // then every file's EAs, descriptor and streams; its cost on its own line.
            let (cpu0, server0, t0) = (cpu_seconds(), smbd_cpu_seconds(), Instant::now());
            let listed = source.read_dir_with_attr(&SourcePath::root()).unwrap().0;
            assert_eq!(listed.len(), files.len(), "listing of the share");
            let next = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (source, next, files) = (source.clone(), next.clone(), files.clone());
                    std::thread::spawn(move || {
                        while let Some((name, _, _)) =
                            files.get(next.fetch_add(1, Ordering::SeqCst))
                        {
                            let p = SourcePath::parse(name.as_bytes()).unwrap();
                            source.xattrs(&p).unwrap();
                            source.acl(&p).unwrap();
                            source.streams(&p).unwrap();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let n = files.len() as f64;
            println!(
                "round {round}: listing + metadata of {} files: client CPU {:.0} µs/file, smbd CPU {:.0} µs/file, wall {:.3} s",
                files.len(),
                (cpu_seconds() - cpu0) / n * 1e6,
                (smbd_cpu_seconds() - server0) / n * 1e6,
                t0.elapsed().as_secs_f64()
            );
        }
        let next = Arc::new(AtomicUsize::new(0));
        let (cpu0, server0, t0) = (cpu_seconds(), smbd_cpu_seconds(), Instant::now());
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
        let server = smbd_cpu_seconds() - server0;
        let gib = len as f64 / (1u64 << 30) as f64;
        println!(
            "round {round}: {mib} MiB in {} files, client CPU {:.3} s/GiB, smbd CPU {:.3} s/GiB ({:.0} µs/file), wall {:.3} s/GiB ({:.0} MiB/s); {:?}",
            files.len(),
            cpu / gib,
            server / gib,
            server / files.len() as f64 * 1e6,
            wall / gib,
            mib as f64 / wall,
            source.stats()
        );
    }
}
