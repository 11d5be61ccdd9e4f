//! Trace readers on small fixture files: values, formats auto-detected by name, and a
//! clear error naming the line or record for every kind of malformed input.

use kaiso_policy::Op;
use kaiso_sim::trace::{self, IoRecord, NEVER, TraceError, TraceFormat};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read_all(name: &str) -> Result<Vec<IoRecord>, TraceError> {
    let path = fixture(name);
    let format = TraceFormat::from_path(&path).expect("format from extension");
    trace::open(&path, format).expect("open").collect()
}

fn error_of(name: &str) -> String {
    read_all(name)
        .expect_err("malformed input must be an error")
        .to_string()
}

#[test]
fn msr_csv() {
    let r = read_all("msr_small.csv").unwrap();
    assert_eq!(r.len(), 5);
    assert_eq!(r[0], IoRecord::new(0, 1, 7_014_609_920, 24_576, Op::Read));
    // FILETIME ticks are 100 ns.
    assert_eq!(r[1].time, (128166372003116447 - 128166372003061629) * 100);
    assert_eq!(r[1].op, Op::Write);
    assert_eq!(
        r[4].time,
        (128166372026382245u64 - 128166372003061629) * 100
    );
    assert_eq!(
        read_all("msr_header.csv").unwrap().len(),
        1,
        "header skipped"
    );
}

#[test]
fn msr_errors_name_the_line() {
    let e = error_of("msr_bad_type.csv");
    assert!(e.contains("line 3") && e.contains("Trim"), "{e}");
    let e = error_of("msr_bad_fields.csv");
    assert!(e.contains("line 2") && e.contains("Size"), "{e}");
    let e = error_of("msr_bad_number.csv");
    assert!(e.contains("line 2") && e.contains("Offset"), "{e}");
}

#[test]
fn blkparse_text() {
    let r = read_all("blkparse_small.blkparse").unwrap();
    // Q actions with R or W and a sector range; the flush-only `Q FWS` has no range.
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!(
        r[0],
        IoRecord::new(812, 8 << 20, 223_490 * 512, 8 * 512, Op::Read)
    );
    assert_eq!(r[1].op, Op::Write);
    assert_eq!(r[1].len, 16 * 512);
    assert_eq!(r[2].object, (8 << 20) | 16);
    assert_eq!(r[2].time, 1_500_000_000);
}

#[test]
fn blkparse_errors_name_the_line() {
    let e = error_of("blkparse_bad.blkparse");
    assert!(e.contains("line 2") && e.contains("time"), "{e}");
    let e = error_of("blkparse_bad_sector.blkparse");
    assert!(e.contains("line 2") && e.contains("sector"), "{e}");
}

#[test]
fn oracle_general() {
    let r = read_all("oracle_small.oracleGeneral").unwrap();
    assert_eq!(r.len(), 4);
    assert_eq!(
        (r[0].object, r[0].len, r[0].next_access, r[0].time),
        (1, 4096, 2, 0)
    );
    assert_eq!(r[1].next_access, NEVER);
    assert_eq!(r[3].time, 5_000_000_000);
    let e = error_of("oracle_truncated.oracleGeneral");
    assert!(e.contains("record 3") && e.contains("truncated"), "{e}");
}

#[test]
fn vscsi_both_versions() {
    let r = read_all("vscsi1_small.vscsi").unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(r[0], IoRecord::new(0, 0, 100 * 512, 4096, Op::Read));
    assert_eq!(r[1].op, Op::Write);
    assert_eq!(r[1].time, 500_000_000);
    let r = read_all("vscsi2_small.vscsi").unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(
        r[1],
        IoRecord::new(100_000, 0, 4096 * 512, 65536, Op::Write)
    );
    let e = error_of("vscsi_unknown.vscsi");
    assert!(e.contains("record 1") && e.contains("version"), "{e}");
}

#[test]
fn kaiso_file_trace() {
    let r = read_all("kaiso_small.ktrace").unwrap();
    assert_eq!(r.len(), 4);
    assert_eq!(r[0], IoRecord::new(0, 7, 0, 0, Op::Open));
    assert_eq!(r[1], IoRecord::new(50_000, 7, 0, 65536, Op::Read));
    assert_eq!(r[3].op, Op::Delete);
    let e = error_of("kaiso_bad_op.ktrace");
    assert!(e.contains("line 3") && e.contains("rename"), "{e}");
}

#[test]
fn garbage_never_panics() {
    // Every reader on every fixture (wrong formats included) returns records or an error.
    let dir = fixture("");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        for name in TraceFormat::NAMES {
            let f = TraceFormat::parse(name).unwrap();
            let n = trace::open(&path, f).unwrap().take(1000).count();
            assert!(n <= 1000);
        }
    }
    // Invalid UTF-8 in a text format.
    let bytes: &[u8] = b"1,a,1,Read,0,1,0\n\xff\xfe\n";
    let e: Result<Vec<_>, _> = trace::from_reader(bytes, TraceFormat::Msr).collect();
    assert!(e.unwrap_err().to_string().contains("line 2"));
}

#[test]
fn oracle_round_trip_through_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.oracleGeneral");
    let reqs = vec![(0u32, 5u64, 100u64), (1, 6, 200), (2, 5, 100), (3, 7, 1)];
    trace::write_oracle_general(std::fs::File::create(&path).unwrap(), &reqs).unwrap();
    let r: Vec<IoRecord> = trace::open(&path, TraceFormat::OracleGeneral)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        r.iter().map(|x| x.object).collect::<Vec<_>>(),
        vec![5, 6, 5, 7]
    );
    assert_eq!(
        r.iter().map(|x| x.next_access).collect::<Vec<_>>(),
        vec![2, NEVER, NEVER, NEVER]
    );
    // MSR writer → MSR reader.
    let csv = dir.path().join("t.csv");
    trace::write_msr_csv(std::fs::File::create(&csv).unwrap(), r.iter().copied()).unwrap();
    let back: Vec<IoRecord> = trace::open(&csv, TraceFormat::Msr)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(back.len(), 4);
    assert_eq!(back[2].time, 2_000_000_000);
}
