//! libCacheSim's oracleGeneral binary format (uncompressed): 24-byte little-endian packed
//! records `u32 clock_time (s), u64 obj_id, u32 obj_size, i64 next_access_vtime`, where
//! `next_access_vtime` is the index of the object's next request, or −1 if none.
//! Compressed `.zst` files must be decompressed first (`zstd -d`).

use super::{IoRecord, NEVER, Position, TraceError, le_u32, le_u64, read_record};
use kaiso_policy::Op;
use std::io::Read;

const FORMAT: &str = "oracleGeneral";
pub const RECORD_BYTES: usize = 24;

pub struct OracleReader<R> {
    input: R,
    record: u64,
    first_ts: Option<u32>,
    done: bool,
}

impl<R: Read> OracleReader<R> {
    pub fn new(input: R) -> Self {
        OracleReader {
            input,
            record: 0,
            first_ts: None,
            done: false,
        }
    }
}

impl<R: Read> Iterator for OracleReader<R> {
    type Item = Result<IoRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        self.record += 1;
        let mut b = [0u8; RECORD_BYTES];
        match read_record(&mut self.input, &mut b, FORMAT, self.record) {
            Ok(true) => {}
            Ok(false) => {
                self.done = true;
                return None;
            }
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        }
        let ts = le_u32(&b, 0);
        let id = le_u64(&b, 4);
        let size = le_u32(&b, 12);
        let next = le_u64(&b, 16) as i64;
        if next < -1 {
            self.done = true;
            return Some(Err(TraceError::at(
                FORMAT,
                Position::Record(self.record),
                format!("next_access_vtime {next} is below -1"),
            )));
        }
        let first = *self.first_ts.get_or_insert(ts);
        let mut r = IoRecord::new(
            (ts.saturating_sub(first)) as u64 * 1_000_000_000,
            id,
            0,
            size as u64,
            Op::Read,
        );
        // libCacheSim writes −1 or INT64_MAX for "never".
        r.next_access = if next < 0 || next == i64::MAX {
            NEVER
        } else {
            next as u64
        };
        Some(Ok(r))
    }
}
