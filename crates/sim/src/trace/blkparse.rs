//! `blkparse` default text output (blktrace 1.2), e.g.
//! `  8,0    3       11     0.009507758   697  Q   R 223490 + 8 [cat]`:
//! device, cpu, sequence, seconds since trace start, pid, action, RWBS, sector, `+`,
//! sectors, process. One action is taken as "the request" (default `Q`, queued: what the
//! application asked for); other actions are skipped, as are the per-CPU summary lines
//! blkparse prints at the end. Requests without R or W in RWBS (flushes, discards) are
//! skipped. The device `maj,min` becomes [`IoRecord::object`] as `maj << 20 | min`.

use super::{IoRecord, LineFormat, LineReader, Position, TraceError};
use kaiso_policy::Op;
use std::io::BufRead;

const FORMAT: &str = "blkparse";
const SECTOR: u64 = 512;

/// Which blktrace action counts as the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlkparseAction {
    /// `Q`: queued by the application (default).
    Queue,
    /// `D`: issued to the driver.
    Dispatch,
    /// `C`: completed.
    Complete,
}

impl BlkparseAction {
    fn code(self) -> &'static str {
        match self {
            BlkparseAction::Queue => "Q",
            BlkparseAction::Dispatch => "D",
            BlkparseAction::Complete => "C",
        }
    }
}

/// Reads blkparse text lines into [`IoRecord`]s.
pub type BlkparseReader<R> = LineReader<R, BlkparseLines>;

impl<R: BufRead> BlkparseReader<R> {
    pub fn new(input: R, action: BlkparseAction) -> Self {
        LineReader::with_format(input, BlkparseLines { action })
    }
}

/// Parse settings of a blkparse trace: which action is the request.
pub struct BlkparseLines {
    action: BlkparseAction,
}

impl LineFormat for BlkparseLines {
    const NAME: &'static str = FORMAT;

    fn parse_line(&mut self, text: &str, number: u64) -> Result<Option<IoRecord>, TraceError> {
        let at = Position::Line(number);
        let err = |m: String| TraceError::at(FORMAT, at, m);
        let mut t = text.split_ascii_whitespace();
        let Some(dev) = t.next() else {
            return Ok(None);
        };
        let Some((maj, min)) = dev.split_once(',') else {
            if dev.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(err(format!("device {dev:?} is not MAJOR,MINOR")));
            }
            return Ok(None); // summary or comment text
        };
        let (Ok(maj), Ok(min)) = (maj.parse::<u64>(), min.parse::<u64>()) else {
            if dev.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(err(format!("device {dev:?} is not MAJOR,MINOR")));
            }
            return Ok(None);
        };
        let fields: Vec<&str> = t.collect();
        if fields.len() < 5 {
            return Err(err(format!(
                "expected cpu, sequence, time, pid, action after the device, got {} fields",
                fields.len()
            )));
        }
        let time = parse_seconds(fields[2])
            .ok_or_else(|| err(format!("time {:?} is not seconds.nanoseconds", fields[2])))?;
        if fields[4] != self.action.code() {
            return Ok(None);
        }
        // A request without a sector range (a pure flush: `Q FWS [proc]`) moves no data.
        if fields.len() <= 7 && fields.get(6).is_none_or(|f| f.starts_with('[')) {
            return Ok(None);
        }
        if fields.len() < 9 || fields[7] != "+" {
            return Err(err(format!(
                "action {} needs `RWBS SECTOR + COUNT`",
                fields[4]
            )));
        }
        let rwbs = fields[5];
        let op = if rwbs.contains('W') {
            Op::Write
        } else if rwbs.contains('R') {
            Op::Read
        } else {
            return Ok(None);
        };
        let sector: u64 = fields[6]
            .parse()
            .map_err(|_| err(format!("sector {:?} is not a number", fields[6])))?;
        let count: u64 = fields[8]
            .parse()
            .map_err(|_| err(format!("sector count {:?} is not a number", fields[8])))?;
        Ok(Some(IoRecord::new(
            time,
            maj << 20 | min,
            sector.saturating_mul(SECTOR),
            count.saturating_mul(SECTOR),
            op,
        )))
    }
}

/// `S.NNNNNNNNN` → nanoseconds.
fn parse_seconds(s: &str) -> Option<u64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let whole: u64 = whole.parse().ok()?;
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut ns: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    for _ in frac.len()..9 {
        ns *= 10;
    }
    whole.checked_mul(1_000_000_000)?.checked_add(ns)
}

#[cfg(test)]
mod tests {
    use super::parse_seconds;

    #[test]
    fn seconds_parse_exactly() {
        assert_eq!(parse_seconds("0.000000001"), Some(1));
        assert_eq!(parse_seconds("12.5"), Some(12_500_000_000));
        assert_eq!(parse_seconds("3"), Some(3_000_000_000));
        assert_eq!(parse_seconds("1.x"), None);
        assert_eq!(parse_seconds("1.0000000001"), None);
    }
}
