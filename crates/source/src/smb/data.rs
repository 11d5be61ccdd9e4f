//! Large-file reads on SMB connections of the source's own: the READ replies are decoded
//! from the socket straight into the caller's buffer (one copy, the kernel's), like the
//! NFS source's READ path. The `smb2` crate copies a reply four times (the frame, the
//! compound split, the frame's body and raw bytes) before the source copies it a fifth
//! time, and verifies every reply's signature: twice the client CPU per byte.
//!
//! A data connection is a blocking TCP socket used by one call at a time: NEGOTIATE
//! (SMB 2.1 to 3.0.2), NTLM SESSION_SETUP, TREE_CONNECT, then CREATE, READ, QUERY_INFO
//! and CLOSE for the files read on it, and files' metadata compounds (CREATE and up to
//! four QUERY_INFOs) whose handles it keeps for the files' first reads. It is only used when the server requires neither
//! signing nor encryption (of the session or the share) and the configuration does not
//! ask for signing; otherwise the source reads through the crate's sessions, which sign
//! or seal as the server asks. A data connection that fails is dropped: after a broken
//! connection or a reply it could not decode the call is read again through the crate;
//! a timeout is the call's error (the source then reconnects everything). A connection
//! that cannot be set up leaves the calls to the crate for a while (`RETRY_AFTER`).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use kaiso_store::migrate::SourcePath;
use smb2::auth::{NtlmAuthenticator, NtlmCredentials};
use smb2::msg::header::Header;
use smb2::msg::negotiate::{NegotiateRequest, NegotiateResponse};
use smb2::msg::session_setup::{
    SessionSetupRequest, SessionSetupRequestFlags, SessionSetupResponse,
};
use smb2::msg::tree_connect::{TreeConnectRequest, TreeConnectRequestFlags, TreeConnectResponse};
use smb2::pack::{Guid, Pack, ReadCursor, Unpack, WriteCursor};
use smb2::types::flags::{Capabilities, SecurityMode, ShareFlags};
use smb2::types::{Command, CreditCharge, Dialect, FileId, MessageId, SessionId, TreeId};

use super::link::{Fail, Requests};
use super::wire::{self, OpenFor, RawAttr, ReadCompound, ReadFrom};
use super::{STATUS_END_OF_FILE, SmbConfig};

const STATUS_SUCCESS: u32 = 0;
const STATUS_PENDING: u32 = 0x0000_0103;
const STATUS_MORE_PROCESSING_REQUIRED: u32 = 0xC000_0016;
const FLAG_ASYNC: u32 = 0x2;
/// Size of the fixed part of a READ reply body (2.2.20).
const READ_REPLY_FIXED: usize = 16;
/// Handles a data connection keeps open for files' next units and first reads (kept from
/// their metadata fetch); the oldest beyond it are closed. smbd holds an open file (and a
/// descriptor) per handle: 1,024 on each of at most `connections` data connections
/// stays far below its per-process limit (`max open files`, 16,384 by default). A
/// metadata pass keeps every listed file's handle until the data pass reads it, and the
/// metadata fetched ahead in batches does not spread evenly over the connections (256
/// reopened 6 % of dataset (a)'s files, session 16).
pub const KEPT_PER_LINK: usize = 1024;
/// How long a kept handle waits for its file's next read before it is closed (also when
/// nobody reads any more: a paused or stopped crawl, a skipped file; see `sweep`).
pub const KEPT_TTL: Duration = Duration::from_secs(30);
/// Credits the source tries to hold on a data connection (each READ of 1 MiB costs 16).
const CREDIT_TARGET: u32 = 512;
/// How long a call waits at most for the busy connection holding its file's kept handle
/// (a call on a data connection is one compound or one window of READs) before it
/// takes another connection and opens the file anew.
const HOLDER_WAIT: Duration = Duration::from_secs(1);
/// Numbers the data connections (which one holds which kept handle).
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);
/// After a data connection could not be set up, the next attempt waits this long.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// What a reply is for.
enum Expect {
    /// A READ of `len` bytes into the caller's buffer at `at`.
    Read { at: usize, len: usize },
    /// FileAllInformation after the read.
    Attr,
}

/// A metadata compound's replies (the CREATE's first) and the handle it opened (`None`
/// when the CREATE failed).
pub type Opened = (Vec<smb2::Frame>, Option<FileId>);

/// One SMB session on a TCP connection of its own, used by one call at a time.
pub struct DataLink {
    serial: u64,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    session_id: u64,
    tree_id: u32,
    next_mid: u64,
    credits: u32,
    max_read: u32,
    /// Message ids of requests nobody waits for (closes): their replies are dropped.
    discard: Vec<u64>,
    /// Handles kept for files' next reads.
    kept: Vec<Kept>,
    /// Bytes of the current transport frame not read yet (a frame may chain replies).
    frame_left: usize,
}

/// A handle kept open on a data connection for its file's next read.
pub struct Kept {
    pub path: SourcePath,
    pub id: FileId,
    at: Instant,
    /// Kept from the file's metadata fetch (nothing read on it yet): the file's link
    /// count then. A read on it that finds fewer links (0 once the file was deleted or
    /// replaced by a rename over its name) reads the path again (see `read_small`).
    pub meta_nlink: Option<u32>,
}

/// A reply's header fields this path uses.
struct Reply {
    status: u32,
    mid: u64,
    credits: u16,
    flags: u32,
    session_id: u64,
    tree_id: u32,
    /// Bytes of the frame after the 64-byte header.
    body_len: usize,
}

