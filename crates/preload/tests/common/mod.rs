//! Shared helpers: locate (or build) the preload library, compile C helpers, temp dirs,
//! and run programs with a private directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// target/<profile>/libkaiso_preload.so, built with `cargo build -p kaiso-preload` in the
/// same profile if it is not there yet.
pub fn preload_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> -> target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(|d| d.parent())
            .expect("target/<profile>");
        let lib = profile_dir.join("libkaiso_preload.so");
        if !lib.is_file() {
            let release = profile_dir.file_name().is_some_and(|n| n == "release");
            let target_dir = profile_dir.parent().expect("target dir");
            let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            c.args(["build", "-p", "kaiso-preload"])
                .env("CARGO_TARGET_DIR", target_dir);
            if release {
                c.arg("--release");
            }
            let st = c.status().expect("run cargo build -p kaiso-preload");
            assert!(st.success(), "cargo build -p kaiso-preload failed");
        }
        assert!(lib.is_file(), "{} missing", lib.display());
        lib
    })
    .clone()
}

/// Bytes available to unprivileged writers on the file system of `p` (0 if unknown).
fn available_bytes(p: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return 0;
    };
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    st.f_bavail as u64 * st.f_frsize as u64
}

/// A scratch directory removed on drop, with a pool path on /dev/shm beside it (when
/// /dev/shm has room).
pub struct Scratch {
    pub dir: PathBuf,
    pub pool: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let id = format!("kaiso-preload-{}-{tag}", std::process::id());
        let dir = std::env::temp_dir().join(&id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let shm = Path::new("/dev/shm");
        // A small /dev/shm (a container's 64 MiB) would SIGBUS the programs when their
        // pool outgrows it: the scratch directory's file system then holds the pool.
        let pool = if shm.is_dir() && available_bytes(shm) >= 1 << 30 {
            shm.join(format!("{id}.pool"))
        } else {
            dir.join("pool")
        };
        let _ = std::fs::remove_file(&pool);
        Scratch { dir, pool }
    }

    /// A fresh directory path below the scratch dir (created empty).
    pub fn sub(&self, name: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// A command whose private directory is `private`, backed by this scratch pool.
    pub fn private_cmd(&self, private: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("LD_PRELOAD", preload_lib())
            .env("KAISO_PRIVATE_DIR", private)
            .env("KAISO_POOL", &self.pool)
            .env("KAISO_POOL_SIZE", "512M")
            .env_remove("KAISO_INHERIT")
            .env_remove("KAISO_CWD");
        c
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.pool);
    }
}

/// Compiles tests/c/<name>.c into the scratch dir.
pub fn compile_c(s: &Scratch, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out = s.dir.join(name);
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc {} failed", src.display());
    out
}

pub fn ok(out: Output) -> String {
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "command failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        so,
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

pub fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .output()
        .is_ok_and(|o| o.status.success())
}
