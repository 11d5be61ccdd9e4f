//! No system calls for private-file data operations: strace between two marker calls.

mod common;
use common::*;
use std::process::Command;

/// Runs tests/c/dataops under `strace -f` on a private directory and returns the system calls
/// made between its markers; `prefault` sets KAISO_PREFAULT=1.
fn private_calls(s: &Scratch, prog: &std::path::Path, name: &str, prefault: bool) -> Vec<String> {
    let private = s.sub(name);
    let trace = s.dir.join(format!("{name}.trace"));
    let warm = warm_file(s);
    let mut cmd = s.private_cmd(&private, "strace");
    if prefault {
        cmd.env("KAISO_PREFAULT", "1");
    }
    let out = cmd
        .arg("-f")
        .arg("-o")
        .arg(&trace)
        .arg(prog)
        .arg(&private)
        .arg(&warm)
        .output()
        .unwrap();
    let so = ok(out);
    assert!(so.starts_with("total "), "{so}");
    between_markers(&std::fs::read_to_string(&trace).unwrap())
}

#[test]
fn data_operations_on_private_files_make_no_system_calls() {
    if !have("strace") {
        panic!("strace is not installed (scripts/deps/libfs.list lists it)");
    }
    let s = Scratch::new("strace");
    let prog = compile_c(&s, "dataops");
    // By default: not a single system call (new pool pages fault in on first store).
    let calls = private_calls(&s, &prog, "strict", false);
    assert!(
        calls.is_empty(),
        "system calls during private data operations:\n{}",
        calls.join("\n")
    );
    // With KAISO_PREFAULT=1 the allocator faults never-used pool memory in 2 MiB ahead of
    // itself: the only calls are those madvises, one per 2 MiB of pool growth (the program
    // writes ~6 MiB of new data), never one per operation.
    let calls = private_calls(&s, &prog, "default", true);
    assert!(
        calls
            .iter()
            .all(|c| c.contains("madvise(") && c.contains("MADV_POPULATE_WRITE")),
        "unexpected system calls during private data operations:\n{}",
        calls.join("\n")
    );
    assert!(
        calls.len() <= 8,
        "too many prefault calls:\n{}",
        calls.join("\n")
    );
    // The same program on a kernel directory makes thousands of calls: the check can fail.
    let normal = s.sub("normal");
    let trace2 = s.dir.join("trace2.txt");
    ok(Command::new("strace")
        .arg("-o")
        .arg(&trace2)
        .arg(&prog)
        .arg(&normal)
        .arg(warm_file(&s))
        .output()
        .unwrap());
    let t2 = std::fs::read_to_string(&trace2).unwrap();
    assert!(
        between_markers(&t2).len() > 5_000,
        "kernel baseline made too few calls"
    );
}

/// A small file outside every private directory, which the program reads before its
/// first marker to warm up stdio (was /etc/hostname, which a container may not have).
fn warm_file(s: &Scratch) -> std::path::PathBuf {
    let p = s.dir.join("warm-up.txt");
    std::fs::write(&p, b"warm-up\n").unwrap();
    p
}

/// The trace lines strictly between the two marker calls.
fn between_markers(t: &str) -> Vec<String> {
    let lines: Vec<&str> = t.lines().collect();
    let b = lines
        .iter()
        .position(|l| l.contains("kaiso-marker-begin"))
        .expect("begin marker in trace");
    let e = lines
        .iter()
        .position(|l| l.contains("kaiso-marker-end"))
        .expect("end marker in trace");
    lines[b + 1..e].iter().map(|l| l.to_string()).collect()
}
