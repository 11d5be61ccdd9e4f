//! TEMPORARY step timing (KAISO_MIGRATE_PROF=1): one stderr line per step, wall and
//! thread CPU time.
use std::sync::LazyLock;
use std::time::Instant;

static T0: LazyLock<Instant> = LazyLock::new(Instant::now);
static ON: LazyLock<bool> = LazyLock::new(|| std::env::var_os("KAISO_MIGRATE_PROF").is_some());

fn cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

pub(crate) fn time<T>(label: &str, id: u64, f: impl FnOnce() -> T) -> T {
    if !*ON {
        return f();
    }
    let s = Instant::now();
    let c = cpu();
    let v = f();
    let c = cpu() - c;
    let e = Instant::now();
    let t = std::thread::current();
    eprintln!(
        "PROF {:>9.3} {:>8.3} {:<14} {:<24} {} {:.3}",
        s.duration_since(*T0).as_secs_f64() * 1e3,
        (e - s).as_secs_f64() * 1e3,
        t.name().unwrap_or("?"),
        label,
        id,
        c
    );
    v
}

/// TEMPORARY A/B knobs.
pub(crate) static PIECE: LazyLock<u64> = LazyLock::new(|| {
    std::env::var("KAISO_PIECE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(super::engine::STORE_WRITE_PIECE)
});
pub(crate) static NODEFER: LazyLock<bool> =
    LazyLock::new(|| std::env::var_os("KAISO_NODEFER").is_some());
