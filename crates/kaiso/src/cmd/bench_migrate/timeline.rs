//! Where a migration's wall time goes (`--timeline`): a [`Source`] wrapper that records
//! when each source call starts and ends, and a CPU breakdown by thread name of this
//! process and of the old server's process. Printed after each kaiso row; a diagnostic
//! for the total-time rows, not part of the table.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kaiso_store::migrate::{
    Source, SourceAcl, SourceAttr, SourceEntry, SourceFeatures, SourcePath, SourceResult,
    SourceStream,
};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    List,
    Meta,
    Read,
}

/// One source call: what, when (from the log's start) and how many bytes it read.
struct Event {
    call: Call,
    start: Duration,
    end: Duration,
    bytes: u64,
}

/// The calls of one migration, shared between the wrapper and the report.
#[derive(Clone)]
pub struct CallLog {
    origin: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl CallLog {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            events: Arc::default(),
        }
    }

    fn record<T>(&self, call: Call, f: impl FnOnce() -> (T, u64)) -> T {
        let start = self.origin.elapsed();
        let (out, bytes) = f();
        let end = self.origin.elapsed();
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Event {
                call,
                start,
                end,
                bytes,
            });
        out
    }

    /// The phases of the run that ended at `total` (from the log's start): the metadata
    /// pass (listings), the data pass (reads), calls in flight on average, the time with
    /// no call in flight, and the read rate in tenths of the data pass.
    pub fn report(&self, total: Duration) -> String {
        let ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        // (first start, last end, count, summed duration) of the calls `c`, if any.
        let span = |c: Call| {
            ev.iter().filter(|e| e.call == c).fold(None, |acc, x| {
                let (s, e, n, busy) = acc.unwrap_or((x.start, x.end, 0usize, Duration::ZERO));
                Some((
                    s.min(x.start),
                    e.max(x.end),
                    n + 1,
                    busy + (x.end - x.start),
                ))
            })
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let _ = write!(out, "timeline: total {:.0} ms", ms(total));
        for (c, name) in [
            (Call::List, "listings"),
            (Call::Meta, "stat/readlink/…"),
            (Call::Read, "reads"),
        ] {
            if let Some((s, e, n, busy)) = span(c) {
                let _ = write!(
                    out,
                    "; {name} {n} from {:.0} to {:.0} ms (in flight {:.1} on average)",
                    ms(s),
                    ms(e),
                    busy.as_secs_f64() / (e - s).as_secs_f64().max(1e-9)
                );
            }
        }
        // Time with no call in flight, after the first call.
        let mut edges: Vec<(Duration, i32)> = ev
            .iter()
            .flat_map(|e| [(e.start, 1), (e.end, -1)])
            .collect();
        edges.sort();
        let (mut depth, mut idle, mut last) = (0, Duration::ZERO, Duration::ZERO);
        for (t, d) in &edges {
            if depth == 0 && t > &last {
                idle += *t - last;
            }
            depth += d;
            last = *t;
        }
        let first = edges.first().map_or(Duration::ZERO, |e| e.0);
        let _ = write!(
            out,
            "; first call at {:.0} ms, no call in flight {:.0} ms after it, {:.0} ms after the last",
            ms(first),
            ms(idle.saturating_sub(first)),
            ms(total.saturating_sub(last))
        );
        if let Some((s, e, _, _)) = span(Call::Read) {
            let tenth = (e - s) / 10;
            let mut mib = [0f64; 10];
            for x in ev.iter().filter(|x| x.call == Call::Read) {
                let i =
                    (((x.end - s).as_secs_f64() / tenth.as_secs_f64().max(1e-9)) as usize).min(9);
                mib[i] += x.bytes as f64 / (1 << 20) as f64;
            }
            let rates: Vec<String> = mib
                .iter()
                .map(|m| format!("{:.0}", m / tenth.as_secs_f64().max(1e-9)))
                .collect();
            let _ = write!(
                out,
                "; read MiB/s by tenth of the data pass: {}",
                rates.join(" ")
            );
        }
        out
    }
}

/// CPU seconds (user + system) so far of the threads of process `pid`, summed by thread
/// name (threads that already ended are not counted: sample before they end).
pub fn thread_cpu(pid: u32) -> Vec<(String, f64)> {
    let mut by_name: Vec<(String, f64)> = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // comm is in parentheses and may hold spaces; fields follow the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let secs = stat_cpu(&stat[close..], 15);
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 += secs,
            None => by_name.push((name, secs)),
        }
    }
    by_name.sort_by(|a, b| b.1.total_cmp(&a.1));
    by_name
}

