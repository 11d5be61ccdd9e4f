//! The calls made once at connect, over the source's own RPC transport ([`RpcConn`]):
//! the portmapper's GETPORT (RFC 1833, version 2) to find the MOUNT and NFS services
//! when their ports are not given, and MOUNT version 3's MNT (RFC 1813) for the export's
//! root file handle. UMNT is not sent: the source holds no state on the server worth
//! clearing, and the kernel client does not either when a server is unreachable.

use nfs3_types::mount::{MOUNT_PROGRAM, dirpath, mountres3, mountstat3};
use nfs3_types::nfs3::nfs_fh3;
use nfs3_types::portmap::{self, PMAP_PROG, mapping};
use nfs3_types::xdr_codec::Opaque;
use tokio::io::{AsyncRead, AsyncWrite};

use super::rpc::{RpcConn, RpcFailure};

/// The MOUNT program number (RFC 1813, appendix I).
pub(crate) const MOUNT_PROGRAM_NUMBER: u32 = nfs3_types::mount::PROGRAM;
pub(crate) const MOUNT_VERSION: u32 = nfs3_types::mount::VERSION;

/// Asks a portmapper connection for the TCP port of `program` version `version`;
/// `Ok(None)` when the program is not registered.
pub(crate) async fn getport<S: AsyncRead + AsyncWrite + Unpin + Send>(
    conn: &mut RpcConn<S>,
    program: u32,
    version: u32,
) -> Result<Option<u16>, RpcFailure> {
    let args = mapping {
        prog: program,
        vers: version,
        prot: portmap::IPPROTO_TCP,
        port: 0,
    };
    let port: u32 = conn.call(PMAP_PROG::PMAPPROC_GETPORT as u32, &args).await?;
    match port {
        0 => Ok(None),
        p => u16::try_from(p)
            .map(Some)
            .map_err(|_| RpcFailure::Protocol(format!("portmapper answered port {p}"))),
    }
}

/// MNT of `export` on a MOUNT connection: the export's root file handle, or the
/// server's refusal.
pub(crate) async fn mnt<S: AsyncRead + AsyncWrite + Unpin + Send>(
    conn: &mut RpcConn<S>,
    export: &str,
) -> Result<Result<nfs_fh3, mountstat3>, RpcFailure> {
    let args = dirpath(Opaque::borrowed(export.as_bytes()));
    let reply: mountres3 = conn
        .call(MOUNT_PROGRAM::MOUNTPROC3_MNT as u32, &args)
        .await?;
    Ok(match reply {
        mountres3::Ok(ok) => Ok(nfs_fh3 {
            data: Opaque::owned(ok.fhandle.0.to_vec()),
        }),
        mountres3::Err(stat) => Err(stat),
    })
}

#[cfg(test)]
mod tests {
    use super::super::rpc::tests::{Scripted, accepted, block, record, test_auth, words};
    use super::*;

    #[test]
    fn getport_asks_for_tcp_and_reads_the_port() {
        let mut body = accepted(9);
        body.extend_from_slice(&words(&[20048]));
        let mut conn = RpcConn::new(Scripted::new(record(&body, 64), 5), test_auth(), 9)
            .for_program(portmap::PROGRAM, portmap::VERSION);
        let port = block(getport(&mut conn, MOUNT_PROGRAM_NUMBER, 3)).unwrap();
        assert_eq!(port, Some(20048));
        let w = &conn.stream_ref().written;
        // xid, CALL, RPC 2, portmapper 100000 v2, GETPORT (3).
        assert_eq!(&w[4..28], &words(&[9, 0, 2, 100_000, 2, 3])[..]);
        // The mapping asked for closes the call: MOUNT v3 over TCP, port 0.
        assert_eq!(&w[w.len() - 16..], &words(&[100_005, 3, 6, 0])[..]);
    }

    #[test]
    fn an_unregistered_program_is_none() {
        let mut body = accepted(1);
        body.extend_from_slice(&words(&[0]));
        let mut conn = RpcConn::new(Scripted::new(record(&body, 64), 64), test_auth(), 1)
            .for_program(portmap::PROGRAM, portmap::VERSION);
        assert_eq!(block(getport(&mut conn, 100_003, 3)).unwrap(), None);
    }

    #[test]
    fn mnt_returns_the_handle_or_the_refusal() {
        // MNT3_OK, a 12-byte handle, one auth flavor (AUTH_UNIX).
        let mut body = accepted(3);
        body.extend_from_slice(&words(&[0, 12]));
        body.extend_from_slice(&[7; 12]);
        body.extend_from_slice(&words(&[1, 1]));
        let mut conn = RpcConn::new(Scripted::new(record(&body, 8), 3), test_auth(), 3)
            .for_program(MOUNT_PROGRAM_NUMBER, MOUNT_VERSION);
        let fh = block(mnt(&mut conn, "/export")).unwrap().unwrap();
        assert_eq!(fh.data.as_ref(), &[7; 12]);
        let w = &conn.stream_ref().written;
        assert_eq!(&w[4..28], &words(&[3, 0, 2, 100_005, 3, 1])[..]);
        // The path as an XDR string: length 7, "/export", one byte of padding.
        assert_eq!(&w[w.len() - 12..], b"\0\0\0\x07/export\0");

        let mut body = accepted(4);
        body.extend_from_slice(&words(&[13])); // MNT3ERR_ACCES
        let mut conn = RpcConn::new(Scripted::new(record(&body, 64), 64), test_auth(), 4)
            .for_program(MOUNT_PROGRAM_NUMBER, MOUNT_VERSION);
        let refused = block(mnt(&mut conn, "/x")).unwrap().unwrap_err();
        assert!(matches!(refused, mountstat3::MNT3ERR_ACCES));
    }

    #[test]
    fn a_server_that_closes_at_once_is_an_error_not_a_loop() {
        let mut conn = RpcConn::new(Scripted::new(Vec::new(), 64), test_auth(), 1)
            .for_program(portmap::PROGRAM, portmap::VERSION);
        let e = block(getport(&mut conn, 100_003, 3)).unwrap_err();
        assert!(matches!(e, RpcFailure::Io(_)), "{e}");
        assert!(e.to_string().contains("closed"), "{e}");
    }
}
