//! Developer check against libCacheSim hit/miss vectors produced by a Python script
//! (see docs/policies.md, "Checking against libCacheSim"). Runs only when
//! KAISO_LCS_DIR names a directory of `<trace>.trace` and `<trace>.<policy>.<cap>.lcs` files.

use kaiso_policy::cache::{Capacity, Request, annotate_next_access, by_name};

#[test]
#[ignore = "needs KAISO_LCS_DIR with libCacheSim outputs"]
fn hit_vectors_match_libcachesim() {
    let dir = std::env::var("KAISO_LCS_DIR").expect("KAISO_LCS_DIR");
    let mut failures = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(stem) = name.strip_suffix(".lcs") else {
            continue;
        };
        let parts: Vec<&str> = stem.split('.').collect();
        let (trace, policy, cap) = (parts[0], parts[1], parts[2].parse::<u64>().unwrap());
        let text = std::fs::read_to_string(format!("{dir}/{trace}.trace")).unwrap();
        let mut reqs: Vec<Request> = text
            .lines()
            .enumerate()
            .map(|(i, l)| {
                let mut it = l.split_whitespace().map(|x| x.parse::<u64>().unwrap());
                Request::new(i as u64, it.next().unwrap(), it.next().unwrap())
            })
            .collect();
        annotate_next_access(&mut reqs);
        let (pname, params) = match policy {
            "clock2" => ("clock", "n-bit-counter=2"),
            p => (p, ""),
        };
        let mut c = by_name(pname, Capacity::bytes(cap), params).unwrap();
        let ours: String = reqs
            .iter()
            .map(|r| if c.access(r) { 'h' } else { 'm' })
            .collect();
        let theirs = std::fs::read_to_string(&path).unwrap();
        let om = ours.matches('m').count();
        let tm = theirs.matches('m').count();
        match ours.chars().zip(theirs.chars()).position(|(a, b)| a != b) {
            None => println!("{stem}: identical ({om} misses)"),
            Some(i) => {
                failures += 1;
                println!("{stem}: DIFFER at request {i}: ours {om} misses, libCacheSim {tm}");
            }
        }
    }
    assert_eq!(failures, 0);
}
