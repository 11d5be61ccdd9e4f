//! Windows metadata in the places Samba keeps it, so a Samba share on the destination
//! (`vfs objects = acl_xattr`, `store dos attributes = yes`, both Samba's defaults on a
//! file server) shows and enforces what the SMB source had:
//!
//! - DOS attributes and the creation time: `user.DOSATTRIB`, NDR `xattr_DOSATTRIB`
//!   (Samba's librpc/idl/xattr.idl, custom push/pull in librpc/ndr/ndr_xattr.c): an
//!   ASCII NUL-terminated hex string (empty from version 4 on), then the version, the
//!   union level and the version's fields. Samba 4.17 writes version 5.
//! - The NT security descriptor: `security.NTACL`, NDR `xattr_NTACL` version 1 (a
//!   unique pointer to the self-relative descriptor). vfs_acl_xattr uses versions 1 and
//!   2 as they are, without the hash of the POSIX ACL that versions 3 and 4 carry.
//!
//! Pure encoding and decoding, no I/O. The unit tests compare with blobs produced by
//! python3-samba 4.17 (`samba.ndr.ndr_pack` of `samba.dcerpc.xattr.DOSATTRIB`/`NTACL`)
//! and by smbd 4.17 itself, checked in as hex.

use super::source::Timestamp;

/// Where Samba reads and writes DOS attributes and the creation time.
pub const DOSATTRIB_XATTR: &str = "user.DOSATTRIB";
/// Where Samba's vfs_acl_xattr keeps the NT security descriptor.
pub const NTACL_XATTR: &str = "security.NTACL";

pub const FILE_ATTRIBUTE_READONLY: u32 = 0x1;
pub const FILE_ATTRIBUTE_HIDDEN: u32 = 0x2;
pub const FILE_ATTRIBUTE_SYSTEM: u32 = 0x4;
pub const FILE_ATTRIBUTE_DIRECTORY: u32 = 0x10;
pub const FILE_ATTRIBUTE_ARCHIVE: u32 = 0x20;
pub const FILE_ATTRIBUTE_OFFLINE: u32 = 0x1000;

/// The attributes Samba stores itself (its SAMBA_ATTRIBUTES_MASK without OFFLINE: a
/// source file marked offline is copied whole, so it is not offline here).
pub const STORED_ATTRIBUTES: u32 = FILE_ATTRIBUTE_READONLY
    | FILE_ATTRIBUTE_HIDDEN
    | FILE_ATTRIBUTE_SYSTEM
    | FILE_ATTRIBUTE_DIRECTORY
    | FILE_ATTRIBUTE_ARCHIVE;

/// `valid_flags` bits of versions 3 to 5.
pub const XATTR_DOSINFO_ATTRIB: u32 = 0x1;
pub const XATTR_DOSINFO_CREATE_TIME: u32 = 0x10;

/// Seconds from 1601-01-01 (NTTIME's epoch) to 1970-01-01.
const NTTIME_UNIX_EPOCH_SECS: i64 = 11_644_473_600;

/// Why a stored blob could not be read or a value could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("{what}: blob ends at byte {len}, {need} bytes needed")]
    Short {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("{what}: version {version} is not supported")]
    Version { what: &'static str, version: u16 },
    #[error("{what}: {detail}")]
    Invalid {
        what: &'static str,
        detail: &'static str,
    },
}

/// One `xattr_DOSATTRIB` value, by version. Times are NTTIME (100 ns since 1601).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DosAttrib {
    /// Samba 3.0's form: only the hex string (`0x20`).
    Compat { attrib: u32 },
    V1 {
        attrib: u32,
        ea_size: u32,
        size: u64,
        alloc_size: u64,
        create_time: u64,
        change_time: u64,
    },
    V3 {
        valid_flags: u32,
        attrib: u32,
        ea_size: u32,
        size: u64,
        alloc_size: u64,
        create_time: u64,
        change_time: u64,
    },
    V4 {
        valid_flags: u32,
        attrib: u32,
        itime: u64,
        create_time: u64,
    },
    V5 {
        valid_flags: u32,
        attrib: u32,
        create_time: u64,
    },
}

impl DosAttrib {
    /// What Samba 4.17 writes (version 5): the source's attributes Samba keeps, and the
    /// creation time if the source has one.
    pub fn from_source(attributes: u32, btime: Option<Timestamp>) -> DosAttrib {
        let mut valid_flags = XATTR_DOSINFO_ATTRIB;
        let create_time = match btime {
            Some(t) => {
                valid_flags |= XATTR_DOSINFO_CREATE_TIME;
                nt_time(t)
            }
            None => 0,
        };
        DosAttrib::V5 {
            valid_flags,
            attrib: attributes & STORED_ATTRIBUTES,
            create_time,
        }
    }

