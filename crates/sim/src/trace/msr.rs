//! MSR Cambridge CSV (SNIA IOTTA trace 388):
//! `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`, one request a line.
//! Timestamp and ResponseTime are Windows FILETIME units (100 ns); Type is `Read` or
//! `Write`; Offset and Size are bytes. Times are rebased to the first record. The disk
//! number becomes [`IoRecord::object`]. An optional header line is skipped.

use super::{IoRecord, LineFormat, LineReader, Position, TraceError};
use kaiso_policy::Op;
use std::io::BufRead;

const FORMAT: &str = "MSR";

/// Reads MSR CSV lines into [`IoRecord`]s.
pub type MsrReader<R> = LineReader<R, MsrLines>;

impl<R: BufRead> MsrReader<R> {
    pub fn new(input: R) -> Self {
        LineReader::with_format(input, MsrLines::default())
    }
}

/// Parse state of an MSR trace: the first timestamp, which times are rebased to.
#[derive(Default)]
pub struct MsrLines {
    first_ts: Option<u64>,
}

impl LineFormat for MsrLines {
    const NAME: &'static str = FORMAT;

    fn parse_line(&mut self, text: &str, number: u64) -> Result<Option<IoRecord>, TraceError> {
        let at = Position::Line(number);
        let line = text.trim();
        if line.is_empty() {
            return Ok(None);
        }
        let mut f = line.split(',');
        let mut field = |name: &str| {
            f.next().map(str::trim).ok_or_else(|| {
                TraceError::at(
                    FORMAT,
                    at,
                    format!("missing field {name} (expected 7 comma-separated fields)"),
                )
            })
        };
        let ts_s = field("Timestamp")?;
        let _host = field("Hostname")?;
        let disk_s = field("DiskNumber")?;
        let ty = field("Type")?;
        let off_s = field("Offset")?;
        let size_s = field("Size")?;
        let _rt = field("ResponseTime")?;
        let Ok(ts) = ts_s.parse::<u64>() else {
            if number == 1 && ts_s.eq_ignore_ascii_case("timestamp") {
                return Ok(None); // header
            }
            return Err(TraceError::at(
                FORMAT,
                at,
                format!("Timestamp {ts_s:?} is not an unsigned integer"),
            ));
        };
        let num = |s: &str, name: &str| {
            s.parse::<u64>().map_err(|_| {
                TraceError::at(
                    FORMAT,
                    at,
                    format!("{name} {s:?} is not an unsigned integer"),
                )
            })
        };
        let disk = num(disk_s, "DiskNumber")?;
        let offset = num(off_s, "Offset")?;
        let len = num(size_s, "Size")?;
        let op = if ty.eq_ignore_ascii_case("read") {
            Op::Read
        } else if ty.eq_ignore_ascii_case("write") {
            Op::Write
        } else {
            return Err(TraceError::at(
                FORMAT,
                at,
                format!("Type {ty:?} is neither Read nor Write"),
            ));
        };
        let first = *self.first_ts.get_or_insert(ts);
        // FILETIME ticks are 100 ns; records slightly out of order clamp to the start.
        let time = ts.saturating_sub(first).saturating_mul(100);
        Ok(Some(IoRecord::new(time, disk, offset, len, op)))
    }
}
