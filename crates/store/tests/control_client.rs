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
