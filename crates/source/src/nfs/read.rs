//! NFSv3 READ whose reply data lands straight in the caller's slice: the reply is
//! decoded field by field from the stream, so the data is neither staged in a reply
//! buffer nor unpacked into a vector of its own.

use std::io::Cursor;

use nfs3_types::nfs3::{NFS_PROGRAM, READ3args, fattr3, nfs_fh3, nfsstat3};
use nfs3_types::xdr_codec::Unpack;
use tokio::io::{AsyncRead, AsyncWrite};

use super::rpc::{RpcConn, RpcFailure, padded};

/// The XDR size of `fattr3`: five 32-bit fields and eight 64-bit ones.
const FATTR3_SIZE: usize = 5 * 4 + 8 * 8;

/// A successful READ: `len` bytes were written to the front of the caller's slice.
#[derive(Debug)]
pub(crate) struct ReadReply {
    pub(crate) len: usize,
    pub(crate) eof: bool,
    /// The file's post-op attributes, when the server sent them.
    pub(crate) attr: Option<fattr3>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> RpcConn<S> {
    /// READs up to `out.len()` bytes of `file` at `offset` into `out`. An NFS error
    /// status is `Ok(Err(status))` and leaves the connection usable.
    pub(crate) async fn read3(
        &mut self,
        file: &nfs_fh3,
        offset: u64,
        out: &mut [u8],
    ) -> Result<Result<ReadReply, nfsstat3>, RpcFailure> {
        let count = u32::try_from(out.len())
            .map_err(|_| RpcFailure::Protocol(format!("READ of {} bytes", out.len())))?;
        let args = READ3args {
            file: file.clone(),
            offset,
            count,
        };
        let xid = self
            .send_call(NFS_PROGRAM::NFSPROC3_READ as u32, &args)
            .await?;
        self.read_reply_header(xid).await?;
        let status = self.read_u32().await?;
        let attr = self.post_op_attr().await?;
        if status != 0 {
            self.finish_record().await?;
            return Ok(Err(nfs_status(status)?));
        }
        let _count = self.read_u32().await?; // the data's own length is what counts
        let eof = match self.read_u32().await? {
            0 => false,
            1 => true,
            other => return Err(RpcFailure::Protocol(format!("READ eof flag {other}"))),
        };
        let len = self.read_u32().await? as usize;
        if len > out.len() {
            return Err(RpcFailure::Protocol(format!(
                "READ returned {len} bytes for {} asked",
                out.len()
            )));
        }
        self.record_bytes(&mut out[..len]).await?;
        self.skip(padded(len) - len).await?;
        self.finish_record().await?;
        Ok(Ok(ReadReply { len, eof, attr }))
    }

    async fn post_op_attr(&mut self) -> Result<Option<fattr3>, RpcFailure> {
        match self.read_u32().await? {
            0 => Ok(None),
            1 => {
                let mut raw = [0u8; FATTR3_SIZE];
                self.record_bytes(&mut raw).await?;
                let (a, _) = fattr3::unpack(&mut Cursor::new(&raw[..]))
                    .map_err(|e| RpcFailure::Protocol(format!("attributes: {e}")))?;
                Ok(Some(a))
            }
            other => Err(RpcFailure::Protocol(format!(
                "post_op_attr discriminant {other}"
            ))),
        }
    }
}

fn nfs_status(status: u32) -> Result<nfsstat3, RpcFailure> {
    nfsstat3::unpack(&mut Cursor::new(status.to_be_bytes()))
        .map(|(s, _)| s)
        .map_err(|_| RpcFailure::Protocol(format!("unknown NFS status {status}")))
}

#[cfg(test)]
mod tests {
    use super::super::rpc::tests::{Scripted, accepted, block, record, test_auth, words};
    use super::*;
    use nfs3_types::nfs3::ftype3;
    use nfs3_types::xdr_codec::Opaque;

    fn handle() -> nfs_fh3 {
        nfs_fh3 {
            data: Opaque::owned(vec![1, 2, 3, 4, 5, 6, 7, 8]),
        }
    }

    /// A regular file's attributes with the given size, nlink and fileid.
    fn attr_words(size: u64, nlink: u32, fileid: u64) -> Vec<u32> {
        let mut w = vec![1, 0o644, nlink, 10, 20];
        for v in [size, size, 0, 1, fileid, 0, 0, 0] {
            w.extend_from_slice(&[(v >> 32) as u32, v as u32]);
        }
        w
    }

