//! SMB 2/3 straight from user space with the `smb` crate (no kernel cifs mount).
//!
//! What the protocol gives, and therefore what this source reports:
//! - Names are UTF-16 on the wire: every name is valid UTF-8 here. A server decides what
//!   to do with names it cannot express; Samba hides entries whose Unix name is not valid
//!   in its `unix charset` (they are invisible to every SMB client, not just to us).
//! - No Unix mode/uid/gid (the SMB3 POSIX extensions are not spoken by this client):
//!   permissions are synthesised from the DOS attributes (directories 0755, files 0644,
//!   read-only clears the write bits) and uid/gid are the ones configured for the share.
//!   The real owner, group and DACL come from [`Source::acl`] as an NT security descriptor.
//! - Samba follows symlinks on the server and shows FIFOs as empty files, so
//!   [`SourceFeatures::symlinks`] and [`SourceFeatures::special_files`] are false.
//! - Extended attributes are SMB EAs; Samba maps a Unix `user.NAME` xattr to the EA
//!   `NAME`, and this source reports it back as `user.NAME`.
//! - Alternate data streams are listed and read where the server has them (Samba with
//!   `vfs objects = streams_xattr`).
//! - Directory listings carry no link count: [`Source::read_dir`] reports nlink 1 for
//!   files and [`Source::stat`] (FileStandardInformation) gives the real count for files;
//!   Samba reports 1 for every directory.

use std::str::FromStr;

use binrw::BinWrite;
use kaiso_store::migrate::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};
use smb::binrw_util::file_time::FileTime;
use smb::{
    AdditionalInfo, Client, ClientConfig, FileAccessMask, FileAllInformation, FileAttributes,
    FileCreateArgs, FileIdBothDirectoryInformation, FileStreamInformation, Resource, UncPath,
};

/// The bytes one SMB2 credit pays for. A larger READ costs several credits, and the `smb`
/// crate (0.12) waits for them without asking the server for more: before Samba has
/// granted that many (it grants them gradually), a 1 MiB READ (16 credits) waits forever.
/// One-credit READs always progress, so READs are capped here and kept in flight instead.
pub const SMB_CREDIT_BYTES: usize = 64 << 10;

/// Where and how to reach an SMB share.
#[derive(Clone, Debug)]
pub struct SmbConfig {
    /// Server IP address or name.
    pub host: String,
    /// TCP port (445 unless the server listens elsewhere).
    pub port: u16,
    pub share: String,
    pub user: String,
    pub password: String,
    /// uid/gid given to every object (SMB has no Unix owners; see the module docs).
    pub uid: u32,
    pub gid: u32,
    /// Size of one READ request, at most [`SMB_CREDIT_BYTES`] (see there).
    pub read_size: usize,
    /// READ requests kept in flight for one `read` call.
    pub parallel_reads: usize,
}

impl SmbConfig {
    pub fn new(
        host: impl Into<String>,
        share: impl Into<String>,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        Self {
            host: host.into(),
            port: 445,
            share: share.into(),
            user: user.into(),
            password: password.into(),
            uid: 0,
            gid: 0,
            read_size: SMB_CREDIT_BYTES,
            parallel_reads: 16,
        }
    }
}

/// An SMB share read over one authenticated session.
pub struct SmbSource {
    config: SmbConfig,
    client: Client,
    share: UncPath,
}

// NTSTATUS values this source distinguishes.
const STATUS_NO_SUCH_FILE: u32 = 0xC000_000F;
const STATUS_OBJECT_NAME_NOT_FOUND: u32 = 0xC000_0034;
const STATUS_OBJECT_PATH_NOT_FOUND: u32 = 0xC000_003A;
const STATUS_ACCESS_DENIED: u32 = 0xC000_0022;
const STATUS_NO_EAS_ON_FILE: u32 = 0xC000_0052;
const STATUS_EAS_NOT_SUPPORTED: u32 = 0xC000_004F;
const STATUS_NOT_SUPPORTED: u32 = 0xC000_00BB;
const STATUS_FILE_IS_A_DIRECTORY: u32 = 0xC000_00BA;
const STATUS_NOT_A_DIRECTORY: u32 = 0xC000_0103;
const STATUS_LOGON_FAILURE: u32 = 0xC000_006D;
const STATUS_BAD_NETWORK_NAME: u32 = 0xC000_00CC;
const STATUS_NO_MORE_FILES: u32 = 0x8000_0006;
const FILE_ATTRIBUTE_READONLY: u32 = 0x1;