    /// The attributes, if the value holds them.
    pub fn attrib(&self) -> Option<u32> {
        match *self {
            DosAttrib::Compat { attrib } | DosAttrib::V1 { attrib, .. } => Some(attrib),
            DosAttrib::V3 {
                valid_flags,
                attrib,
                ..
            }
            | DosAttrib::V4 {
                valid_flags,
                attrib,
                ..
            }
            | DosAttrib::V5 {
                valid_flags,
                attrib,
                ..
            } => (valid_flags & XATTR_DOSINFO_ATTRIB != 0).then_some(attrib),
        }
    }

    /// The creation time (NTTIME), if the value holds one.
    pub fn create_time(&self) -> Option<u64> {
        match *self {
            DosAttrib::Compat { .. } => None,
            DosAttrib::V1 { create_time, .. } => Some(create_time),
            DosAttrib::V3 {
                valid_flags,
                create_time,
                ..
            }
            | DosAttrib::V4 {
                valid_flags,
                create_time,
                ..
            }
            | DosAttrib::V5 {
                valid_flags,
                create_time,
                ..
            } => (valid_flags & XATTR_DOSINFO_CREATE_TIME != 0).then_some(create_time),
        }
    }

    /// The same value (same version, every other field kept) with other attributes.
    pub fn with_attrib(mut self, new: u32) -> DosAttrib {
        match &mut self {
            DosAttrib::Compat { attrib } | DosAttrib::V1 { attrib, .. } => *attrib = new,
            DosAttrib::V3 {
                valid_flags,
                attrib,
                ..
            }
            | DosAttrib::V4 {
                valid_flags,
                attrib,
                ..
            }
            | DosAttrib::V5 {
                valid_flags,
                attrib,
                ..
            } => {
                *valid_flags |= XATTR_DOSINFO_ATTRIB;
                *attrib = new;
            }
        }
        self
    }

    fn version(&self) -> u16 {
        match self {
            DosAttrib::Compat { .. } => 0xFFFF,
            DosAttrib::V1 { .. } => 1,
            DosAttrib::V3 { .. } => 3,
            DosAttrib::V4 { .. } => 4,
            DosAttrib::V5 { .. } => 5,
        }
    }

    /// The hex string Samba writes before the version (its `ndr_compat_xattr_attrib_hex`).
    fn attrib_hex(&self) -> String {
        match *self {
            DosAttrib::Compat { attrib } | DosAttrib::V1 { attrib, .. } => format!("0x{attrib:x}"),
            DosAttrib::V3 {
                valid_flags,
                attrib,
                ..
            } if valid_flags & XATTR_DOSINFO_ATTRIB != 0 => format!("0x{attrib:x}"),
            _ => String::new(),
        }
    }

