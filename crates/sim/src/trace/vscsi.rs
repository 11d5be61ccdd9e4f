//! libCacheSim's vscsi binary format (VMware vscsiStats traces, CloudPhysics), read as
//! libCacheSim reads it. Two little-endian record layouts, told apart by the version byte
//! (`ver >> 8`) of the first two records:
//! - v1, 32 bytes: `u32 sn, u32 len, u32 nSG, u16 cmd, u16 ver, u64 lbn, u64 ts`
//! - v2, 40 bytes: `u16 cmd, u16 ver, u32 sn, u32 len, u32 nSG, u64 lbn, u64 ts, u64 rt`
//!
//! `ts` is in microseconds, `lbn` in 512-byte sectors, `len` in bytes, `cmd` a SCSI
//! opcode (READ/WRITE 6/10/12/16). Records with other opcodes keep their size and are
//! read as reads, as libCacheSim (which ignores the opcode) does.

use super::{IoRecord, Position, TraceError, le_u16, le_u32, le_u64, read_record};
use kaiso_policy::Op;
use std::io::Read;

const FORMAT: &str = "vscsi";
const V1: usize = 32;
const V2: usize = 40;

pub struct VscsiReader<R> {
    input: R,
    /// Bytes read ahead to detect the version.
    head: Vec<u8>,
    record_size: usize,
    record: u64,
    first_ts: Option<u64>,
    done: bool,
    buf: [u8; V2],
}

impl<R: Read> VscsiReader<R> {
    pub fn new(input: R) -> Self {
        VscsiReader {
            input,
            head: Vec::new(),
            record_size: 0,
            record: 0,
            first_ts: None,
            done: false,
            buf: [0; V2],
        }
    }

    /// Read the first two v2-sized records' worth of bytes and decide the version.
    fn detect(&mut self) -> Result<(), TraceError> {
        let mut head = vec![0u8; 2 * V2];
        let mut got = 0;
        while got < head.len() {
            match self.input.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(TraceError::Io {
                        format: FORMAT,
                        source,
                    });
                }
            }
        }
        head.truncate(got);
        if got == 0 {
            self.record_size = V1;
            return Ok(());
        }
        let ver_v2 = |i: usize| head.get(i * V2 + 3).map(|b| *b as u16);
        let ver_v1 = |i: usize| head.get(i * V1 + 15).map(|b| *b as u16);
        self.record_size = if got >= 2 * V2 && ver_v2(0) == Some(2) && ver_v2(1) == Some(2) {
            V2
        } else if got >= 2 * V1 && ver_v1(0) == Some(1) && ver_v1(1) == Some(1) {
            V1
        } else if got < 2 * V1 {
            return Err(TraceError::at(
                FORMAT,
                Position::Record(1),
                format!("file too small ({got} bytes) to hold two records"),
            ));
        } else {
            return Err(TraceError::at(
                FORMAT,
                Position::Record(1),
                "unrecognised version byte: neither vscsi v1 nor v2",
            ));
        };
        self.head = head;
        Ok(())
    }

    fn fill(&mut self) -> Result<bool, TraceError> {
        let size = self.record_size;
        let from_head = self.head.len().min(size);
        self.buf[..from_head].copy_from_slice(&self.head[..from_head]);
        self.head.drain(..from_head);
        if from_head == size {
            return Ok(true);
        }
        let mut rest = vec![0u8; size - from_head];
        match read_record(&mut self.input, &mut rest, FORMAT, self.record) {
            Ok(true) => {
                self.buf[from_head..size].copy_from_slice(&rest);
                Ok(true)
            }
            Ok(false) if from_head == 0 => Ok(false),
            Ok(false) => Err(TraceError::at(
                FORMAT,
                Position::Record(self.record),
                format!("truncated: {from_head} of {size} bytes"),
            )),
            Err(e) => Err(e),
        }
    }

    fn decode(&mut self) -> Result<IoRecord, TraceError> {
        let b = &self.buf;
        let (cmd, ver, len, lbn, ts) = if self.record_size == V2 {
            (
                le_u16(b, 0),
                le_u16(b, 2),
                le_u32(b, 8),
                le_u64(b, 16),
                le_u64(b, 24),
            )
        } else {
            (
                le_u16(b, 12),
                le_u16(b, 14),
                le_u32(b, 4),
                le_u64(b, 16),
                le_u64(b, 24),
            )
        };
        let want = if self.record_size == V2 { 2 } else { 1 };
        if ver >> 8 != want {
            return Err(TraceError::at(
                FORMAT,
                Position::Record(self.record),
                format!("version byte {} in a v{want} trace", ver >> 8),
            ));
        }
        let op = match cmd {
            0x0a | 0x2a | 0xaa | 0x8a => Op::Write,
            _ => Op::Read,
        };
        let first = *self.first_ts.get_or_insert(ts);
        let time = ts.saturating_sub(first).saturating_mul(1000);
        Ok(IoRecord::new(
            time,
            0,
            lbn.saturating_mul(512),
            len as u64,
            op,
        ))
    }
}

impl<R: Read> Iterator for VscsiReader<R> {
    type Item = Result<IoRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.record_size == 0
            && let Err(e) = self.detect()
        {
            self.done = true;
            return Some(Err(e));
        }
        self.record += 1;
        let r = match self.fill() {
            Ok(false) => {
                self.done = true;
                return None;
            }
            Ok(true) => self.decode(),
            Err(e) => Err(e),
        };
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}
