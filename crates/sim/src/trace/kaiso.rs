//! kaiso's own file-level trace (recorded by `kaiso trace record`), format v1 in
//! docs/dev/trace-format.md: UTF-8 text, one record a line,
//! `t_ns op object offset len size path`; lines starting with `#` are headers. The
//! simulator uses the first five fields (`object` is the kaiso inode number); `size` and
//! the percent-encoded `path` are ignored, as are any later fields.

use super::{IoRecord, LineFormat, LineReader, Position, TraceError};
use kaiso_policy::Op;
use std::io::BufRead;

const FORMAT: &str = "kaiso";

/// Reads kaiso trace lines into [`IoRecord`]s.
pub type KaisoReader<R> = LineReader<R, KaisoLines>;

impl<R: BufRead> KaisoReader<R> {
    pub fn new(input: R) -> Self {
        LineReader::with_format(input, KaisoLines::default())
    }
}

/// Parse state of a kaiso trace: the first timestamp, which times are rebased to.
#[derive(Default)]
pub struct KaisoLines {
    first: Option<u64>,
}

impl LineFormat for KaisoLines {
    const NAME: &'static str = FORMAT;

    fn parse_line(&mut self, text: &str, number: u64) -> Result<Option<IoRecord>, TraceError> {
        let at = Position::Line(number);
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            return Ok(None);
        }
        let f: Vec<&str> = text.split_ascii_whitespace().take(5).collect();
        if f.len() < 5 {
            return Err(TraceError::at(
                FORMAT,
                at,
                format!(
                    "expected t_ns op object offset len [size path], got {} fields",
                    f.len()
                ),
            ));
        }
        let num = |i: usize, name: &str| {
            f[i].parse::<u64>().map_err(|_| {
                TraceError::at(
                    FORMAT,
                    at,
                    format!("{name} {:?} is not an unsigned integer", f[i]),
                )
            })
        };
        let time = num(0, "t_ns")?;
        let op = match f[1].to_ascii_lowercase().as_str() {
            "open" => Op::Open,
            "read" => Op::Read,
            "write" => Op::Write,
            "create" => Op::Create,
            "truncate" => Op::Truncate,
            "delete" => Op::Delete,
            other => return Err(TraceError::at(FORMAT, at, format!("unknown op {other:?}"))),
        };
        let file = num(2, "object")?;
        let offset = num(3, "offset")?;
        let len = num(4, "len")?;
        let first = *self.first.get_or_insert(time);
        Ok(Some(IoRecord::new(
            time.saturating_sub(first),
            file,
            offset,
            len,
            op,
        )))
    }
}
