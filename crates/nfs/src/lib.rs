//! kaiso-nfs: the embedded NFSv3 server face over the kaiso store (`kaiso serve --nfs`).
//!
//! A thin adapter: NFS file handles carry kaiso inode numbers and every operation is a
//! store method (the same ones the FUSE face calls). Slow operations answer
//! NFS3ERR_JUKEBOX while the work continues ([`jukebox`]); clients outside the allow list
//! are disconnected at accept ([`allow`]). Each call acts as the user of its AUTH_SYS
//! credential, squashed as configured ([`cred`]): kaiso reads the RPC records itself,
//! answers LINK, MKNOD, MKDIR and ACCESS itself and hands the other calls to the
//! `nfs3_server` crate on one lane per identity (`conn`). User documentation: docs/nfs.md.

pub mod allow;
mod conn;
mod convert;
pub mod cred;
mod fs;
mod handles;
pub mod jukebox;
mod procs;
mod rpc;
mod server;

pub use allow::{AllowList, Cidr};
pub use cred::{Identity, Squash};
pub use server::{NfsServer, ServeOptions, ServerStats};

/// Parse a duration like `500ms`, `2s`, `1.5s`, `0` (for `--jukebox-after`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if t == "0" {
        ("0", 1.0)
    } else {
        return Err(format!("bad duration {s:?}: give a unit, e.g. 500ms or 2s"));
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale < 1e9 => {
            Ok(std::time::Duration::from_secs_f64(v * scale))
        }
        _ => Err(format!("bad duration {s:?}: not a non-negative number")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").unwrap_err().contains("unit"));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("xs").is_err());
    }
}
