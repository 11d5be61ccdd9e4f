//! MSR Cambridge CSV (SNIA IOTTA trace 388):
//! `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`, one request a line.
//! Timestamp and ResponseTime are Windows FILETIME units (100 ns); Type is `Read` or
//! `Write`; Offset and Size are bytes. Times are rebased to the first record. The disk
//! number becomes [`IoRecord::object`]. An optional header line is skipped.

use super::{IoRecord, Position, TraceError, read_line};
use kaiso_policy::Op;
use std::io::BufRead;

const FORMAT: &str = "MSR";

pub struct MsrReader<R> {
    input: R,
    buf: String,
    line: u64,
    first_ts: Option<u64>,
    done: bool,
}

impl<R: BufRead> MsrReader<R> {
    pub fn new(input: R) -> Self {
        MsrReader {
            input,
            buf: String::new(),
            line: 0,
            first_ts: None,
            done: false,
        }
    }

    fn parse(&mut self) -> Result<Option<IoRecord>, TraceError> {
        let at = Position::Line(self.line);
        let line = self.buf.trim();
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
            if self.line == 1 && ts_s.eq_ignore_ascii_case("timestamp") {
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

impl<R: BufRead> Iterator for MsrReader<R> {
    type Item = Result<IoRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.line += 1;
            match read_line(&mut self.input, &mut self.buf, FORMAT, self.line) {
                Ok(false) => self.done = true,
                Ok(true) => match self.parse() {
                    Ok(None) => continue,
                    Ok(Some(r)) => return Some(Ok(r)),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                },
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        None
    }
}
