//! The control client against a daemon that does not answer, and the mover's status as
//! the control socket reports it.

mod common;
use common::*;
use kaiso_store::control::{self, Client, Request};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

/// A daemon that accepts the connection and never answers: `kaiso status` must fail with
/// a clear error after its timeout instead of hanging.
#[test]
fn a_hung_daemon_gives_a_timeout_error() {
    let dir = tempfile::tempdir().unwrap();
    let l = UnixListener::bind(control::socket_path(dir.path())).unwrap();
    let mut c = Client::connect(dir.path()).unwrap();
    let (_conn, _) = l.accept().unwrap();
    c.set_timeout(Duration::from_millis(300)).unwrap();
    let t = Instant::now();
    let e = c.call(&Request::Status).unwrap_err().to_string();
    let waited = t.elapsed();
    assert!(e.contains("did not answer"), "{e}");
    assert!(e.contains("hung"), "{e}");
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // Its late reply could be taken for the next request's: the connection is done.
    let e = c.call(&Request::Status).unwrap_err().to_string();
    assert!(e.contains("earlier timeout"), "{e}");
}

#[test]
fn only_requests_answered_at_once_have_a_limit() {
    assert!(control::answered_at_once(&Request::Status));
    assert!(control::answered_at_once(&Request::Unpin {
        path: "a".into(),
        recursive: false
    }));
    assert!(!control::answered_at_once(&Request::Fsck));
    assert!(!control::answered_at_once(&Request::Migrate {
        args: serde_json::json!({})
    }));
    assert!(!control::answered_at_once(&Request::Pin {
        path: "a".into(),
        tier: None,
        recursive: true
    }));
}

/// The mover counters of `kaiso status` that come from the planner (newer than the rest).
const PLANNER_COUNTERS: [&str; 5] = [
    "plans",
    "empty_plans_in_a_row",
    "moving_files",
    "waiting_files",
    "backed_off_ms",
];

/// The planner's counters are part of `MoverStatus` (what `kaiso status --json` shows
/// under `mover`; `kaiso bench fs` waits for `empty_plans_in_a_row`).
#[test]
fn status_reports_the_planner_counters_under_mover() {
    let t = TestStore::new(&["64MiB", "64MiB"]);
    let stop = std::sync::atomic::AtomicBool::new(false);
    t.s().plan_and_move(&stop);
    t.s().plan_and_move(&stop);
    let st = t.s().status();
    assert_eq!(st.mover.plans, 2);
    assert_eq!(st.mover.empty_plans_in_a_row, 2);
    assert_eq!(st.mover.moving_files, 0);
    assert_eq!(st.mover.waiting_files, 0);
    let v = control::handle(t.s(), Request::Status).unwrap();
    let m = &v["mover"];
    for k in PLANNER_COUNTERS.iter().chain(&["queued_files"]) {
        assert!(m[k].is_u64(), "{k} missing in {m}");
    }
    assert_eq!(m["plans"], 2);
    // A status from an older daemon without those counters still parses.
    let mut old = serde_json::to_value(&st).unwrap();
    for k in PLANNER_COUNTERS {
        old["mover"].as_object_mut().unwrap().remove(k);
    }
    let back: kaiso_store::StoreStatus = serde_json::from_value(old).unwrap();
    assert_eq!(back.mover.plans, 0);
}

/// Paths travel as strings when they are UTF-8 and as byte arrays when not; both forms
/// are read back to the same path.
#[test]
fn paths_that_are_not_utf8_cross_the_protocol_as_bytes() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let latin = std::path::PathBuf::from(OsStr::from_bytes(b"caf\xe9/x\xff"));
    let req = Request::Where {
        path: latin.clone(),
    };
    let v = serde_json::to_value(&req).unwrap();
    assert_eq!(
        v["path"],
        serde_json::json!(b"caf\xe9/x\xff".to_vec()),
        "{v}"
    );
    assert_eq!(serde_json::from_value::<Request>(v).unwrap(), req);
    let plain = Request::Unpin {
        path: "a/b".into(),
        recursive: true,
    };
    let v = serde_json::to_value(&plain).unwrap();
    assert_eq!(v["path"], "a/b");
    assert_eq!(serde_json::from_value::<Request>(v).unwrap(), plain);
    // An older client's string form still parses.
    let old = r#"{"op":"explain","path":"d/f"}"#;
    assert_eq!(
        serde_json::from_str::<Request>(old).unwrap(),
        Request::Explain { path: "d/f".into() }
    );
}

