//! ONC RPC over TCP (RFC 5531) for the NFS source's own connections (NFS, and the
//! portmapper and MOUNT at connect): record marking, call encoding with a pre-encoded
//! credential, and reply decoding straight from the stream. A server that closes the
//! connection is an error at once, never a retry loop.
//!
//! One call is outstanding per connection at a time (the pool gives each caller its own
//! connection), so a reply must carry the xid of the call just sent. Replies are read
//! through a small buffer: headers come out of it, while large bodies (READ data,
//! READDIRPLUS replies) are read from the socket straight into their destination, so a
//! 1 MiB READ reply is copied once, by the kernel, into the caller's slice.

use std::io::Cursor;

use nfs3_types::rpc::opaque_auth;
use nfs3_types::xdr_codec::{Pack, Unpack};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub(crate) const NFS_PROGRAM: u32 = 100_003;
pub(crate) const NFS_VERSION: u32 = 3;

const RPC_VERSION: u32 = 2;
const MSG_CALL: u32 = 0;
const MSG_REPLY: u32 = 1;
const MSG_ACCEPTED: u32 = 0;
const MSG_DENIED: u32 = 1;
const LAST_FRAGMENT: u32 = 0x8000_0000;
/// RFC 5531 caps an authenticator body at 400 bytes.
const MAX_AUTH_BODY: usize = 400;
/// The largest reply decoded in memory (READDIRPLUS asks for 512 KiB at most).
const MAX_BUFFERED_REPLY: usize = 16 << 20;
/// Bytes read ahead of the parser: enough for any reply header, small enough that the
/// part of a READ body that lands here (and is copied once more) stays negligible.
const INBOUND_BUFFER: usize = 4 << 10;

/// Why a call failed; every kind leaves the connection unusable.
#[derive(Debug)]
pub(crate) enum RpcFailure {
    /// The transport failed or the server closed the connection.
    Io(std::io::Error),
    /// The server refused the credential (MSG_DENIED / AUTH_ERROR).
    Denied(String),
    /// The reply does not follow the protocol, or the call was not accepted.
    Protocol(String),
}

impl std::fmt::Display for RpcFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "transport: {e}"),
            Self::Denied(m) => write!(f, "credential refused: {m}"),
            Self::Protocol(m) => write!(f, "protocol: {m}"),
        }
    }
}

