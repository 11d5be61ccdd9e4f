//! uring-floor: minimal in-memory FUSE file system served directly on /dev/fuse, with two
//! transports (classic read()/write() threads, or FUSE-over-io_uring per-CPU queues), plus a
//! single-threaded metadata workload (create / stat / unlink) to measure the floor.
//!
//! ABI (FUSE 7.42+ io_uring part) written from the kernel UAPI description:
//!   struct fuse_uring_req_header { char in_out[128]; char op_in[128];
//!                                  struct fuse_uring_ent_in_out ring_ent_in_out; } // 288 B
//!   struct fuse_uring_ent_in_out { u64 flags; u64 commit_id; u32 payload_sz; u32 pad; u64 rsv; }
//!   struct fuse_uring_cmd_req    { u64 flags; u64 commit_id; u16 qid; u8 pad[6]; } // in SQE cmd
//!   FUSE_IO_URING_CMD_REGISTER = 1, FUSE_IO_URING_CMD_COMMIT_AND_FETCH = 2
//!   FUSE_OVER_IO_URING = 1 << 41 (flags2 bit 9), FUSE_INIT_EXT = 1 << 30

use std::collections::HashMap;
use std::ffi::CString;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use io_uring::{IoUring, cqueue, opcode, squeue, types};

// ---- FUSE constants ----
const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_UNLINK: u32 = 10;
const FUSE_OPEN: u32 = 14;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_OPENDIR: u32 = 27;
const FUSE_READDIR: u32 = 28;
const FUSE_RELEASEDIR: u32 = 29;
const FUSE_ACCESS: u32 = 34;
const FUSE_CREATE: u32 = 35;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;

const FUSE_INIT_EXT: u32 = 1 << 30;
const FUSE_OVER_IO_URING_HI: u32 = 1 << (41 - 32);
const FUSE_PARALLEL_DIROPS: u32 = 1 << 18;
const FUSE_MAX_PAGES: u32 = 1 << 22;

const IN_HDR: usize = 40;
const OUT_HDR: usize = 16;
const MAX_WRITE: u32 = 128 * 1024;
const CLASSIC_BUF: usize = 256 * 1024;
const URING_PAYLOAD: usize = 256 * 1024;
const URING_HDR: usize = 288;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

fn rd_u32(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes(b[o..o + 4].try_into().unwrap())
}
fn rd_u64(b: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
}
fn wr_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_ne_bytes())
}
fn wr_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_ne_bytes())
}
fn wr_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_ne_bytes())
}

#[derive(Clone, Copy, Debug)]
struct InHeader {
    len: u32,
    opcode: u32,
    unique: u64,
    nodeid: u64,
}
fn parse_in(b: &[u8]) -> InHeader {
    InHeader {
        len: rd_u32(b, 0),
        opcode: rd_u32(b, 4),
        unique: rd_u64(b, 8),
        nodeid: rd_u64(b, 16),
    }
}

/// Size of in_args[0] (the per-op header) for the ops we parse; used to split a classic
/// /dev/fuse message into (op_in, payload) the same way the io_uring transport delivers it.
fn arg0_size(op: u32) -> usize {
    match op {
        FUSE_FORGET => 8,
        FUSE_GETATTR => 16,
        FUSE_OPEN | FUSE_OPENDIR | FUSE_ACCESS | FUSE_INTERRUPT => 8,
        FUSE_RELEASE | FUSE_FLUSH | FUSE_RELEASEDIR => 24,
        FUSE_READDIR => 40,
        FUSE_CREATE => 16,
        FUSE_INIT => 64,
        FUSE_BATCH_FORGET => 8,
        _ => 0,
    }
}

enum Reply {
    None,
    Err(i32),
    Ok(usize), // bytes written into the out buffer
}

struct Inode {
    mode: u32,
    nlink: u32,
}
struct State {
    names: HashMap<Vec<u8>, u64>,
    inodes: HashMap<u64, Inode>,
    next: u64,
}
struct Fs {
    st: Mutex<State>,
    ttl_s: u64,
    ttl_ns: u32,
    nreq: AtomicU64,
    nforget: AtomicU64,
}

