//! Writers for traces kaiso generates: oracleGeneral (to replay the very same requests in
//! libCacheSim) and MSR CSV (to replay them in tools that read MSR, or to inspect them).

use super::IoRecord;
use kaiso_policy::Op;
use std::collections::HashMap;
use std::io::{self, Write};

/// FILETIME of 2007-02-22 00:00 UTC, the start of the MSR Cambridge week; generated traces
/// start here so that they look like the real ones.
pub const MSR_EPOCH_FILETIME: u64 = 128_166_372_000_000_000;

/// Write `(clock seconds, object id, object size)` requests as oracleGeneral, computing
/// `next_access_vtime` (index of the object's next request, −1 if none) by one backward
/// pass. Sizes above `u32::MAX` are clamped, as the format cannot hold them.
pub fn write_oracle_general<W: Write>(out: W, requests: &[(u32, u64, u64)]) -> io::Result<()> {
    let mut next = vec![-1i64; requests.len()];
    let mut seen: HashMap<u64, i64> = HashMap::new();
    for (i, &(_, id, _)) in requests.iter().enumerate().rev() {
        if let Some(n) = seen.insert(id, i as i64) {
            next[i] = n;
        }
    }
    let mut w = OracleWriter::new(out);
    for (&(ts, id, size), &n) in requests.iter().zip(&next) {
        w.write(ts, id, size, n)?;
    }
    w.finish()
}

/// Record-at-a-time oracleGeneral writer (the caller supplies `next_access_vtime`).
pub struct OracleWriter<W: Write> {
    out: io::BufWriter<W>,
}

impl<W: Write> OracleWriter<W> {
    pub fn new(out: W) -> Self {
        OracleWriter {
            out: io::BufWriter::with_capacity(1 << 16, out),
        }
    }

    pub fn write(&mut self, ts: u32, id: u64, size: u64, next: i64) -> io::Result<()> {
        let mut b = [0u8; 24];
        b[0..4].copy_from_slice(&ts.to_le_bytes());
        b[4..12].copy_from_slice(&id.to_le_bytes());
        b[12..16].copy_from_slice(&(size.min(u32::MAX as u64) as u32).to_le_bytes());
        b[16..24].copy_from_slice(&next.to_le_bytes());
        self.out.write_all(&b)
    }

    pub fn finish(mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Write records as MSR Cambridge CSV (host `kaiso`, object = disk number, response time 0,
/// writes and reads only; other ops are written as reads).
pub fn write_msr_csv<W: Write>(
    out: W,
    records: impl IntoIterator<Item = IoRecord>,
) -> io::Result<()> {
    let mut out = io::BufWriter::with_capacity(1 << 16, out);
    for r in records {
        let ty = if r.op == Op::Write { "Write" } else { "Read" };
        writeln!(
            out,
            "{},kaiso,{},{},{},{},0",
            MSR_EPOCH_FILETIME + r.time / 100,
            r.object,
            ty,
            r.offset,
            r.len
        )?;
    }
    out.flush()
}
