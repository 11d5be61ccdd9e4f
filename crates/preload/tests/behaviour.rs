//! The same scenario program runs in a normal directory and in a private directory; the two
//! transcripts must match line for line (stdio, readdir after create/unlink/rename, unlink
//! while open, O_APPEND, sparse writes, rename over an existing file, fsync, dup, locks,
//! symlinks, current directory, error codes).

mod common;
use common::*;
use std::process::Command;

#[test]
fn private_directory_behaves_like_a_kernel_directory() {
    let s = Scratch::new("behaviour");
    let prog = compile_c(&s, "scenario");
    let normal = s.sub("normal");
    let expected = ok(Command::new(&prog).arg(&normal).output().unwrap());
    let private = s.sub("private");
    let got = ok(s
        .private_cmd(&private, &prog)
        .arg(&private)
        .output()
        .unwrap());
    let exp_lines: Vec<_> = expected.lines().collect();
    let got_lines: Vec<_> = got.lines().collect();
    for (i, (e, g)) in exp_lines.iter().zip(&got_lines).enumerate() {
        assert_eq!(
            e,
            g,
            "line {} differs\nnormal:\n{expected}\nprivate:\n{got}",
            i + 1
        );
    }
    assert_eq!(
        exp_lines.len(),
        got_lines.len(),
        "transcript lengths differ\nnormal:\n{expected}\nprivate:\n{got}"
    );
    // Nothing reached the kernel directory that stands for the private one.
    assert_eq!(
        std::fs::read_dir(&private).unwrap().count(),
        0,
        "files leaked to disk"
    );
}
