//! The SMB2 request bodies this source sends and decoders of the replies it reads
//! itself (MS-SMB2, MS-FSCC, MS-DTYP): `smb2` packs the messages and signs them, but its
//! high-level calls hide fields kaiso needs (link counts, file ids, EA sizes, raw names),
//! so the source asks with raw QUERY_INFO / QUERY_DIRECTORY and decodes the buffers here.

use kaiso_store::migrate::{FileKind, SourceAttr, SourceStream, Timestamp};
use smb2::msg::close::CloseRequest;
use smb2::msg::create::{CreateDisposition, CreateRequest, ImpersonationLevel, ShareAccess};
use smb2::msg::query_directory::{
    FileInformationClass, QueryDirectoryFlags, QueryDirectoryRequest,
};
use smb2::msg::query_info::{InfoType, QueryInfoRequest};
use smb2::msg::read::{ReadRequest, SMB2_CHANNEL_NONE};
use smb2::types::FileId;
use smb2::types::OplockLevel;
use smb2::types::flags::FileAccessMask;

// FileInformationClass values (MS-FSCC 2.4) and FsInformationClass (2.5).
pub const FILE_ALL_INFORMATION: u8 = 18;
pub const FILE_FULL_EA_INFORMATION: u8 = 15;
pub const FILE_STREAM_INFORMATION: u8 = 22;
pub const FILE_FS_ATTRIBUTE_INFORMATION: u8 = 5;
pub const FILE_FS_VOLUME_INFORMATION: u8 = 1;
pub const FILE_INTERNAL_INFORMATION: u8 = 6;
/// Owner, group and DACL (MS-DTYP 2.4.7 SECURITY_INFORMATION).
pub const OWNER_GROUP_DACL: u32 = 0x1 | 0x2 | 0x4;
/// QUERY_INFO flag: return EAs from the first one on.
const SL_RESTART_SCAN: u32 = 0x1;
/// CREATE option: the object must be a directory.
const FILE_DIRECTORY_FILE: u32 = 0x1;
/// CREATE option: the object must not be a directory.
const FILE_NON_DIRECTORY_FILE: u32 = 0x40;

// File system attribute bits (MS-FSCC 2.5.1).
pub const FILE_NAMED_STREAMS: u32 = 0x0004_0000;

pub const FILE_ATTRIBUTE_READONLY: u32 = 0x1;
pub const FILE_ATTRIBUTE_DIRECTORY: u32 = 0x10;

/// Output buffer of one query: one credit's worth.
pub const QUERY_BUFFER: u32 = 64 << 10;

/// What an open asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenFor {
    /// Attributes, EAs and the security descriptor (files and directories).
    Metadata,
    /// As `Metadata`, and the data too: a metadata fetch whose handle is kept for the
    /// file's first read (see `data`).
    MetadataAndRead,
    /// Listing a directory (and its metadata).
    List,
    /// Reading a file's (or a named stream's) data.
    Read,
    /// One narrow query: just this access.
    Only(u32),
}

/// A CREATE that opens an existing object read-only, sharing everything (the old server
/// stays in use by its clients during the migration).
pub fn create(name: String, open_for: OpenFor) -> CreateRequest {
    let (access, options) = match open_for {
        OpenFor::Metadata => (
            FileAccessMask::FILE_READ_ATTRIBUTES
                | FileAccessMask::FILE_READ_EA
                | FileAccessMask::READ_CONTROL
                | FileAccessMask::SYNCHRONIZE,
            0,
        ),
        OpenFor::MetadataAndRead => (
            FileAccessMask::FILE_READ_DATA
                | FileAccessMask::FILE_READ_ATTRIBUTES
                | FileAccessMask::FILE_READ_EA
                | FileAccessMask::READ_CONTROL
                | FileAccessMask::SYNCHRONIZE,
            0,
        ),
        OpenFor::List => (
            FileAccessMask::FILE_READ_DATA
                | FileAccessMask::FILE_READ_ATTRIBUTES
                | FileAccessMask::FILE_READ_EA
                | FileAccessMask::READ_CONTROL
                | FileAccessMask::SYNCHRONIZE,
            FILE_DIRECTORY_FILE,
        ),
        OpenFor::Read => (
            FileAccessMask::FILE_READ_DATA
                | FileAccessMask::FILE_READ_ATTRIBUTES
                | FileAccessMask::SYNCHRONIZE,
            FILE_NON_DIRECTORY_FILE,
        ),
        OpenFor::Only(access) => (access | FileAccessMask::SYNCHRONIZE, 0),
    };
    CreateRequest {
        requested_oplock_level: OplockLevel::None,
        impersonation_level: ImpersonationLevel::Impersonation,
        desired_access: FileAccessMask::new(access),
        file_attributes: 0,
        share_access: ShareAccess(
            ShareAccess::FILE_SHARE_READ
                | ShareAccess::FILE_SHARE_WRITE
                | ShareAccess::FILE_SHARE_DELETE,
        ),
        create_disposition: CreateDisposition::FileOpen,
        create_options: options,
        name,
        create_contexts: vec![],
    }
}

