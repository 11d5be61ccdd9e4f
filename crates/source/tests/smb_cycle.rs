//! The SMB source against a real Samba smbd: a symlink to an ancestor, which Samba
//! follows (`follow symlinks = yes`, its default), is a directory that contains itself;
//! the source refuses to list it (a directory cycle) instead of letting a crawl go down
//! `d/self/self/…` without end (audit s11).

mod common;

use kaiso_source::SmbSource;
use kaiso_store::migrate::{Source, SourceErrorKind, SourcePath};

fn p(s: &str) -> SourcePath {
    SourcePath::parse(s.as_bytes()).unwrap()
}

fn names(source: &SmbSource, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = source
        .read_dir(&p(dir))
        .unwrap_or_else(|e| panic!("list {dir}: {e}"))
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    v.sort();
    v
}

/// `dir` must be refused as the directory `same` again.
fn assert_cycle(source: &SmbSource, dir: &str, same: &str) {
    match source.read_dir(&p(dir)) {
        Ok(entries) => panic!(
            "{dir} is {same} again (a symlink Samba follows): listing it must fail as a \
             directory cycle, it listed {} entries",
            entries.len()
        ),
        Err(e) => {
            assert_eq!(e.kind, SourceErrorKind::Unsupported, "{dir}: {e}");
            assert!(
                e.message.contains("directory cycle") && e.message.contains(same),
                "{dir}: the reason must say it is a directory cycle back to {same}: {e}"
            );
        }
    }
}

#[test]
fn a_symlink_to_an_ancestor_is_a_directory_cycle() {
    if !common::have(&["smbd", "smbpasswd"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let root = share.path();
    std::fs::create_dir_all(root.join("d/sub")).unwrap();
    std::fs::create_dir_all(root.join("e")).unwrap();
    std::fs::write(root.join("d/file"), b"in d\n").unwrap();
    std::fs::write(root.join("d/sub/leaf"), b"leaf\n").unwrap();
    std::os::unix::fs::symlink(".", root.join("d/self")).unwrap();
    std::os::unix::fs::symlink("..", root.join("d/sub/up")).unwrap();
    std::os::unix::fs::symlink("../..", root.join("d/sub/top")).unwrap();
    // A link to a directory elsewhere is no cycle: it is listed (a second copy).
    std::os::unix::fs::symlink("../d/sub", root.join("e/alias")).unwrap();
    let server = common::Samba::start_read_only(root);

    // Top-down, as a crawl lists.
    let source = SmbSource::connect(server.config()).expect("connect to samba");
    assert_eq!(names(&source, ""), ["d", "e"]);
    assert_eq!(names(&source, "d"), ["file", "self", "sub"]);
    assert_eq!(names(&source, "d/sub"), ["leaf", "top", "up"]);
    assert_cycle(&source, "d/self", "its ancestor /d again");
    assert_cycle(&source, "d/sub/up", "its ancestor /d again");
    assert_cycle(&source, "d/sub/top", "the share's root again");
    assert_eq!(names(&source, "e"), ["alias"]);
    assert_eq!(names(&source, "e/alias"), ["leaf", "top", "up"]);
    drop(source);

    // A new source that listed nothing yet (a daemon restarted in the middle of a
    // crawl) asks for the ancestors it does not know.
    let fresh = SmbSource::connect(server.config()).expect("connect to samba");
    assert_cycle(&fresh, "d/sub/up", "its ancestor /d again");
    assert_cycle(&fresh, "d/self", "its ancestor /d again");
    assert_eq!(names(&fresh, "d/sub"), ["leaf", "top", "up"]);
}
