//! Tiering mode: a discrete-event replay of block or file requests over tiers whose
//! devices are `kaiso_device` models, placed by a `PlacementPolicy` (or, for baselines, a
//! write-back `CachePolicy` in front of the home tier, or nothing at all).
//!
//! - Objects are regions of `region_bytes` of each trace object (1 GB segments for the
//!   002 rule, 1 MiB chunks for ch.3). Every region starts on the home (slowest) tier; a
//!   request spanning regions is split. Device offsets are the volume offsets (identity
//!   mapping, as the 002 tiering table keeps the HDD as home).
//! - Every `plan_interval` the policy gets tier states (capacity, use, and the device's
//!   iostat %util over the last interval as `busy`) and returns moves. A mover copies one
//!   region at a time in `copy_chunk` pieces: read from the source device, write to the
//!   destination, the next read issued when the previous read completes; the region's
//!   user requests wait in a pending queue until the copy is done (002 §4.3).
//! - Open loop: records arrive at their trace time divided by `speed`. Closed loop:
//!   `clients` issue transactions back to back, each IO after the previous one completes,
//!   with `think` time between transactions; throughput is the result.
//! - Write-back cache baseline (flashcache-like): `block`-sized blocks; read hits from the
//!   fast device, read misses from the home device and filled into the cache; writes go to
//!   the cache (dirty); evicting a dirty block writes it back to the home device.

use super::stats::{LatencyHistogram, LatencySummary};
use crate::rng::Rng;
use crate::trace::IoRecord;
use kaiso_device::{DeviceModel, DeviceSpec, IoOp, Iostat};
use kaiso_policy::cache::{CachePolicy, Eviction, Request};
use kaiso_policy::time::SECOND;
use kaiso_policy::{Access, Move, Nanos, ObjectId, Op, PlacementPolicy, TierId, TierState};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

/// One tier: its device model and the bytes it may hold.
#[derive(Clone, Debug)]
pub struct TierSpec {
    pub name: String,
    pub device: DeviceSpec,
    pub capacity: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
}

impl TierSpec {
    pub fn new(name: &str, device: DeviceSpec, capacity: u64) -> Self {
        TierSpec {
            name: name.to_string(),
            device,
            capacity,
            high_watermark: 0.98,
            low_watermark: 0.90,
        }
    }
}

/// Who decides placement.
pub enum Placement<'a> {
    /// Everything stays on the home tier (the "HDD only" baseline).
    HomeOnly,
    /// A tiering policy over the tiers.
    Policy(&'a mut dyn PlacementPolicy),
    /// A write-back block cache on tier 0 in front of the home tier.
    WriteBackCache {
        cache: &'a mut dyn CachePolicy,
        block: u64,
        /// For an offline cache (Belady): the next-access index of every block access, in
        /// the order the replay makes them ([`block_future`]). None: every access is "never
        /// again", which only offline policies care about.
        future: Option<&'a [u64]>,
    },
}

/// Draws one transaction's IOs at a time.
pub type TxnSource<'a> = Box<dyn FnMut(&mut Rng, Nanos) -> Vec<IoRecord> + 'a>;

/// Where requests come from.
pub enum Workload<'a> {
    /// Records at their timestamps divided by `speed`.
    Open {
        records: Box<dyn Iterator<Item = IoRecord> + 'a>,
        speed: f64,
    },
    /// `clients` closed-loop clients; `txn(rng, now)` draws one transaction's IOs.
    Closed {
        clients: u32,
        think: Nanos,
        duration: Nanos,
        seed: u64,
        txn: TxnSource<'a>,
    },
}

/// Engine parameters.
#[derive(Clone, Debug)]
pub struct TierConfig {
    pub tiers: Vec<TierSpec>,
    pub region_bytes: u64,
    pub plan_interval: Nanos,
    /// Time-series interval (and the window of the reported figures).
    pub sample_interval: Nanos,
    pub copy_chunk: u64,
    /// Bytes a single plan may move (the policy may ask for less).
    pub max_plan_bytes: u64,
    /// Stop after this much simulated time (open loop: also stops reading records).
    pub horizon: Option<Nanos>,
    /// Open loop: at most this many user requests outstanding; a record due while the
    /// limit is reached is issued when the earliest outstanding one completes (as a replay
    /// tool with a bounded queue does). None: unbounded.
    pub max_outstanding: Option<usize>,
    /// Regions that exist from the start (placed on the home tier before the first
    /// request), so a policy can move regions never accessed yet (prefetch units).
    pub initial_regions: Vec<ObjectId>,
    /// Byte size of every trace object (file workloads): objects are then laid out one
    /// after another on the devices (object `i` starts at the sum of the sizes before it)
    /// and an object's last region is only as large as what is left of it. None: block
    /// volumes, where the trace offset is the device offset.
    pub object_bytes: Option<std::sync::Arc<ObjectLayout>>,
}

