//! Descriptor numbers, fork, exec, and the single-owner rule.

mod common;
use common::*;
use std::process::Command;

#[test]
fn fork_and_exec_follow_the_documented_rules() {
    let s = Scratch::new("forkexec");
    let prog = compile_c(&s, "forkexec");
    let private = s.sub("private");
    let out = s
        .private_cmd(&private, &prog)
        .arg(&private)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        so.contains(&format!(
            "child with parent busy: refused errno={}",
            libc::EBUSY
        )),
        "{so}\n{se}"
    );
    assert!(
        se.contains("in use by another process"),
        "the refusal must say why: {se}"
    );
    assert!(
        so.contains("child with parent waiting: opened"),
        "{so}\n{se}"
    );
    assert!(so.contains("parent after child: [abcdefXYZ]"), "{so}\n{se}");
    assert!(so.contains("inherited read 3 [def]"), "{so}\n{se}");
    assert!(
        so.contains(&format!("cloexec fd: -1 errno={}", libc::EBADF)),
        "{so}\n{se}"
    );
}

#[test]
fn a_second_process_is_refused_with_a_clear_error() {
    let s = Scratch::new("owner");
    let private = s.sub("private");
    // The first process holds the pool (a shell redirect opens it) and says so by
    // creating `ready` outside the private directory; then it waits on its stdin (a
    // builtin: no child left behind) until killed below, or until the pipe closes when
    // the test fails early.
    let ready = s.dir.join("ready");
    let mut holder = s
        .private_cmd(&private, "bash")
        .stdin(std::process::Stdio::piped())
        .arg("-c")
        .arg(format!(
            "exec 3>{}/held && : >{} && read -r _",
            private.display(),
            ready.display()
        ))
        .spawn()
        .unwrap();
    // Wait for the holder (not a fixed time: a loaded machine starts bash slowly).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ready.exists() {
        if let Some(st) = holder.try_wait().unwrap() {
            panic!("the holder exited ({st}) before it held the pool");
        }
        if std::time::Instant::now() > deadline {
            let _ = holder.kill();
            let _ = holder.wait();
            panic!("the holder did not hold the pool within 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = s
        .private_cmd(&private, "cat")
        .arg(private.join("held"))
        .output()
        .unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is in use by another process (pid"), "{err}");
    assert!(err.contains("Device or resource busy"), "{err}");
}

#[test]
fn private_descriptors_never_collide_with_kernel_ones() {
    let s = Scratch::new("fds");
    let private = s.sub("private");
    // A kernel file of the test's own (was /etc/hostname, which a container may lack).
    let kernel_file = s.dir.join("kernel-file.txt");
    std::fs::write(&kernel_file, b"a kernel file\n").unwrap();
    // Interleave many opens of private and kernel files; every number must be distinct and
    // each read must return its own file's contents.
    let script = format!(
        r#"import os
p = "{p}"
fds = []
for i in range(300):
    a = os.open(f"{{p}}/f{{i}}", os.O_CREAT | os.O_RDWR)
    os.write(a, f"private {{i}}".encode())
    b = os.open("{k}", os.O_RDONLY)
    fds += [(a, f"private {{i}}".encode()), (b, open("{k}", "rb").read())]
assert len({{fd for fd, _ in fds}}) == len(fds), "descriptor collision"
for fd, want in fds:
    os.lseek(fd, 0, 0)
    assert os.read(fd, 100) == want, (fd, want)
    os.close(fd)
print("ok", len(fds))
"#,
        p = private.display(),
        k = kernel_file.display()
    );
    if !have("python3") {
        panic!("python3 missing");
    }
    let out = ok(s
        .private_cmd(&private, "python3")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap());
    assert_eq!(out.trim(), "ok 600");
    let _ = Command::new("true");
}

#[test]
fn every_exec_form_and_posix_spawn_hand_over_descriptors_and_settings() {
    let s = Scratch::new("execchain");
    let prog = compile_c(&s, "execchain");
    let private = s.sub("private");
    let out = s
        .private_cmd(&private, &prog)
        .arg(&private)
        .arg("0")
        .arg(&prog)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{so}\n{se}");
    // Stage n was started by: 1 execl, 2 execlp, 3 execle (own env), 4 execvpe (own env),
    // 5 fexecve (own env), 6 execv of the program copied into the private directory,
    // 7 a private #! script, 8 execv from that script.
    let reads = ["ab", "cd", "ef", "gh", "ij", "kl", "mn"];
    let stages = [1, 2, 3, 4, 5, 6, 8];
    for (n, r) in stages.iter().zip(reads) {
        let x = if *n >= 3 { "own-env" } else { "-" };
        let want = format!("stage {n}: read 2 [{r}] preload=yes pool=yes X={x}");
        assert!(so.contains(&want), "missing {want:?}\n{so}\n{se}");
    }
    assert!(so.contains("script ran with 3 arguments"), "{so}\n{se}");
    // posix_spawn with the child's stdout dup2'ed from a private descriptor.
    assert!(
        so.contains(
            "spawned child wrote to the private file: stage 9: read 2 [op] preload=yes pool=yes X=own-env"
        ),
        "{so}\n{se}"
    );
    assert!(so.contains("spawned child exit 0"), "{so}\n{se}");
    assert!(
        so.contains("addopen of a private path: Operation not supported"),
        "{so}\n{se}"
    );
    assert!(se.contains("posix_spawn_file_actions_addopen of a private path is not supported"));
}