pub fn query(info_type: InfoType, class: u8, additional: u32, file_id: FileId) -> QueryInfoRequest {
    QueryInfoRequest {
        info_type,
        file_info_class: class,
        output_buffer_length: QUERY_BUFFER,
        additional_information: additional,
        flags: if class == FILE_FULL_EA_INFORMATION && info_type == InfoType::File {
            SL_RESTART_SCAN
        } else {
            0
        },
        file_id,
        input_buffer: vec![],
    }
}

pub fn query_all(file_id: FileId) -> QueryInfoRequest {
    query(InfoType::File, FILE_ALL_INFORMATION, 0, file_id)
}

pub fn query_security(file_id: FileId) -> QueryInfoRequest {
    query(InfoType::Security, 0, OWNER_GROUP_DACL, file_id)
}

pub fn query_streams(file_id: FileId) -> QueryInfoRequest {
    query(InfoType::File, FILE_STREAM_INFORMATION, 0, file_id)
}

pub fn query_eas(file_id: FileId) -> QueryInfoRequest {
    query(InfoType::File, FILE_FULL_EA_INFORMATION, 0, file_id)
}

pub fn list(file_id: FileId, restart: bool, buffer: u32) -> QueryDirectoryRequest {
    QueryDirectoryRequest {
        file_information_class: FileInformationClass::FileIdBothDirectoryInformation,
        flags: QueryDirectoryFlags(if restart {
            QueryDirectoryFlags::RESTART_SCANS
        } else {
            0
        }),
        file_index: 0,
        file_id,
        output_buffer_length: buffer,
        file_name: "*".into(),
    }
}

pub fn read(file_id: FileId, offset: u64, len: u32) -> ReadRequest {
    ReadRequest {
        padding: 0x50,
        flags: 0,
        length: len,
        offset,
        file_id,
        minimum_count: 0,
        channel: SMB2_CHANNEL_NONE,
        remaining_bytes: 0,
        read_channel_info: vec![],
    }
}

pub fn close(file_id: FileId) -> CloseRequest {
    CloseRequest { flags: 0, file_id }
}

/// Where to split a READ of `len` bytes at `offset` of a file of `size` bytes (as its
/// listing said) that goes out inside a compound: Samba pads every reply of a compound
/// to 8 bytes, and pads a READ reply by copying its data into a fresh zeroed buffer
/// (smbd 4.17, `smbd_smb2_request_done_ex`): for a file whose end is not on an 8-byte
/// boundary that copy cost smbd as much CPU again as the read itself. Split at the last
/// 8-byte boundary before the end, the first READ's reply needs no padding and the
/// second one carries fewer than 8 bytes (and what a grown file added). `None`: one
/// READ (the end is aligned, beyond the range, or fewer than 8 bytes away).
pub fn aligned_split(offset: u64, len: usize, size: Option<u64>) -> Option<usize> {
    let left = size?.checked_sub(offset)?;
    let aligned = (left - left % 8) as usize;
    (left % 8 != 0 && aligned > 0 && left <= len as u64).then_some(aligned)
}

