//! Generated source trees: the thesis's depth × width grid (Fig. 2.7) and datasets shaped
//! like its Table 2.2 (file and directory counts, mean file size with Pareto-distributed
//! sizes, mean file depth), scaled down to fit this machine.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A small deterministic PRNG (xorshift64*), so every run generates the same trees.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// One row of the thesis's Table 2.2.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub dirs: u64,
    pub files: u64,
    pub mean_size: u64,
    pub mean_depth: f64,
}

/// Table 2.2: (a) R&D data, (b) office documents, (c) media.
pub const TABLE_2_2: [Shape; 3] = [
    Shape {
        name: "a",
        dirs: 109_000,
        files: 802_000,
        mean_size: 844 << 10,
        mean_depth: 13.1,
    },
    Shape {
        name: "b",
        dirs: 47_000,
        files: 353_000,
        mean_size: 1_097 << 10,
        mean_depth: 8.1,
    },
    Shape {
        name: "c",
        dirs: 743,
        files: 8_000,
        mean_size: 26_324 << 10,
        mean_depth: 6.1,
    },
];

impl Shape {
    /// Counts divided by `count_div` (at least 2 files and 1 directory), sizes by `size_div`.
    pub fn scaled(&self, count_div: u64, size_div: u64) -> Shape {
        Shape {
            name: self.name,
            dirs: (self.dirs / count_div).max(1),
            files: (self.files / count_div).max(2),
            mean_size: (self.mean_size / size_div).max(1),
            mean_depth: self.mean_depth,
        }
    }
}

/// What a generator produced.
#[derive(Clone, Debug, Default)]
pub struct Generated {
    pub dirs: u64,
    pub files: u64,
    pub bytes: u64,
    pub mean_depth: f64,
    /// Every regular file, relative to the root.
    pub file_paths: Vec<PathBuf>,
}

/// Pareto(α = 1.5) sizes, capped at 200 × the mean and rescaled so the total matches
/// `files × mean` (a small sample of a heavy tail would otherwise miss the mean badly).
fn pareto_sizes(rng: &mut Rng, files: u64, mean: u64) -> Vec<u64> {
    let alpha = 1.5;
    let xm = mean as f64 * (alpha - 1.0) / alpha;
    let cap = mean as f64 * 200.0;
    let raw: Vec<f64> = (0..files)
        .map(|_| (xm / rng.unit().powf(1.0 / alpha)).min(cap))
        .collect();
    let sum: f64 = raw.iter().sum();
    let want = (files * mean) as f64;
    raw.iter()
        .map(|s| (s * want / sum).round() as u64)
        .collect()
}

