//! A reply that stalls half-way must not break the SMB connection: a receive timeout in
//! the middle of a message once dropped the bytes read so far (the `smb` crate, before
//! the port to `smb2`), so the connection lost its framing ("bad magic") and every
//! request on it waited for the timeout. A TCP relay between the source and Samba here
//! pauses 300 ms inside large replies.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use kaiso_source::SmbSource;
use kaiso_store::migrate::{Source, SourcePath};

/// Relays every connection to `server`, pausing 300 ms in the middle of the server's
/// data once per 3 MiB sent. Runs until the process ends (the test's threads die with it).
fn stalling_relay(server: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(upstream) = TcpStream::connect(("127.0.0.1", server)) else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (mut c_in, mut c_out) = (client.try_clone().unwrap(), client);
            let (mut s_in, mut s_out) = (upstream.try_clone().unwrap(), upstream);
            std::thread::spawn(move || std::io::copy(&mut c_in, &mut s_out));
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                let mut sent = 0usize;
                let mut next_pause = 3 << 20;
                loop {
                    let n = match s_in.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let mut chunk = &buf[..n];
                    if sent + n > next_pause && n > 1 {
                        // Half the chunk, a pause, the rest: the pause falls inside a reply.
                        let half = n / 2;
                        if c_out.write_all(&chunk[..half]).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(300));
                        chunk = &chunk[half..];
                        next_pause += 3 << 20;
                    }
                    if c_out.write_all(chunk).is_err() {
                        return;
                    }
                    sent += n;
                }
            });
        }
    });
    port
}

#[test]
fn smb_reply_stalling_mid_message_keeps_the_connection() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let len = 16 << 20;
    let data = common::content(3, len);
    std::fs::write(share.path().join("big"), &data).unwrap();
    let server = common::Samba::start(share.path());
    let mut config = server.config();
    config.port = stalling_relay(server.port);
    config.timeout = Duration::from_secs(30);
    config.connections = 1;
    let source = SmbSource::connect(config).expect("connect through the relay");
    let p = SourcePath::parse(b"big").unwrap();
    let started = Instant::now();
    let mut buf = vec![0u8; 10 << 20];
    let mut off = 0;
    while off < len {
        let (n, _) = source
            .read_into(&p, off as u64, &mut buf)
            .unwrap_or_else(|e| panic!("read at {off}: {e}"));
        assert!(n > 0 && buf[..n] == data[off..off + n], "bytes at {off}");
        off += n;
    }
    // Five pauses of 300 ms; a lost framing costs a timeout (30 s) and a reconnect.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "read took {took:?}");
}