/// The requests of a file's metadata compound: CREATE, FileAllInformation, the security
/// descriptor, the streams (when the share has named streams), the EAs (last before the
/// CLOSE: a file without EAs answers with an error status; left out with `eas` false,
/// when the file's listing said it has none) and CLOSE. Used by the crate's sessions
/// (with the CLOSE) and the data connections (without: the handle is kept).
pub struct MetadataRequests {
    create: CreateRequest,
    all: QueryInfoRequest,
    sd: QueryInfoRequest,
    streams: Option<QueryInfoRequest>,
    eas: Option<QueryInfoRequest>,
    close: CloseRequest,
}

pub fn metadata_requests(
    name: String,
    open_for: OpenFor,
    named_streams: bool,
    eas: bool,
) -> MetadataRequests {
    MetadataRequests {
        create: create(name, open_for),
        all: query_all(FileId::SENTINEL),
        sd: query_security(FileId::SENTINEL),
        streams: named_streams.then(|| query_streams(FileId::SENTINEL)),
        eas: eas.then(|| query_eas(FileId::SENTINEL)),
        close: close(FileId::SENTINEL),
    }
}

impl MetadataRequests {
    /// The requests in order; the CLOSE is the last.
    pub fn ops(&self) -> Vec<super::link::Op<'_>> {
        use smb2::types::Command;
        let mut ops: Vec<super::link::Op<'_>> = vec![
            (Command::Create, &self.create, 1),
            (Command::QueryInfo, &self.all, 1),
            (Command::QueryInfo, &self.sd, 1),
        ];
        if let Some(s) = &self.streams {
            ops.push((Command::QueryInfo, s, 1));
        }
        if let Some(e) = &self.eas {
            ops.push((Command::QueryInfo, e, 1));
        }
        ops.push((Command::Close, &self.close, 1));
        ops
    }
}

/// The requests of one read compound: a CREATE of the file (or a handle already open),
/// a READ of the range, split in two at `first` when [`aligned_split`] says so, the
/// attributes after the read (FileAllInformation) and a CLOSE. The one builder of the
/// crate's sessions (`read_compound`) and the source's own data connections
/// (`DataLink::read_small`).
pub struct ReadCompound {
    create: Option<CreateRequest>,
    read: ReadRequest,
    tail: Option<ReadRequest>,
    query: QueryInfoRequest,
    close: CloseRequest,
    /// Bytes of the first READ (the whole range when it is not split).
    pub first: usize,
    /// Bytes of the range.
    pub len: usize,
}

/// What a read compound reads from.
pub enum ReadFrom {
    /// Opens the file (or `file:stream`) by this wire name.
    Name(String),
    /// A handle already open (kept from the file's metadata fetch); closed at the end.
    Handle(FileId),
}

impl ReadCompound {
    /// `len` bytes from `offset`; `split` as [`aligned_split`] gives it (ignored unless
    /// strictly inside the range).
    pub fn new(from: ReadFrom, offset: u64, len: usize, split: Option<usize>) -> Self {
        let first = split.filter(|&s| s > 0 && s < len).unwrap_or(len);
        // The requests after a CREATE use the handle it opened (the sentinel, related);
        // on a kept handle every request names it.
        let (create, id) = match from {
            ReadFrom::Name(name) => (Some(create(name, OpenFor::Read)), FileId::SENTINEL),
            ReadFrom::Handle(id) => (None, id),
        };
        Self {
            create,
            read: read(id, offset, first as u32),
            tail: (first < len).then(|| read(id, offset + first as u64, (len - first) as u32)),
            query: query_all(id),
            close: close(id),
            first,
            len,
        }
    }

