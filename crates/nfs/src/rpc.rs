//! ONC RPC over TCP as the face's connection layer sees it (RFC 5531): record marking,
//! the call header (xid, program, version, procedure, credential) and replies.
//!
//! The header is decoded by hand, not with `rpc_msg::unpack`, so that any credential
//! flavour (also ones the XDR types do not know, like RPCSEC_GSS) gets a proper
//! AUTH_ERROR reply instead of a dropped connection.

use crate::cred::SysCred;
use nfs3_server::nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_stat, auth_unix, fragment_header, msg_body, opaque_auth,
    rejected_reply, reply_body, rpc_msg,
};
use nfs3_server::nfs3_types::xdr_codec::{Pack, Unpack, Void};
use std::io::Cursor;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest record accepted from a client: a 1 MiB WRITE plus headers, with room to spare.
pub const MAX_RECORD: usize = 4 << 20;

const AUTH_NULL: u32 = 0;
const AUTH_SYS: u32 = 1;

/// One record, kept framed: a single-fragment record mark, then the message, so it can
/// be passed on without copying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record(Vec<u8>);

impl Record {
    /// The message (without the record mark).
    pub fn body(&self) -> &[u8] {
        &self.0[4..]
    }
    /// The record as one fragment, ready to write to a stream.
    pub fn into_framed(self) -> Vec<u8> {
        self.0
    }
}

/// Read one record (all its fragments). `Ok(None)` at a clean end of stream.
pub async fn read_record<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<Record>> {
    let mut out = vec![0u8; 4];
    loop {
        let mut hdr = [0u8; 4];
        match r.read_exact(&mut hdr).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && out.len() == 4 => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        let h = fragment_header::from(hdr);
        let len = h.fragment_length() as usize;
        if out.len() - 4 + len > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("RPC record larger than {max} bytes"),
            ));
        }
        let at = out.len();
        out.resize(at + len, 0);
        r.read_exact(&mut out[at..]).await?;
        if h.eof() {
            let mark = fragment_header::new((out.len() - 4) as u32, true).into_xdr_buf();
            out[..4].copy_from_slice(&mark);
            return Ok(Some(Record(out)));
        }
    }
}

/// The credential of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    Null,
    Sys(SysCred),
    /// A flavour the face does not serve (AUTH_DES, RPCSEC_GSS…).
    Unsupported(u32),
    /// An AUTH_SYS body that does not decode.
    Malformed,
}

/// The parsed header of an RPC call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallHeader {
    pub xid: u32,
    pub rpcvers: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub cred: Credential,
    /// Where the procedure's arguments start in the record.
    pub args_at: usize,
}

struct Xdr<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Xdr<'a> {
    fn u32(&mut self) -> Option<u32> {
        let v = self.b.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]))
    }
    fn opaque(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > 400 {
            return None; // RFC 5531: opaque_auth bodies are at most 400 bytes
        }
        let padded = len.div_ceil(4) * 4;
        let v = self.b.get(self.at..self.at + len)?;
        self.b.get(self.at..self.at + padded)?;
        self.at += padded;
        Some(v)
    }
}

/// Parse a call header. `None`: not an RPC call at all (the connection is dropped).
pub fn parse_call(rec: &[u8]) -> Option<CallHeader> {
    let mut x = Xdr { b: rec, at: 0 };
    let xid = x.u32()?;
    if x.u32()? != 0 {
        return None; // a REPLY sent to a server
    }
    let rpcvers = x.u32()?;
    let prog = x.u32()?;
    let vers = x.u32()?;
    let proc_ = x.u32()?;
    let flavor = x.u32()?;
    let body = x.opaque()?;
    let _verf_flavor = x.u32()?;
    let _verf = x.opaque()?;
    let cred = match flavor {
        AUTH_NULL => Credential::Null,
        AUTH_SYS => match auth_unix::unpack(&mut Cursor::new(body)) {
            Ok((a, _)) => Credential::Sys(SysCred {
                uid: a.uid,
                gid: a.gid,
                gids: a.gids,
            }),
            Err(_) => Credential::Malformed,
        },
        other => Credential::Unsupported(other),
    };
    Some(CallHeader {
        xid,
        rpcvers,
        prog,
        vers,
        proc_,
        cred,
        args_at: x.at,
    })
}

fn reply(xid: u32, body: reply_body<'_>, result: &impl Pack) -> Vec<u8> {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(body),
    };
    let mut c = Cursor::new(Vec::with_capacity(
        4 + msg.packed_size() + result.packed_size(),
    ));
    c.get_mut().extend_from_slice(&[0; 4]);
    c.set_position(4);
    // Packing into a Vec cannot fail.
    let _ = msg.pack(&mut c);
    let _ = result.pack(&mut c);
    let mut v = c.into_inner();
    let len = (v.len() - 4) as u32;
    v[..4].copy_from_slice(&fragment_header::new(len, true).into_xdr_buf());
    v
}

/// A framed successful reply carrying `result`.
pub fn success(xid: u32, result: &impl Pack) -> Vec<u8> {
    let body = reply_body::MSG_ACCEPTED(accepted_reply {
        verf: opaque_auth::default(),
        reply_data: accept_stat_data::SUCCESS,
    });
    reply(xid, body, result)
}

/// A framed accepted-but-failed reply (PROC_UNAVAIL, GARBAGE_ARGS, SYSTEM_ERR…).
pub fn accept_error(xid: u32, stat: accept_stat_data) -> Vec<u8> {
    let body = reply_body::MSG_ACCEPTED(accepted_reply {
        verf: opaque_auth::default(),
        reply_data: stat,
    });
    reply(xid, body, &Void)
}

