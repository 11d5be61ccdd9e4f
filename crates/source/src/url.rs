//! Source locations as URLs, for the command line and configuration:
//!
//! - `/srv/old[?timeout=SECONDS|off]` or `posix:/srv/old[?timeout=…]`: a directory on
//!   this host (e.g. a kernel NFS/SMB mount); on a file system that can hang (network,
//!   FUSE) each call fails as unreachable after `timeout` (default 15 s), `off` never
//! - `nfs://HOST[:NFSPORT]/EXPORT[?mountport=N&portmapper=N&uid=N&gid=N&connections=N&rsize=N&unprivileged=1&timeout=SECONDS&subdir=PATH]`:
//!   `subdir` migrates one directory inside the export as the share; `timeout` bounds
//!   each NFS call (default 15 s) before it fails as unreachable and the next one
//!   reconnects
//! - `smb://[[DOMAIN;]USER@]HOST[:PORT]/SHARE[?uid=N&gid=N&timeout=SECONDS&connections=N&sign=0|1]`:
//!   the password comes from the environment variable `KAISO_SMB_PASSWORD` (never from
//!   the command line); `DOMAIN` is the NTLM domain of the account (default none);
//!   `timeout` bounds each SMB request (default 15 s) before the call fails and the next
//!   one reconnects; `connections` is the number of SMB sessions, each on its own TCP
//!   connection (default 8, 1 to 64); `sign=1` signs every message, also when the
//!   server does not require it (default `sign=0`: signed only when the server requires
//!   signing; encryption the server asks for is always used)
//!
//! HOST must be a literal IP address for NFS (the user-space client does no DNS).

use kaiso_store::migrate::{Source, SourceError, SourceErrorKind, SourcePath};

use crate::{NfsConfig, NfsSource, SmbConfig, SmbSource};

fn invalid(msg: impl Into<String>) -> SourceError {
    SourceError::new(SourceErrorKind::Invalid, &SourcePath::root(), msg)
}

/// A parsed source URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceUrl {
    Posix(std::path::PathBuf),
    Nfs {
        host: String,
        port: Option<u16>,
        export: String,
        query: Vec<(String, String)>,
    },
    Smb {
        /// The NTLM domain (`DOMAIN;USER@`), empty if none.
        domain: String,
        user: String,
        host: String,
        port: Option<u16>,
        share: String,
        query: Vec<(String, String)>,
    },
}

fn split_query(s: &str) -> (&str, Vec<(String, String)>) {
    match s.split_once('?') {
        None => (s, Vec::new()),
        Some((head, q)) => (
            head,
            q.split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    None => (kv.to_string(), String::new()),
                })
                .collect(),
        ),
    }
}

fn host_port(s: &str) -> Result<(String, Option<u16>), SourceError> {
    if s.is_empty() {
        return Err(invalid("missing host"));
    }
    // [v6]:port, v4:port, or host alone.
    if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| invalid(format!("bad host {s:?}")))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(p.parse().map_err(|_| invalid(format!("bad port {p:?}")))?),
            None => None,
        };
        return Ok((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((
            h.to_string(),
            Some(p.parse().map_err(|_| invalid(format!("bad port {p:?}")))?),
        )),
        _ => Ok((s.to_string(), None)),
    }
}

impl SourceUrl {
    pub fn parse(url: &str) -> Result<Self, SourceError> {
        if let Some(rest) = url.strip_prefix("nfs://") {
            let (body, query) = split_query(rest);
            let (hp, path) = body
                .split_once('/')
                .ok_or_else(|| invalid("nfs URL needs an export path: nfs://HOST/EXPORT"))?;
            let (host, port) = host_port(hp)?;
            Ok(SourceUrl::Nfs {
                host,
                port,
                export: format!("/{path}"),
                query,
            })
        } else if let Some(rest) = url.strip_prefix("smb://") {
            let (body, query) = split_query(rest);
            let (auth_host, share) = body
                .split_once('/')
                .ok_or_else(|| invalid("smb URL needs a share: smb://USER@HOST/SHARE"))?;
            let share = share.trim_end_matches('/');
            if share.is_empty() || share.contains('/') {
                return Err(invalid(format!(
                    "bad share {share:?} (one share name, no path)"
                )));
            }
            let (user, hp) = match auth_host.rsplit_once('@') {
                Some((u, h)) => (u.to_string(), h),
                None => ("guest".to_string(), auth_host),
            };
            let (domain, user) = match user.split_once(';') {
                Some((d, u)) => (d.to_string(), u.to_string()),
                None => (String::new(), user),
            };
            if user.is_empty() {
                return Err(invalid("smb URL has an empty user name"));
            }
            let (host, port) = host_port(hp)?;
            Ok(SourceUrl::Smb {
                domain,
                user,
                host,
                port,
                share: share.to_string(),
                query,
            })
        } else if let Some(p) = url.strip_prefix("posix:") {
            Ok(SourceUrl::Posix(p.into()))
        } else if url.starts_with('/') {
            Ok(SourceUrl::Posix(url.into()))
        } else {
            Err(invalid(format!(
                "unknown source {url:?}: use /PATH, nfs://HOST/EXPORT or smb://USER@HOST/SHARE"
            )))
        }
    }
}