    /// The requests in order, with their credit charges.
    pub fn ops(&self) -> Vec<super::link::Op<'_>> {
        use smb2::types::Command;
        let mut ops: Vec<super::link::Op<'_>> = Vec::with_capacity(5);
        if let Some(c) = &self.create {
            ops.push((Command::Create, c, 1));
        }
        ops.push((Command::Read, &self.read, credit_charge(self.first as u32)));
        if let Some(t) = &self.tail {
            ops.push((
                Command::Read,
                t,
                credit_charge((self.len - self.first) as u32),
            ));
        }
        ops.push((Command::QueryInfo, &self.query, 1));
        ops.push((Command::Close, &self.close, 1));
        ops
    }

    /// Index of the CREATE in [`ReadCompound::ops`], if the chain opens the file.
    pub fn create_at(&self) -> Option<usize> {
        self.create.as_ref().map(|_| 0)
    }

    /// Index of the first READ.
    pub fn read_at(&self) -> usize {
        usize::from(self.create.is_some())
    }

    /// Index of the tail READ, if the range is split.
    pub fn tail_at(&self) -> Option<usize> {
        self.tail.as_ref().map(|_| self.read_at() + 1)
    }

    /// Index of the QUERY_INFO.
    pub fn query_at(&self) -> usize {
        self.read_at() + 1 + usize::from(self.tail.is_some())
    }

    /// The range this READ (index `k` of the ops) fills in the caller's buffer.
    pub fn range_of(&self, k: usize) -> Option<std::ops::Range<usize>> {
        if k == self.read_at() {
            Some(0..self.first)
        } else if Some(k) == self.tail_at() {
            Some(self.first..self.len)
        } else {
            None
        }
    }
}

/// The credits a request moving `bytes` costs (one per 64 KiB, at least one).
pub fn credit_charge(bytes: u32) -> u16 {
    (bytes.div_ceil(64 << 10)).max(1).min(u16::MAX as u32) as u16
}

/// A share-relative path (`a/b`) as the wire name (`a\b`), plus an optional `:stream`
/// suffix. Names go over the wire as they are: no mapping of private-use characters.
pub fn wire_name(path: &str, suffix: &str) -> String {
    let mut s = path.replace('/', "\\");
    s.push_str(suffix);
    s
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// FILETIME (100 ns since 1601) to Unix time.
pub fn unix_time(ft: u64) -> Timestamp {
    const EPOCH_DIFF_SECS: i64 = 11_644_473_600;
    Timestamp {
        secs: (ft / 10_000_000) as i64 - EPOCH_DIFF_SECS,
        nanos: ((ft % 10_000_000) * 100) as u32,
    }
}

/// The fields of an object's attributes the wire gives, before they become a
/// [`SourceAttr`] (which needs the configured uid/gid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawAttr {
    pub times: [u64; 4], // creation, last access, last write, change
    pub dos: u32,
    pub size: u64,
    pub nlink: u32,
    pub file_id: u64,
    pub directory: bool,
    pub ea_size: u32,
}

impl RawAttr {
    pub fn to_attr(self, uid: u32, gid: u32) -> SourceAttr {
        let dir = self.directory || self.dos & FILE_ATTRIBUTE_DIRECTORY != 0;
        let mut perm = if dir { 0o755 } else { 0o644 };
        if self.dos & FILE_ATTRIBUTE_READONLY != 0 {
            perm &= !0o222;
        }
        SourceAttr {
            kind: if dir {
                FileKind::Directory
            } else {
                FileKind::Regular
            },
            perm,
            uid,
            gid,
            size: if dir { 0 } else { self.size },
            nlink: self.nlink,
            ino: self.file_id,
            rdev: (0, 0),
            atime: unix_time(self.times[1]),
            mtime: unix_time(self.times[2]),
            ctime: unix_time(self.times[3]),
            btime: Some(unix_time(self.times[0])),
            dos_attributes: Some(self.dos),
        }
    }
}

/// FILE_ALL_INFORMATION (MS-FSCC 2.4.2): Basic (40 bytes), Standard (24), Internal (8),
/// Ea (4), then access, position, mode, alignment and the name.
pub fn parse_all_information(b: &[u8]) -> Option<RawAttr> {
    Some(RawAttr {
        times: [u64_at(b, 0)?, u64_at(b, 8)?, u64_at(b, 16)?, u64_at(b, 24)?],
        dos: u32_at(b, 32)?,
        size: u64_at(b, 48)?,
        nlink: u32_at(b, 56)?,
        directory: *b.get(61)? != 0,
        file_id: u64_at(b, 64)?,
        ea_size: u32_at(b, 72)?,
    })
}

