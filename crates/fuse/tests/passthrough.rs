//! Proof that passthrough is in effect on a real mount: with the kernel offering it, I/O on
//! a resident file never reaches the daemon (no READ/WRITE requests), while a file on an
//! emulated tier is served by kaiso request by request.

mod common;
use common::{MountedStore, fuse_available};
use kaiso_store::{Store, StoreConfig};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::Ordering;

const SIZE: usize = 16 << 20;

fn read_all(p: &Path) -> usize {
    let mut f = std::fs::File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        match f.read(&mut buf).unwrap() {
            0 => return total,
            n => total += n,
        }
    }
}

#[test]
fn resident_io_bypasses_the_daemon_and_emulated_io_does_not() {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in ["t0", "t1", "mnt"] {
        std::fs::create_dir(root.join(d)).unwrap();
    }
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("t0/resident"), &data).unwrap();
    std::fs::write(root.join("t1/emulated"), &data).unwrap();
    // The real tier has room for a passthrough writer's reserve (1 GiB by default).
    let text = format!(
        "[store]\nstate_dir = \"{0}/state\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"real\"\npath = \"{0}/t0\"\ncapacity = \"8GiB\"\n\
         [[tier]]\nname = \"emulated\"\npath = \"{0}/t1\"\ncapacity = \"1GiB\"\n\
         [tier.device]\nkind = \"nvm\"\n",
        root.display()
    );
    let store = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
    let mnt = root.join("mnt");
    let mount =
        kaiso_fuse::mount(store.clone(), &mnt, &kaiso_fuse::MountOptions::default()).unwrap();
    let env = MountedStore {
        dir,
        store,
        mount: Some(mount),
    };
    // The first request waits for INIT, so the passthrough decision is known after it.
    std::fs::metadata(mnt.join("resident")).unwrap();
    let stats = env.mount.as_ref().unwrap().stats();
    if !stats.passthrough.load(Ordering::Relaxed) {
        eprintln!("skipping: this kernel does not offer FUSE passthrough (Linux 6.9 or later)");
        return;
    }
    let reads = || stats.reads.load(Ordering::Relaxed);
    let writes = || stats.writes.load(Ordering::Relaxed);

    let before = reads();
    assert_eq!(read_all(&mnt.join("resident")), SIZE);
    assert_eq!(
        reads() - before,
        0,
        "reading a resident file sent READ requests"
    );

    let before = reads();
    assert_eq!(read_all(&mnt.join("emulated")), SIZE);
    let served = reads() - before;
    assert!(
        served > 0,
        "the emulated tier's file was not served by kaiso"
    );

    // A new file goes to the real tier and its writer gets passthrough too.
    let before = writes();
    let mut f = std::fs::File::create(mnt.join("written")).unwrap();
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        writes() - before,
        0,
        "writing a new file on a real tier sent WRITE requests"
    );
    assert_eq!(
        std::fs::read(root_of(&mnt).join("t0/written")).unwrap(),
        data
    );
    eprintln!("READ requests for 16 MiB: resident 0, emulated {served}");
}

fn root_of(mnt: &Path) -> &Path {
    mnt.parent().unwrap()
}
