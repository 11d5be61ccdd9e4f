//! A fast, deterministic hasher for `u64` object ids (the FxHash multiply-rotate).
//!
//! Object ids are trusted (they come from our own traces and stores), so a DoS-resistant
//! SipHash buys nothing and costs a large share of a policy's per-request time.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (as used by rustc): one multiply per word.
#[derive(Clone, Copy, Default)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes the bucket from the low bits and its control byte from the top 7.
        // The multiply alone leaves the low bits of `id << k` zero (block ids are
        // `object << 44 | block`), so mix the high half down and the result back up.
        let h = (self.hash ^ (self.hash >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

pub type FxBuild = BuildHasherDefault<FxHasher>;
pub type FxHashMap<K, V> = HashMap<K, V, FxBuild>;
pub type FxHashSet<K> = HashSet<K, FxBuild>;

/// An empty map with room for `n` entries.
pub fn map_with_capacity<K, V>(n: usize) -> FxHashMap<K, V> {
    FxHashMap::with_capacity_and_hasher(n, FxBuild::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_bit_ids_spread_over_low_bits() {
        // Ids that differ only above bit 44 (`object << 44`) must not share low bits.
        let mut low = FxHashSet::default();
        for id in 0u64..1024 {
            let mut h = FxHasher::default();
            h.write_u64(id << 44);
            low.insert(h.finish() & 1023);
        }
        assert!(
            low.len() > 500,
            "only {} distinct low-bit buckets",
            low.len()
        );
    }

    #[test]
    fn sequential_ids_spread_over_buckets() {
        // Sequential ids (block numbers) must not collide in the low bits.
        let mut low = FxHashSet::default();
        for id in 0u64..1024 {
            let mut h = FxHasher::default();
            h.write_u64(id * 4096);
            low.insert(h.finish() & 1023);
        }
        assert!(
            low.len() > 500,
            "only {} distinct low-bit buckets",
            low.len()
        );
    }
}