fn fill_attr(b: &mut [u8], ino: u64, mode: u32, nlink: u32) {
    // struct fuse_attr (88 bytes)
    for x in b[..88].iter_mut() {
        *x = 0;
    }
    wr_u64(b, 0, ino);
    let t = 1_700_000_000u64;
    wr_u64(b, 24, t);
    wr_u64(b, 32, t);
    wr_u64(b, 40, t);
    wr_u32(b, 60, mode);
    wr_u32(b, 64, nlink);
    wr_u32(b, 80, 4096); // blksize
}

impl Fs {
    fn entry_out(&self, b: &mut [u8], ino: u64, mode: u32, nlink: u32) -> usize {
        // struct fuse_entry_out (128 bytes)
        wr_u64(b, 0, ino);
        wr_u64(b, 8, 1);
        wr_u64(b, 16, self.ttl_s);
        wr_u64(b, 24, self.ttl_s);
        wr_u32(b, 32, self.ttl_ns);
        wr_u32(b, 36, self.ttl_ns);
        fill_attr(&mut b[40..], ino, mode, nlink);
        128
    }

    fn handle(&self, h: &InHeader, op_in: &[u8], payload: &[u8], out: &mut [u8]) -> Reply {
        self.nreq.fetch_add(1, Ordering::Relaxed);
        let name = |p: &[u8]| -> Vec<u8> {
            let end = p.iter().position(|&c| c == 0).unwrap_or(p.len());
            p[..end].to_vec()
        };
        match h.opcode {
            FUSE_LOOKUP => {
                if h.nodeid != 1 {
                    return Reply::Err(libc::ENOENT);
                }
                let n = name(payload);
                let st = self.st.lock().unwrap();
                match st.names.get(&n) {
                    Some(&ino) => {
                        let i = &st.inodes[&ino];
                        Reply::Ok(self.entry_out(out, ino, i.mode, i.nlink))
                    }
                    None => Reply::Err(libc::ENOENT),
                }
            }
            FUSE_FORGET => {
                self.nforget.fetch_add(1, Ordering::Relaxed);
                self.forget(h.nodeid);
                Reply::None
            }
            FUSE_BATCH_FORGET => {
                let cnt = rd_u32(op_in, 0) as usize;
                self.nforget.fetch_add(cnt as u64, Ordering::Relaxed);
                for k in 0..cnt {
                    if payload.len() >= (k + 1) * 16 {
                        self.forget(rd_u64(payload, k * 16));
                    }
                }
                Reply::None
            }
            FUSE_GETATTR => {
                // struct fuse_attr_out (104 bytes)
                let (mode, nlink) = if h.nodeid == 1 {
                    (0o40755, 2)
                } else {
                    let st = self.st.lock().unwrap();
                    match st.inodes.get(&h.nodeid) {
                        Some(i) => (i.mode, i.nlink),
                        None => return Reply::Err(libc::ENOENT),
                    }
                };
                wr_u64(out, 0, self.ttl_s);
                wr_u32(out, 8, self.ttl_ns);
                wr_u32(out, 12, 0);
                fill_attr(&mut out[16..], h.nodeid, mode, nlink);
                Reply::Ok(104)
            }
            FUSE_CREATE => {
                if h.nodeid != 1 {
                    return Reply::Err(libc::EACCES);
                }
                let mode = rd_u32(op_in, 4);
                let n = name(payload);
                let mut st = self.st.lock().unwrap();
                if st.names.contains_key(&n) {
                    return Reply::Err(libc::EEXIST);
                }
                let ino = st.next;
                st.next += 1;
                let mode = libc::S_IFREG | (mode & 0o7777);
                st.inodes.insert(ino, Inode { mode, nlink: 1 });
                st.names.insert(n, ino);
                drop(st);
                let l = self.entry_out(out, ino, mode, 1);
                // struct fuse_open_out (16 bytes)
                wr_u64(out, l, 0);
                wr_u32(out, l + 8, 0);
                wr_u32(out, l + 12, 0);
                Reply::Ok(l + 16)
            }
            FUSE_OPEN | FUSE_OPENDIR => {
                wr_u64(out, 0, 0);
                wr_u64(out, 8, 0);
                Reply::Ok(16)
            }
            FUSE_RELEASE | FUSE_RELEASEDIR | FUSE_DESTROY => Reply::Ok(0),
            FUSE_READDIR => Reply::Ok(0),
            FUSE_UNLINK => {
                let n = name(payload);
                let mut st = self.st.lock().unwrap();
                match st.names.remove(&n) {
                    Some(ino) => {
                        if let Some(i) = st.inodes.get_mut(&ino) {
                            i.nlink = 0;
                        }
                        Reply::Ok(0)
                    }
                    None => Reply::Err(libc::ENOENT),
                }
            }
            FUSE_STATFS => {
                for x in out[..80].iter_mut() {
                    *x = 0;
                }
                wr_u64(out, 0, 1 << 20);
                wr_u64(out, 8, 1 << 19);
                wr_u64(out, 16, 1 << 19);
                wr_u64(out, 24, 1 << 20);
                wr_u64(out, 32, 1 << 19);
                wr_u32(out, 40, 4096);
                wr_u32(out, 44, 255);
                wr_u32(out, 48, 4096);
                Reply::Ok(80)
            }
            FUSE_INTERRUPT => Reply::None, // reply to the original is all that matters
            _ => Reply::Err(libc::ENOSYS), // FLUSH, ACCESS, anything else
        }
    }

