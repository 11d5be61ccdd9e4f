//! A running `kaiso migrate start` for the migration tests of the binary: started with the
//! test's arguments (and only the environment the test gives), waited for until it serves,
//! stopped with SIGTERM (bounded) or SIGKILL, its mount removed on drop. Plus the
//! bounded `kaiso migrate VERB` commands the tests run against it, and status polling.

use super::{force_unmount, is_mounted, kaiso_bin};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// `len` bytes of a fixed pseudo-random sequence for `seed` (xorshift): source file
/// contents that differ from file to file and are easy to write again for comparison.
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Waits at most `limit` for `child` to exit.
pub fn wait_child(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `kaiso migrate start`.
pub struct Daemon {
    pub child: Option<Child>,
    log: PathBuf,
    mnt: Option<PathBuf>,
}

impl Daemon {
    /// Starts the daemon and waits (bounded) until it says it serves and the mount is up.
    pub fn start(args: &[&OsStr], log: PathBuf, mnt: Option<&Path>) -> Result<Daemon, String> {
        Self::start_env(args, &[], log, mnt)
    }

    /// [`Daemon::start`] with extra environment variables.
    pub fn start_env(
        args: &[&OsStr],
        env: &[(&str, &str)],
        log: PathBuf,
        mnt: Option<&Path>,
    ) -> Result<Daemon, String> {
        let f = fs::File::create(&log).unwrap();
        let child = Command::new(kaiso_bin())
            // Only what the test gives: never a password of the caller's environment.
            .env_remove("KAISO_SMB_PASSWORD")
            .envs(env.iter().copied())
            .arg("migrate")
            .arg("start")
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut d = Daemon {
            child: Some(child),
            log,
            mnt: mnt.map(Path::to_path_buf),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if d.log_text().contains("kaiso: serving after") && mnt.is_none_or(is_mounted) {
                return Ok(d);
            }
            if let Some(s) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                return Err(format!("daemon exited ({s}):\n{}", d.log_text()));
            }
            if Instant::now() > deadline {
                return Err(format!("daemon not serving within 30 s:\n{}", d.log_text()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's own "serving after N ms".
    pub fn serving_ms(&self) -> u64 {
        let t = self.log_text();
        let rest = t
            .split("kaiso: serving after ")
            .nth(1)
            .expect("serving line");
        rest.split(' ').next().unwrap().parse().unwrap()
    }

    pub fn nfs_port(&self) -> u16 {
        let t = self.log_text();
        let rest = t
            .split("kaiso: nfs listening on ")
            .nth(1)
            .expect("nfs line");
        let addr = rest.lines().next().unwrap();
        addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// SIGKILL, then the mount the daemon left is removed; the value forgets the
    /// mountpoint, so that dropping it later cannot unmount a successor's mount there.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(m) = self.mnt.take() {
            force_unmount(&m);
        }
    }

    /// SIGTERM and a bounded wait: the daemon unmounts and exits.
    pub fn stop(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running daemon");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        match wait_child(&mut c, Duration::from_secs(30)) {
            Some(s) => s,
            None => {
                let _ = c.kill();
                panic!("daemon did not stop within 30 s:\n{}", self.log_text());
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if wait_child(&mut c, Duration::from_secs(10)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if let Some(m) = &self.mnt
            && is_mounted(m)
        {
            force_unmount(m);
        }
    }
}

/// Runs `kaiso ARGS` without `$KAISO_SMB_PASSWORD` unless `env` sets it, with `env`,
/// killed after `limit`.
pub fn run_kaiso_bounded(args: &[&OsStr], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut all: Vec<(&str, Option<&str>)> = vec![("KAISO_SMB_PASSWORD", None)];
    all.extend(env.iter().map(|(k, v)| (*k, Some(*v))));
    run_kaiso_env(args, &all, limit)
}

/// Runs `kaiso ARGS` with extra environment variables (`None`: removed), killed after
/// `limit`; the output goes through files, so a child that keeps a pipe open cannot hang
/// the test.
pub fn run_kaiso_env(args: &[&OsStr], env: &[(&str, Option<&str>)], limit: Duration) -> Output {
    let dir = super::temp_dir("migd-out");
    let (o, e) = (dir.join("out"), dir.join("err"));
    let mut cmd = Command::new(kaiso_bin());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&o).unwrap())
        .stderr(fs::File::create(&e).unwrap())
        .spawn()
        .expect("spawn kaiso");
    let status = match wait_child(&mut child, limit) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let s = child.wait().unwrap();
            eprintln!("kaiso {args:?} killed after {limit:?}");
            s
        }
    };
    let out = Output {
        status,
        stdout: fs::read(&o).unwrap_or_default(),
        stderr: fs::read(&e).unwrap_or_default(),
    };
    let _ = fs::remove_dir_all(&dir);
    out
}

/// `kaiso migrate VERB CONFIG EXTRA…`, killed after `limit`.
pub fn migrate_cmd(verb: &str, config: &Path, extra: &[&str], limit: Duration) -> Output {
    let mut args = vec![OsStr::new("migrate"), OsStr::new(verb), config.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    run_kaiso_bounded(&args, &[], limit)
}

/// A command's exit status and both streams, for failure messages.
pub fn output_text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `kaiso migrate status CONFIG --json` (must succeed within 30 s), parsed.
pub fn migrate_status_json(config: &Path) -> serde_json::Value {
    let o = migrate_cmd("status", config, &["--json"], Duration::from_secs(30));
    assert!(o.status.success(), "{}", output_text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", output_text(&o)))
}

/// Polls `status --json` until `pred` holds for the first share, at most `limit`; the
/// failure names `what` and shows the last status.
pub fn wait_share_status(
    config: &Path,
    limit: Duration,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = migrate_status_json(config);
        if pred(&v["shares"][0]) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}; last status {v:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `n` files of `size` seeded bytes, `f000`, `f001`…, in `root/dir` (created).
pub fn write_numbered_files(root: &Path, dir: &str, n: usize, size: usize) {
    fs::create_dir_all(root.join(dir)).unwrap();
    for i in 0..n {
        fs::write(
            root.join(dir).join(format!("f{i:03}")),
            seeded_bytes(i as u64 + 1, size),
        )
        .unwrap();
    }
}

/// Waits (at most 30 s) until the daemon log `log` says "kaiso: serving after".
pub fn wait_logged_serving(log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fs::read_to_string(log)
        .unwrap_or_default()
        .contains("kaiso: serving after")
    {
        assert!(
            Instant::now() < deadline,
            "not serving within 30 s:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
