//! Trace readers and writers. Every reader streams: it holds one line or record at a time,
//! so memory does not grow with the trace. Malformed input is an [`TraceError`] naming the
//! line (text formats) or record (binary formats); readers never panic on input.

mod blkparse;
mod kaiso;
mod msr;
mod oracle;
mod vscsi;
mod write;

pub use blkparse::{BlkparseAction, BlkparseLines, BlkparseReader};
pub use kaiso::{KaisoLines, KaisoReader};
pub use msr::{MsrLines, MsrReader};
pub use oracle::OracleReader;
pub use vscsi::VscsiReader;
pub use write::{OracleWriter, write_msr_csv, write_oracle_general};

use kaiso_policy::{Nanos, Op};
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// `next_access` value of a record whose object is not requested again (or unknown).
pub const NEVER: u64 = u64::MAX;

/// One request from a trace or a generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoRecord {
    /// Issue time since the trace's first record.
    pub time: Nanos,
    /// What is addressed: the disk/volume number (block traces), the file id (file traces)
    /// or the object id (oracleGeneral).
    pub object: u64,
    /// Byte offset inside `object` (0 for whole-object formats).
    pub offset: u64,
    /// Bytes (the object size for whole-object formats).
    pub len: u64,
    pub op: Op,
    /// Index of the next request for the same object (oracleGeneral only), else [`NEVER`].
    pub next_access: u64,
}

impl IoRecord {
    pub fn new(time: Nanos, object: u64, offset: u64, len: u64, op: Op) -> Self {
        IoRecord {
            time,
            object,
            offset,
            len,
            op,
            next_access: NEVER,
        }
    }
}

/// Where in the input a problem was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// 1-based line number of a text trace.
    Line(u64),
    /// 1-based record number of a binary trace.
    Record(u64),
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Line(n) => write!(f, "line {n}"),
            Position::Record(n) => write!(f, "record {n}"),
        }
    }
}

/// A trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{format} trace, {at}: {message}")]
    Malformed {
        format: &'static str,
        at: Position,
        message: String,
    },
    #[error("{format} trace: {source}")]
    Io {
        format: &'static str,
        #[source]
        source: io::Error,
    },
}

impl TraceError {
    pub(crate) fn at(format: &'static str, at: Position, message: impl Into<String>) -> Self {
        TraceError::Malformed {
            format,
            at,
            message: message.into(),
        }
    }
}

/// The trace formats `kaiso sim` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// MSR Cambridge CSV (SNIA IOTTA): FILETIME timestamps.
    Msr,
    /// `blkparse` default text output.
    Blkparse,
    /// libCacheSim vscsi binary (versions 1 and 2).
    Vscsi,
    /// libCacheSim oracleGeneral binary (24-byte records, uncompressed).
    OracleGeneral,
    /// kaiso's own file-level trace (docs/dev/trace-format.md).
    Kaiso,
}

impl TraceFormat {
    pub const NAMES: &'static [&'static str] = &["msr", "blkparse", "vscsi", "oracle", "kaiso"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "msr" | "csv" => TraceFormat::Msr,
            "blkparse" | "blktrace" => TraceFormat::Blkparse,
            "vscsi" => TraceFormat::Vscsi,
            "oracle" | "oraclegeneral" | "oracle-general" => TraceFormat::OracleGeneral,
            "kaiso" | "ktrace" => TraceFormat::Kaiso,
            _ => return None,
        })
    }

    /// Guess from a file name: `.csv` MSR, `.blkparse`/`.blk` blkparse, `.vscsi`,
    /// `.oracleGeneral`/`.oracle`/`.bin` oracleGeneral, `.ktrace`/`.kaiso` kaiso.
    pub fn from_path(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
        let ext = name.rsplit('.').next()?;
        Some(match ext {
            "csv" => TraceFormat::Msr,
            "blkparse" | "blk" => TraceFormat::Blkparse,
            "vscsi" => TraceFormat::Vscsi,
            "oraclegeneral" | "oracle" | "bin" => TraceFormat::OracleGeneral,
            "ktrace" | "kaiso" => TraceFormat::Kaiso,
            _ => return None,
        })
    }
}