fn q<T: std::str::FromStr>(
    query: &[(String, String)],
    key: &str,
) -> Result<Option<T>, SourceError> {
    match query.iter().find(|(k, _)| k == key) {
        None => Ok(None),
        Some((_, v)) => v
            .parse()
            .map(Some)
            .map_err(|_| invalid(format!("bad value {v:?} for {key}"))),
    }
}

fn check_keys(query: &[(String, String)], allowed: &[&str]) -> Result<(), SourceError> {
    for (k, _) in query {
        if !allowed.contains(&k.as_str()) {
            return Err(invalid(format!(
                "unknown option {k:?} (allowed: {})",
                allowed.join(", ")
            )));
        }
    }
    Ok(())
}

/// `sign=1` signs every SMB message, `sign=0` (the default) only when the server
/// requires signing.
fn smb_sign(query: &[(String, String)]) -> Result<bool, SourceError> {
    match query
        .iter()
        .find(|(k, _)| k == "sign")
        .map(|(_, v)| v.as_str())
    {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(invalid(format!("bad sign={v:?} (0 or 1)"))),
    }
}

/// A timeout given in seconds: positive and finite (an hour at most).
fn timeout_secs(t: f64) -> Result<std::time::Duration, SourceError> {
    if t.is_finite() && t > 0.0 && t <= 3600.0 {
        Ok(std::time::Duration::from_secs_f64(t))
    } else {
        Err(invalid(format!(
            "bad timeout={t} (seconds, more than 0, at most 3600)"
        )))
    }
}

/// The NFS client settings an nfs:// URL asks for (checked before any connect).
fn nfs_config(
    host: String,
    port: Option<u16>,
    export: String,
    query: &[(String, String)],
) -> Result<NfsConfig, SourceError> {
    check_keys(
        query,
        &[
            "mountport",
            "portmapper",
            "uid",
            "gid",
            "connections",
            "unprivileged",
            "rsize",
            "timeout",
            "subdir",
        ],
    )?;
    let mut c = NfsConfig::new(host, export);
    c.nfs_port = port;
    c.mount_port = q(query, "mountport")?;
    if let Some(p) = q(query, "portmapper")? {
        c.portmapper_port = p;
    }
    c.uid = q(query, "uid")?.unwrap_or(0);
    c.gid = q(query, "gid")?.unwrap_or(0);
    c.connections = q(query, "connections")?.unwrap_or(c.connections);
    c.read_size = q(query, "rsize")?.unwrap_or(c.read_size);
    c.privileged_port = q::<u8>(query, "unprivileged")?.unwrap_or(0) == 0;
    c.subdir = q(query, "subdir")?;
    if let Some(t) = q::<f64>(query, "timeout")? {
        c.rpc_timeout = timeout_secs(t)?;
    }
    if port.is_some() && c.mount_port.is_none() {
        return Err(invalid("with an explicit NFS port give ?mountport=N too"));
    }
    Ok(c)
}