/// Trace objects (files) laid out back to back on a volume.
#[derive(Clone, Debug, Default)]
pub struct ObjectLayout {
    sizes: Vec<u64>,
    starts: Vec<u64>,
}

impl ObjectLayout {
    pub fn new(sizes: Vec<u64>) -> Self {
        let mut starts = Vec::with_capacity(sizes.len());
        let mut at = 0u64;
        for &s in &sizes {
            starts.push(at);
            // Keep objects 4 KiB aligned, as a file system allocates.
            at += s.div_ceil(4096) * 4096;
        }
        ObjectLayout { sizes, starts }
    }
    /// Bytes all objects take on the device.
    pub fn total_bytes(&self) -> u64 {
        match (self.starts.last(), self.sizes.last()) {
            (Some(a), Some(s)) => a + s,
            _ => 0,
        }
    }
    pub fn size(&self, object: u64) -> Option<u64> {
        self.sizes.get(object as usize).copied()
    }
    fn start(&self, object: u64) -> u64 {
        self.starts.get(object as usize).copied().unwrap_or(0)
    }
}

impl TierConfig {
    pub fn new(tiers: Vec<TierSpec>, region_bytes: u64) -> Self {
        TierConfig {
            tiers,
            region_bytes: region_bytes.max(4096),
            plan_interval: SECOND,
            sample_interval: 60 * SECOND,
            copy_chunk: 1 << 20,
            max_plan_bytes: u64::MAX,
            horizon: None,
            // A replay tool's bounded queue (btreplay's default depth is in this range):
            // with an unbounded open loop an overloaded FIFO disk's queue grows without
            // end and a move's reads wait behind all of it, so the mover starves.
            max_outstanding: Some(32),
            initial_regions: Vec::new(),
            object_bytes: None,
        }
    }
    fn home(&self) -> TierId {
        (self.tiers.len().max(1) - 1) as TierId
    }
}

/// Per-device figures over one sample interval.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceSample {
    pub tier: String,
    pub util: f64,
    pub iops: f64,
    pub svctm_ms: f64,
    pub await_ms: f64,
}

/// One time-series point.
#[derive(Clone, Debug, Serialize)]
pub struct IntervalSample {
    pub end_s: f64,
    /// User requests completed per second in the interval.
    pub iops: f64,
    /// Transactions completed per second (closed loop).
    pub tps: f64,
    /// Share of user requests served by tier 0 in the interval.
    pub hit_ratio: f64,
    pub mean_latency_ms: f64,
    pub bytes_moved: u64,
    pub devices: Vec<DeviceSample>,
}

/// Whole-run result.
#[derive(Clone, Debug, Serialize)]
pub struct TierResult {
    pub placement: String,
    pub simulated_s: f64,
    pub requests: u64,
    pub transactions: u64,
    /// Completed user requests per simulated second.
    pub iops: f64,
    pub tps: f64,
    pub hit_ratio: f64,
    pub latency: LatencySummary,
    pub bytes_moved: u64,
    pub moves: u64,
    /// Fast-tier bytes used at the end.
    pub fast_tier_used: u64,
    pub devices: Vec<DeviceSample>,
    pub series: Vec<IntervalSample>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Open loop: the next record is due.
    Arrival,
    /// Closed loop: client is ready to issue its next IO.
    Client(u32),
    Plan,
    Sample,
    /// The mover issues the next read of its current move.
    MoveRead,
    /// The mover's write of a chunk is due (the read completed).
    MoveWrite,
    MoveDone,
}

struct ActiveMove {
    mv: Move,
    next_offset: u64,
    /// Chunks read and not yet written: (offset in region, length).
    writes: VecDeque<(u64, u64)>,
    last_write_finish: Nanos,
}