    fn forget(&self, ino: u64) {
        if ino == 1 {
            return;
        }
        let mut st = self.st.lock().unwrap();
        if st.inodes.get(&ino).is_some_and(|i| i.nlink == 0) {
            st.inodes.remove(&ino);
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn pin_to(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("sched_setaffinity({cpu}) failed errno={}", errno());
        }
    }
}

fn write_reply(fd: i32, unique: u64, r: Reply, out: &[u8]) {
    let (err, len) = match r {
        Reply::None => return,
        Reply::Err(e) => (-e, 0),
        Reply::Ok(l) => (0, l),
    };
    let mut buf = [0u8; OUT_HDR + 256];
    wr_u32(&mut buf, 0, (OUT_HDR + len) as u32);
    wr_u32(&mut buf, 4, err as u32);
    wr_u64(&mut buf, 8, unique);
    buf[OUT_HDR..OUT_HDR + len].copy_from_slice(&out[..len]);
    let n = unsafe { libc::write(fd, buf.as_ptr() as *const _, OUT_HDR + len) };
    if n < 0 {
        let e = errno();
        if e != libc::ENOENT {
            eprintln!("write reply unique={unique} errno={e}");
        }
    }
}

/// Classic transport loop: read a request, handle it, write the reply.
fn classic_loop(fd: i32, fs: Arc<Fs>, stop: Arc<AtomicBool>) {
    let mut buf = vec![0u8; CLASSIC_BUF];
    let mut out = vec![0u8; 4096];
    loop {
        let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut _, buf.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR || e == libc::EAGAIN || e == libc::ENOENT {
                continue;
            }
            if e != libc::ENODEV {
                eprintln!("read /dev/fuse errno={e}");
            }
            stop.store(true, Ordering::SeqCst);
            return;
        }
        let n = n as usize;
        let h = parse_in(&buf[..n]);
        let body = &buf[IN_HDR..n];
        let k = arg0_size(h.opcode).min(body.len());
        let r = fs.handle(&h, &body[..k], &body[k..], &mut out);
        write_reply(fd, h.unique, r, &out);
    }
}

// ---- io_uring transport ----

#[repr(C, align(64))]
struct HdrBuf([u8; URING_HDR]);