/// Connects to the source a URL names.
pub fn open_source(url: &str) -> Result<Box<dyn Source>, SourceError> {
    match SourceUrl::parse(url)? {
        // A hung mount must not hang callers: a per-call deadline (see `deadline`).
        SourceUrl::Posix(p) => crate::deadline::open_posix(&p),
        SourceUrl::Nfs {
            host,
            port,
            export,
            query,
        } => {
            let c = nfs_config(host, port, export, &query)?;
            Ok(Box::new(NfsSource::connect(c)?))
        }
        SourceUrl::Smb {
            domain,
            user,
            host,
            port,
            share,
            query,
        } => {
            check_keys(&query, &["uid", "gid", "timeout", "connections", "sign"])?;
            let password = std::env::var("KAISO_SMB_PASSWORD").unwrap_or_default();
            let mut c = SmbConfig::new(host, share, user, password);
            c.domain = domain;
            if let Some(p) = port {
                c.port = p;
            }
            c.uid = q(&query, "uid")?.unwrap_or(0);
            c.gid = q(&query, "gid")?.unwrap_or(0);
            if let Some(t) = q::<f64>(&query, "timeout")? {
                c.timeout = timeout_secs(t)?;
            }
            if let Some(n) = q::<usize>(&query, "connections")? {
                if !(1..=64).contains(&n) {
                    return Err(invalid(format!(
                        "bad connections={n} for SMB (sessions, 1 to 64)"
                    )));
                }
                c.connections = n;
            }
            c.sign = smb_sign(&query)?;
            Ok(Box::new(SmbSource::connect(c)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_kinds() {
        assert_eq!(
            SourceUrl::parse("/srv/old").unwrap(),
            SourceUrl::Posix("/srv/old".into())
        );
        assert_eq!(
            SourceUrl::parse("posix:/x").unwrap(),
            SourceUrl::Posix("/x".into())
        );
        assert_eq!(
            SourceUrl::parse("nfs://127.0.0.1:2049/export/a?mountport=20048&uid=5").unwrap(),
            SourceUrl::Nfs {
                host: "127.0.0.1".into(),
                port: Some(2049),
                export: "/export/a".into(),
                query: vec![
                    ("mountport".into(), "20048".into()),
                    ("uid".into(), "5".into())
                ]
            }
        );
        assert_eq!(
            SourceUrl::parse("smb://backup@10.1.2.3:4450/data").unwrap(),
            SourceUrl::Smb {
                domain: String::new(),
                user: "backup".into(),
                host: "10.1.2.3".into(),
                port: Some(4450),
                share: "data".into(),
                query: vec![]
            }
        );
        assert!(matches!(
            SourceUrl::parse("smb://CORP;backup@10.1.2.3/data").unwrap(),
            SourceUrl::Smb { ref domain, ref user, .. } if domain == "CORP" && user == "backup"
        ));
        assert!(
            matches!(SourceUrl::parse("nfs://[::1]:20/e").unwrap(), SourceUrl::Nfs { ref host, port: Some(20), .. } if host == "::1")
        );
    }

    #[test]
    fn rejects_bad_urls_clearly() {
        for bad in [
            "ftp://x/y",
            "relative/path",
            "nfs://host",
            "smb://u@h/",
            "smb://u@h/a/b",
            "smb://D;@h/s",
            "nfs://h:notaport/e",
        ] {
            let e = SourceUrl::parse(bad).unwrap_err();
            assert_eq!(e.kind, SourceErrorKind::Invalid, "{bad}");
        }
        let e = open_source("nfs://127.0.0.1/e?bogus=1").err().unwrap();
        assert!(e.message.contains("unknown option"), "{e}");
        let e = open_source("nfs://127.0.0.1:1/e").err().unwrap();
        assert!(e.message.contains("mountport"), "{e}");
        for t in ["0", "-1", "nan", "inf", "7200", "soon", ""] {
            for url in [
                format!("smb://u@127.0.0.1:1/s?timeout={t}"),
                format!("nfs://127.0.0.1/e?timeout={t}"),
            ] {
                let e = open_source(&url).err().unwrap();
                assert_eq!(e.kind, SourceErrorKind::Invalid, "{url}: {e}");
                assert!(e.message.contains("timeout"), "{url}: {e}");
                assert!(!e.message.contains('\n'), "one line: {e}");
            }
        }
    }

    #[test]
    fn smb_connections_out_of_range_is_refused_by_name() {
        for n in ["0", "65", "x"] {
            let e = open_source(&format!("smb://u@127.0.0.1:1/s?connections={n}"))
                .err()
                .expect("refused before connecting");
            assert_eq!(e.kind, SourceErrorKind::Invalid, "connections={n}: {e}");
            assert!(e.message.contains("connections"), "{e}");
        }
    }

    #[test]
    fn nfs_timeout_is_the_rpc_timeout_default_15_s() {
        let parse = |url: &str| match SourceUrl::parse(url).unwrap() {
            SourceUrl::Nfs {
                host,
                port,
                export,
                query,
            } => nfs_config(host, port, export, &query),
            other => panic!("{other:?}"),
        };
        let c = parse("nfs://10.0.0.1/export").unwrap();
        assert_eq!(c.rpc_timeout, std::time::Duration::from_secs(15));
        let c = parse("nfs://10.0.0.1/export?timeout=2.5&uid=7").unwrap();
        assert_eq!(c.rpc_timeout, std::time::Duration::from_millis(2500));
        assert_eq!(c.uid, 7);
        let e = parse("nfs://10.0.0.1/export?timeout=0").unwrap_err();
        assert!(e.message.contains("timeout=0"), "{e}");
    }

    #[test]
    fn smb_sign_is_0_or_1() {
        let q = |v: &str| vec![("sign".to_string(), v.to_string())];
        assert!(!smb_sign(&[]).unwrap());
        assert!(!smb_sign(&q("0")).unwrap());
        assert!(smb_sign(&q("1")).unwrap());
        for bad in ["", "yes", "2"] {
            let e = smb_sign(&q(bad)).unwrap_err();
            assert!(e.message.contains("sign"), "{bad}: {e}");
        }
    }

    #[test]
    fn smb_timeout_is_seconds() {
        assert_eq!(
            timeout_secs(2.5).unwrap(),
            std::time::Duration::from_millis(2500)
        );
    }
}