struct Token {
    arrival: Nanos,
    parts: u32,
    finish: Nanos,
    client: Option<u32>,
}

struct ClientState {
    queue: VecDeque<IoRecord>,
    txn_active: bool,
}

/// The simulation state.
struct Engine<'a, 'b> {
    cfg: &'b TierConfig,
    placement: Placement<'a>,
    devices: Vec<Box<dyn DeviceModel>>,
    iostats_plan: Vec<Iostat>,
    iostats_sample: Vec<Iostat>,
    busy: Vec<f64>,
    used: Vec<u64>,
    tier_of: HashMap<ObjectId, TierId>,
    size_of: HashMap<ObjectId, u64>,
    moving: HashMap<ObjectId, Vec<(usize, IoRecord)>>,
    queued_moves: VecDeque<Move>,
    queued_set: HashSet<ObjectId>,
    active: Option<ActiveMove>,
    dirty: HashSet<u64>,
    /// Regions written while off their home tier: demoting them needs a copy back.
    dirty_regions: HashSet<ObjectId>,
    /// Finish times of outstanding open-loop user requests (for `max_outstanding`).
    outstanding: BinaryHeap<Reverse<Nanos>>,
    evicted: Vec<Eviction>,
    /// Block accesses made so far (index into the write-back cache's `future`).
    block_seq: u64,
    events: BinaryHeap<Reverse<(Nanos, u64, Event)>>,
    seq: u64,
    tokens: Vec<Option<Token>>,
    free_tokens: Vec<usize>,
    // totals
    hist: LatencyHistogram,
    requests: u64,
    fast_parts: u64,
    parts: u64,
    txns: u64,
    bytes_moved: u64,
    moves: u64,
    // interval accumulators
    /// Completions and latency sums by sample interval of the completion time.
    done_bins: Vec<(u64, u128)>,
    /// Requests completed by the measurement end.
    done_in_horizon: u64,
    measure_end: Nanos,
    i_txns: u64,
    i_fast: u64,
    i_parts: u64,
    i_moved: u64,
    series: Vec<IntervalSample>,
    last_sample: Nanos,
    clients: Vec<ClientState>,
}