impl DataLink {
    /// Sets up a session and connects the share. `Ok(None)`: the server requires
    /// signing or encryption, or speaks no dialect of SMB 2.1 to 3.0.2 with multi-credit
    /// READs: this path is not for it.
    pub fn connect(config: &SmbConfig) -> Result<Option<Self>, Fail> {
        let io = |e: io::Error| Fail::Io(e.to_string());
        // Every address the name resolves to, in turn (as `TcpStream::connect` does):
        // `localhost` may give ::1 first while the server listens on 127.0.0.1 only.
        let mut last = Fail::Io(format!("{}: no address", config.server()));
        let mut connected = None;
        for addr in (config.host.as_str(), config.port)
            .to_socket_addrs()
            .map_err(io)?
        {
            match TcpStream::connect_timeout(&addr, config.timeout) {
                Ok(s) => {
                    connected = Some(s);
                    break;
                }
                Err(e) => last = io(e),
            }
        }
        let Some(sock) = connected else {
            return Err(last);
        };
        sock.set_nodelay(true).map_err(io)?;
        sock.set_read_timeout(Some(config.timeout)).map_err(io)?;
        sock.set_write_timeout(Some(config.timeout)).map_err(io)?;
        let writer = sock.try_clone().map_err(io)?;
        let mut link = DataLink {
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            reader: BufReader::with_capacity(16 << 10, sock),
            writer,
            session_id: 0,
            tree_id: 0,
            next_mid: 0,
            credits: 1,
            max_read: 0,
            discard: Vec::new(),
            kept: Vec::new(),
            frame_left: 0,
        };
        let nonce = std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        let negotiate = NegotiateRequest {
            security_mode: SecurityMode::new(SecurityMode::SIGNING_ENABLED),
            capabilities: Capabilities::new(Capabilities::LARGE_MTU),
            client_guid: Guid {
                data1: nonce as u32,
                data2: (nonce >> 32) as u16,
                data3: 0x4b53,
                data4: *b"kaisodat",
            },
            dialects: vec![Dialect::Smb2_1, Dialect::Smb3_0, Dialect::Smb3_0_2],
            negotiate_contexts: Vec::new(),
        };
        // A server that speaks none of these dialects (e.g. `server min protocol =
        // SMB3_11`) refuses the NEGOTIATE or hangs up: not a server for this path.
        let (reply, body) = match link.request(Command::Negotiate, &negotiate, 1, false) {
            Ok(r) => r,
            Err(Fail::Io(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if reply.status != STATUS_SUCCESS {
            return Ok(None);
        }
        let neg = NegotiateResponse::unpack(&mut ReadCursor::new(&body))
            .map_err(|_| Fail::Malformed("NEGOTIATE"))?;
        if neg.security_mode.signing_required()
            || !neg.capabilities.contains(Capabilities::LARGE_MTU)
        {
            return Ok(None);
        }
        link.max_read = neg.max_read_size;
        let mut auth = NtlmAuthenticator::new(NtlmCredentials {
            username: config.user.clone(),
            password: config.password.clone(),
            domain: config.domain.clone(),
        });
        let setup = |token: Vec<u8>| SessionSetupRequest {
            flags: SessionSetupRequestFlags(0),
            security_mode: SecurityMode::new(SecurityMode::SIGNING_ENABLED),
            capabilities: Capabilities::default(),
            channel: 0,
            previous_session_id: 0,
            security_buffer: token,
        };
        let (reply, body) =
            link.request(Command::SessionSetup, &setup(auth.negotiate()), 1, false)?;
        if reply.status != STATUS_MORE_PROCESSING_REQUIRED {
            return Err(Fail::Status {
                status: reply.status,
                op: "session setup",
            });
        }
        link.session_id = reply.session_id;
        let challenge = SessionSetupResponse::unpack(&mut ReadCursor::new(&body))
            .map_err(|_| Fail::Malformed("SESSION_SETUP"))?;
        let token = auth
            .authenticate(&challenge.security_buffer)
            .map_err(Fail::Smb)?;
        let (reply, body) = link.request(Command::SessionSetup, &setup(token), 1, false)?;
        if reply.status != STATUS_SUCCESS {
            return Err(Fail::Status {
                status: reply.status,
                op: "session setup",
            });
        }
        let done = SessionSetupResponse::unpack(&mut ReadCursor::new(&body))
            .map_err(|_| Fail::Malformed("SESSION_SETUP"))?;
        let flags = done.session_flags;
        if flags.encrypt_data() || flags.is_guest() || flags.is_null() {
            return Ok(None);
        }
        let tree = TreeConnectRequest {
            flags: TreeConnectRequestFlags(0),
            path: format!(r"\\{}\{}", config.host, config.share),
        };
        let (reply, body) = link.request(Command::TreeConnect, &tree, 1, false)?;
        if reply.status != STATUS_SUCCESS {
            return Err(Fail::Status {
                status: reply.status,
                op: "tree connect",
            });
        }
        let share = TreeConnectResponse::unpack(&mut ReadCursor::new(&body))
            .map_err(|_| Fail::Malformed("TREE_CONNECT"))?;
        if share.share_flags.contains(ShareFlags::ENCRYPT_DATA) {
            return Ok(None);
        }
        link.tree_id = reply.tree_id;
        Ok(Some(link))
    }

    /// Sends one request; returns its message id.
    fn send(
        &mut self,
        command: Command,
        body: &dyn Pack,
        charge: u16,
        on_tree: bool,
    ) -> Result<u64, Fail> {
        let charge = charge.max(1);
        let mid = self.next_mid;
        let mut header = Header::new_request(command);
        header.credit_charge = CreditCharge(if mid == 0 { 0 } else { charge });
        // Ask for what this request costs and, below the target, some more.
        let want = if self.credits < CREDIT_TARGET {
            charge as u32 + 64
        } else {
            charge as u32
        };
        header.credits = want.min(u16::MAX as u32) as u16;
        header.message_id = MessageId(mid);
        header.session_id = SessionId(self.session_id);
        header.tree_id = on_tree.then_some(TreeId(self.tree_id));
        let mut cursor = WriteCursor::new();
        cursor.write_bytes(&[0; 4]);
        header.pack(&mut cursor);
        body.pack(&mut cursor);
        let mut msg = cursor.into_inner();
        let len = msg.len() - 4;
        if len >= 1 << 24 {
            return Err(Fail::Malformed("request too large"));
        }
        msg[1..4].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        self.writer
            .write_all(&msg)
            .map_err(|e| Fail::Io(e.to_string()))?;
        self.next_mid += charge as u64;
        self.credits = self.credits.saturating_sub(charge as u32);
        Ok(mid)
    }

    /// The next reply's SMB2 header (interim replies included); its body (`body_len`
    /// bytes) is for the caller to read. A transport frame may chain several replies
    /// (a compound's), each starting at the NextCommand offset of the one before.
    fn next_reply(&mut self) -> Result<Reply, Fail> {
        if self.frame_left == 0 {
            let mut nb = [0u8; 4];
            self.reader.read_exact(&mut nb).map_err(read_fail)?;
            if nb[0] != 0 {
                return Err(Fail::Malformed("SMB2 frame"));
            }
            self.frame_left = u32::from_be_bytes([0, nb[1], nb[2], nb[3]]) as usize;
        }
        let mut h = [0u8; Header::SIZE];
        if self.frame_left < Header::SIZE {
            return Err(Fail::Malformed("SMB2 frame"));
        }
        self.reader.read_exact(&mut h).map_err(read_fail)?;
        if h[..4] != [0xFE, b'S', b'M', b'B'] {
            return Err(Fail::Malformed("SMB2 header"));
        }
        let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let u64_at = |o: usize| (u32_at(o) as u64) | ((u32_at(o + 4) as u64) << 32);
        let next_command = u32_at(20) as usize;
        let body_len = if next_command == 0 {
            self.frame_left - Header::SIZE
        } else if next_command >= Header::SIZE && next_command <= self.frame_left {
            next_command - Header::SIZE
        } else {
            return Err(Fail::Malformed("compound reply (NextCommand)"));
        };
        self.frame_left -= Header::SIZE + body_len;
        let reply = Reply {
            status: u32_at(8),
            credits: u16_at(14),
            flags: u32_at(16),
            mid: u64_at(24),
            tree_id: u32_at(36),
            session_id: u64_at(40),
            body_len,
        };
        self.credits += reply.credits as u32;
        Ok(reply)
    }

    /// Reads the rest of a frame into a new buffer (small replies only).
    fn body(&mut self, reply: &Reply) -> Result<Vec<u8>, Fail> {
        let mut body = vec![0u8; reply.body_len];
        self.reader.read_exact(&mut body).map_err(read_fail)?;
        Ok(body)
    }

    /// The next final reply that somebody waits for: interim replies and the replies of
    /// background closes are read and dropped.
    fn next_final(&mut self) -> Result<Reply, Fail> {
        loop {
            let reply = self.next_reply()?;
            let interim = reply.status == STATUS_PENDING && reply.flags & FLAG_ASYNC != 0;
            if interim {
                skip(&mut self.reader, reply.body_len)?;
                continue;
            }
            if let Some(i) = self.discard.iter().position(|&m| m == reply.mid) {
                self.discard.swap_remove(i);
                skip(&mut self.reader, reply.body_len)?;
                continue;
            }
            return Ok(reply);
        }
    }

    /// Sends a request and waits for its reply (header and body).
    fn request(
        &mut self,
        command: Command,
        body: &dyn Pack,
        charge: u16,
        on_tree: bool,
    ) -> Result<(Reply, Vec<u8>), Fail> {
        let mid = self.send(command, body, charge, on_tree)?;
        let reply = self.next_final()?;
        if reply.mid != mid {
            return Err(Fail::Malformed("reply to a request not sent"));
        }
        let body = self.body(&reply)?;
        Ok((reply, body))
    }

    /// Opens `name` for reading: one round trip.
    pub fn open(&mut self, name: String, requests: &Requests) -> Result<FileId, Fail> {
        requests.count(Command::Create);
        let create = wire::create(name, OpenFor::Read);
        let (reply, body) = self.request(Command::Create, &create, 1, true)?;
        if reply.status != STATUS_SUCCESS {
            return Err(Fail::Status {
                status: reply.status,
                op: "open",
            });
        }
        wire::created_file_id(&body).ok_or(Fail::Malformed("CREATE"))
    }

    /// CREATE + READ + QUERY_INFO (FileAllInformation) + CLOSE as one related compound
    /// (`from` a name), or READ + QUERY_INFO + CLOSE on a handle kept open: one round
    /// trip for a file that fits one READ. Returns the bytes read and the attributes after
    /// the read. With `split` (see [`wire::aligned_split`]) the range is asked as two
    /// READs, the first ending on an 8-byte boundary.
    pub fn read_small(
        &mut self,
        from: ReadFrom,
        offset: u64,
        buf: &mut [u8],
        split: Option<usize>,
        requests: &Requests,
    ) -> Result<(usize, Option<RawAttr>), Fail> {
        let len = buf.len().min(self.max_read as usize);
        let chain = ReadCompound::new(from, offset, len, split);
        let ops = chain.ops();
        for (c, _, _) in &ops {
            requests.count(*c);
        }
        requests.compounds.fetch_add(1, Ordering::Relaxed);
        let mids = self.send_compound(&ops)?;
        // Bytes of each READ (the first, the tail), and its status.
        let mut got = [None, None];
        let mut read_status = [STATUS_SUCCESS; 2];
        let mut open_status = STATUS_SUCCESS;
        let mut attr = None;
        let mut left = ops.len();
        while left > 0 {
            let reply = self.next_final()?;
            let Some(k) = mids.iter().position(|&m| m == reply.mid) else {
                return Err(Fail::Malformed("reply to a request not sent"));
            };
            left -= 1;
            let piece = chain
                .range_of(k)
                .map(|range| (usize::from(Some(k) == chain.tail_at()), range));
            match piece {
                Some((i, range)) if reply.status == STATUS_SUCCESS => {
                    got[i] = Some(read_reply_into(
                        &mut self.reader,
                        reply.body_len,
                        &mut buf[range],
                    )?);
                }
                Some((i, _)) => {
                    read_status[i] = reply.status;
                    skip(&mut self.reader, reply.body_len)?;
                }
                None if k == chain.query_at() && reply.status == STATUS_SUCCESS => {
                    let body = self.body(&reply)?;
                    attr = wire::output_buffer(&body).and_then(wire::parse_all_information);
                }
                None => {
                    if Some(k) == chain.create_at() {
                        open_status = reply.status;
                    }
                    skip(&mut self.reader, reply.body_len)?;
                }
            }
        }
        if open_status != STATUS_SUCCESS {
            return Err(Fail::Status {
                status: open_status,
                op: "open",
            });
        }
        let first = chain.first;
        let n = match (got[0], read_status[0]) {
            (Some(n), _) => n,
            (None, STATUS_END_OF_FILE) => 0,
            (None, status) => return Err(Fail::Status { status, op: "read" }),
        };
        if chain.tail_at().is_none() || n < first {
            return Ok((n, attr));
        }
        // The first part was whole: the tail follows it.
        match (got[1], read_status[1]) {
            (Some(m), _) => Ok((n + m, attr)),
            (None, STATUS_END_OF_FILE) => Ok((n, attr)),
            (None, status) => Err(Fail::Status { status, op: "read" }),
        }
    }

    /// Files' metadata, one compound each (`(name, eas)`): CREATE (data, attributes, EAs
    /// and security descriptor access), FileAllInformation, the security descriptor, the
    /// streams (`named_streams`) and the EAs (`eas`), without a CLOSE: the handle is for
    /// the file's first read. The compounds go out one after another without waiting,
    /// then their replies are read: one round trip for all of them instead of one each
    /// (smbd answers them in turn; the wait for the network is paid once). As many go
    /// out at once as the credits allow; the rest follow as replies bring credits back.
    /// Per item, in the order of `items`: each reply as a frame (the CREATE's first) and
    /// the handle (`None` when the CREATE failed), which the caller keeps or closes.
    pub fn metadata_batch(
        &mut self,
        items: Vec<(String, bool)>,
        named_streams: bool,
        requests: &Requests,
    ) -> Result<Vec<Opened>, Fail> {
        let owned: Vec<wire::MetadataRequests> = items
            .into_iter()
            .map(|(name, eas)| {
                wire::metadata_requests(name, OpenFor::MetadataAndRead, named_streams, eas)
            })
            .collect();
        // Each compound's ops (no CLOSE: the handle stays open), its message ids once
        // sent, and its replies as they come.
        let all_ops: Vec<Vec<(Command, &dyn Pack, u16)>> = owned
            .iter()
            .map(|o| {
                let mut ops = o.ops();
                ops.pop();
                ops
            })
            .collect();
        let mut mids: Vec<Vec<u64>> = Vec::with_capacity(all_ops.len());
        let mut frames: Vec<Vec<Option<smb2::Frame>>> = all_ops
            .iter()
            .map(|ops| (0..ops.len()).map(|_| None).collect())
            .collect();
        let mut left = 0usize;
        while mids.len() < all_ops.len() || left > 0 {
            while let Some(ops) = all_ops.get(mids.len()) {
                // Out of credits: wait for replies first (they bring more).
                if left > 0 && (self.credits as usize) < ops.len() {
                    break;
                }
                for (c, _, _) in ops {
                    requests.count(*c);
                }
                requests.compounds.fetch_add(1, Ordering::Relaxed);
                mids.push(self.send_compound(ops)?);
                left += ops.len();
            }
            let reply = self.next_final()?;
            let Some((i, k)) = mids
                .iter()
                .enumerate()
                .find_map(|(i, m)| m.iter().position(|&x| x == reply.mid).map(|k| (i, k)))
            else {
                return Err(Fail::Malformed("reply to a request not sent"));
            };
            if frames[i][k].is_some() {
                return Err(Fail::Malformed("two replies to one request"));
            }
            left -= 1;
            let body = self.body(&reply)?;
            let mut header = Header::new_request(all_ops[i][k].0);
            header.status = smb2::types::status::NtStatus(reply.status);
            header.message_id = MessageId(reply.mid);
            frames[i][k] = Some(smb2::Frame {
                header,
                body,
                raw: Vec::new(),
            });
        }
        Ok(frames
            .into_iter()
            .map(|f| {
                let f: Vec<smb2::Frame> = f.into_iter().flatten().collect();
                let id = f
                    .first()
                    .filter(|f| f.header.status.0 == STATUS_SUCCESS)
                    .and_then(|f| wire::created_file_id(&f.body));
                (f, id)
            })
            .collect())
    }

    /// Sends `ops` as one related compound (each request 8-byte aligned, the FileId of
    /// the CREATE carried over); returns their message ids.
    fn send_compound(&mut self, ops: &[(Command, &dyn Pack, u16)]) -> Result<Vec<u64>, Fail> {
        let mut cursor = WriteCursor::new();
        cursor.write_bytes(&[0; 4]);
        let mut mids = Vec::with_capacity(ops.len());
        let mut starts = Vec::with_capacity(ops.len());
        for (i, (command, body, charge)) in ops.iter().enumerate() {
            let charge = (*charge).max(1);
            let mid = self.next_mid;
            let mut header = Header::new_request(*command);
            header.credit_charge = CreditCharge(charge);
            let want = if self.credits < CREDIT_TARGET {
                charge as u32 + 16
            } else {
                charge as u32
            };
            header.credits = want.min(u16::MAX as u32) as u16;
            header.message_id = MessageId(mid);
            header.session_id = SessionId(self.session_id);
            header.tree_id = Some(TreeId(self.tree_id));
            if i > 0 {
                header.flags.set_related();
            }
            let start = cursor.position();
            starts.push(start);
            header.pack(&mut cursor);
            body.pack(&mut cursor);
            if i + 1 < ops.len() {
                while !(cursor.position() - 4).is_multiple_of(8) {
                    cursor.write_bytes(&[0]);
                }
            }
            self.next_mid += charge as u64;
            self.credits = self.credits.saturating_sub(charge as u32);
            mids.push(mid);
        }
        let mut msg = cursor.into_inner();
        // NextCommand of each request but the last: the distance to the next one.
        for i in 0..starts.len().saturating_sub(1) {
            let next = (starts[i + 1] - starts[i]) as u32;
            msg[starts[i] + 20..starts[i] + 24].copy_from_slice(&next.to_le_bytes());
        }
        let len = msg.len() - 4;
        if len >= 1 << 24 {
            return Err(Fail::Malformed("request too large"));
        }
        msg[1..4].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        self.writer
            .write_all(&msg)
            .map_err(|e| Fail::Io(e.to_string()))?;
        Ok(mids)
    }

    /// Closes a handle without waiting for the reply (dropped when it comes).
    pub fn close_later(&mut self, file_id: FileId, requests: &Requests) -> Result<(), Fail> {
        requests.count(Command::Close);
        let mid = self.send(Command::Close, &wire::close(file_id), 1, true)?;
        self.discard.push(mid);
        Ok(())
    }

    /// Fills `buf` from `offset` of an open file with READs of `piece` bytes, up to
    /// `parallel` in flight, each reply decoded into its place in `buf`; with
    /// `want_attr` also FileAllInformation, asked with the last READ. Returns the bytes
    /// read (fewer only at end of file) and the number of windows waited for.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &mut self,
        file_id: FileId,
        offset: u64,
        buf: &mut [u8],
        piece: usize,
        parallel: usize,
        want_attr: bool,
        requests: &Requests,
    ) -> Result<(usize, Option<RawAttr>, u64), Fail> {
        let piece = piece.min(self.max_read as usize).max(64 << 10);
        let mut pending: Vec<(u64, Expect)> = Vec::with_capacity(parallel + 1);
        let mut next = 0usize;
        let mut eof_at: Option<usize> = None;
        let mut attr = None;
        let mut asked_attr = false;
        let mut pieces = 0u64;
        loop {
            while pending.len() < parallel && next < buf.len() && eof_at.is_none_or(|e| next < e) {
                let len = piece.min(buf.len() - next);
                let charge = wire::credit_charge(len as u32);
                if self.credits < charge as u32 && !pending.is_empty() {
                    break; // wait for replies to bring credits
                }
                requests.count(Command::Read);
                let read = wire::read(file_id, offset + next as u64, len as u32);
                let mid = self.send(Command::Read, &read, charge, true)?;
                pending.push((mid, Expect::Read { at: next, len }));
                next += len;
                pieces += 1;
                if next >= buf.len() && want_attr {
                    requests.count(Command::QueryInfo);
                    let q = wire::query_all(file_id);
                    let mid = self.send(Command::QueryInfo, &q, 1, true)?;
                    pending.push((mid, Expect::Attr));
                    asked_attr = true;
                }
            }
            if pending.is_empty() {
                break;
            }
            let reply = self.next_final()?;
            let Some(i) = pending.iter().position(|(m, _)| *m == reply.mid) else {
                return Err(Fail::Malformed("reply to a request not sent"));
            };
            let (_, expect) = pending.swap_remove(i);
            match expect {
                Expect::Attr => {
                    let body = self.body(&reply)?;
                    if reply.status == STATUS_SUCCESS {
                        attr = wire::output_buffer(&body).and_then(wire::parse_all_information);
                    }
                }
                Expect::Read { at, len } => {
                    let got = match reply.status {
                        STATUS_SUCCESS => read_reply_into(
                            &mut self.reader,
                            reply.body_len,
                            &mut buf[at..at + len],
                        )?,
                        STATUS_END_OF_FILE => {
                            skip(&mut self.reader, reply.body_len)?;
                            0
                        }
                        status => {
                            skip(&mut self.reader, reply.body_len)?;
                            // The replies still due are dropped when they come, so the
                            // connection stays in step for its next call.
                            self.discard.extend(pending.iter().map(|(m, _)| *m));
                            return Err(Fail::Status { status, op: "read" });
                        }
                    };
                    if got < len {
                        eof_at = Some(eof_at.map_or(at + got, |e| e.min(at + got)));
                    }
                }
            }
        }
        let mut windows = pieces.div_ceil(parallel as u64);
        if want_attr && !asked_attr {
            // The end of file came before the last READ went out.
            requests.count(Command::QueryInfo);
            let (reply, body) =
                self.request(Command::QueryInfo, &wire::query_all(file_id), 1, true)?;
            if reply.status == STATUS_SUCCESS {
                attr = wire::output_buffer(&body).and_then(wire::parse_all_information);
            }
            windows += 1;
        }
        Ok((eof_at.unwrap_or(buf.len()).min(buf.len()), attr, windows))
    }

    /// The handle kept for `path`, if this connection has one (an expired one is closed).
    pub fn take_kept(&mut self, path: &SourcePath, requests: &Requests) -> Option<Kept> {
        let i = self.kept.iter().position(|k| &k.path == path)?;
        let k = self.kept.remove(i);
        if k.at.elapsed() < KEPT_TTL {
            return Some(k);
        }
        let _ = self.close_later(k.id, requests);
        None
    }

    fn has_kept(&self, path: &SourcePath) -> bool {
        self.kept.iter().any(|k| &k.path == path)
    }

    /// A handle kept from a read of `path` (for its next unit), not from its metadata.
    fn has_unit_kept(&self, path: &SourcePath) -> bool {
        self.kept
            .iter()
            .any(|k| &k.path == path && k.meta_nlink.is_none())
    }

    /// Handles kept open on this connection.
    pub fn kept_count(&self) -> usize {
        self.kept.len()
    }

    /// Keeps `file_id` for the file's next read (`meta_nlink`: kept from its metadata
    /// fetch, see [`Kept`]); the oldest handles beyond the limit and expired ones are
    /// closed. A handle kept for the same path before is closed.
    pub fn keep(
        &mut self,
        path: &SourcePath,
        file_id: FileId,
        meta_nlink: Option<u32>,
        requests: &Requests,
    ) {
        if let Some(old) = self.kept.iter().position(|k| &k.path == path) {
            let old = self.kept.remove(old);
            let _ = self.close_later(old.id, requests);
        }
        self.kept.push(Kept {
            path: path.clone(),
            id: file_id,
            at: Instant::now(),
            meta_nlink,
        });
        let _ = self.close_expired(requests);
    }

    /// Closes (without waiting) the handles kept too long, and the oldest beyond the
    /// limit. The list is in the order the handles were kept.
    pub fn close_expired(&mut self, requests: &Requests) -> Result<(), Fail> {
        let over = self.kept.len().saturating_sub(KEPT_PER_LINK);
        let mut close: Vec<FileId> = self.kept.drain(..over).map(|k| k.id).collect();
        self.kept.retain(|k| {
            let keep = k.at.elapsed() < KEPT_TTL;
            if !keep {
                close.push(k.id);
            }
            keep
        });
        let mut result = Ok(());
        for id in close {
            if let Err(e) = self.close_later(id, requests) {
                result = Err(e);
            }
        }
        result
    }
}

fn read_fail(e: io::Error) -> Fail {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Fail::TimedOut,
        _ => Fail::Io(e.to_string()),
    }
}

/// Reads and drops `n` bytes of the stream.
fn skip<R: BufRead>(r: &mut R, n: usize) -> Result<(), Fail> {
    let copied = io::copy(&mut r.take(n as u64), &mut io::sink()).map_err(read_fail)?;
    if copied as usize != n {
        return Err(Fail::Io("connection closed in a reply".into()));
    }
    Ok(())
}

/// Decodes a successful READ reply's body (`body_len` bytes after the header) from `r`,
/// its data straight into `dest`. Returns the bytes of data; a reply that claims more
/// than was asked, points inside its own fixed part or ends early is an error (never
/// zeros in the caller's buffer).
pub fn read_reply_into<R: BufRead>(
    r: &mut R,
    body_len: usize,
    dest: &mut [u8],
) -> Result<usize, Fail> {
    if body_len < READ_REPLY_FIXED {
        return Err(Fail::Malformed("READ"));
    }
    let mut fixed = [0u8; READ_REPLY_FIXED];
    r.read_exact(&mut fixed).map_err(read_fail)?;
    let data_offset = fixed[2] as usize;
    let data_len = u32::from_le_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]) as usize;
    if data_len == 0 {
        skip(r, body_len - READ_REPLY_FIXED)?;
        return Ok(0);
    }
    let pad = data_offset
        .checked_sub(Header::SIZE + READ_REPLY_FIXED)
        .ok_or(Fail::Malformed("READ (data offset)"))?;
    if data_len > dest.len() || READ_REPLY_FIXED + pad + data_len > body_len {
        return Err(Fail::Malformed("READ (data length)"));
    }
    skip(r, pad)?;
    r.read_exact(&mut dest[..data_len]).map_err(read_fail)?;
    skip(r, body_len - READ_REPLY_FIXED - pad - data_len)?;
    Ok(data_len)
}