/// CPU seconds of process `pid` (`/proc` stat fields utime, stime), with those of the
/// children it has waited for (cutime, cstime) if `children`.
pub fn process_cpu(pid: u32, children: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(close) = stat.rfind(')') else {
        return 0.0;
    };
    stat_cpu(&stat[close..], if children { 17 } else { 15 })
}

/// CPU seconds of process `pid` and every live descendant (by parent pid, so also a
/// forking server's per-connection processes), with the children each has reaped
/// (cutime, cstime), and how many processes that was. A process that ends between two
/// samples moves from its own fields to its parent's reaped-children fields.
pub fn tree_cpu(pid: u32) -> (f64, usize) {
    // (pid, ppid, CPU with reaped children) of every process.
    let procs: Vec<(u32, u32, f64)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let rest = &stat[stat.rfind(')')?..];
            let ppid = rest.get(2..)?.split(' ').nth(1)?.parse().ok()?;
            Some((p, ppid, stat_cpu(rest, 17)))
        })
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(procs.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    let cpu = procs
        .iter()
        .filter(|p| tree.contains(&p.0))
        .map(|p| p.2)
        .sum();
    (cpu, tree.len())
}

/// CPU seconds so far of each thread of this process named like the bench's delay
/// proxy (`proxy-read`, `proxy-write`, `delay-proxy`), by thread id.
pub fn proxy_threads() -> Vec<(u32, f64)> {
    let is_proxy = |n: &str| n.starts_with("proxy-") || n == "delay-proxy";
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid: u32 = t.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let (open, close) = (stat.find('(')?, stat.rfind(')')?);
            is_proxy(&stat[open + 1..close]).then(|| (tid, stat_cpu(&stat[close..], 15)))
        })
        .collect()
}

/// What the proxy threads alive in `after` spent since `before` (threads new since
/// then count whole).
pub fn proxy_delta(before: &[(u32, f64)], after: &[(u32, f64)]) -> f64 {
    after
        .iter()
        .map(|(tid, a)| a - before.iter().find(|b| b.0 == *tid).map_or(0.0, |b| b.1))
        .sum()
}

/// Seconds in the clock-tick fields 14 (utime) to `last` (15 stime, 17 cstime) of a `/proc`
/// stat line, given from its last `)` (comm may hold spaces and parentheses).
fn stat_cpu(from_comm_end: &str, last: usize) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tick = if t > 0 { t as f64 } else { 100.0 };
    // Field 3 (state) is at index 0 after ") ": field n is at n - 3.
    let f: Vec<&str> = from_comm_end.get(2..).unwrap_or("").split(' ').collect();
    (11..=last - 3)
        .map(|i| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0))
        .sum::<f64>()
        / tick
}

/// CPU of a process over a run: the process's own total (every thread, also those that
/// ended during the run) and the part of it by thread name of the threads still alive.
pub struct ProcessCpu {
    pub total: f64,
    pub threads: Vec<(String, f64)>,
}

impl ProcessCpu {
    /// Samples process `pid` now.
    pub fn sample(pid: u32) -> Self {
        Self {
            total: process_cpu(pid, false),
            threads: thread_cpu(pid),
        }
    }

    /// `self` (later) against `before`, as one line: the process's total, then by thread
    /// name what the threads alive now spent, then what threads that ended spent (the
    /// process's total counts them; `/proc/PID/task` no longer lists them).
    pub fn delta_line(&self, what: &str, before: &ProcessCpu) -> String {
        let total = self.total - before.total;
        let (line, by_thread) = cpu_delta_parts(&before.threads, &self.threads);
        let ended = total - by_thread;
        let mut out = format!("{what} CPU {total:.2} s: {line}");
        if ended > 0.005 {
            out.push_str(&format!(", threads that ended {ended:.2}"));
        }
        out
    }
}

/// `after - before` per thread name, largest first, and their sum.
fn cpu_delta_parts(before: &[(String, f64)], after: &[(String, f64)]) -> (String, f64) {
    let mut d: Vec<(String, f64)> = after
        .iter()
        .map(|(n, a)| {
            let b = before.iter().find(|(m, _)| m == n).map_or(0.0, |x| x.1);
            (n.clone(), a - b)
        })
        .filter(|(_, s)| *s > 0.005)
        .collect();
    d.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = d.iter().map(|x| x.1).sum();
    let parts: Vec<String> = d.iter().map(|(n, s)| format!("{n} {s:.2}")).collect();
    (parts.join(", "), total)
}

