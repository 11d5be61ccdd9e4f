//! Unmodified programs on a private directory: the sqlite3 CLI, tar, a shell script doing
//! ordinary file work, RocksDB's db_bench.
//!
//! A pool has one owner process at a time, so the shell script never runs two commands that
//! touch the private directory at the same moment (e.g. both ends of a pipe); a shell that
//! itself touches it (cd, `>` on a builtin, `[ -f ]`) lends the pool to each child it waits
//! for.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

const SQL_WORKLOAD: &str = "
PRAGMA journal_mode=DELETE;
CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT, n INTEGER);
CREATE INDEX kv_n ON kv(n);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 20000)
  INSERT INTO kv SELECT x, printf('value-%d-%s', x, hex(randomblob(20))), x % 97 FROM c;
BEGIN; UPDATE kv SET n = n + 1 WHERE k % 3 = 0; DELETE FROM kv WHERE k % 7 = 0; COMMIT;
CREATE TABLE big AS SELECT k, v || v || v AS v FROM kv;
DELETE FROM big WHERE k % 2 = 0;
VACUUM;
";

const SQL_CHECK: &str = "PRAGMA integrity_check; SELECT count(*), sum(n), sum(length(v)) > 0 FROM kv; SELECT count(*) FROM big;";

#[test]
fn sqlite3_cli_workload_and_integrity_check() {
    if !have("sqlite3") {
        panic!("sqlite3 is not installed (scripts/deps/libfs.list lists it)");
    }
    let s = Scratch::new("sqlite");
    let private = s.sub("private");
    let normal = s.sub("normal");
    let run = |dir: &Path, sql: &str, private_mode: bool| {
        let db = dir.join("test.db");
        let mut c = if private_mode {
            s.private_cmd(&private, "sqlite3")
        } else {
            Command::new("sqlite3")
        };
        ok(c.arg(&db).arg(sql).output().unwrap())
    };
    run(&normal, SQL_WORKLOAD, false);
    run(&private, SQL_WORKLOAD, true);
    let expected = run(&normal, SQL_CHECK, false);
    // A second process opens the same pool: the database must have persisted.
    let got = run(&private, SQL_CHECK, true);
    assert!(got.starts_with("ok\n"), "integrity_check failed: {got}");
    assert_eq!(got, expected);
    // WAL works with exclusive locking (the wal-index then lives in heap memory, not mmap).
    let wal = "PRAGMA locking_mode=EXCLUSIVE; PRAGMA journal_mode=WAL; CREATE TABLE w(x); INSERT INTO w VALUES(1),(2),(3); SELECT sum(x) FROM w; PRAGMA integrity_check;";
    let out = run(&private, wal, true);
    assert!(out.ends_with("6\nok\n"), "{out}");
    assert_eq!(
        std::fs::read_dir(&private).unwrap().count(),
        0,
        "files leaked to disk"
    );
}

/// A deterministic tree: nested directories, files of many sizes, a symlink.
fn make_tree(root: &Path, files: usize) {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for i in 0..files {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let dir = root.join(format!("d{}/e{}", i % 13, i % 5));
        std::fs::create_dir_all(&dir).unwrap();
        let len = (seed % 70_000) as usize;
        let data: Vec<u8> = (0..len).map(|j| (j as u64 ^ seed) as u8).collect();
        std::fs::write(dir.join(format!("f{i}.bin")), data).unwrap();
    }
    std::os::unix::fs::symlink("d1/e1", root.join("link")).unwrap();
}

fn diff_trees(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "trees differ:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn tar_extracts_a_generated_tree_and_archives_it_back() {
    let s = Scratch::new("tar");
    let src = s.sub("src");
    make_tree(&src, 1500);
    let archive = s.dir.join("tree.tar");
    ok(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .output()
        .unwrap());
    let private = s.sub("private");
    ok(s.private_cmd(&private, "tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&private)
        .output()
        .unwrap());
    // Read everything back through the library: tar -c inside, tar -x outside.
    let back = s.sub("back");
    let reader = s
        .private_cmd(&private, "tar")
        .arg("-cf")
        .arg("-")
        .arg("-C")
        .arg(&private)
        .arg(".")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = reader;
    let st = Command::new("tar")
        .arg("-xf")
        .arg("-")
        .arg("-C")
        .arg(&back)
        .stdin(reader.stdout.take().unwrap())
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        reader.wait().unwrap().success(),
        "tar -c on the private directory failed"
    );
    diff_trees(&src, &back);
}

#[test]
fn shell_script_does_ordinary_file_work() {
    let s = Scratch::new("shell");
    let private = s.sub("private");
    let script = format!(
        r#"set -eu
P={p}
mkdir -p $P/a/b
echo hello > $P/a/h.txt
echo again >> $P/a/h.txt
cat $P/a/h.txt
cp /etc/services $P/a/s
sort $P/a/s > $P/a/sorted
wc -l < $P/a/sorted
cd $P/a
mv s b/t
ls -R
[ -f b/t ] && echo exists
[ -e missing ] || echo no-missing
for f in *; do echo "entry $f"; done
while read -r line; do echo "read: $line"; done < h.txt
head -c 20 b/t > first
od -c first | head -1 | wc -l
cd ..
rm -r a
ls -A | wc -l
echo done
"#,
        p = private.display()
    );
    let normal = s.sub("normal");
    let normal_script = script.replace(
        &private.display().to_string(),
        &normal.display().to_string(),
    );
    let expected = ok(Command::new("bash")
        .arg("-c")
        .arg(&normal_script)
        .output()
        .unwrap());
    let got = ok(s
        .private_cmd(&private, "bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap());
    assert_eq!(got, expected);
    assert!(got.ends_with("0\ndone\n"));
}

#[test]
fn rocksdb_db_bench_runs_on_a_private_directory() {
    if !have("db_bench") {
        panic!(
            "db_bench is not installed (Debian package rocksdb-tools, in scripts/deps/libfs.list)"
        );
    }
    let s = Scratch::new("dbbench");
    let private = s.sub("private");
    let db = private.join("db");
    let out = ok(s
        .private_cmd(&private, "db_bench")
        .env("KAISO_POOL_SIZE", "2G")
        .arg(format!("--db={}", db.display()))
        .args([
            "--benchmarks=fillseq,fillrandom,readrandom,compact,readseq",
            "--num=20000",
            "--value_size=400",
            "--compression_type=none",
        ])
        .output()
        .unwrap());
    for b in ["fillseq", "fillrandom", "readrandom", "readseq"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(b) && l.contains("ops/sec")),
            "{b} missing:\n{out}"
        );
    }
    // readrandom after fillseq+fillrandom must find keys; a second run reopens the database.
    let again = ok(s
        .private_cmd(&private, "db_bench")
        .arg(format!("--db={}", db.display()))
        .args([
            "--benchmarks=readrandom",
            "--use_existing_db=1",
            "--num=20000",
            "--value_size=400",
        ])
        .output()
        .unwrap());
    let line = again
        .lines()
        .find(|l| l.starts_with("readrandom"))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains(" found)") && !line.contains("(0 of"),
        "{again}"
    );
    assert_eq!(
        std::fs::read_dir(&private).unwrap().count(),
        0,
        "files leaked to disk"
    );
}