/// One FILE_ID_BOTH_DIR_INFORMATION entry (MS-FSCC 2.4.17): its name and attributes
/// (link count 1: listings carry none).
pub fn parse_directory(b: &[u8], out: &mut Vec<(String, RawAttr)>) -> Option<()> {
    let mut at = 0usize;
    loop {
        let e = b.get(at..)?;
        let next = u32_at(e, 0)? as usize;
        let name_len = u32_at(e, 60)? as usize;
        let name = utf16(e.get(104..104 + name_len)?);
        out.push((
            name,
            RawAttr {
                times: [
                    u64_at(e, 8)?,
                    u64_at(e, 16)?,
                    u64_at(e, 24)?,
                    u64_at(e, 32)?,
                ],
                size: u64_at(e, 40)?,
                dos: u32_at(e, 56)?,
                ea_size: u32_at(e, 64)?,
                file_id: u64_at(e, 96)?,
                nlink: 1,
                directory: false,
            },
        ));
        if next == 0 {
            return Some(());
        }
        at += next;
    }
}

/// UTF-16LE to a string; an unpaired surrogate (legal on NTFS) becomes U+FFFD.
fn utf16(b: &[u8]) -> String {
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    String::from_utf16_lossy(&units)
}

/// FILE_FULL_EA_INFORMATION entries (MS-FSCC 2.4.15) as (name, value).
pub fn parse_eas(b: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < b.len() {
        let e = &b[at..];
        let next = u32_at(e, 0)? as usize;
        let name_len = *e.get(5)? as usize;
        let value_len = u16_at(e, 6)? as usize;
        let name = e.get(8..8 + name_len)?.to_vec();
        let value_at = 8 + name_len + 1;
        let value = e.get(value_at..value_at + value_len)?.to_vec();
        out.push((name, value));
        if next == 0 {
            break;
        }
        at += next;
    }
    Some(out)
}

/// FILE_STREAM_INFORMATION entries (MS-FSCC 2.4.43): the named streams (not the main
/// `::$DATA` one) by name without the `:` and `:$DATA` decorations, sorted.
pub fn parse_streams(b: &[u8]) -> Option<Vec<SourceStream>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < b.len() {
        let e = &b[at..];
        let next = u32_at(e, 0)? as usize;
        let name_len = u32_at(e, 4)? as usize;
        let size = u64_at(e, 8)?;
        let full = utf16(e.get(24..24 + name_len)?);
        let name = full
            .strip_prefix(':')
            .and_then(|n| n.strip_suffix(":$DATA"))
            .unwrap_or(&full);
        if !name.is_empty() {
            out.push(SourceStream {
                name: name.to_string(),
                size,
            });
        }
        if next == 0 {
            break;
        }
        at += next;
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Some(out)
}

/// The owner and group SIDs of a self-relative security descriptor (MS-DTYP 2.4.6), in
/// `S-1-…` form.
pub fn descriptor_sids(sd: &[u8]) -> (Option<String>, Option<String>) {
    let sid_at = |field: usize| {
        let off = u32_at(sd, field)? as usize;
        if off == 0 {
            return None;
        }
        sid_string(sd.get(off..)?)
    };
    (sid_at(4), sid_at(8))
}

/// A binary SID (MS-DTYP 2.4.2.2) as its string form (2.4.2.1).
fn sid_string(b: &[u8]) -> Option<String> {
    let revision = *b.first()?;
    let count = *b.get(1)? as usize;
    let authority = b
        .get(2..8)?
        .iter()
        .fold(0u64, |acc, x| (acc << 8) | u64::from(*x));
    let mut s = format!("S-{revision}-");
    if authority >> 32 == 0 {
        s += &authority.to_string();
    } else {
        s += &format!("0x{authority:x}");
    }
    for i in 0..count {
        s += &format!("-{}", u32_at(b, 8 + 4 * i)?);
    }
    Some(s)
}

/// The file system attribute bits of FILE_FS_ATTRIBUTE_INFORMATION (MS-FSCC 2.5.1).
pub fn fs_attributes(b: &[u8]) -> Option<u32> {
    u32_at(b, 0)
}

/// VolumeCreationTime and VolumeSerialNumber of FileFsVolumeInformation (MS-FSCC 2.5.9).
pub fn volume_identity(b: &[u8]) -> Option<(u64, u32)> {
    Some((u64_at(b, 0)?, u32_at(b, 8)?))
}