/// The fetch barrier's syncs of one run (`origin`: the run's start), as one line: how
/// many, `syncfs` calls and time, time fetch writes were held back, and each sync as
/// `start ms (syncfs ms / held ms)`.
pub fn barrier_line(origin: Instant, syncs: &[kaiso_store::stub::BarrierSync]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let calls: u32 = syncs.iter().map(|s| s.syncfs_calls).sum();
    let syncfs: Duration = syncs.iter().map(|s| s.syncfs).sum();
    let held: Duration = syncs.iter().map(|s| s.held).sum();
    let total: Duration = syncs.iter().map(|s| s.total).sum();
    let mut out = format!(
        "fetch barrier: {} syncs, {calls} syncfs taking {:.0} ms, fetch writes held {:.0} ms, {:.0} ms in all",
        syncs.len(),
        ms(syncfs),
        ms(held),
        ms(total)
    );
    let shown: Vec<String> = syncs
        .iter()
        .filter(|s| s.syncfs_calls > 0)
        .take(40)
        .map(|s| {
            format!(
                "{:.0} ({:.0}/{:.0})",
                ms(s.started.saturating_duration_since(origin)),
                ms(s.syncfs),
                ms(s.held)
            )
        })
        .collect();
    if !shown.is_empty() {
        let _ = write!(
            out,
            "; those with syncfs at ms (syncfs ms/held ms): {}",
            shown.join(" ")
        );
    }
    out
}

/// A source whose calls are recorded in a [`CallLog`].
pub struct Timed {
    inner: Box<dyn Source>,
    log: CallLog,
}

impl Timed {
    pub fn new(inner: Box<dyn Source>, log: CallLog) -> Self {
        Self { inner, log }
    }
}

impl Source for Timed {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn features(&self) -> SourceFeatures {
        self.inner.features()
    }
    fn stat(&self, p: &SourcePath) -> SourceResult<SourceAttr> {
        self.log.record(Call::Meta, || (self.inner.stat(p), 0))
    }
    fn read_dir(&self, p: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.log.record(Call::List, || (self.inner.read_dir(p), 0))
    }
    fn read_dir_with_attr(
        &self,
        p: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        self.log
            .record(Call::List, || (self.inner.read_dir_with_attr(p), 0))
    }
    fn read_into(
        &self,
        p: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        self.log.record(Call::Read, || {
            let r = self.inner.read_into(p, offset, buf);
            let n = r.as_ref().map_or(0, |x| x.0 as u64);
            (r, n)
        })
    }
    fn read(&self, p: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.log.record(Call::Read, || {
            let r = self.inner.read(p, offset, len);
            let n = r.as_ref().map_or(0, |x| x.len() as u64);
            (r, n)
        })
    }
    fn read_with_attr(
        &self,
        p: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        self.log.record(Call::Read, || {
            let r = self.inner.read_with_attr(p, offset, len);
            let n = r.as_ref().map_or(0, |x| x.0.len() as u64);
            (r, n)
        })
    }
    fn read_link(&self, p: &SourcePath) -> SourceResult<Vec<u8>> {
        self.log.record(Call::Meta, || (self.inner.read_link(p), 0))
    }
    fn xattrs(&self, p: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.log.record(Call::Meta, || (self.inner.xattrs(p), 0))
    }
    fn acl(&self, p: &SourcePath) -> SourceResult<SourceAcl> {
        self.log.record(Call::Meta, || (self.inner.acl(p), 0))
    }
    fn streams(&self, p: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.log.record(Call::Meta, || (self.inner.streams(p), 0))
    }
    fn read_stream(
        &self,
        p: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.log.record(Call::Read, || {
            let r = self.inner.read_stream(p, stream, offset, len);
            let n = r.as_ref().map_or(0, |x| x.len() as u64);
            (r, n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_reads_utime_to_the_last_field_after_a_comm_with_parentheses() {
        let line = "42 (a) (b) S 1 2 3 4 5 6 7 8 9 10 100 200 300 400 20 0";
        let from = &line[line.rfind(')').unwrap()..];
        // SAFETY: sysconf has no preconditions.
        let tick = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
            t if t > 0 => t as f64,
            _ => 100.0,
        };
        assert!((stat_cpu(from, 15) * tick - 300.0).abs() < 1e-9);
        assert!((stat_cpu(from, 17) * tick - 1000.0).abs() < 1e-9);
        assert_eq!(stat_cpu(")", 17), 0.0);
    }
}
