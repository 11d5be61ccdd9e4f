//! kaiso's file-level access trace (format v1; spec in docs/dev/trace-format.md).
//!
//! ```text
//! #kaiso-trace v1
//! #start_unix_ns 1763730000000000000
//! #fields t_ns op object offset len size path
//! 0 create 281474976710913 0 0 0 dir/a.txt
//! 1520 write 281474976710913 0 4096 4096 dir/a.txt
//! ```
//! One record per line, fields separated by one space. `t_ns` counts from `start_unix_ns`;
//! `op` is open|read|write|create|truncate|delete; `object` is the kaiso inode number
//! (stable across moves and remounts); `size` is the file size after the operation; `path`
//! is store-relative with bytes outside 0x21..=0x7e and `%` percent-encoded.

// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

use kaiso_policy::Op;
use std::io::{BufWriter, Write};
use std::path::Path;

pub const HEADER: &str = "#kaiso-trace v1";

/// Name of an op in the trace.
pub fn op_name(op: Op) -> &'static str {
    match op {
        Op::Open => "open",
        Op::Read => "read",
        Op::Write => "write",
        Op::Create => "create",
        Op::Truncate => "truncate",
        Op::Delete => "delete",
    }
}

/// Parse an op name.
pub fn parse_op(s: &str) -> Option<Op> {
    Some(match s {
        "open" => Op::Open,
        "read" => Op::Read,
        "write" => Op::Write,
        "create" => Op::Create,
        "truncate" => Op::Truncate,
        "delete" => Op::Delete,
        _ => return None,
    })
}

/// Percent-encode a path for the trace.
pub fn escape_path(p: &[u8]) -> String {
    let mut s = String::with_capacity(p.len());
    for &b in p {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// Decode a percent-encoded trace path.
pub fn unescape_path(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// One trace record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub t_ns: u64,
    pub op: Op,
    pub object: u64,
    pub offset: u64,
    pub len: u64,
    pub size: u64,
    pub path: Vec<u8>,
}

impl Record {
    /// Parse one non-comment line.
    pub fn parse(line: &str) -> Option<Record> {
        let mut it = line.split(' ');
        let r = Record {
            t_ns: it.next()?.parse().ok()?,
            op: parse_op(it.next()?)?,
            object: it.next()?.parse().ok()?,
            offset: it.next()?.parse().ok()?,
            len: it.next()?.parse().ok()?,
            size: it.next()?.parse().ok()?,
            path: unescape_path(it.next().unwrap_or(""))?,
        };
        Some(r)
    }

    pub fn to_line(&self) -> String {
        format!(
            "{} {} {} {} {} {} {}",
            self.t_ns,
            op_name(self.op),
            self.object,
            self.offset,
            self.len,
            self.size,
            escape_path(&self.path)
        )
    }
}

/// Where a live store writes trace records.
pub struct TraceSink {
    out: BufWriter<std::fs::File>,
    start: u64,
    pub records: u64,
}

impl TraceSink {
    pub fn create(path: &Path, start_unix_ns: u64) -> std::io::Result<TraceSink> {
        let f = std::fs::File::create(path)?;
        let mut out = BufWriter::new(f);
        writeln!(
            out,
            "{HEADER}\n#start_unix_ns {start_unix_ns}\n#fields t_ns op object offset len size path"
        )?;
        Ok(TraceSink {
            out,
            start: start_unix_ns,
            records: 0,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        at_unix_ns: u64,
        op: Op,
        object: u64,
        offset: u64,
        len: u64,
        size: u64,
        path: &Path,
    ) {
        let r = Record {
            t_ns: at_unix_ns.saturating_sub(self.start),
            op,
            object,
            offset,
            len,
            size,
            path: path.as_os_str().as_encoded_bytes().to_vec(),
        };
        if writeln!(self.out, "{}", r.to_line()).is_ok() {
            self.records += 1;
        }
    }

    pub fn finish(mut self) -> std::io::Result<u64> {
        self.out.flush()?;
        self.out.get_ref().sync_all()?;
        Ok(self.records)
    }
}

impl crate::Store {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn trace_event(
        &self,
        at: u64,
        ino: u64,
        op: Op,
        offset: u64,
        len: u64,
        size: u64,
        path: &Path,
    ) {
        if let Ok(mut t) = self.trace.lock() {
            if let Some(s) = t.as_mut() {
                s.write(at, op, ino, offset, len, size, path);
            }
        }
    }

    /// Start writing the access stream to `path` (replacing any running trace).
    pub fn trace_start(&self, path: &Path) -> std::io::Result<()> {
        let sink = TraceSink::create(path, crate::util::now_nanos())?;
        let old = self
            .trace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(sink);
        if let Some(o) = old {
            o.finish()?;
        }
        Ok(())
    }

    /// Stop tracing; returns the number of records written.
    pub fn trace_stop(&self) -> std::io::Result<u64> {
        let old = self.trace.lock().unwrap_or_else(|e| e.into_inner()).take();
        match old {
            Some(s) => s.finish(),
            None => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn record_roundtrip() {
        let r = Record {
            t_ns: 5,
            op: Op::Write,
            object: 9,
            offset: 4096,
            len: 10,
            size: 5000,
            path: b"a b/%x\n".to_vec(),
        };
        let line = r.to_line();
        assert_eq!(line, "5 write 9 4096 10 5000 a%20b/%25x%0A");
        assert_eq!(Record::parse(&line), Some(r));
    }
}