impl SmbSource {
    /// Connects and authenticates (NTLM) to `\\host\share`.
    pub fn connect(config: SmbConfig) -> SourceResult<Self> {
        let root = SourcePath::root();
        if config.read_size == 0 || config.parallel_reads == 0 {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                &root,
                "read_size and parallel_reads must be > 0",
            ));
        }
        let mut cc = ClientConfig::default();
        cc.connection.port = Some(config.port);
        cc.connection.timeout = Some(std::time::Duration::from_secs(60));
        let client = Client::new(cc);
        let share =
            UncPath::from_str(&format!(r"\\{}\{}", config.host, config.share)).map_err(|e| {
                SourceError::new(SourceErrorKind::Invalid, &root, format!("share name: {e}"))
            })?;
        client
            .share_connect(&share, &config.user, config.password.clone())
            .map_err(|e| smb_error(&root, &format!("connect {share} port {}", config.port), &e))?;
        Ok(Self {
            config,
            client,
            share,
        })
    }

    /// The share-relative Windows path of `path`.
    fn win_path(path: &SourcePath) -> SourceResult<String> {
        let s = std::str::from_utf8(path.as_bytes()).map_err(|_| {
            SourceError::new(
                SourceErrorKind::Invalid,
                path,
                "SMB names must be valid UTF-8 (UTF-16 on the wire)",
            )
        })?;
        Ok(s.replace('/', "\\"))
    }

    fn open(
        &self,
        path: &SourcePath,
        suffix: &str,
        access: FileAccessMask,
    ) -> SourceResult<Resource> {
        let p = format!("{}{suffix}", Self::win_path(path)?);
        let target = self.share.clone().with_path(&p);
        self.client
            .create_file(&target, &FileCreateArgs::make_open_existing(access))
            .map_err(|e| smb_error(path, "open", &e))
    }

    fn read_access() -> FileAccessMask {
        FileAccessMask::new().with_generic_read(true)
    }

    fn attr_from_all(&self, info: &FileAllInformation) -> SourceAttr {
        let attrs = info.basic.file_attributes;
        let dir = bool::from(info.standard.directory) || attrs.directory();
        self.make_attr(
            dir,
            attrs,
            info.standard.end_of_file,
            info.standard.number_of_links,
            info.internal.index_number,
            [
                &info.basic.last_access_time,
                &info.basic.last_write_time,
                &info.basic.change_time,
                &info.basic.creation_time,
            ],
        )
    }

    fn make_attr(
        &self,
        dir: bool,
        attrs: FileAttributes,
        size: u64,
        nlink: u32,
        ino: u64,
        times: [&FileTime; 4],
    ) -> SourceAttr {
        let dos = u32::from_le_bytes(attrs.into_bytes());
        let mut perm = if dir { 0o755 } else { 0o644 };
        if dos & FILE_ATTRIBUTE_READONLY != 0 {
            perm &= !0o222;
        }
        SourceAttr {
            kind: if dir {
                FileKind::Directory
            } else {
                FileKind::Regular
            },
            perm,
            uid: self.config.uid,
            gid: self.config.gid,
            size: if dir { 0 } else { size },
            nlink,
            ino,
            rdev: (0, 0),
            atime: unix_time(times[0]),
            mtime: unix_time(times[1]),
            ctime: unix_time(times[2]),
            btime: Some(unix_time(times[3])),
            dos_attributes: Some(dos),
        }
    }
}

/// FILETIME (100 ns since 1601) to Unix time.
fn unix_time(t: &FileTime) -> Timestamp {
    const EPOCH_DIFF_SECS: i64 = 11_644_473_600;
    let d = t.since_epoch();
    Timestamp {
        secs: d.as_secs() as i64 - EPOCH_DIFF_SECS,
        nanos: d.subsec_nanos(),
    }
}

fn status_of(e: &smb::Error) -> Option<u32> {
    match e {
        smb::Error::ReceivedErrorMessage(s, _) | smb::Error::UnexpectedMessageStatus(s) => Some(*s),
        _ => None,
    }
}

fn smb_error(path: &SourcePath, what: &str, e: &smb::Error) -> SourceError {
    let kind = match status_of(e) {
        Some(STATUS_NO_SUCH_FILE | STATUS_OBJECT_NAME_NOT_FOUND | STATUS_OBJECT_PATH_NOT_FOUND) => {
            SourceErrorKind::NotFound
        }
        Some(STATUS_ACCESS_DENIED | STATUS_LOGON_FAILURE) => SourceErrorKind::PermissionDenied,
        Some(STATUS_FILE_IS_A_DIRECTORY | STATUS_NOT_A_DIRECTORY) => SourceErrorKind::WrongKind,
        Some(STATUS_NOT_SUPPORTED | STATUS_EAS_NOT_SUPPORTED) => SourceErrorKind::Unsupported,
        Some(STATUS_BAD_NETWORK_NAME) => SourceErrorKind::NotFound,
        Some(_) => SourceErrorKind::Io,
        None => match e {
            smb::Error::IoError(_)
            | smb::Error::ConnectionStopped
            | smb::Error::TransportError(_)
            | smb::Error::OperationTimeout(..) => SourceErrorKind::Unreachable,
            _ => SourceErrorKind::Io,
        },
    };
    let status = status_of(e)
        .map(|s| format!(" (NTSTATUS {s:#010x})"))
        .unwrap_or_default();
    SourceError::new(kind, path, format!("{what}: {e}{status}"))
}