    /// The NDR encoding Samba's `ndr_push_xattr_DOSATTRIB` produces.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64);
        w.extend_from_slice(self.attrib_hex().as_bytes());
        w.push(0);
        if let DosAttrib::Compat { .. } = self {
            return w;
        }
        pad(&mut w, 2);
        // The version, then the union's level (the same number), then the union.
        w.extend_from_slice(&self.version().to_le_bytes());
        w.extend_from_slice(&self.version().to_le_bytes());
        pad(&mut w, 4);
        let u32s = |w: &mut Vec<u8>, v: &[u32]| v.iter().for_each(|x| w.extend(x.to_le_bytes()));
        let u64s = |w: &mut Vec<u8>, v: &[u64]| v.iter().for_each(|x| w.extend(x.to_le_bytes()));
        match *self {
            DosAttrib::Compat { .. } => {}
            DosAttrib::V1 {
                attrib,
                ea_size,
                size,
                alloc_size,
                create_time,
                change_time,
            } => {
                u32s(&mut w, &[attrib, ea_size]);
                u64s(&mut w, &[size, alloc_size, create_time, change_time]);
            }
            DosAttrib::V3 {
                valid_flags,
                attrib,
                ea_size,
                size,
                alloc_size,
                create_time,
                change_time,
            } => {
                u32s(&mut w, &[valid_flags, attrib, ea_size]);
                u64s(&mut w, &[size, alloc_size, create_time, change_time]);
            }
            DosAttrib::V4 {
                valid_flags,
                attrib,
                itime,
                create_time,
            } => {
                u32s(&mut w, &[valid_flags, attrib]);
                u64s(&mut w, &[itime, create_time]);
            }
            DosAttrib::V5 {
                valid_flags,
                attrib,
                create_time,
            } => {
                u32s(&mut w, &[valid_flags, attrib]);
                u64s(&mut w, &[create_time]);
            }
        }
        w
    }

    /// Reads what Samba's `ndr_pull_xattr_DOSATTRIB` reads (trailing bytes are ignored,
    /// as there). Version 2 (a short-lived, never-written draft) is refused.
    pub fn decode(blob: &[u8]) -> Result<DosAttrib, MetaError> {
        const WHAT: &str = "user.DOSATTRIB";
        let nul = blob
            .iter()
            .position(|b| *b == 0)
            .ok_or(MetaError::Invalid {
                what: WHAT,
                detail: "no NUL-terminated attribute string",
            })?;
        let mut r = Reader {
            blob,
            at: nul + 1,
            what: WHAT,
        };
        if r.at >= blob.len() {
            // The compat form: the string is all there is.
            let text = std::str::from_utf8(&blob[..nul]).ok();
            let hex = text.map(|t| t.trim_start_matches("0x").trim_start_matches("0X"));
            let attrib =
                hex.and_then(|h| u32::from_str_radix(h, 16).ok())
                    .ok_or(MetaError::Invalid {
                        what: WHAT,
                        detail: "attribute string is not hexadecimal",
                    })?;
            return Ok(DosAttrib::Compat { attrib });
        }
        r.align(2);
        let version = r.u16()?;
        let level = r.u16()?;
        if level != version {
            return Err(MetaError::Invalid {
                what: WHAT,
                detail: "union level differs from the version",
            });
        }
        r.align(4);
        Ok(match version {
            1 => DosAttrib::V1 {
                attrib: r.u32()?,
                ea_size: r.u32()?,
                size: r.u64()?,
                alloc_size: r.u64()?,
                create_time: r.u64()?,
                change_time: r.u64()?,
            },
            3 => DosAttrib::V3 {
                valid_flags: r.u32()?,
                attrib: r.u32()?,
                ea_size: r.u32()?,
                size: r.u64()?,
                alloc_size: r.u64()?,
                create_time: r.u64()?,
                change_time: r.u64()?,
            },
            4 => DosAttrib::V4 {
                valid_flags: r.u32()?,
                attrib: r.u32()?,
                itime: r.u64()?,
                create_time: r.u64()?,
            },
            5 => DosAttrib::V5 {
                valid_flags: r.u32()?,
                attrib: r.u32()?,
                create_time: r.u64()?,
            },
            version => {
                return Err(MetaError::Version {
                    what: WHAT,
                    version,
                });
            }
        })
    }
}

/// NTTIME (100 ns units since 1601-01-01 UTC) of a Unix timestamp; 0 before 1601.
pub fn nt_time(t: Timestamp) -> u64 {
    let secs = t.secs.saturating_add(NTTIME_UNIX_EPOCH_SECS);
    if secs < 0 {
        return 0;
    }
    (secs as u64)
        .saturating_mul(10_000_000)
        .saturating_add(u64::from(t.nanos.min(999_999_999)) / 100)
}

/// The Unix timestamp of an NTTIME.
pub fn unix_time(nt: u64) -> Timestamp {
    Timestamp {
        secs: (nt / 10_000_000) as i64 - NTTIME_UNIX_EPOCH_SECS,
        nanos: ((nt % 10_000_000) * 100) as u32,
    }
}

/// The skip-report text for an xattr the destination would not take: the errno, and
/// what it usually means for the xattrs metadata copies write.
pub fn xattr_skip_reason(name: &str, errno: i32) -> String {
    let why = match errno {
        libc::EOPNOTSUPP => " (the tier's file system has no xattrs of this namespace)",
        libc::EPERM | libc::EACCES
            if name.starts_with("security.") || name.starts_with("trusted.") =>
        {
            " (needs CAP_SYS_ADMIN: run kaiso as root)"
        }
        libc::E2BIG | libc::ENOSPC | libc::ERANGE => {
            " (value too large for the tier's file system)"
        }
        _ => "",
    };
    format!("{name}: errno {errno}{why}")
}