/// A stream of records.
pub type RecordStream = Box<dyn Iterator<Item = Result<IoRecord, TraceError>> + Send>;

/// Open `path` (or `-` for standard input) in `format`.
pub fn open(path: &Path, format: TraceFormat) -> io::Result<RecordStream> {
    let input: Box<dyn Read + Send> = if path.as_os_str() == "-" {
        Box::new(io::stdin())
    } else {
        Box::new(File::open(path)?)
    };
    Ok(from_reader(
        BufReader::with_capacity(1 << 16, input),
        format,
    ))
}

/// Read records in `format` from any buffered reader.
pub fn from_reader<R: BufRead + Send + 'static>(input: R, format: TraceFormat) -> RecordStream {
    match format {
        TraceFormat::Msr => Box::new(MsrReader::new(input)),
        TraceFormat::Blkparse => Box::new(BlkparseReader::new(input, BlkparseAction::Queue)),
        TraceFormat::Vscsi => Box::new(VscsiReader::new(input)),
        TraceFormat::OracleGeneral => Box::new(OracleReader::new(input)),
        TraceFormat::Kaiso => Box::new(KaisoReader::new(input)),
    }
}

/// One line-oriented text format: parses a line at a time, keeping whatever state the
/// format needs (e.g. the first timestamp). [`LineReader`] does the reading, the line
/// numbering and stopping at the first error, once for every text format.
pub trait LineFormat {
    /// The format's name in error messages.
    const NAME: &'static str;
    /// Parses line number `number` (1-based); `Ok(None)` skips it (header, comment, blank).
    fn parse_line(&mut self, text: &str, number: u64) -> Result<Option<IoRecord>, TraceError>;
}

/// Iterates the records of a line-oriented trace; ends after the first error.
pub struct LineReader<R, F> {
    input: R,
    buf: String,
    line: u64,
    done: bool,
    format: F,
}

impl<R: BufRead, F: LineFormat> LineReader<R, F> {
    pub fn with_format(input: R, format: F) -> Self {
        LineReader {
            input,
            buf: String::new(),
            line: 0,
            done: false,
            format,
        }
    }
}

impl<R: BufRead, F: LineFormat> Iterator for LineReader<R, F> {
    type Item = Result<IoRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.line += 1;
            let parsed = match read_line(&mut self.input, &mut self.buf, F::NAME, self.line) {
                Ok(false) => {
                    self.done = true;
                    return None;
                }
                Ok(true) => self.format.parse_line(&self.buf, self.line),
                Err(e) => Err(e),
            };
            match parsed {
                Ok(None) => continue,
                Ok(Some(record)) => return Some(Ok(record)),
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        None
    }
}

/// Reads one line into `buf` (cleared first); `Ok(false)` at end of input.
pub(crate) fn read_line<R: BufRead>(
    input: &mut R,
    buf: &mut String,
    format: &'static str,
    line: u64,
) -> Result<bool, TraceError> {
    buf.clear();
    match input.read_line(buf) {
        Ok(0) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(TraceError::at(
            format,
            Position::Line(line),
            "not valid UTF-8 text",
        )),
        Err(source) => Err(TraceError::Io { format, source }),
    }
}

/// Fills `buf` completely; `Ok(false)` on a clean end of input before the first byte,
/// an error naming the record when the input ends inside it.
pub(crate) fn read_record<R: Read>(
    input: &mut R,
    buf: &mut [u8],
    format: &'static str,
    record: u64,
) -> Result<bool, TraceError> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(TraceError::at(
                    format,
                    Position::Record(record),
                    format!("truncated: {got} of {} bytes", buf.len()),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => return Err(TraceError::Io { format, source }),
        }
    }
    Ok(true)
}

pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}