/// Whether a read on a handle kept from the file's metadata fetch (its link count then:
/// `meta_nlink`) read a file the path no longer names: the attributes after the read
/// show fewer links (0 once it was deleted or replaced by a rename over its name), or
/// are missing. Then the path is read again, opened by name.
fn replaced(meta_nlink: Option<u32>, attr: Option<&RawAttr>) -> bool {
    meta_nlink.is_some_and(|was| attr.is_none_or(|a| a.nlink == 0 || a.nlink < was))
}

impl DataPool {
    /// Reads a range that fits one READ with one compound on a data connection: on the
    /// handle kept from the file's metadata fetch when this connection has it (READ,
    /// attributes, CLOSE), else opened by name (CREATE first). `None`: no connection, or
    /// it failed (then dropped): read through the crate.
    pub fn read_small(
        &self,
        path: &SourcePath,
        name: &str,
        offset: u64,
        buf: &mut [u8],
        split: Option<usize>,
        requests: &Requests,
    ) -> Option<Result<(usize, Option<RawAttr>), Fail>> {
        let mut link = self.take(path)?;
        let result = (|| {
            if let Some(k) = link.take_kept(path, requests) {
                match link.read_small(ReadFrom::Handle(k.id), offset, buf, split, requests) {
                    Ok((n, attr)) if !replaced(k.meta_nlink, attr.as_ref()) => {
                        self.reads_on_kept.fetch_add(1, Ordering::Relaxed);
                        return Ok((n, attr));
                    }
                    Ok((_, attr)) => {
                        tracing::debug!(%path, ?attr, "smb2: file replaced since its metadata fetch: read again");
                        self.reads_again.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Fail::Status { status, op }) => {
                        // The handle went bad (the compound closed it): the path again.
                        tracing::debug!(%path, status, op, "smb2: kept handle failed");
                        self.reads_again.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
            link.read_small(
                ReadFrom::Name(name.to_string()),
                offset,
                buf,
                split,
                requests,
            )
        })();
        match result {
            Ok(x) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.give_back(link);
                Some(Ok(x))
            }
            Err(Fail::Status { status, op }) => {
                self.give_back(link);
                Some(Err(Fail::Status { status, op }))
            }
            Err(e) => self.failed(path, link.serial, e),
        }
    }

    /// Files' metadata compounds (`(path, name on the wire, eas)`) on one data
    /// connection, sent together ([`DataLink::metadata_batch`]), each file's handle kept
    /// there for its first read (a directory's is closed). One answer per item, in
    /// order: `None` when there is no connection, it failed (then dropped), or the
    /// server refused the open (e.g. data access denied where the metadata is
    /// readable): the caller fetches through the crate, as without this path; else the
    /// replies (CREATE first, no CLOSE) for the caller to decode.
    pub fn metadata_batch(
        &self,
        items: Vec<(SourcePath, String, bool)>,
        named_streams: bool,
        requests: &Requests,
    ) -> Vec<Option<Result<Vec<smb2::Frame>, Fail>>> {
        let none = |n: usize| (0..n).map(|_| None).collect::<Vec<_>>();
        let Some(first) = items.first() else {
            return Vec::new();
        };
        let Some(mut link) = self.take(&first.0) else {
            return none(items.len());
        };
        let names = items.iter().map(|(_, n, e)| (n.clone(), *e)).collect();
        let replies = match link.metadata_batch(names, named_streams, requests) {
            Ok(r) => {
                self.metadata_windows.fetch_add(1, Ordering::Relaxed);
                r
            }
            Err(Fail::Status { .. }) => {
                self.give_back(link);
                return none(items.len());
            }
            Err(e) => {
                let timed_out = matches!(e, Fail::TimedOut);
                let _ = self.failed::<()>(&first.0, link.serial, e);
                return (0..items.len())
                    .map(|_| timed_out.then_some(Err(Fail::TimedOut)))
                    .collect();
            }
        };
        let mut broken = None;
        let out = items
            .iter()
            .zip(replies)
            .map(|((path, _, _), (frames, id))| {
                // The server refused the open: through the crate.
                let id = id?;
                let raw = frames
                    .get(1)
                    .filter(|f| f.header.status.0 == STATUS_SUCCESS)
                    .and_then(|f| wire::output_buffer(&f.body))
                    .and_then(wire::parse_all_information);
                let kept = match raw {
                    Some(r) if !r.directory => {
                        link.keep(path, id, Some(r.nlink), requests);
                        Ok(())
                    }
                    _ => link.close_later(id, requests),
                };
                if let Err(e) = kept {
                    broken.get_or_insert(e);
                }
                Some(Ok(frames))
            })
            .collect();
        match broken {
            // A CLOSE could not be written: the connection is gone (its handles with
            // it); the answers read before are good.
            Some(e) => {
                let _ = self.failed::<()>(&first.0, link.serial, e);
            }
            None => self.give_back(link),
        }
        out
    }

    /// Closes the handles kept too long on the idle connections (a paused or stopped
    /// crawl, files skipped or never read): run every few seconds by the source.
    pub fn sweep(&self, requests: &Requests) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let mut broken = Vec::new();
        for (i, l) in idle.iter_mut().enumerate() {
            // A CLOSE that could not be written: the connection is gone.
            if l.close_expired(requests).is_err() {
                broken.push(i);
            }
        }
        for l in idle.iter() {
            self.note_kept(l);
        }
        for i in broken.into_iter().rev() {
            let l = idle.swap_remove(i);
            self.forget_link(l.serial);
            self.open.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Handles kept open on idle connections.
    pub fn kept_handles(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|l| l.kept_count())
            .sum()
    }
}

/// What a read on a data connection did.
pub struct DirectRead {
    pub n: usize,
    pub attr: Option<RawAttr>,
    /// Replies waited for (the open, one per window of READs).
    pub round_trips: u64,
    /// The file was opened (not continued on a kept handle).
    pub opened: bool,
}

/// The source's data connections: at most `max`, each used by one call at a time.
pub struct DataPool {
    config: SmbConfig,
    idle: Mutex<Vec<DataLink>>,
    freed: Condvar,
    /// Which connection (serial) holds a kept handle of which file, as of the last time
    /// the connection was given back (locked inside `idle`).
    kept_on: Mutex<HashMap<SourcePath, u64>>,
    /// Connections that exist (idle or in use) or are being set up.
    open: AtomicUsize,
    max: usize,
    /// The server needs what this path does not do (signing, encryption): off for good.
    off: AtomicBool,
    /// No new connection before this (a setup failed).
    pause_until: Mutex<Option<Instant>>,
    /// Reads done here, and connections set up.
    pub reads: AtomicU64,
    pub connects: AtomicU64,
    /// Reads done on a handle kept from the file's metadata fetch (no CREATE of their
    /// own), and reads that found the file replaced or the handle bad and opened the
    /// path again.
    pub reads_on_kept: AtomicU64,
    pub reads_again: AtomicU64,
    /// Batches of metadata compounds whose replies were read (one wait each).
    pub metadata_windows: AtomicU64,
}

impl DataPool {
    pub fn new(config: &SmbConfig) -> Self {
        Self {
            off: AtomicBool::new(config.sign),
            // As many as the crate's sessions: each is a process of smbd's (with twice as
            // many smbd spent 0.06-0.17 CPU-s more on the bench's dataset (a) in each of
            // 7 alternated pairs, session 14). The metadata fetched ahead uses at most
            // all of them at a time (`Shared::prefetch_one`).
            max: config.connections,
            config: config.clone(),
            idle: Mutex::new(Vec::new()),
            freed: Condvar::new(),
            kept_on: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            pause_until: Mutex::new(None),
            reads: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            reads_on_kept: AtomicU64::new(0),
            reads_again: AtomicU64::new(0),
            metadata_windows: AtomicU64::new(0),
        }
    }

    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    /// Data connections at most.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A connection for one call: the one holding `path`'s kept handle (waited for at
    /// most [`HOLDER_WAIT`] while another call uses it), else an idle one, a new one if
    /// fewer than `max` exist, else the first freed within the timeout. `None`: read
    /// through the crate instead.
    pub fn take(&self, path: &SourcePath) -> Option<DataLink> {
        if self.is_off() {
            return None;
        }
        let deadline = Instant::now() + self.config.timeout;
        let mut holder_until: Option<Instant> = None;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(i) = idle.iter().position(|l| l.has_kept(path)) {
                return Some(idle.swap_remove(i));
            }
            // Idle connections' entries are current: one for `path` names a busy one.
            let holder = self
                .kept_on
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(path)
                .copied();
            if let Some(serial) = holder {
                let until = *holder_until
                    .get_or_insert_with(|| Instant::now() + HOLDER_WAIT.min(self.config.timeout));
                let now = Instant::now();
                if now < until {
                    idle = self
                        .freed
                        .wait_timeout(idle, until - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    continue;
                }
                // Not given back in time (or dropped): the file is opened anew.
                let mut kept_on = self.kept_on.lock().unwrap_or_else(|p| p.into_inner());
                if kept_on.get(path) == Some(&serial) {
                    kept_on.remove(path);
                }
            }
            if let Some(l) = idle.pop() {
                return Some(l);
            }
            if self.open.load(Ordering::SeqCst) < self.max {
                let paused = self
                    .pause_until
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_some_and(|t| Instant::now() < t);
                if paused {
                    return None;
                }
                self.open.fetch_add(1, Ordering::SeqCst);
                drop(idle);
                return self.connect();
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            idle = self
                .freed
                .wait_timeout(idle, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn connect(&self) -> Option<DataLink> {
        match DataLink::connect(&self.config) {
            Ok(Some(l)) => {
                self.connects.fetch_add(1, Ordering::Relaxed);
                Some(l)
            }
            Ok(None) => {
                tracing::debug!("smb2: server requires signing or encryption: no direct reads");
                self.off.store(true, Ordering::SeqCst);
                self.lost();
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "smb2: data connection failed");
                *self.pause_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Instant::now() + RETRY_AFTER);
                self.lost();
                None
            }
        }
    }

    /// A call's connection failed: it is dropped. A timeout is the call's error (the
    /// server is silent: the crate would wait out the timeout again); after a broken
    /// connection (e.g. an idle one the server closed) or a reply this path could not
    /// decode, the call is read again through the crate, which reports what is wrong.
    fn failed<T>(&self, path: &SourcePath, serial: u64, e: Fail) -> Option<Result<T, Fail>> {
        self.forget_link(serial);
        tracing::debug!(%path, error = %e, "smb2: data connection dropped");
        self.lost();
        match e {
            Fail::TimedOut => Some(Err(e)),
            _ => None,
        }
    }

    /// An idle connection holds a handle kept for `path`'s next unit (not one kept from
    /// its metadata fetch: a small file's first read goes by `read_small` all the same).
    pub fn holds(&self, path: &SourcePath) -> bool {
        !self.is_off()
            && self
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|l| l.has_unit_kept(path))
    }

    /// A connection taken is given back after a call that went well.
    pub fn give_back(&self, link: DataLink) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        self.note_kept(&link);
        idle.push(link);
        drop(idle);
        // Every waiter: one may wait for this connection's handle.
        self.freed.notify_all();
    }

    /// A connection dropped: its kept handles are gone with it.
    fn forget_link(&self, serial: u64) {
        self.kept_on
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, s| *s != serial);
    }

    /// Records which files' handles `link` holds (called with `idle` locked).
    fn note_kept(&self, link: &DataLink) {
        let mut kept_on = self.kept_on.lock().unwrap_or_else(|p| p.into_inner());
        kept_on.retain(|_, s| *s != link.serial);
        for k in &link.kept {
            kept_on.insert(k.path.clone(), link.serial);
        }
    }

    /// A connection taken failed and is dropped.
    pub fn lost(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.freed.notify_one();
    }

    /// The server is gone: idle connections are dropped.
    pub fn clear(&self) {
        let n = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let n = idle.len();
            idle.clear();
            self.kept_on
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            n
        };
        self.open.fetch_sub(n, Ordering::SeqCst);
        self.freed.notify_all();
    }