/// Writes `len` bytes of non-repeating content (so no layer can compress or dedupe it).
fn write_file(path: &Path, len: u64, seed: u64) -> Result<()> {
    let mut f = fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; (len as usize).min(1 << 20)];
    let mut left = len;
    while left > 0 {
        for w in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            w.copy_from_slice(&b[..w.len()]);
        }
        let n = (left as usize).min(buf.len());
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// A tree shaped like `shape` under `root`: file depths (path components, a file in the
/// root has depth 1) spread around the mean depth; directories spread over the levels in
/// proportion to the files below them, each under a random directory one level up.
pub fn generate(root: &Path, shape: &Shape, seed: u64) -> Result<Generated> {
    let mut rng = Rng::new(seed);
    fs::create_dir_all(root)?;
    let max_depth = ((shape.mean_depth * 2.0).round() as usize).max(2);
    // File depths: triangular-ish around the mean (sum of two uniforms), 1..=max_depth.
    let depths: Vec<usize> = (0..shape.files)
        .map(|_| {
            let u = (rng.unit() + rng.unit()) / 2.0;
            ((u * 2.0 * shape.mean_depth).round() as usize).clamp(1, max_depth)
        })
        .collect();
    // Directories per level 1..max_depth-1, weighted by the files deeper than the level.
    let levels = max_depth - 1;
    let weight: Vec<f64> = (1..=levels)
        .map(|l| depths.iter().filter(|d| **d > l).count() as f64)
        .collect();
    let total_w: f64 = weight.iter().sum::<f64>().max(1.0);
    let mut per_level: Vec<u64> = weight
        .iter()
        .map(|w| ((w / total_w) * shape.dirs as f64).floor() as u64)
        .collect();
    for (l, n) in per_level.iter_mut().enumerate() {
        if weight[l] > 0.0 && *n == 0 {
            *n = 1;
        }
    }
    let mut by_level: Vec<Vec<PathBuf>> = vec![vec![PathBuf::new()]];
    let mut dirs = 0;
    for (l, n) in per_level.iter().enumerate() {
        let mut here = Vec::new();
        for i in 0..*n {
            let parent = &by_level[l][rng.below(by_level[l].len())];
            let p = parent.join(format!("d{}_{i}", l + 1));
            fs::create_dir(root.join(&p))?;
            here.push(p);
            dirs += 1;
        }
        by_level.push(here);
    }
    let sizes = pareto_sizes(&mut rng, shape.files, shape.mean_size);
    let mut out = Generated {
        dirs,
        ..Default::default()
    };
    let mut depth_sum = 0usize;
    for (i, (d, size)) in depths.iter().zip(&sizes).enumerate() {
        // The deepest level that has directories, if the wanted one has none.
        let mut l = d - 1;
        while by_level.get(l).is_none_or(|v| v.is_empty()) {
            l -= 1;
        }
        let dir = &by_level[l][rng.below(by_level[l].len())];
        let rel = dir.join(format!("f{i}.dat"));
        write_file(&root.join(&rel), *size, seed ^ i as u64)?;
        depth_sum += l + 1;
        out.bytes += size;
        out.files += 1;
        out.file_paths.push(rel);
    }
    out.mean_depth = depth_sum as f64 / out.files.max(1) as f64;
    Ok(out)
}

/// The grid tree for one (depth, width) point: every directory on the path to the target
/// holds `width` entries (the next directory or the target file, plus empty directories
/// at the inner levels / small files at the last level). Returns the target's path.
pub fn grid_tree(root: &Path, depth: usize, width: usize, target_size: u64) -> Result<PathBuf> {
    fs::create_dir_all(root)?;
    let mut rel = PathBuf::new();
    for level in 1..=depth {
        let last = level == depth;
        for i in 1..width {
            let p = root.join(&rel).join(format!("e{i}"));
            if last {
                fs::write(&p, b"x")?;
            } else {
                fs::create_dir(&p)?;
            }
        }
        if last {
            rel.push("target.bin");
            write_file(&root.join(&rel), target_size, 7)?;
        } else {
            rel.push("next");
            fs::create_dir(root.join(&rel))?;
        }
    }
    Ok(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tree_has_the_shape_asked_for() {
        let d = tempfile::tempdir().unwrap();
        let shape = Shape {
            name: "t",
            dirs: 40,
            files: 300,
            mean_size: 2000,
            mean_depth: 5.0,
        };
        let g = generate(d.path(), &shape, 1).unwrap();
        assert_eq!(g.files, 300);
        assert!((g.dirs as i64 - 40).abs() <= 8, "{} dirs", g.dirs);
        assert!((g.bytes as i64 - 600_000).abs() < 1000, "{} bytes", g.bytes);
        assert!(
            (g.mean_depth - 5.0).abs() < 1.0,
            "mean depth {}",
            g.mean_depth
        );
        for p in &g.file_paths {
            assert!(d.path().join(p).is_file());
        }
    }

    #[test]
    fn grid_tree_has_width_entries_at_every_level() {
        let d = tempfile::tempdir().unwrap();
        let t = grid_tree(d.path(), 3, 10, 100).unwrap();
        assert_eq!(t, PathBuf::from("next/next/target.bin"));
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 10);
        assert_eq!(
            fs::read_dir(d.path().join("next/next")).unwrap().count(),
            10
        );
        assert_eq!(fs::metadata(d.path().join(&t)).unwrap().len(), 100);
    }
}
