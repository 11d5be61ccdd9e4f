//! No system calls for private-file data operations: strace between two marker calls.

mod common;
use common::*;
use std::process::Command;

#[test]
fn data_operations_on_private_files_make_no_system_calls() {
    if !have("strace") {
        panic!("strace is not installed (scripts/deps/libfs.list lists it)");
    }
    let s = Scratch::new("strace");
    let prog = compile_c(&s, "dataops");
    let private = s.sub("private");
    let trace = s.dir.join("trace.txt");
    let out = s
        .private_cmd(&private, "strace")
        .arg("-f")
        .arg("-o")
        .arg(&trace)
        .arg(&prog)
        .arg(&private)
        .arg("/etc/hostname")
        .output()
        .unwrap();
    let so = ok(out);
    assert!(so.starts_with("total "), "{so}");
    let t = std::fs::read_to_string(&trace).unwrap();
    let calls = between_markers(&t);
    assert!(
        calls.is_empty(),
        "system calls during private data operations:\n{}",
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
        .arg("/etc/hostname")
        .output()
        .unwrap());
    let t2 = std::fs::read_to_string(&trace2).unwrap();
    assert!(
        between_markers(&t2).len() > 5_000,
        "kernel baseline made too few calls"
    );
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