impl Source for SmbSource {
    fn describe(&self) -> String {
        format!(
            "smb://{}:{}/{}",
            self.config.host, self.config.port, self.config.share
        )
    }

    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            unix_ids: false,
            symlinks: false,
            special_files: false,
            xattrs: true,
            acls: true,
            streams: true,
            byte_names: false,
        }
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        let r = self.open(
            path,
            "",
            FileAccessMask::new().with_file_read_attributes(true),
        )?;
        let info = r
            .as_handle_query_all()
            .map_err(|e| smb_error(path, "query info", &e));
        let _ = r.close_quietly();
        Ok(self.attr_from_all(&info?))
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        let dir = match self.open(path, "", Self::read_access())? {
            Resource::Directory(d) => d,
            other => {
                let _ = other.close_quietly();
                return Err(SourceError::new(
                    SourceErrorKind::WrongKind,
                    path,
                    "not a directory",
                ));
            }
        };
        let mut out = Vec::new();
        let mut failure = None;
        match dir.query::<FileIdBothDirectoryInformation>("*") {
            Ok(iter) => {
                for item in iter {
                    match item {
                        Ok(e) => {
                            let name = e.file_name.to_string();
                            if name == "." || name == ".." {
                                continue;
                            }
                            let is_dir = e.file_attributes.directory();
                            let attr = self.make_attr(
                                is_dir,
                                e.file_attributes,
                                e.end_of_file,
                                1,
                                e.file_id,
                                [
                                    &e.last_access_time,
                                    &e.last_write_time,
                                    &e.change_time,
                                    &e.creation_time,
                                ],
                            );
                            out.push(SourceEntry {
                                name: name.into_bytes(),
                                attr,
                            });
                        }
                        Err(e) if status_of(&e) == Some(STATUS_NO_MORE_FILES) => break,
                        Err(e) => {
                            failure = Some(smb_error(path, "query directory", &e));
                            break;
                        }
                    }
                }
            }
            Err(e) if status_of(&e) == Some(STATUS_NO_MORE_FILES) => {}
            Err(e) => failure = Some(smb_error(path, "query directory", &e)),
        }
        let _ = dir.close();
        match failure {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.read_named(path, "", offset, len)
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::Unsupported,
            path,
            "SMB servers follow symlinks; no link is ever visible",
        ))
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let r = self.open(path, "", Self::read_access())?;
        let res = r.as_handle_query_eas();
        let _ = r.close_quietly();
        match res {
            Ok(eas) => {
                let mut out: Vec<(Vec<u8>, Vec<u8>)> = eas
                    .into_iter()
                    .map(|(name, value)| {
                        let mut n = b"user.".to_vec();
                        n.extend_from_slice(&name);
                        (n, value)
                    })
                    .collect();
                out.sort();
                Ok(out)
            }
            Err(e)
                if matches!(
                    status_of(&e),
                    Some(STATUS_NO_EAS_ON_FILE | STATUS_EAS_NOT_SUPPORTED | STATUS_NOT_SUPPORTED)
                ) =>
            {
                Ok(Vec::new())
            }
            Err(e) => Err(smb_error(path, "query EAs", &e)),
        }
    }

    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        let r = self.open(path, "", FileAccessMask::new().with_read_control(true))?;
        let info = AdditionalInfo::new()
            .with_owner_security_information(true)
            .with_group_security_information(true)
            .with_dacl_security_information(true);
        let sd = r.as_handle_security(info);
        let _ = r.close_quietly();
        let sd = sd.map_err(|e| smb_error(path, "query security", &e))?;
        let mut bytes = std::io::Cursor::new(Vec::new());
        sd.write_le(&mut bytes).map_err(|e| {
            SourceError::new(
                SourceErrorKind::Io,
                path,
                format!("encode security descriptor: {e}"),
            )
        })?;
        Ok(SourceAcl {
            nt_security_descriptor: Some(bytes.into_inner()),
            owner_sid: sd.owner_sid.as_ref().map(|s| s.to_string()),
            group_sid: sd.group_sid.as_ref().map(|s| s.to_string()),
            ..SourceAcl::default()
        })
    }

    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        let r = self.open(path, "", Self::read_access())?;
        if r.is_dir() {
            let _ = r.close_quietly();
            return Ok(Vec::new());
        }
        let info = r.as_handle_query_streams();
        let _ = r.close_quietly();
        let info = match info {
            Ok(i) => i,
            Err(e) if matches!(status_of(&e), Some(STATUS_NOT_SUPPORTED)) => return Ok(Vec::new()),
            Err(e) => return Err(smb_error(path, "query streams", &e)),
        };
        let mut out = Vec::new();
        for s in info.iter() {
            let full = s.stream_name.to_string();
            // ":name:$DATA"; the unnamed main stream is "::$DATA".
            let name = full
                .strip_prefix(':')
                .and_then(|n| n.strip_suffix(":$DATA"))
                .unwrap_or(&full);
            if !name.is_empty() {
                out.push(SourceStream {
                    name: name.to_string(),
                    size: s.stream_size,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        if stream.is_empty() || stream.contains([':', '\\', '/']) {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                path,
                format!("bad stream name {stream:?}"),
            ));
        }
        self.read_named(path, &format!(":{stream}"), offset, len)
    }
}