    /// Reads `buf` from `offset` of `path` (`name` on the wire) on a data connection.
    /// `None`: no connection, or it failed (then dropped): read through the crate.
    pub fn read(
        &self,
        path: &SourcePath,
        name: &str,
        offset: u64,
        buf: &mut [u8],
        want_attr: bool,
        requests: &Requests,
    ) -> Option<Result<DirectRead, Fail>> {
        let mut link = self.take(path)?;
        let result = (|| {
            let mut kept = link.take_kept(path, requests);
            loop {
                let meta_nlink = kept.as_ref().and_then(|k| k.meta_nlink);
                let (file_id, mut round_trips) = match &kept {
                    Some(k) => (k.id, 0),
                    None => (link.open(name.to_string(), requests)?, 1),
                };
                // On a handle kept from the metadata fetch the attributes tell whether
                // the path still names this file.
                let r = link.read(
                    file_id,
                    offset,
                    buf,
                    self.config.data_read_size,
                    self.config.parallel_reads,
                    want_attr || meta_nlink.is_some(),
                    requests,
                );
                let (n, attr, windows) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = link.close_later(file_id, requests);
                        if kept.take().is_some() && matches!(e, Fail::Status { .. }) {
                            self.reads_again.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        return Err(e);
                    }
                };
                if replaced(meta_nlink, attr.as_ref()) {
                    tracing::debug!(%path, ?attr, "smb2: file replaced since its metadata fetch: read again");
                    link.close_later(file_id, requests)?;
                    self.reads_again.fetch_add(1, Ordering::Relaxed);
                    kept = None;
                    continue;
                }
                if meta_nlink.is_some() {
                    self.reads_on_kept.fetch_add(1, Ordering::Relaxed);
                }
                round_trips += windows;
                let more =
                    n == buf.len() && attr.as_ref().is_none_or(|a| a.size > offset + n as u64);
                if more {
                    link.keep(path, file_id, None, requests);
                } else {
                    link.close_later(file_id, requests)?;
                }
                return Ok(DirectRead {
                    n,
                    attr: attr.filter(|_| want_attr),
                    round_trips,
                    opened: round_trips > windows,
                });
            }
        })();
        match result {
            Ok(x) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.give_back(link);
                Some(Ok(x))
            }
            Err(Fail::Status { status, op }) => {
                // The server answered: the connection is fine, the file is not.
                self.give_back(link);
                Some(Err(Fail::Status { status, op }))
            }
            Err(e) => self.failed(path, link.serial, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A READ reply body: the fixed part, `pad` bytes, then `data`.
    fn reply(data_offset: u8, claimed: u32, pad: usize, data: &[u8]) -> Vec<u8> {
        let mut b = vec![17, 0, data_offset, 0];
        b.extend_from_slice(&claimed.to_le_bytes());
        b.extend_from_slice(&[0; 8]);
        b.extend(std::iter::repeat_n(0xAA, pad));
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn a_read_reply_lands_in_the_buffer() {
        let data: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let body = reply(80, 300, 0, &data);
        let mut dest = vec![0u8; 512];
        let mut r = io::Cursor::new(&body[..]);
        assert_eq!(read_reply_into(&mut r, body.len(), &mut dest).unwrap(), 300);
        assert_eq!(dest[..300], data[..]);
        // With padding before the data and bytes after it, the stream stays in step.
        let mut body = reply(88, 300, 8, &data);
        body.extend_from_slice(b"next");
        let mut r = io::Cursor::new(&body[..]);
        let n = read_reply_into(&mut r, body.len() - 4, &mut dest).unwrap();
        assert_eq!((n, &dest[..300]), (300, &data[..]));
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"next");
    }

    #[test]
    fn a_short_or_corrupt_read_reply_is_an_error() {
        let data = vec![7u8; 100];
        let mut dest = vec![0u8; 100];
        // The connection ends inside the data.
        let body = reply(80, 100, 0, &data);
        let mut r = io::Cursor::new(&body[..60]);
        assert!(read_reply_into(&mut r, body.len(), &mut dest).is_err());
        // The frame is shorter than the data it claims.
        let mut r = io::Cursor::new(&body[..]);
        assert!(read_reply_into(&mut r, 16 + 50, &mut dest).is_err());
        // More data than was asked for.
        let body = reply(80, 100, 0, &data);
        let mut small = vec![0u8; 99];
        let mut r = io::Cursor::new(&body[..]);
        assert!(read_reply_into(&mut r, body.len(), &mut small).is_err());
        // A data offset inside the header or the fixed part.
        let body = reply(70, 100, 0, &data);
        let mut r = io::Cursor::new(&body[..]);
        assert!(read_reply_into(&mut r, body.len(), &mut dest).is_err());
        // A body too short for the fixed part.
        let mut r = io::Cursor::new(&body[..]);
        assert!(read_reply_into(&mut r, 10, &mut dest).is_err());
        // None of these wrote zeros the caller would take for data: the errors stop it.
        assert!(dest.iter().all(|&b| b == 0 || b == 7));
    }
}