impl<'a, 'b> Engine<'a, 'b> {
    fn push(&mut self, at: Nanos, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, e)));
    }

    fn tier(&self, id: ObjectId) -> TierId {
        self.tier_of.get(&id).copied().unwrap_or(self.cfg.home())
    }

    /// Bytes of region `id`: the region size, or what is left of a smaller object.
    fn region_size(&self, id: ObjectId) -> u64 {
        let rb = self.cfg.region_bytes;
        match &self.cfg.object_bytes {
            Some(l) => {
                let start = (id & ((1 << 40) - 1)) * rb;
                l.size(id >> 40)
                    .map_or(rb, |s| s.saturating_sub(start).clamp(1, rb))
            }
            None => rb,
        }
    }

    /// Where byte `off` of trace object `object` lives on a device.
    fn device_offset(&self, object: u64, off: u64) -> u64 {
        match &self.cfg.object_bytes {
            Some(l) => l.start(object) + off,
            None => off,
        }
    }

    fn ensure_known(&mut self, id: ObjectId) {
        if !self.size_of.contains_key(&id) {
            let home = self.cfg.home();
            let size = self.region_size(id);
            self.size_of.insert(id, size);
            self.used[home as usize] += size;
            if let Placement::Policy(p) = &mut self.placement {
                p.placed(id, size, home);
            }
        }
    }

    fn new_token(&mut self, arrival: Nanos, client: Option<u32>) -> usize {
        let t = Token {
            arrival,
            parts: 0,
            finish: arrival,
            client,
        };
        match self.free_tokens.pop() {
            Some(i) => {
                self.tokens[i] = Some(t);
                i
            }
            None => {
                self.tokens.push(Some(t));
                self.tokens.len() - 1
            }
        }
    }

    /// One part of a token finished at `finish`.
    fn part_done(&mut self, tok: usize, finish: Nanos) {
        let Some(t) = self.tokens[tok].as_mut() else {
            return;
        };
        t.finish = t.finish.max(finish);
        t.parts -= 1;
        if t.parts == 0 {
            let t = self.tokens[tok].take().expect("token present");
            self.free_tokens.push(tok);
            let lat = t.finish - t.arrival;
            self.hist.record(lat);
            self.requests += 1;
            let bin = (t.finish / self.cfg.sample_interval.max(1)) as usize;
            if bin >= self.done_bins.len() {
                self.done_bins.resize(bin + 1, (0, 0));
            }
            self.done_bins[bin].0 += 1;
            self.done_bins[bin].1 += lat as u128;
            if t.finish <= self.measure_end {
                self.done_in_horizon += 1;
            }
            if let Some(c) = t.client {
                self.push(t.finish, Event::Client(c));
            } else if self.cfg.max_outstanding.is_some() {
                self.outstanding.push(Reverse(t.finish));
            }
        }
    }

    /// Issue a user record at `now`, split into region parts.
    fn issue(&mut self, now: Nanos, r: IoRecord, client: Option<u32>) {
        let tok = self.new_token(now, client);
        let rb = self.cfg.region_bytes;
        let len = r.len.max(1);
        let mut off = r.offset;
        let end = r.offset + len;
        let mut parts = Vec::new();
        while off < end {
            let region_end = (off / rb + 1) * rb;
            let piece = region_end.min(end) - off;
            parts.push(IoRecord {
                offset: off,
                len: piece,
                ..r
            });
            off += piece;
        }
        if let Some(t) = self.tokens[tok].as_mut() {
            t.parts = parts.len() as u32;
        }
        for p in parts {
            self.issue_part(now, tok, p);
        }
    }

    fn object_of(&self, r: &IoRecord) -> ObjectId {
        (r.object << 40) | (r.offset / self.cfg.region_bytes)
    }

    fn issue_part(&mut self, now: Nanos, tok: usize, r: IoRecord) {
        let op = if r.op == Op::Write {
            IoOp::Write
        } else {
            IoOp::Read
        };
        let home = self.cfg.home() as usize;
        self.parts += 1;
        self.i_parts += 1;
        match &mut self.placement {
            Placement::HomeOnly => {
                let at = self.device_offset(r.object, r.offset);
                let c = self.devices[home].service(now, at, r.len, op);
                self.part_done(tok, c.finish);
            }
            Placement::WriteBackCache { .. } => self.cache_part(now, tok, r, op),
            Placement::Policy(_) => {
                let id = self.object_of(&r);
                self.ensure_known(id);
                let rb = self.cfg.region_bytes;
                if let Placement::Policy(p) = &mut self.placement {
                    p.record(&Access {
                        at: now,
                        object: id,
                        op: r.op,
                        offset: r.offset % rb,
                        len: r.len,
                    });
                }
                if let Some(waiting) = self.moving.get_mut(&id) {
                    self.parts -= 1;
                    self.i_parts -= 1;
                    waiting.push((tok, r));
                    return;
                }
                let t = self.tier(id) as usize;
                if t == 0 {
                    self.fast_parts += 1;
                    self.i_fast += 1;
                }
                if op == IoOp::Write && t != home {
                    self.dirty_regions.insert(id);
                }
                let at = self.device_offset(r.object, r.offset);
                let c = self.devices[t].service(now, at, r.len, op);
                self.part_done(tok, c.finish);
            }
        }
    }

    fn cache_part(&mut self, now: Nanos, tok: usize, r: IoRecord, op: IoOp) {
        let object_base = self.device_offset(r.object, 0);
        let Placement::WriteBackCache {
            cache,
            block,
            future,
        } = &mut self.placement
        else {
            return;
        };
        let bs = *block;
        let home = self.devices.len() - 1;
        let first = r.offset / bs;
        let last = (r.offset + r.len - 1) / bs;
        let mut finish = now;
        let mut all_hit = true;
        // Contiguous blocks going to the same device the same way become one request, as
        // a block cache passes a missed bio to the origin whole: (device, op, start, len).
        let mut run: Option<(usize, IoOp, u64, u64)> = None;
        let mut fill: Option<(u64, u64)> = None;
        let devices = &mut self.devices;
        let mut flush = |run: Option<(usize, IoOp, u64, u64)>, finish: &mut Nanos| {
            if let Some((d, op, at, len)) = run {
                *finish = (*finish).max(devices[d].service(now, at, len, op).finish);
            }
        };
        let mut fills = Vec::new();
        for b in first..=last {
            let id = (r.object << 44) ^ b;
            let next_access = future
                .and_then(|f| f.get(self.block_seq as usize).copied())
                .unwrap_or(u64::MAX);
            self.block_seq += 1;
            let req = Request {
                time: now,
                id,
                size: bs,
                op: r.op,
                next_access,
            };
            let hit = cache.access(&req);
            cache.drain_evictions(&mut self.evicted);
            let boff = object_base + b * bs;
            let target = if op == IoOp::Write {
                if cache.contains(id) {
                    self.dirty.insert(id);
                    (0, IoOp::Write)
                } else {
                    all_hit = false;
                    (home, IoOp::Write)
                }
            } else if hit {
                (0, IoOp::Read)
            } else {
                all_hit = false;
                if cache.contains(id) {
                    // Fill: written to the cache in the background (a flash write, so it
                    // counts as bytes moved between tiers).
                    self.bytes_moved += bs;
                    self.i_moved += bs;
                    match &mut fill {
                        Some((at, len)) if *at + *len == boff => *len += bs,
                        _ => {
                            if let Some(f) = fill.take() {
                                fills.push(f);
                            }
                            fill = Some((boff, bs));
                        }
                    }
                }
                (home, IoOp::Read)
            };
            match &mut run {
                Some((d, o, at, len)) if (*d, *o) == target && *at + *len == boff => *len += bs,
                _ => {
                    flush(run.take(), &mut finish);
                    run = Some((target.0, target.1, boff, bs));
                }
            }
        }
        flush(run, &mut finish);
        fills.extend(fill);
        for (at, len) in fills {
            self.devices[0].service(now, at, len, IoOp::Write);
        }
        for e in std::mem::take(&mut self.evicted) {
            if self.dirty.remove(&e.id) {
                let boff = self.device_offset(e.id >> 44, (e.id & ((1 << 44) - 1)) * bs);
                self.devices[0].service(now, boff, bs, IoOp::Read);
                self.devices[home].service(now, boff, bs, IoOp::Write);
                self.bytes_moved += bs;
                self.i_moved += bs;
            }
        }
        if all_hit {
            self.fast_parts += 1;
            self.i_fast += 1;
        }
        self.part_done(tok, finish);
    }

    fn tier_states(&self) -> Vec<TierState> {
        self.cfg
            .tiers
            .iter()
            .enumerate()
            .map(|(i, t)| TierState {
                capacity: t.capacity,
                used: self.used[i],
                high_watermark: t.high_watermark,
                low_watermark: t.low_watermark,
                busy: self.busy[i],
            })
            .collect()
    }

    fn plan(&mut self, now: Nanos) {
        for i in 0..self.devices.len() {
            let k = self.devices[i].counters(now);
            self.busy[i] = self.iostats_plan[i].sample(now, k).util;
        }
        let states = self.tier_states();
        let Placement::Policy(p) = &mut self.placement else {
            return;
        };
        let moves = p.plan(now, &states, self.cfg.max_plan_bytes);
        for m in moves {
            if self.queued_set.insert(m.object) {
                self.queued_moves.push_back(m);
            }
        }
        self.start_move(now);
    }

    fn start_move(&mut self, now: Nanos) {
        while self.active.is_none() {
            let Some(mut m) = self.queued_moves.pop_front() else {
                return;
            };
            self.queued_set.remove(&m.object);
            self.ensure_known(m.object);
            let from = self.tier(m.object);
            let size = self.size_of[&m.object];
            let to = m.to as usize;
            // Skip moves that are stale or would overfill the destination.
            if from == m.to
                || to >= self.used.len()
                || self.used[to] + size > self.cfg.tiers[to].capacity
            {
                continue;
            }
            m.from = from;
            m.bytes = size;
            self.moving.insert(m.object, Vec::new());
            // A clean region going home needs no copy: the home copy is current.
            let clean_home = m.to == self.cfg.home() && !self.dirty_regions.contains(&m.object);
            let next_offset = if clean_home { size } else { 0 };
            self.active = Some(ActiveMove {
                mv: m,
                next_offset,
                writes: VecDeque::new(),
                last_write_finish: now,
            });
            self.push(now, Event::MoveRead);
        }
    }

    fn region_base(&self, id: ObjectId) -> u64 {
        self.device_offset(id >> 40, (id & ((1 << 40) - 1)) * self.cfg.region_bytes)
    }

    fn move_read(&mut self, now: Nanos) {
        let Some(a) = &self.active else { return };
        let (id, from, bytes, off) = (a.mv.object, a.mv.from as usize, a.mv.bytes, a.next_offset);
        if off >= bytes {
            let done = a.last_write_finish.max(now);
            self.push(done, Event::MoveDone);
            return;
        }
        let len = self.cfg.copy_chunk.min(bytes - off);
        let base = self.region_base(id);
        let c = self.devices[from].service(now, base + off, len, IoOp::Read);
        if let Some(a) = &mut self.active {
            a.next_offset += len;
            a.writes.push_back((off, len));
        }
        self.push(c.finish, Event::MoveWrite);
        self.push(c.finish, Event::MoveRead);
    }

    fn move_write(&mut self, now: Nanos) {
        let rb = self.cfg.region_bytes;
        let Some(a) = &mut self.active else { return };
        let Some((off, len)) = a.writes.pop_front() else {
            return;
        };
        let to = a.mv.to as usize;
        let id = a.mv.object;
        let base = self.device_offset(id >> 40, (id & ((1 << 40) - 1)) * rb);
        let c = self.devices[to].service(now, base + off, len, IoOp::Write);
        if let Some(a) = &mut self.active {
            a.last_write_finish = a.last_write_finish.max(c.finish);
        }
    }

    fn move_done(&mut self, now: Nanos) {
        let Some(a) = &self.active else { return };
        // The done event may have been scheduled before the last write was issued.
        if a.last_write_finish > now {
            let t = a.last_write_finish;
            self.push(t, Event::MoveDone);
            return;
        }
        let a = self.active.take().expect("active move");
        let m = a.mv;
        if m.to == self.cfg.home() {
            self.dirty_regions.remove(&m.object);
        }
        self.used[m.from as usize] -= m.bytes;
        self.used[m.to as usize] += m.bytes;
        self.tier_of.insert(m.object, m.to);
        self.bytes_moved += m.bytes;
        self.i_moved += m.bytes;
        self.moves += 1;
        if let Placement::Policy(p) = &mut self.placement {
            p.placed(m.object, m.bytes, m.to);
        }
        for (tok, r) in self.moving.remove(&m.object).unwrap_or_default() {
            // Re-issue the parts that waited; the policy already saw them.
            let op = if r.op == Op::Write {
                IoOp::Write
            } else {
                IoOp::Read
            };
            let t = m.to as usize;
            self.parts += 1;
            self.i_parts += 1;
            if t == 0 {
                self.fast_parts += 1;
                self.i_fast += 1;
            }
            let at = self.device_offset(r.object, r.offset);
            let c = self.devices[t].service(now, at, r.len, op);
            self.part_done(tok, c.finish);
        }
        self.start_move(now);
    }

    fn device_samples(&mut self, now: Nanos, per_interval: bool) -> Vec<DeviceSample> {
        (0..self.devices.len())
            .map(|i| {
                let k = self.devices[i].counters(now);
                let s = if per_interval {
                    self.iostats_sample[i].sample(now, k)
                } else {
                    Iostat::new(0, Default::default()).sample(now, k)
                };
                DeviceSample {
                    tier: self.cfg.tiers[i].name.clone(),
                    util: s.util,
                    iops: s.iops,
                    svctm_ms: s.svctm_ms,
                    await_ms: s.await_ms,
                }
            })
            .collect()
    }

    fn sample(&mut self, now: Nanos) {
        let secs = (now - self.last_sample) as f64 / 1e9;
        self.last_sample = now;
        let devices = self.device_samples(now, true);
        let bin = (now.saturating_sub(1) / self.cfg.sample_interval.max(1)) as usize;
        let (i_done, i_lat) = self.done_bins.get(bin).copied().unwrap_or((0, 0));
        let s = IntervalSample {
            end_s: now as f64 / 1e9,
            iops: if secs > 0.0 {
                i_done as f64 / secs
            } else {
                0.0
            },
            tps: if secs > 0.0 {
                self.i_txns as f64 / secs
            } else {
                0.0
            },
            hit_ratio: if self.i_parts > 0 {
                self.i_fast as f64 / self.i_parts as f64
            } else {
                0.0
            },
            mean_latency_ms: if i_done > 0 {
                i_lat as f64 / i_done as f64 / 1e6
            } else {
                0.0
            },
            bytes_moved: self.i_moved,
            devices,
        };
        self.series.push(s);
        self.i_txns = 0;
        self.i_fast = 0;
        self.i_parts = 0;
        self.i_moved = 0;
    }
}