impl SmbSource {
    /// Reads `len` bytes from `offset` of the main stream (`suffix` = "") or a named
    /// stream (`suffix` = ":name"), with up to `parallel_reads` READs in flight.
    fn read_named(
        &self,
        path: &SourcePath,
        suffix: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        let file = match self.open(path, suffix, Self::read_access())? {
            Resource::File(f) => f,
            other => {
                let _ = other.close_quietly();
                return Err(SourceError::new(
                    SourceErrorKind::WrongKind,
                    path,
                    "read of a directory",
                ));
            }
        };
        let piece = self.config.read_size.min(SMB_CREDIT_BYTES);
        let mut buf = vec![0u8; len];
        let result = std::thread::scope(|s| -> SourceResult<usize> {
            let mut chunks: Vec<(u64, &mut [u8])> = buf
                .chunks_mut(piece)
                .enumerate()
                .map(|(i, c)| (offset + (i * piece) as u64, c))
                .collect();
            let mut total = 0usize;
            // Waves of `parallel_reads` concurrent READs; stop at the first short piece (EOF).
            while !chunks.is_empty() {
                let take = chunks.len().min(self.config.parallel_reads);
                let wave: Vec<(u64, &mut [u8])> = chunks.drain(..take).collect();
                let handles: Vec<_> = wave
                    .into_iter()
                    .map(|(off, chunk)| {
                        let file = &file;
                        s.spawn(move || -> Result<(usize, usize), smb::Error> {
                            let want = chunk.len();
                            let mut got = 0;
                            while got < want {
                                let n = file.read_block(
                                    &mut chunk[got..],
                                    off + got as u64,
                                    None,
                                    false,
                                )?;
                                if n == 0 {
                                    break;
                                }
                                got += n;
                            }
                            Ok((got, want))
                        })
                    })
                    .collect();
                let mut short = false;
                for h in handles {
                    let (got, want) = h
                        .join()
                        .map_err(|_| {
                            SourceError::new(SourceErrorKind::Io, path, "read thread panicked")
                        })?
                        .map_err(|e| smb_error(path, "read", &e))?;
                    if !short {
                        total += got;
                    }
                    short |= got < want;
                }
                if short {
                    break;
                }
            }
            Ok(total)
        });
        let _ = file.close();
        let total = result?;
        buf.truncate(total);
        Ok(buf)
    }
}

/// Small helpers over `Resource`, which wraps files and directories alike.
trait ResourceExt {
    fn handle(&self) -> &smb::ResourceHandle;
    fn close_quietly(&self) -> smb::Result<()> {
        self.handle().close()
    }
    fn as_handle_query_all(&self) -> smb::Result<FileAllInformation> {
        self.handle().query_info::<FileAllInformation>()
    }
    fn as_handle_query_streams(&self) -> smb::Result<FileStreamInformation> {
        self.handle().query_info::<FileStreamInformation>()
    }
    fn as_handle_query_eas(&self) -> smb::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let eas = self.handle().query_full_ea_info(Vec::new())?;
        Ok(eas
            .iter()
            .map(|e| (e.ea_name.to_string().into_bytes(), e.ea_value.clone()))
            .collect())
    }
    fn as_handle_security(&self, info: AdditionalInfo) -> smb::Result<smb::SecurityDescriptor> {
        self.handle().query_security_info(info)
    }
}

impl ResourceExt for Resource {
    fn handle(&self) -> &smb::ResourceHandle {
        match self {
            Resource::File(f) => f,
            Resource::Directory(d) => d,
            Resource::Pipe(p) => p,
        }
    }
}