    /// A READ reply record (one or more fragments) for `xid` carrying `data`.
    fn read_reply(xid: u32, data: &[u8], eof: bool, fragment: usize) -> Vec<u8> {
        let mut body = accepted(xid);
        body.extend_from_slice(&words(&[0, 1]));
        body.extend_from_slice(&words(&attr_words(data.len() as u64, 1, 42)));
        body.extend_from_slice(&words(&[data.len() as u32, eof as u32, data.len() as u32]));
        body.extend_from_slice(data);
        body.resize(body.len() + padded(data.len()) - data.len(), 0);
        record(&body, fragment)
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn read_reply_split_across_reads_lands_in_the_slice() {
        let data = pattern(100_003); // not a multiple of 4: padding follows
        for (chunk, fragment) in [
            (1, 1 << 20),
            (5, 1000),
            (4096, 4096),
            (1 << 20, 7),
            (1 << 20, 1 << 20),
        ] {
            let mut wire = read_reply(9, &data, false, fragment);
            // A second reply on the same connection proves the first was consumed exactly.
            wire.extend_from_slice(&read_reply(10, &data[..10], true, fragment));
            let mut conn = RpcConn::new(Scripted::new(wire, chunk), test_auth(), 9);
            let mut out = vec![0u8; 200_000];
            let r = block(conn.read3(&handle(), 0, &mut out)).unwrap().unwrap();
            assert_eq!(r.len, data.len(), "chunk {chunk} fragment {fragment}");
            assert!(!r.eof);
            assert_eq!(&out[..r.len], &data[..]);
            assert!(
                out[r.len..].iter().all(|b| *b == 0),
                "nothing written past the data"
            );
            let a = r.attr.expect("post-op attributes");
            assert_eq!(
                (a.type_, a.fileid, a.size, a.nlink),
                (ftype3::NF3REG, 42, 100_003, 1)
            );
            let r = block(conn.read3(&handle(), 0, &mut out[..10]))
                .unwrap()
                .unwrap();
            assert_eq!((r.len, r.eof), (10, true));
        }
    }

    #[test]
    fn short_read_at_end_of_file() {
        let mut conn = RpcConn::new(
            Scripted::new(read_reply(3, b"tail", true, 1 << 20), 1 << 20),
            test_auth(),
            3,
        );
        let mut out = vec![0u8; 1 << 20];
        let r = block(conn.read3(&handle(), 1 << 30, &mut out))
            .unwrap()
            .unwrap();
        assert_eq!((r.len, r.eof), (4, true));
        assert_eq!(&out[..4], b"tail");
        // The call asked for the whole slice at the offset given.
        let w = &conn.stream_ref().written;
        assert_eq!(&w[w.len() - 12..], &words(&[0, 1 << 30, 1 << 20])[..]);
    }

    #[test]
    fn error_status_keeps_the_connection_usable() {
        // NFS3ERR_ACCES (13) with post-op attributes, then NFS3ERR_JUKEBOX (10008) without.
        let mut body = accepted(1);
        body.extend_from_slice(&words(&[13, 1]));
        body.extend_from_slice(&words(&attr_words(5, 1, 7)));
        let mut wire = record(&body, 16);
        let mut body = accepted(2);
        body.extend_from_slice(&words(&[10008, 0]));
        wire.extend_from_slice(&record(&body, 1 << 20));
        wire.extend_from_slice(&read_reply(3, b"ok!", true, 1 << 20));
        let mut conn = RpcConn::new(Scripted::new(wire, 3), test_auth(), 1);
        let mut out = [0u8; 16];
        let e = block(conn.read3(&handle(), 0, &mut out))
            .unwrap()
            .unwrap_err();
        assert_eq!(e, nfsstat3::NFS3ERR_ACCES);
        let e = block(conn.read3(&handle(), 0, &mut out))
            .unwrap()
            .unwrap_err();
        assert_eq!(e, nfsstat3::NFS3ERR_JUKEBOX);
        let r = block(conn.read3(&handle(), 0, &mut out)).unwrap().unwrap();
        assert_eq!(&out[..r.len], b"ok!");
    }

    #[test]
    fn mismatched_xid_and_oversized_data_are_errors() {
        let wire = read_reply(77, b"data", true, 1 << 20);
        let mut conn = RpcConn::new(Scripted::new(wire, 1 << 20), test_auth(), 76);
        let mut out = [0u8; 16];
        let e = block(conn.read3(&handle(), 0, &mut out)).unwrap_err();
        assert!(
            matches!(e, RpcFailure::Protocol(ref m) if m.contains("xid")),
            "{e}"
        );

        let wire = read_reply(5, &pattern(32), false, 1 << 20);
        let mut conn = RpcConn::new(Scripted::new(wire, 1 << 20), test_auth(), 5);
        let e = block(conn.read3(&handle(), 0, &mut out)).unwrap_err();
        assert!(
            matches!(e, RpcFailure::Protocol(ref m) if m.contains("32 bytes")),
            "{e}"
        );
        assert_eq!(out, [0u8; 16], "nothing written on error");

        let mut body = accepted(6);
        body.extend_from_slice(&words(&[0xffff, 0]));
        let mut conn = RpcConn::new(Scripted::new(record(&body, 64), 64), test_auth(), 6);
        let e = block(conn.read3(&handle(), 0, &mut out)).unwrap_err();
        assert!(
            matches!(e, RpcFailure::Protocol(ref m) if m.contains("65535")),
            "{e}"
        );
    }
}
