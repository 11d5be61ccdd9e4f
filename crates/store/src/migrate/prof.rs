//! TEMPORARY profiling (remove before commit).
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
pub static T: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
pub static N: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
pub const NAMES: [&str; 16] = ["read_dir","create_entries","db_insert","db_sync","dir_listed","finish_dir","ensure_partial","src_read","stub_write","complete","fetch_leaf","list(crawl)","open_file","meta_pass_end","data_pass_end","x"];
pub struct G(usize, Instant);
pub fn g(i: usize) -> G { G(i, Instant::now()) }
impl Drop for G { fn drop(&mut self) { T[self.0].fetch_add(self.1.elapsed().as_nanos() as u64, Ordering::Relaxed); N[self.0].fetch_add(1, Ordering::Relaxed);} }
pub fn mark(i: usize, t0: Instant) { T[i].store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed); }
pub fn dump() { let mut s=String::new(); for i in 0..16 { let t=T[i].swap(0,Ordering::Relaxed); let n=N[i].swap(0,Ordering::Relaxed); if t>0 { s+=&format!("{}={:.1}ms/{} ", NAMES[i], t as f64/1e6, n);} } eprintln!("PROF {s}"); }