struct Ent {
    hdr: Box<HdrBuf>,
    payload: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

fn cmd_bytes(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    wr_u64(&mut c, 0, 0); // flags
    wr_u64(&mut c, 8, commit_id);
    wr_u16(&mut c, 16, qid);
    c
}

#[derive(Clone, Copy)]
struct RingOpts {
    depth: usize,
    single_issuer: bool,
    defer_taskrun: bool,
    coop_taskrun: bool,
}

struct QueueStats {
    reqs: u64,
    enters: u64,
}

fn uring_queue(
    fd: i32,
    qid: usize,
    pin: bool,
    fs: Arc<Fs>,
    o: RingOpts,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) -> QueueStats {
    if pin {
        pin_to(qid);
    }
    let mut b = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
    if o.single_issuer || o.defer_taskrun {
        b.setup_single_issuer();
    }
    if o.defer_taskrun {
        b.setup_defer_taskrun();
    }
    if o.coop_taskrun {
        b.setup_coop_taskrun();
    }
    let mut ring = match b.build((o.depth * 2).next_power_of_two() as u32) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(format!("q{qid}: io_uring_setup failed: {e}")));
            return QueueStats { reqs: 0, enters: 0 };
        }
    };
    let mut ents: Vec<Ent> = (0..o.depth)
        .map(|_| {
            let mut hdr = Box::new(HdrBuf([0u8; URING_HDR]));
            let mut payload = vec![0u8; URING_PAYLOAD];
            let iov = Box::new([
                libc::iovec {
                    iov_base: hdr.0.as_mut_ptr() as *mut _,
                    iov_len: URING_HDR,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr() as *mut _,
                    iov_len: URING_PAYLOAD,
                },
            ]);
            Ent { hdr, payload, iov }
        })
        .collect();
    // REGISTER every entry; sqe->addr = iovec[2], sqe->len = 2
    for (i, e) in ents.iter().enumerate() {
        let mut sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
            .cmd(cmd_bytes(0, qid as u16))
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        unsafe {
            // io_uring_sqe.len is at byte offset 24; the crate has no setter for UringCmd80.
            let p = (&mut sqe as *mut squeue::Entry128 as *mut u8).add(24) as *mut u32;
            *p = 2;
            ring.submission().push(&sqe).expect("sq full");
        }
    }
    if let Err(e) = ring.submit() {
        let _ = ready.send(Err(format!("q{qid}: submit REGISTER failed: {e}")));
        return QueueStats { reqs: 0, enters: 0 };
    }
    // A failed REGISTER completes at once with a negative res; a good one stays pending.
    std::thread::sleep(std::time::Duration::from_millis(50));
    {
        let mut bad = None;
        for c in ring.completion() {
            if c.result() < 0 {
                bad = Some(c.result());
            }
        }
        if let Some(r) = bad {
            let _ = ready.send(Err(format!(
                "q{qid}: FUSE_IO_URING_CMD_REGISTER completed with res={r} ({})",
                std::io::Error::from_raw_os_error(-r)
            )));
            return QueueStats { reqs: 0, enters: 0 };
        }
    }
    let _ = ready.send(Ok(()));
    let mut out = vec![0u8; 4096];
    let mut st = QueueStats { reqs: 0, enters: 0 };
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(o.depth);
    loop {
        st.enters += 1;
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                eprintln!("q{qid}: submit_and_wait: {e}");
                return st;
            }
        }
        done.clear();
        for c in ring.completion() {
            done.push((c.user_data(), c.result()));
        }
        for &(ud, res) in &done {
            if res < 0 {
                if res != -libc::ENOTCONN && res != -libc::ECONNABORTED && res != -libc::ECANCELED {
                    eprintln!(
                        "q{qid}: cqe res={res} ({})",
                        std::io::Error::from_raw_os_error(-res)
                    );
                }
                return st; // teardown
            }
            let e = &mut ents[ud as usize];
            let h = parse_in(&e.hdr.0[..IN_HDR]);
            let commit_id = rd_u64(&e.hdr.0, 256 + 8);
            let psz = rd_u32(&e.hdr.0, 256 + 16) as usize;
            let k = arg0_size(h.opcode).min(128);
            let r = {
                let op_in = &e.hdr.0[128..128 + k];
                let payload = &e.payload[..psz.min(URING_PAYLOAD)];
                // Older kernels without a zero-sized arg0 for LOOKUP/UNLINK would put the name in op_in.
                if psz == 0 && (h.opcode == FUSE_LOOKUP || h.opcode == FUSE_UNLINK) {
                    fs.handle(&h, &[], &e.hdr.0[128..256], &mut out)
                } else {
                    fs.handle(&h, op_in, payload, &mut out)
                }
            };
            st.reqs += 1;
            let (err, len) = match r {
                Reply::None => (0, 0),
                Reply::Err(x) => (-x, 0),
                Reply::Ok(l) => (0, l),
            };
            e.payload[..len].copy_from_slice(&out[..len]);
            wr_u32(&mut e.hdr.0, 0, (OUT_HDR + len) as u32);
            wr_u32(&mut e.hdr.0, 4, err as u32);
            wr_u64(&mut e.hdr.0, 8, h.unique);
            wr_u32(&mut e.hdr.0, 256 + 16, len as u32);
            let sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_COMMIT_AND_FETCH)
                .cmd(cmd_bytes(commit_id, qid as u16))
                .build()
                .user_data(ud);
            unsafe {
                ring.submission().push(&sqe).expect("sq full");
            }
        }
    }
}

