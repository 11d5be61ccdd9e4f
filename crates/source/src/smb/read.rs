//! Reading a byte range of an open file with many READs in flight.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use smb::FileAllInformation;

use super::link::{Link, Requests};

/// `File::read_block` (smb 0.12) turns every error into an `io::Error` holding only the
/// message; this recovers whether the server is unreachable from that message.
fn read_error(e: std::io::Error) -> smb::Error {
    const GONE: [&str; 6] = [
        "Operation timed out",
        "Client connection is stopped",
        "Transport error",
        "IO Error",
        "Message processing failed",
        "Channel recv error",
    ];
    let msg = e.to_string();
    if e.kind() != std::io::ErrorKind::InvalidData && GONE.iter().any(|g| msg.starts_with(g)) {
        smb::Error::IoError(e)
    } else {
        smb::Error::InvalidMessage(msg)
    }
}

/// What [`read_pieces`] returns: the bytes read (short only at end of file) and, when
/// asked for, the file's attributes queried together with the last READ.
pub(super) struct ReadOutcome {
    pub total: usize,
    pub attr: Option<FileAllInformation>,
}

/// Fills `buf` from `offset` of `file` in `piece`-sized READs with up to `parallel` in
/// flight: a sliding window (a new READ leaves as soon as any one returns), not waves.
/// With `want_attr`, FileAllInformation is queried on the same handle once the last READ
/// is on its way, so it costs no round trip of its own and describes the file as it was
/// when the data was read (the engine compares it with the listing).
pub(super) fn read_pieces(
    l: &Link,
    file: &smb::File,
    buf: &mut [u8],
    offset: u64,
    piece: usize,
    parallel: usize,
    want_attr: bool,
) -> smb::Result<ReadOutcome> {
    let chunks: Vec<Mutex<Option<&mut [u8]>>> =
        buf.chunks_mut(piece).map(|c| Mutex::new(Some(c))).collect();
    let n = chunks.len();
    // Bytes got per piece; usize::MAX = not read.
    let got: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(usize::MAX)).collect();
    let next = AtomicUsize::new(0);
    // Set by the first short piece: pieces after it are past the end of the file.
    let eof_at = AtomicUsize::new(usize::MAX);
    let failure: Mutex<Option<smb::Error>> = Mutex::new(None);
    let attr: Mutex<Option<smb::Result<FileAllInformation>>> = Mutex::new(None);
    let attr_asked = AtomicBool::new(false);
    let query_attr = || {
        if attr_asked.swap(true, Ordering::SeqCst) {
            return;
        }
        l.count_queries(1);
        let r = l.check(file.query_info::<FileAllInformation>());
        *attr.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    };
    std::thread::scope(|s| {
        let worker = || {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n
                    || i > eof_at.load(Ordering::SeqCst)
                    || failure.lock().unwrap_or_else(|p| p.into_inner()).is_some()
                {
                    break;
                }
                if want_attr && i == n - 1 {
                    s.spawn(query_attr);
                }
                let Some(chunk) = chunks[i].lock().unwrap_or_else(|p| p.into_inner()).take() else {
                    continue;
                };
                let at = offset + (i * piece) as u64;
                let want = chunk.len();
                let mut have = 0;
                while have < want {
                    match l.check(
                        file.read_block(&mut chunk[have..], at + have as u64, None, false)
                            .map_err(read_error),
                    ) {
                        // Past the end of file the open reported: answered without a READ.
                        Ok(0) => break,
                        Ok(k) => {
                            Requests::add(&l.requests.reads, 1);
                            have += k;
                        }
                        Err(e) => {
                            Requests::add(&l.requests.reads, 1);
                            failure
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e);
                            return;
                        }
                    }
                }
                got[i].store(have, Ordering::SeqCst);
                if have < want {
                    eof_at.fetch_min(i, Ordering::SeqCst);
                }
            }
        };
        let threads = parallel.min(n).max(1);
        for _ in 1..threads {
            s.spawn(worker);
        }
        worker();
    });
    // The range ended before its last piece (end of file) or was empty: ask now.
    if want_attr && failure.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
        query_attr();
    }
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut total = 0;
    for g in &got {
        match g.load(Ordering::SeqCst) {
            usize::MAX => break,
            k => {
                total += k;
                if k < piece {
                    break;
                }
            }
        }
    }
    let attr = match attr.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(r) => Some(r?),
        None => None,
    };
    Ok(ReadOutcome { total, attr })
}