/// Length of a self-relative security descriptor's header: revision, sbz1, control,
/// then the offsets of owner, group, SACL and DACL.
const SD_HEADER: usize = 20;
/// SE_SELF_RELATIVE in the descriptor's control word.
const SE_SELF_RELATIVE: u16 = 0x8000;
/// Bytes before the descriptor in an `xattr_NTACL` version 1 blob: version, union level
/// and the unique pointer's referent id.
const NTACL_V1_PREFIX: [u8; 8] = [1, 0, 1, 0, 0, 0, 2, 0];

/// The `security.NTACL` value (version 1) holding a self-relative security descriptor
/// as SMB's QUERY_INFO returns it. Samba's NDR keeps the descriptor's offsets relative
/// to the start of the whole blob, so each is moved by the 8 bytes in front.
pub fn ntacl_v1(sd: &[u8]) -> Result<Vec<u8>, MetaError> {
    check_sd(sd)?;
    let mut blob = Vec::with_capacity(NTACL_V1_PREFIX.len() + sd.len());
    blob.extend_from_slice(&NTACL_V1_PREFIX);
    blob.extend_from_slice(sd);
    rebase_offsets(
        &mut blob[NTACL_V1_PREFIX.len()..],
        NTACL_V1_PREFIX.len() as i64,
    )?;
    Ok(blob)
}

/// The self-relative security descriptor (offsets from its own start, as on the wire)
/// in a `security.NTACL` version 1 blob.
pub fn ntacl_v1_sd(blob: &[u8]) -> Result<Vec<u8>, MetaError> {
    const WHAT: &str = "security.NTACL";
    if blob.len() < NTACL_V1_PREFIX.len() {
        return Err(MetaError::Short {
            what: WHAT,
            len: blob.len(),
            need: NTACL_V1_PREFIX.len(),
        });
    }
    let version = u16::from_le_bytes([blob[0], blob[1]]);
    if version != 1 || blob[..4] != NTACL_V1_PREFIX[..4] {
        return Err(MetaError::Version {
            what: WHAT,
            version,
        });
    }
    if blob[4..8] == [0; 4] {
        return Err(MetaError::Invalid {
            what: WHAT,
            detail: "no security descriptor (NULL pointer)",
        });
    }
    let mut sd = blob[NTACL_V1_PREFIX.len()..].to_vec();
    rebase_offsets(&mut sd, -(NTACL_V1_PREFIX.len() as i64))?;
    check_sd(&sd)?;
    Ok(sd)
}

fn check_sd(sd: &[u8]) -> Result<(), MetaError> {
    const WHAT: &str = "security descriptor";
    if sd.len() < SD_HEADER {
        return Err(MetaError::Short {
            what: WHAT,
            len: sd.len(),
            need: SD_HEADER,
        });
    }
    if sd[0] != 1 {
        return Err(MetaError::Invalid {
            what: WHAT,
            detail: "revision is not 1",
        });
    }
    if u16::from_le_bytes([sd[2], sd[3]]) & SE_SELF_RELATIVE == 0 {
        return Err(MetaError::Invalid {
            what: WHAT,
            detail: "not self-relative",
        });
    }
    for off in sd_offsets(sd) {
        if off != 0 && (off < SD_HEADER || off >= sd.len()) {
            return Err(MetaError::Invalid {
                what: WHAT,
                detail: "an offset points outside the descriptor",
            });
        }
    }
    Ok(())
}

fn sd_offsets(sd: &[u8]) -> [usize; 4] {
    let at = |i: usize| u32::from_le_bytes([sd[i], sd[i + 1], sd[i + 2], sd[i + 3]]) as usize;
    [at(4), at(8), at(12), at(16)]
}

/// Adds `by` to the owner, group, SACL and DACL offsets that are set (0 means absent).
fn rebase_offsets(sd: &mut [u8], by: i64) -> Result<(), MetaError> {
    if sd.len() < SD_HEADER {
        return Err(MetaError::Short {
            what: "security descriptor",
            len: sd.len(),
            need: SD_HEADER,
        });
    }
    for (i, off) in sd_offsets(sd).into_iter().enumerate() {
        if off == 0 {
            continue;
        }
        let moved = u32::try_from(off as i64 + by).map_err(|_| MetaError::Invalid {
            what: "security descriptor",
            detail: "an offset points before the descriptor",
        })?;
        let at = 4 + 4 * i;
        sd[at..at + 4].copy_from_slice(&moved.to_le_bytes());
    }
    Ok(())
}

fn pad(w: &mut Vec<u8>, to: usize) {
    while !w.len().is_multiple_of(to) {
        w.push(0);
    }
}