fn rusage() -> (f64, f64, i64, i64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (tv(ru.ru_utime), tv(ru.ru_stime), ru.ru_nvcsw, ru.ru_nivcsw)
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}
fn flag(args: &[String], name: &str) -> bool {
    args.iter().any(|a| a == name)
}

fn serve(args: &[String]) {
    let mnt = arg(args, "--mnt").expect("--mnt DIR");
    let transport = arg(args, "--transport").unwrap_or("classic").to_string();
    let threads: usize = arg(args, "--threads").unwrap_or("2").parse().unwrap();
    let ttl_ms: u64 = arg(args, "--ttl-ms").unwrap_or("60000").parse().unwrap();
    let o = RingOpts {
        depth: arg(args, "--depth").unwrap_or("4").parse().unwrap(),
        single_issuer: flag(args, "--single-issuer"),
        defer_taskrun: flag(args, "--defer-taskrun"),
        coop_taskrun: flag(args, "--coop-taskrun"),
    };
    let nopin = flag(args, "--no-pin");
    // Pin the /dev/fuse reader threads (classic transport; in io_uring mode the FORGET reader) to one CPU.
    // "each": classic reader thread i pinned to CPU i % ncpu.
    let pin_each = arg(args, "--pin-devfuse") == Some("each");
    let pin_dev: Option<usize> = if pin_each {
        None
    } else {
        arg(args, "--pin-devfuse").map(|s| s.parse().unwrap())
    };
    let fs = Arc::new(Fs {
        st: Mutex::new(State {
            names: HashMap::new(),
            inodes: HashMap::new(),
            next: 2,
        }),
        ttl_s: ttl_ms / 1000,
        ttl_ns: ((ttl_ms % 1000) * 1_000_000) as u32,
        nreq: AtomicU64::new(0),
        nforget: AtomicU64::new(0),
    });

    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        panic!("open /dev/fuse errno={}", errno());
    }
    let data = CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0")).unwrap();
    let target = CString::new(mnt).unwrap();
    let r = unsafe {
        libc::mount(
            c"uringfloor".as_ptr(),
            target.as_ptr(),
            c"fuse.uringfloor".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr() as *const _,
        )
    };
    if r != 0 {
        panic!("mount errno={}", errno());
    }
    // INIT
    let mut buf = vec![0u8; CLASSIC_BUF];
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut _, buf.len()) };
    assert!(n > 0, "read INIT errno={}", errno());
    let h = parse_in(&buf);
    assert_eq!(h.opcode, FUSE_INIT, "first request not INIT");
    let body = &buf[IN_HDR..n as usize];
    let (kmaj, kmin, _ra, kflags) = (
        rd_u32(body, 0),
        rd_u32(body, 4),
        rd_u32(body, 8),
        rd_u32(body, 12),
    );
    let kflags2 = if kflags & FUSE_INIT_EXT != 0 && body.len() >= 20 {
        rd_u32(body, 16)
    } else {
        0
    };
    let k_uring = kflags2 & FUSE_OVER_IO_URING_HI != 0;
    eprintln!(
        "INIT from kernel: {kmaj}.{kmin} flags={kflags:#x} flags2={kflags2:#x} offers FUSE_OVER_IO_URING={k_uring} (in.len={})",
        h.len
    );
    let want_uring = transport == "uring";
    if want_uring && !k_uring {
        eprintln!(
            "ERROR: kernel did not offer FUSE_OVER_IO_URING (is /sys/module/fuse/parameters/enable_uring Y?)"
        );
    }
    let mut out = [0u8; 64];
    wr_u32(&mut out, 0, 7);
    wr_u32(&mut out, 4, kmin.min(45));
    wr_u32(&mut out, 8, 128 * 1024);
    let mut fl = FUSE_INIT_EXT | FUSE_PARALLEL_DIROPS | FUSE_MAX_PAGES;
    fl &= kflags;
    wr_u32(&mut out, 12, fl);
    wr_u16(&mut out, 16, 16); // max_background
    wr_u16(&mut out, 18, 12); // congestion_threshold
    wr_u32(&mut out, 20, MAX_WRITE);
    wr_u32(&mut out, 24, 1); // time_gran
    wr_u16(&mut out, 28, 32); // max_pages
    let fl2 = if want_uring && k_uring {
        FUSE_OVER_IO_URING_HI
    } else {
        0
    };
    wr_u32(&mut out, 32, fl2);
    write_reply(fd, h.unique, Reply::Ok(64), &out);
    eprintln!(
        "INIT reply: 7.{} flags={fl:#x} flags2={fl2:#x} transport={transport}",
        kmin.min(45)
    );

    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut qhandles = Vec::new();
    let t0 = Instant::now();
    if want_uring {
        let ncpu = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) } as usize;
        let (tx, rx) = std::sync::mpsc::channel();
        for q in 0..ncpu {
            let fs2 = fs.clone();
            let tx2 = tx.clone();
            qhandles.push(std::thread::spawn(move || {
                uring_queue(fd, q, !nopin, fs2, o, tx2)
            }));
        }
        // Only the queues hold senders now: one that dies unreported ends the wait.
        drop(tx);
        let mut ok = true;
        for _ in 0..ncpu {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(s)) => {
                    eprintln!("ERROR: {s}");
                    ok = false;
                }
                Err(_) => {
                    eprintln!("ERROR: an io_uring queue thread ended before reporting");
                    ok = false;
                    break;
                }
            }
        }
        eprintln!(
            "io_uring queues: {ncpu} (ok={ok}), depth {} per queue, opts si={} dt={} coop={} pin={}",
            o.depth, o.single_issuer, o.defer_taskrun, o.coop_taskrun, !nopin
        );
        // /dev/fuse still carries FORGET/INTERRUPT (and anything before the ring is ready)
        let fs2 = fs.clone();
        let s2 = stop.clone();
        handles.push(std::thread::spawn(move || {
            if let Some(c) = pin_dev {
                pin_to(c);
            }
            classic_loop(fd, fs2, s2)
        }));
    } else {
        let ncpu = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } as usize;
        for t in 0..threads {
            let fs2 = fs.clone();
            let s2 = stop.clone();
            handles.push(std::thread::spawn(move || {
                if let Some(c) = pin_dev {
                    pin_to(c);
                } else if pin_each {
                    pin_to(t % ncpu);
                }
                classic_loop(fd, fs2, s2)
            }));
        }
        eprintln!("classic threads: {threads} pinned to {pin_dev:?} each={pin_each}");
    }
    println!("READY pid={}", std::process::id());
    std::io::stdout().flush().ok();
    for h in handles {
        let _ = h.join();
    }
    let mut qreqs = 0;
    let mut qent = 0;
    let mut perq = Vec::new();
    for h in qhandles {
        if let Ok(s) = h.join() {
            qreqs += s.reqs;
            qent += s.enters;
            perq.push(s.reqs);
        }
    }
    if !perq.is_empty() {
        eprintln!("requests served per io_uring queue (qid = cpu): {perq:?}");
    }
    let (u, s, v, iv) = rusage();
    eprintln!(
        "daemon exit after {:.1}s: requests={} (via uring {qreqs}, ring enters {qent}) forgets={} utime={u:.3}s stime={s:.3}s nvcsw={v} nivcsw={iv}",
        t0.elapsed().as_secs_f64(),
        fs.nreq.load(Ordering::Relaxed),
        fs.nforget.load(Ordering::Relaxed)
    );
}