/// A framed AUTH_ERROR rejection.
pub fn auth_error(xid: u32, stat: auth_stat) -> Vec<u8> {
    reply(
        xid,
        reply_body::MSG_DENIED(rejected_reply::auth_error(stat)),
        &Void,
    )
}

/// A framed RPC_MISMATCH rejection (only RPC version 2 is spoken).
pub fn rpc_mismatch(xid: u32) -> Vec<u8> {
    reply(
        xid,
        reply_body::MSG_DENIED(rejected_reply::rpc_mismatch(2, 2)),
        &Void,
    )
}

/// Decode a procedure's arguments, which must fill the rest of the record exactly.
pub fn args<T: Unpack>(rec: &[u8], at: usize) -> Option<T> {
    let rest = rec.get(at..)?;
    let mut c = Cursor::new(rest);
    let (v, _) = T::unpack(&mut c).ok()?;
    (c.position() as usize == rest.len()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_server::nfs3_types::rpc::call_body;
    use nfs3_server::nfs3_types::xdr_codec::Opaque;

    fn call(cred: opaque_auth<'static>, args: &[u8]) -> Vec<u8> {
        let msg = rpc_msg {
            xid: 77,
            body: msg_body::CALL(call_body {
                rpcvers: 2,
                prog: 100003,
                vers: 3,
                proc: 15,
                cred,
                verf: opaque_auth::default(),
            }),
        };
        let mut c = Cursor::new(Vec::new());
        msg.pack(&mut c).unwrap();
        let mut v = c.into_inner();
        v.extend_from_slice(args);
        v
    }

    fn sys_cred(uid: u32, gid: u32, gids: Vec<u32>) -> opaque_auth<'static> {
        let a = auth_unix {
            stamp: 1,
            machinename: Opaque::owned(b"client".to_vec()),
            uid,
            gid,
            gids,
        };
        let mut c = Cursor::new(Vec::new());
        a.pack(&mut c).unwrap();
        opaque_auth {
            flavor: nfs3_server::nfs3_types::rpc::auth_flavor::AUTH_UNIX,
            body: Opaque::owned(c.into_inner()),
        }
    }

    #[test]
    fn call_headers() {
        let rec = call(sys_cred(1234, 5678, vec![1, 2]), &[0, 0, 0, 9]);
        let h = parse_call(&rec).unwrap();
        assert_eq!(
            (h.xid, h.rpcvers, h.prog, h.vers, h.proc_),
            (77, 2, 100003, 3, 15)
        );
        assert_eq!(
            h.cred,
            Credential::Sys(SysCred {
                uid: 1234,
                gid: 5678,
                gids: vec![1, 2]
            })
        );
        assert_eq!(&rec[h.args_at..], &[0, 0, 0, 9]);
        let null = parse_call(&call(opaque_auth::default(), &[])).unwrap();
        assert_eq!(null.cred, Credential::Null);
        let mut bad = sys_cred(1, 1, vec![]);
        bad.body = Opaque::owned(vec![0, 0, 0, 1]);
        assert_eq!(
            parse_call(&call(bad, &[])).unwrap().cred,
            Credential::Malformed
        );
        // RPCSEC_GSS (6): not decodable by the XDR types, still a parsed call.
        let mut gss = call(opaque_auth::default(), &[]);
        gss[27] = 6;
        assert_eq!(parse_call(&gss).unwrap().cred, Credential::Unsupported(6));
        // Truncated or not a call.
        assert!(parse_call(&rec[..10]).is_none());
        let mut reply = rec.clone();
        reply[7] = 1;
        assert!(parse_call(&reply).is_none());
    }

    fn framed_test_record(len: usize) -> Vec<u8> {
        let mut v = fragment_header::new(len as u32, true)
            .into_xdr_buf()
            .to_vec();
        v.resize(4 + len, 0);
        v
    }

    #[test]
    fn records_and_replies() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            // Two fragments make one record; then a clean end.
            let mut wire = Vec::new();
            wire.extend_from_slice(&fragment_header::new(3, false).into_xdr_buf());
            wire.extend_from_slice(b"abc");
            wire.extend_from_slice(&fragment_header::new(2, true).into_xdr_buf());
            wire.extend_from_slice(b"de");
            let mut r = wire.as_slice();
            let rec = read_record(&mut r, 100).await.unwrap().unwrap();
            assert_eq!(rec.body(), b"abcde");
            // Passed on as one fragment.
            let framed = rec.into_framed();
            assert_eq!(framed[..4], [0x80, 0, 0, 5]);
            assert_eq!(&framed[4..], b"abcde");
            assert!(read_record(&mut r, 100).await.unwrap().is_none());
            let big = framed_test_record(64);
            assert!(read_record(&mut big.as_slice(), 16).await.is_err());
        });
        let v = accept_error(5, accept_stat_data::GARBAGE_ARGS);
        let mut r = Cursor::new(&v[4..]);
        let (m, _) = rpc_msg::unpack(&mut r).unwrap();
        assert_eq!(m.xid, 5);
        assert!(matches!(
            m.body,
            msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
                reply_data: accept_stat_data::GARBAGE_ARGS,
                ..
            }))
        ));
        assert_eq!(
            u32::from_be_bytes(v[..4].try_into().unwrap()),
            0x8000_0000 | (v.len() as u32 - 4)
        );
    }
}