/// Little-endian NDR reading with alignment relative to the blob's start.
struct Reader<'a> {
    blob: &'a [u8],
    at: usize,
    what: &'static str,
}

impl Reader<'_> {
    fn align(&mut self, to: usize) {
        self.at = self.at.div_ceil(to) * to;
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], MetaError> {
        let end = self.at + N;
        let bytes = self.blob.get(self.at..end).ok_or(MetaError::Short {
            what: self.what,
            len: self.blob.len(),
            need: end,
        })?;
        self.at = end;
        Ok(bytes.try_into().expect("slice of N bytes"))
    }

    fn u16(&mut self) -> Result<u16, MetaError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, MetaError> {
        self.take().map(u32::from_le_bytes)
    }

    /// NDR `hyper`/NTTIME here: 4-byte aligned (every field before is a multiple of 4).
    fn u64(&mut self) -> Result<u64, MetaError> {
        self.take().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    //! Expected blobs: produced once with python3-samba 4.17.12
    //! (`/usr/bin/python3`, `samba.ndr.ndr_pack` of `samba.dcerpc.xattr.DOSATTRIB` with a
    //! `DosInfo1/3/4/5`, of `security.descriptor.from_sddl(..)` and of an `xattr.NTACL`
    //! with version 1), plus one `user.DOSATTRIB` smbd 4.17.12 wrote itself
    //! (`smbclient -c 'setmode g.txt +hs'` on a share with `store dos attributes = yes`).
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    const CT: u64 = 0x01d4_f54c_f65a_0000;

    #[test]
    fn v5_as_samba_writes_it() {
        let d = DosAttrib::V5 {
            valid_flags: 0x11,
            attrib: 0x6,
            create_time: CT,
        };
        let blob = hex("0000050005000000110000000600000000005af64cf5d401");
        assert_eq!(d.encode(), blob);
        assert_eq!(DosAttrib::decode(&blob).unwrap(), d);
        let offline = hex("0000050005000000110000000610000000005af64cf5d401");
        assert_eq!(d.clone().with_attrib(0x1006).encode(), offline);
        let attrib_only = DosAttrib::V5 {
            valid_flags: XATTR_DOSINFO_ATTRIB,
            attrib: 0x1020,
            create_time: 0,
        };
        let blob = hex("000005000500000001000000201000000000000000000000");
        assert_eq!(attrib_only.encode(), blob);
        assert_eq!(DosAttrib::decode(&blob).unwrap().create_time(), None);
    }

    #[test]
    fn smbd_written_value_decodes() {
        // smbd 4.17.12 after `setmode g.txt +hs`: HSA, create time 2026-11-22 12:40:08.
        let d =
            DosAttrib::decode(&hex("00000500050000001100000026000000dbebfb9a7e7add01")).unwrap();
        assert_eq!(d.attrib(), Some(0x26));
        let t = unix_time(d.create_time().unwrap());
        assert_eq!(t.secs, 1_795_351_207);
        assert_eq!(t.nanos / 1000, 565_205);
    }

    #[test]
    fn older_versions_keep_their_form_when_the_attributes_change() {
        let cases = [
            (
                DosAttrib::V1 {
                    attrib: 0x22,
                    ea_size: 3,
                    size: 4096,
                    alloc_size: 8192,
                    create_time: 0x01d0_0000_0000_0001,
                    change_time: 0x01d0_0000_0000_0002,
                },
                "307832320000010001000000220000000300000000100000000000000020000000000000010000000000d001020000000000d001",
                "307831303232000001000100221000000300000000100000000000000020000000000000010000000000d001020000000000d001",
            ),
            (
                DosAttrib::V3 {
                    valid_flags: 0x11,
                    attrib: 0x2,
                    ea_size: 0,
                    size: 0,
                    alloc_size: 0,
                    create_time: 0x01d0_0000_0000_0003,
                    change_time: 0,
                },
                "307832000300030011000000020000000000000000000000000000000000000000000000030000000000d0010000000000000000",
                "30783130303200000300030011000000021000000000000000000000000000000000000000000000030000000000d0010000000000000000",
            ),
            (
                DosAttrib::V4 {
                    valid_flags: 0x11,
                    attrib: 0x20,
                    itime: 0x01d0_0000_0000_0004,
                    create_time: 0x01d0_0000_0000_0005,
                },
                "00000400040000001100000020000000040000000000d001050000000000d001",
                "00000400040000001100000020100000040000000000d001050000000000d001",
            ),
        ];
        for (value, blob, offline) in cases {
            assert_eq!(value.encode(), hex(blob), "{value:?}");
            assert_eq!(DosAttrib::decode(&hex(blob)).unwrap(), value);
            let a = value.attrib().unwrap();
            let marked = value.clone().with_attrib(a | FILE_ATTRIBUTE_OFFLINE);
            assert_eq!(marked.encode(), hex(offline), "{value:?}");
            assert_eq!(DosAttrib::decode(&hex(offline)).unwrap(), marked);
            assert_eq!(marked.create_time(), value.create_time());
        }
    }

    #[test]
    fn compat_hex_string() {
        assert_eq!(
            DosAttrib::decode(b"0x22\0").unwrap(),
            DosAttrib::Compat { attrib: 0x22 }
        );
        assert_eq!(
            DosAttrib::Compat { attrib: 0x1022 }.encode(),
            hex("30783130323200")
        );
    }

    #[test]
    fn bad_blobs_are_errors_not_panics() {
        for blob in [
            &b""[..],
            b"0x2",
            b"zz\0",
            &hex("000005000500"),
            &hex("0000050006000000110000000600000000005af64cf5"),
            &hex("000002000200000011000000"),
            &hex("0000090009000000110000000600000000005af64cf5d401"),
        ] {
            assert!(DosAttrib::decode(blob).is_err(), "{blob:?}");
        }
    }

    #[test]
    fn from_source_keeps_what_samba_keeps() {
        let t = Timestamp {
            secs: 1_555_526_400,
            nanos: 123_456_700,
        };
        let d = DosAttrib::from_source(0x80 | 0x1000 | 0x2000 | 0x6, Some(t));
        assert_eq!(d.attrib(), Some(0x6));
        assert_eq!(unix_time(d.create_time().unwrap()), t);
        assert_eq!(nt_time(t), 132_000_000_001_234_567);
        assert_eq!(
            DosAttrib::from_source(0x20, None).create_time(),
            None,
            "no creation time: only the attributes are valid"
        );
        assert_eq!(
            nt_time(Timestamp {
                secs: -20_000_000_000,
                nanos: 0
            }),
            0
        );
    }

    /// O:S-1-5-21-1-2-3-1000 G:S-1-5-21-1-2-3-513
    /// D:P(D;;FA;;;S-1-22-1-1)(A;;FR;;;S-1-22-1-2)(A;;FA;;;S-1-5-21-1-2-3-1000)
    const SD: &str = "010004901400000030000000000000004c000000010500000000000515000000010000000200000003000000e80300000105000000000005150000000100000002000000030000000102000004005c000300000001001800ff0100000102000000000016010000000100000000001800890012000102000000000016010000000200000000002400ff010000010500000000000515000000010000000200000003000000e8030000";
    const NTACL: &str = "0100010000000200010004901c000000380000000000000054000000010500000000000515000000010000000200000003000000e80300000105000000000005150000000100000002000000030000000102000004005c000300000001001800ff0100000102000000000016010000000100000000001800890012000102000000000016010000000200000000002400ff010000010500000000000515000000010000000200000003000000e8030000";

    #[test]
    fn ntacl_v1_as_samba_packs_it() {
        assert_eq!(ntacl_v1(&hex(SD)).unwrap(), hex(NTACL));
        assert_eq!(ntacl_v1_sd(&hex(NTACL)).unwrap(), hex(SD));
    }

    #[test]
    fn skip_reasons_say_why() {
        assert_eq!(
            xattr_skip_reason(NTACL_XATTR, libc::EPERM),
            "security.NTACL: errno 1 (needs CAP_SYS_ADMIN: run kaiso as root)"
        );
        assert!(xattr_skip_reason(DOSATTRIB_XATTR, libc::EOPNOTSUPP).contains("no xattrs"));
        assert_eq!(xattr_skip_reason("user.x", libc::EIO), "user.x: errno 5");
    }

    #[test]
    fn bad_descriptors_are_refused() {
        let sd = hex(SD);
        assert!(ntacl_v1(&sd[..12]).is_err());
        let mut not_relative = sd.clone();
        not_relative[3] = 0x10;
        assert!(ntacl_v1(&not_relative).is_err());
        let mut outside = sd.clone();
        outside[4] = 0xf0;
        assert!(ntacl_v1(&outside).is_err());
        let mut v4 = hex(NTACL);
        v4[0] = 4;
        assert!(ntacl_v1_sd(&v4).is_err());
        assert!(ntacl_v1_sd(&[1, 0]).is_err());
    }
}
