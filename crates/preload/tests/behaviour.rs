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

#[test]
fn a_shared_mapping_of_a_private_file_is_refused_with_enodev() {
    let s = Scratch::new("mmapshared");
    let private = s.sub("private");
    let script = format!(
        r#"import mmap, os
fd = os.open("{p}/f", os.O_CREAT | os.O_RDWR)
os.write(fd, b"x" * 8192)
try:
    mmap.mmap(fd, 8192, mmap.MAP_SHARED)
    print("mapped")
except OSError as e:
    print("refused", e.errno)
m = mmap.mmap(fd, 8192, mmap.MAP_PRIVATE)
print("private", m[:4])
"#,
        p = private.display()
    );
    let out = ok(s
        .private_cmd(&private, "python3")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap());
    assert_eq!(
        out.trim(),
        format!("refused {}\nprivate b'xxxx'", libc::ENODEV)
    );
}