/// Over a real socket: where/explain/pin/unpin/move of a Latin-1 name, and errors that
/// say what failed (audit2 #14a, #32).
#[test]
fn a_served_store_answers_for_names_that_are_not_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let t = TestStore::new(&["1MiB", "1MiB"]);
    let name = OsStr::from_bytes(b"n\xe9e");
    let s = t.s();
    let d = s
        .mkdir(
            kaiso_store::ROOT_INO,
            OsStr::new("d"),
            0o755,
            0,
            kaiso_store::Caller::ROOT,
        )
        .unwrap()
        .ino;
    let (_, o) = s
        .create(
            d,
            name,
            0o644,
            0,
            libc::O_RDWR,
            kaiso_store::Caller::ROOT,
            false,
        )
        .unwrap();
    assert_eq!(s.write(o.fh, 0, b"latin").unwrap(), 5);
    s.release(o.fh).unwrap();
    let rel = std::path::Path::new("d").join(name);
    let on = |tier: usize| t.tier(tier).join(&rel).exists();
    let sock = control::serve(t.s().clone()).unwrap();
    let mut c = Client::connect(sock.parent().unwrap()).unwrap();
    let v = c.call(&Request::Where { path: rel.clone() }).unwrap();
    let p: kaiso_store::Placement = serde_json::from_value(v).unwrap();
    assert_eq!(p.tiers, vec!["t0"]);
    assert_eq!(
        p.backing_path_raw(),
        t.tier(0).join(&rel).as_os_str().as_bytes()
    );
    assert!(p.backing_path.contains('\u{fffd}'), "{p:?}");
    let v = c
        .call(&Request::Move {
            path: rel.clone(),
            direction: kaiso_store::Direction::Demote,
            tier: None,
            recursive: false,
        })
        .unwrap();
    let job = v["job"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p: kaiso_store::JobProgress =
            serde_json::from_value(c.call(&Request::Job { id: job }).unwrap()).unwrap();
        if p.finished {
            assert_eq!((p.files_done, p.failed), (1, 0), "{p:?}");
            break;
        }
        assert!(Instant::now() < deadline, "move did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(on(1) && !on(0));
    let v = c
        .call(&Request::Pin {
            path: "d".into(),
            tier: Some("t1".into()),
            recursive: true,
        })
        .unwrap();
    assert_eq!(v["files"], 1);
    let e: kaiso_store::Explanation =
        serde_json::from_value(c.call(&Request::Explain { path: rel.clone() }).unwrap()).unwrap();
    assert!(e.rule.contains("pinned to tier t1"), "{e:?}");
    let v = c
        .call(&Request::Unpin {
            path: rel.clone(),
            recursive: false,
        })
        .unwrap();
    assert_eq!(v["files"], 1);

    fn c_err(c: &mut Client, req: &Request) -> String {
        c.call(req).unwrap_err().to_string()
    }
    let e = c_err(
        &mut c,
        &Request::Move {
            path: rel.clone(),
            direction: kaiso_store::Direction::Promote,
            tier: Some("bogus".into()),
            recursive: false,
        },
    );
    assert_eq!(e, "unknown tier \"bogus\" (tiers: t0, t1)");
    let e = c_err(
        &mut c,
        &Request::Pin {
            path: "d".into(),
            tier: None,
            recursive: false,
        },
    );
    assert_eq!(e, "is a directory: give -r to pin every file below it");
    let e = c_err(
        &mut c,
        &Request::Where {
            path: "nope".into(),
        },
    );
    assert_eq!(e, "no such file or directory in the store");
    let e = c_err(&mut c, &Request::Job { id: 999 });
    assert!(e.contains("no job 999"), "{e}");
    t.s().shutdown();
}