/// IndexNumber of FileInternalInformation (MS-FSCC 2.4.22): the FileId.
pub fn internal_id(b: &[u8]) -> Option<u64> {
    u64_at(b, 0)
}

/// The data of a READ reply body (the body follows the 64-byte header; DataOffset counts
/// from the header's start). `None` if the reply is malformed.
pub fn read_data(body: &[u8]) -> Option<&[u8]> {
    let offset = (*body.get(2)? as usize).checked_sub(64)?.max(16);
    let len = u32_at(body, 4)? as usize;
    body.get(offset..offset + len)
}

/// The output buffer of a QUERY_INFO or QUERY_DIRECTORY reply body (2.2.38, 2.2.34).
pub fn output_buffer(body: &[u8]) -> Option<&[u8]> {
    let offset = (u16_at(body, 2)? as usize)
        .checked_sub(64)
        .unwrap_or(8)
        .max(8);
    let len = u32_at(body, 4)? as usize;
    if len == 0 {
        return Some(&[]);
    }
    body.get(offset..offset + len)
}

/// The FileId of a CREATE reply body (2.2.14): at byte 64 of the body.
pub fn created_file_id(body: &[u8]) -> Option<FileId> {
    Some(FileId {
        persistent: u64_at(body, 64)?,
        volatile: u64_at(body, 72)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid_bytes(authority: u8, subs: &[u32]) -> Vec<u8> {
        let mut b = vec![1, subs.len() as u8, 0, 0, 0, 0, 0, authority];
        for s in subs {
            b.extend_from_slice(&s.to_le_bytes());
        }
        b
    }

    #[test]
    fn descriptor_owner_and_group_in_string_form() {
        let owner = sid_bytes(5, &[21, 1, 2, 3, 1000]);
        let group = sid_bytes(22, &[2, 100]);
        let mut sd = vec![1, 0, 0x04, 0x80];
        sd.extend_from_slice(&20u32.to_le_bytes());
        sd.extend_from_slice(&((20 + owner.len()) as u32).to_le_bytes());
        sd.extend_from_slice(&0u32.to_le_bytes());
        sd.extend_from_slice(&0u32.to_le_bytes());
        sd.extend_from_slice(&owner);
        sd.extend_from_slice(&group);
        let (o, g) = descriptor_sids(&sd);
        assert_eq!(o.as_deref(), Some("S-1-5-21-1-2-3-1000"));
        assert_eq!(g.as_deref(), Some("S-1-22-2-100"));
        // Truncated: no panic, no SID.
        assert_eq!(descriptor_sids(&sd[..30]).0, None);
        assert_eq!(descriptor_sids(&[]), (None, None));
    }

    #[test]
    fn eas_and_streams_decode_and_truncation_is_refused() {
        let mut ea = Vec::new();
        for (i, (n, v)) in [(&b"color"[..], &b"blue"[..]), (b"k", b"")]
            .iter()
            .enumerate()
        {
            let mut e = vec![0u8; 8];
            e[5] = n.len() as u8;
            e[6..8].copy_from_slice(&(v.len() as u16).to_le_bytes());
            e.extend_from_slice(n);
            e.push(0);
            e.extend_from_slice(v);
            while i == 0 && !e.len().is_multiple_of(4) {
                e.push(0);
            }
            if i == 0 {
                let len = e.len() as u32;
                e[0..4].copy_from_slice(&len.to_le_bytes());
            }
            ea.extend_from_slice(&e);
        }
        assert_eq!(
            parse_eas(&ea).unwrap(),
            vec![
                (b"color".to_vec(), b"blue".to_vec()),
                (b"k".to_vec(), vec![])
            ]
        );
        assert!(parse_eas(&ea[..10]).is_none());

        let mut st = Vec::new();
        for (i, name) in ["::$DATA", ":extra:$DATA"].iter().enumerate() {
            let units: Vec<u8> = name.encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
            let mut e = vec![0u8; 24];
            e[4..8].copy_from_slice(&(units.len() as u32).to_le_bytes());
            e[8..16].copy_from_slice(&(10 * (i as u64 + 1)).to_le_bytes());
            e.extend_from_slice(&units);
            if i == 0 {
                let len = e.len() as u32;
                e[0..4].copy_from_slice(&len.to_le_bytes());
            }
            st.extend_from_slice(&e);
        }
        let streams = parse_streams(&st).unwrap();
        assert_eq!(
            streams,
            vec![SourceStream {
                name: "extra".into(),
                size: 20
            }]
        );
        assert!(parse_streams(&st[..30]).is_none());
    }

    #[test]
    fn directory_entries_and_all_information_decode() {
        let name: Vec<u8> = "a\u{e9}"
            .encode_utf16()
            .flat_map(|u| u.to_le_bytes())
            .collect();
        let mut e = vec![0u8; 104];
        e[24..32].copy_from_slice(&(116_444_736_000_000_000u64 + 15).to_le_bytes());
        e[40..48].copy_from_slice(&1234u64.to_le_bytes());
        e[56..60].copy_from_slice(&FILE_ATTRIBUTE_READONLY.to_le_bytes());
        e[60..64].copy_from_slice(&(name.len() as u32).to_le_bytes());
        e[64..68].copy_from_slice(&7u32.to_le_bytes());
        e[96..104].copy_from_slice(&99u64.to_le_bytes());
        e.extend_from_slice(&name);
        let mut out = Vec::new();
        parse_directory(&e, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        let (n, a) = &out[0];
        assert_eq!(n, "a\u{e9}");
        assert_eq!((a.size, a.ea_size, a.file_id), (1234, 7, 99));
        let attr = a.to_attr(5, 6);
        assert_eq!(
            attr.mtime,
            Timestamp {
                secs: 0,
                nanos: 1500
            }
        );
        assert_eq!(
            (attr.perm, attr.uid, attr.kind),
            (0o444, 5, FileKind::Regular)
        );
        assert!(parse_directory(&e[..50], &mut Vec::new()).is_none());

        let mut all = vec![0u8; 100];
        all[32..36].copy_from_slice(&FILE_ATTRIBUTE_DIRECTORY.to_le_bytes());
        all[56..60].copy_from_slice(&3u32.to_le_bytes());
        all[64..72].copy_from_slice(&42u64.to_le_bytes());
        let a = parse_all_information(&all).unwrap();
        assert_eq!((a.nlink, a.file_id), (3, 42));
        assert_eq!(a.to_attr(0, 0).kind, FileKind::Directory);
        assert!(parse_all_information(&all[..70]).is_none());
    }

    #[test]
    fn reply_buffers_and_charges() {
        let mut body = vec![0u8; 16];
        body[2] = 80;
        body[4..8].copy_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"xyz");
        assert_eq!(read_data(&body), Some(&b"xyz"[..]));
        assert_eq!(read_data(&body[..17]), None);
        let mut q = vec![0u8; 8];
        q[2..4].copy_from_slice(&72u16.to_le_bytes());
        q[4..8].copy_from_slice(&2u32.to_le_bytes());
        q.extend_from_slice(b"ok");
        assert_eq!(output_buffer(&q), Some(&b"ok"[..]));
        assert_eq!(credit_charge(1), 1);
        assert_eq!(credit_charge(1 << 20), 16);
        assert_eq!(wire_name("a/b", ":s"), "a\\b:s");
    }
}

#[cfg(test)]
mod split_tests {
    use super::aligned_split;

    #[test]
    fn a_read_ending_off_an_8_byte_boundary_is_split_before_its_last_bytes() {
        // The file ends inside the range, 5 bytes past a boundary: split there.
        assert_eq!(aligned_split(0, 1 << 20, Some(1005)), Some(1000));
        assert_eq!(aligned_split(4096, 1 << 20, Some(4096 + 13)), Some(8));
        // The range ends exactly at the unaligned end of the file.
        assert_eq!(aligned_split(0, 1005, Some(1005)), Some(1000));
        // Aligned end, an end beyond the range, fewer than 8 bytes, past the end, no size.
        assert_eq!(aligned_split(0, 1 << 20, Some(1008)), None);
        assert_eq!(aligned_split(0, 1000, Some(1005)), None);
        assert_eq!(aligned_split(0, 1 << 20, Some(7)), None);
        assert_eq!(aligned_split(2000, 1 << 20, Some(1005)), None);
        assert_eq!(aligned_split(0, 1 << 20, None), None);
    }
}