impl From<std::io::Error> for RpcFailure {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

fn protocol(msg: impl Into<String>) -> RpcFailure {
    RpcFailure::Protocol(msg.into())
}

/// The credential and verifier of every call, XDR-encoded once per source.
pub(crate) fn encode_auth(credential: &opaque_auth<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    // Packing into a Vec cannot fail for a credential opaque_auth::auth_unix accepted.
    let _ = credential.pack(&mut out);
    let _ = opaque_auth::default().pack(&mut out);
    out
}

/// One TCP connection (or any byte stream) speaking ONC RPC to one program (NFS unless
/// [`RpcConn::for_program`] says otherwise).
pub(crate) struct RpcConn<S> {
    stream: S,
    program: u32,
    version: u32,
    next_xid: u32,
    /// Encoded credential + verifier, shared by the source's connections.
    auth: std::sync::Arc<[u8]>,
    /// The call being sent (reused).
    outbound: Vec<u8>,
    /// Bytes read from the stream and not yet parsed: `inbound[start..end]`.
    inbound: Box<[u8]>,
    start: usize,
    end: usize,
    /// Bytes left in the current record fragment, and whether it is the record's last.
    fragment_left: usize,
    last_fragment: bool,
    /// A whole reply decoded in memory (reused; never shrinks below its largest use).
    reply: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> RpcConn<S> {
    pub(crate) fn new(stream: S, auth: std::sync::Arc<[u8]>, first_xid: u32) -> Self {
        Self {
            stream,
            program: NFS_PROGRAM,
            version: NFS_VERSION,
            next_xid: first_xid,
            auth,
            outbound: Vec::with_capacity(512),
            inbound: vec![0u8; INBOUND_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            fragment_left: 0,
            last_fragment: true,
            reply: Vec::new(),
        }
    }

    /// The same connection calling `program` version `version` instead of NFSv3.
    pub(crate) fn for_program(mut self, program: u32, version: u32) -> Self {
        self.program = program;
        self.version = version;
        self
    }

    /// The underlying stream (to check an idle connection is still open).
    pub(crate) fn stream_ref(&self) -> &S {
        &self.stream
    }

    /// Calls procedure `proc` of the connection's program and decodes the whole result as `R`.
    pub(crate) async fn call<A: Pack, R: Unpack>(
        &mut self,
        proc: u32,
        args: &A,
    ) -> Result<R, RpcFailure> {
        let xid = self.send_call(proc, args).await?;
        self.read_reply_header(xid).await?;
        let len = self.read_rest_of_record().await?;
        let mut cursor = Cursor::new(&self.reply[..len]);
        let (value, _) =
            R::unpack(&mut cursor).map_err(|e| protocol(format!("undecodable reply: {e}")))?;
        Ok(value)
    }

    /// Encodes and sends one call in a single record; returns its xid.
    pub(crate) async fn send_call<A: Pack>(
        &mut self,
        proc: u32,
        args: &A,
    ) -> Result<u32, RpcFailure> {
        let xid = self.next_xid;
        self.next_xid = xid.wrapping_add(1);
        let out = &mut self.outbound;
        out.clear();
        out.extend_from_slice(&[0; 4]); // record mark, filled in below
        for word in [xid, MSG_CALL, RPC_VERSION, self.program, self.version, proc] {
            out.extend_from_slice(&word.to_be_bytes());
        }
        out.extend_from_slice(&self.auth);
        args.pack(out)
            .map_err(|e| protocol(format!("arguments not encodable: {e}")))?;
        let body = u32::try_from(out.len() - 4)
            .ok()
            .filter(|n| *n < LAST_FRAGMENT && n % 4 == 0)
            .ok_or_else(|| protocol(format!("call of {} bytes", out.len() - 4)))?;
        out[..4].copy_from_slice(&(body | LAST_FRAGMENT).to_be_bytes());
        self.stream.write_all(&self.outbound).await?;
        Ok(xid)
    }

    /// Reads a reply's RPC header up to the procedure's result, which comes next.
    /// A reply that is not an accepted, successful reply to call `xid` is an error.
    pub(crate) async fn read_reply_header(&mut self, xid: u32) -> Result<(), RpcFailure> {
        self.begin_record().await?;
        let got = self.read_u32().await?;
        if got != xid {
            return Err(protocol(format!(
                "reply with xid {got:#x} to call {xid:#x}"
            )));
        }
        if self.read_u32().await? != MSG_REPLY {
            return Err(protocol("a call where a reply was expected"));
        }
        match self.read_u32().await? {
            MSG_ACCEPTED => {}
            MSG_DENIED => return Err(self.denied().await),
            other => return Err(protocol(format!("reply status {other}"))),
        }
        let _verifier_flavor = self.read_u32().await?;
        let verifier_len = self.read_u32().await? as usize;
        if verifier_len > MAX_AUTH_BODY {
            return Err(protocol(format!("verifier of {verifier_len} bytes")));
        }
        self.skip(padded(verifier_len)).await?;
        match self.read_u32().await? {
            0 => Ok(()),
            1 => Err(protocol(format!(
                "program {} not served (PROG_UNAVAIL)",
                self.program
            ))),
            2 => {
                let (low, high) = (self.read_u32().await?, self.read_u32().await?);
                Err(protocol(format!(
                    "version {} of program {} not served (PROG_MISMATCH, versions {low}..={high})",
                    self.version, self.program
                )))
            }
            3 => Err(protocol("procedure unavailable (PROC_UNAVAIL)")),
            4 => Err(protocol(
                "server could not decode the arguments (GARBAGE_ARGS)",
            )),
            5 => Err(protocol("server error (SYSTEM_ERR)")),
            other => Err(protocol(format!("accept status {other}"))),
        }
    }

    /// The rest of a MSG_DENIED reply, as an error.
    async fn denied(&mut self) -> RpcFailure {
        let detail = async {
            match self.read_u32().await? {
                0 => {
                    let (low, high) = (self.read_u32().await?, self.read_u32().await?);
                    Ok::<_, RpcFailure>(protocol(format!(
                        "RPC version refused (RPC_MISMATCH, versions {low}..={high})"
                    )))
                }
                1 => {
                    let stat = self.read_u32().await?;
                    Ok(RpcFailure::Denied(format!(
                        "AUTH_ERROR {}",
                        auth_stat_name(stat)
                    )))
                }
                other => Ok(protocol(format!("reject status {other}"))),
            }
        };
        match detail.await {
            Ok(e) | Err(e) => e,
        }
    }

    /// Reads the rest of the current record into `self.reply`; returns its length.
    async fn read_rest_of_record(&mut self) -> Result<usize, RpcFailure> {
        let mut len = 0;
        loop {
            let part = self.fragment_left;
            if len + part > MAX_BUFFERED_REPLY {
                return Err(protocol(format!("reply of more than {len} + {part} bytes")));
            }
            if self.reply.len() < len + part {
                self.reply.resize(len + part, 0);
            }
            let mut reply = std::mem::take(&mut self.reply);
            let r = self.record_bytes(&mut reply[len..len + part]).await;
            self.reply = reply;
            r?;
            len += part;
            if self.last_fragment {
                return Ok(len);
            }
            self.next_fragment().await?;
        }
    }

    /// Discards what is left of the current record (the caller decoded what it needs).
    pub(crate) async fn finish_record(&mut self) -> Result<(), RpcFailure> {
        loop {
            let n = self.fragment_left;
            self.skip(n).await?;
            if self.last_fragment {
                return Ok(());
            }
            self.next_fragment().await?;
        }
    }

    async fn begin_record(&mut self) -> Result<(), RpcFailure> {
        if self.fragment_left != 0 || !self.last_fragment {
            return Err(protocol("a new reply before the previous one ended"));
        }
        self.next_fragment().await
    }

    async fn next_fragment(&mut self) -> Result<(), RpcFailure> {
        let mut mark = [0u8; 4];
        self.stream_bytes(&mut mark).await?;
        let mark = u32::from_be_bytes(mark);
        self.last_fragment = mark & LAST_FRAGMENT != 0;
        self.fragment_left = (mark & !LAST_FRAGMENT) as usize;
        Ok(())
    }

    /// Fills `out` with the record's next bytes, across fragment boundaries.
    pub(crate) async fn record_bytes(&mut self, mut out: &mut [u8]) -> Result<(), RpcFailure> {
        while !out.is_empty() {
            if self.fragment_left == 0 {
                if self.last_fragment {
                    return Err(protocol("reply shorter than its contents"));
                }
                self.next_fragment().await?;
                continue;
            }
            let n = self.fragment_left.min(out.len());
            let (now, rest) = out.split_at_mut(n);
            self.stream_bytes(now).await?;
            self.fragment_left -= n;
            out = rest;
        }
        Ok(())
    }

    /// Skips `n` bytes of the record.
    pub(crate) async fn skip(&mut self, mut n: usize) -> Result<(), RpcFailure> {
        let mut scratch = [0u8; 256];
        while n > 0 {
            let k = n.min(scratch.len());
            self.record_bytes(&mut scratch[..k]).await?;
            n -= k;
        }
        Ok(())
    }

    pub(crate) async fn read_u32(&mut self) -> Result<u32, RpcFailure> {
        let mut b = [0u8; 4];
        self.record_bytes(&mut b).await?;
        Ok(u32::from_be_bytes(b))
    }

    /// Fills `out` from the buffer, then from the stream: straight into `out` when what
    /// is missing is at least a buffer's worth, through the buffer otherwise.
    async fn stream_bytes(&mut self, mut out: &mut [u8]) -> Result<(), RpcFailure> {
        loop {
            let buffered = self.end - self.start;
            let n = buffered.min(out.len());
            out[..n].copy_from_slice(&self.inbound[self.start..self.start + n]);
            self.start += n;
            out = &mut out[n..];
            if out.is_empty() {
                return Ok(());
            }
            if out.len() >= self.inbound.len() {
                let got = self.stream.read(out).await?;
                if got == 0 {
                    return Err(closed());
                }
                out = &mut out[got..];
                if out.is_empty() {
                    return Ok(());
                }
            } else {
                self.start = 0;
                self.end = self.stream.read(&mut self.inbound).await?;
                if self.end == 0 {
                    return Err(closed());
                }
            }
        }
    }
}

fn closed() -> RpcFailure {
    RpcFailure::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    ))
}

/// XDR pads opaque data to a multiple of 4 bytes.
pub(crate) fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

fn auth_stat_name(stat: u32) -> String {
    match stat {
        1 => "AUTH_BADCRED".into(),
        2 => "AUTH_REJECTEDCRED".into(),
        3 => "AUTH_BADVERF".into(),
        4 => "AUTH_REJECTEDVERF".into(),
        5 => "AUTH_TOOWEAK (the server may want a privileged source port)".into(),
        other => format!("auth_stat {other}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use nfs3_types::nfs3::{GETATTR3args, GETATTR3res, Nfs3Result, nfs_fh3};
    use nfs3_types::rpc::auth_unix;
    use nfs3_types::xdr_codec::Opaque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A stream that hands out a scripted reply at most `chunk` bytes per read (as TCP
    /// may split it anywhere) and records what the client wrote.
    pub(crate) struct Scripted {
        pub(crate) input: Vec<u8>,
        pub(crate) pos: usize,
        pub(crate) chunk: usize,
        pub(crate) written: Vec<u8>,
    }

    impl Scripted {
        pub(crate) fn new(input: Vec<u8>, chunk: usize) -> Self {
            Self {
                input,
                pos: 0,
                chunk,
                written: Vec::new(),
            }
        }
    }

    impl AsyncRead for Scripted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = self
                .chunk
                .min(buf.remaining())
                .min(self.input.len() - self.pos);
            let at = self.pos;
            buf.put_slice(&self.input[at..at + n]);
            self.pos += n;
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.written.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    pub(crate) fn test_auth() -> std::sync::Arc<[u8]> {
        let cred = opaque_auth::auth_unix(&auth_unix {
            stamp: 7,
            machinename: Opaque::owned(b"kaiso".to_vec()),
            uid: 1000,
            gid: 100,
            gids: vec![],
        });
        encode_auth(&cred).into()
    }

    pub(crate) fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    /// An accepted, successful reply header for `xid` (verifier AUTH_NONE), without the
    /// record mark.
    pub(crate) fn accepted(xid: u32) -> Vec<u8> {
        words(&[xid, MSG_REPLY, MSG_ACCEPTED, 0, 0, 0])
    }

    /// `body` as one record, split into fragments of at most `fragment` bytes.
    pub(crate) fn record(body: &[u8], fragment: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let pieces: Vec<&[u8]> = body.chunks(fragment).collect();
        for (i, p) in pieces.iter().enumerate() {
            let last = if i + 1 == pieces.len() {
                LAST_FRAGMENT
            } else {
                0
            };
            out.extend_from_slice(&(p.len() as u32 | last).to_be_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    fn getattr_args() -> GETATTR3args {
        GETATTR3args {
            object: nfs_fh3 {
                data: Opaque::owned(vec![1; 8]),
            },
        }
    }

    /// Runs `f` to completion on a runtime of its own.
    pub(crate) fn block<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// The failure of a GETATTR call (xid 5) answered by `wire`, read `chunk` bytes at a
    /// time.
    fn getattr_failure(wire: Vec<u8>, chunk: usize) -> RpcFailure {
        let mut conn = RpcConn::new(Scripted::new(wire, chunk), test_auth(), 5);
        block(conn.call::<_, GETATTR3res>(1, &getattr_args())).unwrap_err()
    }

    #[test]
    fn call_is_one_record_with_the_credential() {
        let mut conn = RpcConn::new(Scripted::new(Vec::new(), 1), test_auth(), 0x10);
        let args = GETATTR3args {
            object: nfs_fh3 {
                data: Opaque::owned(vec![9; 8]),
            },
        };
        let xid = block(conn.send_call(1, &args)).unwrap();
        assert_eq!(xid, 0x10);
        let w = &conn.stream.written;
        let mark = u32::from_be_bytes(w[..4].try_into().unwrap());
        assert_eq!(mark, LAST_FRAGMENT | (w.len() as u32 - 4));
        assert_eq!(&w[4..28], &words(&[0x10, 0, 2, 100_003, 3, 1])[..]);
        // AUTH_UNIX: flavor 1, body length, stamp, "kaiso" (padded), uid, gid, no gids.
        let mut cred = words(&[1, 28, 7, 5]);
        cred.extend_from_slice(b"kaiso\0\0\0");
        cred.extend_from_slice(&words(&[1000, 100, 0]));
        assert_eq!(&w[28..28 + cred.len()], &cred[..]);
        let rest = &w[28 + cred.len()..];
        assert_eq!(&rest[..8], &words(&[0, 0])[..], "AUTH_NONE verifier");
        assert_eq!(
            &rest[8..],
            &[&words(&[8])[..], &[9; 8]].concat()[..],
            "the handle"
        );
        // The next call takes the next xid.
        assert_eq!(block(conn.send_call(1, &args)).unwrap(), 0x11);
    }

    #[test]
    fn a_reply_split_across_reads_and_fragments_decodes() {
        // GETATTR3res with an error status: status NFS3ERR_STALE (70), then resfail
        // (post-op attributes absent... GETATTR3resfail is void).
        let mut body = accepted(5);
        body.extend_from_slice(&words(&[70]));
        for (chunk, fragment) in [(1, 3), (3, 4), (7, 1000), (4096, 8)] {
            let mut conn = RpcConn::new(
                Scripted::new(record(&body, fragment), chunk),
                test_auth(),
                5,
            );
            let r: GETATTR3res = block(conn.call(1, &getattr_args())).unwrap();
            match r {
                Nfs3Result::Err((stat, _)) => {
                    assert_eq!(stat, nfs3_types::nfs3::nfsstat3::NFS3ERR_STALE)
                }
                Nfs3Result::Ok(_) => panic!("stale expected"),
            }
        }
    }

    #[test]
    fn a_mismatched_xid_is_an_error() {
        let mut body = accepted(99);
        body.extend_from_slice(&words(&[70]));
        let e = getattr_failure(record(&body, 64), 64);
        assert!(
            matches!(e, RpcFailure::Protocol(ref m) if m.contains("xid")),
            "{e}"
        );
    }

    #[test]
    fn refused_credentials_and_unaccepted_calls_are_errors() {
        // MSG_DENIED, AUTH_ERROR, AUTH_TOOWEAK.
        let denied = words(&[5, MSG_REPLY, MSG_DENIED, 1, 5]);
        let e = getattr_failure(record(&denied, 64), 64);
        assert!(
            matches!(e, RpcFailure::Denied(ref m) if m.contains("TOOWEAK")),
            "{e}"
        );
        // Accepted with a 4-byte verifier, then PROG_MISMATCH 2..=2.
        let mismatch = words(&[5, MSG_REPLY, MSG_ACCEPTED, 1, 4, 0xdead, 2, 2, 2]);
        let e = getattr_failure(record(&mismatch, 64), 64);
        assert!(
            matches!(e, RpcFailure::Protocol(ref m) if m.contains("2..=2")),
            "{e}"
        );
    }

    #[test]
    fn a_truncated_reply_or_closed_connection_is_an_error() {
        // The record says 24 bytes but the connection ends after 10.
        let mut bytes = (24u32 | LAST_FRAGMENT).to_be_bytes().to_vec();
        bytes.extend_from_slice(&accepted(5)[..10]);
        let e = getattr_failure(bytes, 3);
        assert!(matches!(e, RpcFailure::Io(_)), "{e}");
        // A record whose contents end before the result does.
        let body = accepted(5);
        let e = getattr_failure(record(&body, 64), 64);
        assert!(matches!(e, RpcFailure::Protocol(_)), "{e}");
    }
}