/// Sum of on-CPU time (ns) of all threads of a process, from /proc/PID/task/*/schedstat.
fn proc_cpu_ns(pid: u32) -> u64 {
    let mut sum = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                sum += s
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    sum
}

fn self_cpu() -> (u64, i64, i64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(ru.ru_utime) + us(ru.ru_stime), ru.ru_nvcsw, ru.ru_nivcsw)
}

fn work(args: &[String]) {
    let dir = arg(args, "--dir").expect("--dir DIR");
    let n: usize = arg(args, "--n").unwrap_or("20000").parse().unwrap();
    let label = arg(args, "--label").unwrap_or("run").to_string();
    let dpid: Option<u32> = arg(args, "--daemon-pid").map(|s| s.parse().unwrap());
    if let Some(c) = arg(args, "--pin") {
        pin_to(c.parse().unwrap());
    }
    let paths: Vec<CString> = (0..n)
        .map(|i| CString::new(format!("{dir}/f{i:06}")).unwrap())
        .collect();
    let mut cpus = std::collections::BTreeSet::new();
    let mut phase = |name: &str, f: &dyn Fn(&CString)| {
        let c0 = self_cpu();
        let d0 = dpid.map(proc_cpu_ns).unwrap_or(0);
        let t = Instant::now();
        for p in &paths {
            f(p);
        }
        let el = t.elapsed().as_secs_f64();
        let c1 = self_cpu();
        let d1 = dpid.map(proc_cpu_ns).unwrap_or(0);
        cpus.insert(unsafe { libc::sched_getcpu() });
        println!(
            "RESULT {label} {name} ops/s={:.0} caller_cpu_us/op={:.2} daemon_cpu_us/op={:.2} vcsw/op={:.2} ivcsw/op={:.2}",
            n as f64 / el,
            (c1.0 - c0.0) as f64 / n as f64,
            (d1 - d0) as f64 / 1000.0 / n as f64,
            (c1.1 - c0.1) as f64 / n as f64,
            (c1.2 - c0.2) as f64 / n as f64,
        );
    };
    phase("create", &|p| unsafe {
        let fd = libc::open(
            p.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            panic!("open {:?} errno={}", p, errno());
        }
        libc::close(fd);
    });
    phase("stat", &|p| unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::stat(p.as_ptr(), &mut st) != 0 {
            panic!("stat {:?} errno={}", p, errno());
        }
    });
    phase("unlink", &|p| unsafe {
        if libc::unlink(p.as_ptr()) != 0 {
            panic!("unlink {:?} errno={}", p, errno());
        }
    });
    eprintln!("{label}: ran on cpu(s) {:?} at phase ends", cpus);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(|s| s.as_str()) {
        Some("serve") => serve(&args[2..]),
        Some("work") => work(&args[2..]),
        _ => {
            eprintln!(
                "usage: uring-floor serve --mnt DIR --transport classic|uring [--threads N] [--depth D] [--ttl-ms T] [--single-issuer] [--defer-taskrun] [--coop-taskrun] [--no-pin]"
            );
            eprintln!(
                "       uring-floor work --dir DIR [--n N] [--pin CPU] [--daemon-pid PID] [--label L]"
            );
            std::process::exit(2);
        }
    }
}