/// The next-access index of every block access a write-back cache replay of `records`
/// makes (requests split at `region_bytes` boundaries, then into `block`-sized blocks, in
/// record order), for an offline policy (Belady). Valid for open-loop replays, whose
/// access order does not depend on the policy; a closed loop's does.
pub fn block_future(records: &[IoRecord], region_bytes: u64, block: u64) -> Vec<u64> {
    let rb = region_bytes.max(4096);
    let bs = block.max(1);
    let mut ids = Vec::new();
    for r in records {
        let len = r.len.max(1);
        let mut off = r.offset;
        let end = r.offset + len;
        while off < end {
            let piece = ((off / rb + 1) * rb).min(end) - off;
            for b in off / bs..=(off + piece - 1) / bs {
                ids.push((r.object << 44) ^ b);
            }
            off += piece;
        }
    }
    let mut next = vec![u64::MAX; ids.len()];
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for (i, id) in ids.iter().enumerate().rev() {
        if let Some(j) = seen.insert(*id, i as u64) {
            next[i] = j;
        }
    }
    next
}

/// Run one replay. `on_sample` sees every time-series point as it closes (for feedback to
/// policies that need application figures, e.g. the ch.3 rate controller's TPS).
pub fn run_tiering(
    cfg: &TierConfig,
    placement: Placement<'_>,
    workload: Workload<'_>,
    mut on_sample: impl FnMut(&IntervalSample),
) -> TierResult {
    let n = cfg.tiers.len();
    let mut devices: Vec<Box<dyn DeviceModel>> =
        cfg.tiers.iter().map(|t| t.device.build()).collect();
    let iostats: Vec<Iostat> = devices
        .iter_mut()
        .map(|d| Iostat::new(0, d.counters(0)))
        .collect();
    let placement_name = match &placement {
        Placement::HomeOnly => format!(
            "{}-only",
            cfg.tiers.last().map_or("home", |t| t.name.as_str())
        ),
        Placement::Policy(p) => p.name().to_string(),
        Placement::WriteBackCache { cache, .. } => format!("writeback-{}", cache.name()),
    };
    let mut e = Engine {
        cfg,
        placement,
        devices,
        iostats_plan: iostats.clone(),
        iostats_sample: iostats,
        busy: vec![0.0; n],
        used: vec![0; n],
        tier_of: HashMap::new(),
        size_of: HashMap::new(),
        moving: HashMap::new(),
        queued_moves: VecDeque::new(),
        queued_set: HashSet::new(),
        active: None,
        dirty: HashSet::new(),
        dirty_regions: HashSet::new(),
        outstanding: BinaryHeap::new(),
        evicted: Vec::new(),
        block_seq: 0,
        events: BinaryHeap::new(),
        seq: 0,
        tokens: Vec::new(),
        free_tokens: Vec::new(),
        hist: LatencyHistogram::default(),
        requests: 0,
        fast_parts: 0,
        parts: 0,
        txns: 0,
        bytes_moved: 0,
        moves: 0,
        done_bins: Vec::new(),
        done_in_horizon: 0,
        measure_end: cfg.horizon.unwrap_or(u64::MAX),
        i_txns: 0,
        i_fast: 0,
        i_parts: 0,
        i_moved: 0,
        series: Vec::new(),
        last_sample: 0,
        clients: Vec::new(),
    };
    if let Placement::WriteBackCache { cache, .. } = &mut e.placement {
        cache.set_eviction_log(true);
    }
    for &id in &cfg.initial_regions {
        e.ensure_known(id);
    }
    let horizon = cfg.horizon.unwrap_or(u64::MAX);
    let (mut records, speed, closed) = match workload {
        Workload::Open { records, speed } => (Some(records), speed.max(1e-9), None),
        Workload::Closed {
            clients,
            think,
            duration,
            seed,
            txn,
        } => (
            None,
            1.0,
            Some((clients, think, duration, Rng::new(seed), txn)),
        ),
    };
    let mut next_record: Option<IoRecord> = None;
    let mut end = horizon;
    if let Some(recs) = records.as_mut() {
        next_record = recs.next().map(|mut r| {
            r.time = (r.time as f64 / speed) as u64;
            r
        });
        if let Some(r) = next_record {
            e.push(r.time, Event::Arrival);
        }
    }
    if let Some((clients, _, duration, _, _)) = closed.as_ref() {
        end = end.min(*duration);
        e.measure_end = end;
        for c in 0..*clients {
            e.clients.push(ClientState {
                queue: VecDeque::new(),
                txn_active: false,
            });
            e.push(0, Event::Client(c));
        }
    }
    let mut closed = closed;
    if matches!(e.placement, Placement::Policy(_)) {
        e.push(cfg.plan_interval, Event::Plan);
    }
    e.push(cfg.sample_interval, Event::Sample);
    let mut last_time = 0;
    while let Some(Reverse((now, _, ev))) = e.events.pop() {
        if now > end {
            break;
        }
        last_time = now;
        match ev {
            Event::Arrival => {
                if let Some(limit) = cfg.max_outstanding {
                    while e.outstanding.peek().is_some_and(|Reverse(f)| *f <= now) {
                        e.outstanding.pop();
                    }
                    let in_moves: usize = e.moving.values().map(Vec::len).sum();
                    if e.outstanding.len() + in_moves >= limit.max(1) {
                        // Wait for the earliest completion (or a move to finish).
                        let wake = e
                            .outstanding
                            .peek()
                            .map_or(now + cfg.plan_interval, |Reverse(f)| *f);
                        e.push(wake.max(now + 1), Event::Arrival);
                        continue;
                    }
                }
                let Some(r) = next_record.take() else {
                    continue;
                };
                e.issue(now, r, None);
                if let Some(recs) = records.as_mut() {
                    next_record = recs.next().map(|mut r| {
                        r.time = ((r.time as f64 / speed) as u64).max(now);
                        r
                    });
                }
                match next_record {
                    Some(r) if r.time <= end => e.push(r.time, Event::Arrival),
                    _ => {
                        // Open loop ends when the records do (plus draining), if no horizon.
                        if horizon == u64::MAX {
                            end = now;
                        }
                    }
                }
            }
            Event::Client(c) => {
                let Some((_, think, _, rng, txn)) = closed.as_mut() else {
                    continue;
                };
                let st = &mut e.clients[c as usize];
                if let Some(io) = st.queue.pop_front() {
                    let mut io = io;
                    io.time = now;
                    e.issue(now, io, Some(c));
                } else if st.txn_active {
                    st.txn_active = false;
                    e.txns += 1;
                    e.i_txns += 1;
                    let t = now + *think;
                    e.push(t, Event::Client(c));
                } else {
                    let ios = txn(rng, now);
                    let st = &mut e.clients[c as usize];
                    st.queue.extend(ios);
                    st.txn_active = true;
                    e.push(now, Event::Client(c));
                }
            }
            Event::Plan => {
                e.plan(now);
                e.push(now + cfg.plan_interval, Event::Plan);
            }
            Event::Sample => {
                e.sample(now);
                if let Some(s) = e.series.last() {
                    on_sample(s);
                }
                e.push(now + cfg.sample_interval, Event::Sample);
            }
            Event::MoveRead => e.move_read(now),
            Event::MoveWrite => e.move_write(now),
            Event::MoveDone => e.move_done(now),
        }
    }
    let simulated = if closed.is_some() || horizon != u64::MAX {
        end.min(last_time.max(end))
    } else {
        last_time
    };
    let simulated = simulated.max(1);
    let devices = e.device_samples(simulated, false);
    let secs = simulated as f64 / 1e9;
    TierResult {
        placement: placement_name,
        simulated_s: secs,
        requests: e.requests,
        transactions: e.txns,
        iops: if horizon != u64::MAX || closed.is_some() {
            e.done_in_horizon
        } else {
            e.requests
        } as f64
            / secs,
        tps: e.txns as f64 / secs,
        hit_ratio: if e.parts > 0 {
            e.fast_parts as f64 / e.parts as f64
        } else {
            0.0
        },
        latency: e.hist.summary(),
        bytes_moved: e.bytes_moved,
        moves: e.moves,
        fast_tier_used: e.used.first().copied().unwrap_or(0),
        devices,
        series: e.series,
    }
}
