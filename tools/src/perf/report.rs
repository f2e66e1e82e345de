//! The results of a `roxe perf` run, and printing them: progress lines
//! while it runs, then the report as a human reads it (with perftest's
//! table under it), perftest's table alone (`-a`: one row per size), or
//! JSON (`--json`).

use super::args::{default_outs, Args, Op, Params, ALL_SIZES};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Progress lines start after this long, then come every second.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);

/// Latency percentiles, microseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct LatUs {
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
    /// Standard deviation (perftest's t_stdev).
    #[serde(default)]
    pub stdev: f64,
}

/// The results (what `--json` prints).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub op: Op,
    pub mode: String,
    pub size: u32,
    pub iters: u64,
    pub qps: u32,
    pub tx_depth: u32,
    pub cq_mod: u32,
    /// READs and atomics outstanding per QP.
    #[serde(default = "default_outs")]
    pub outs: u8,
    pub mtu: u32,
    pub seconds: f64,
    pub bytes: u64,
    pub gbytes_per_s: f64,
    pub gbits_per_s: f64,
    pub mmsgs_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lat_us: Option<LatUs>,
}

/// The report of a run of `p` that took `elapsed`.
pub fn report(p: &Params, elapsed: Duration, lat_us: Option<LatUs>) -> Report {
    let seconds = elapsed.as_secs_f64();
    let bytes = u64::from(p.size) * p.iters;
    let rate = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
    Report {
        op: p.op,
        mode: p.mode().into(),
        size: p.size,
        iters: p.iters,
        qps: p.qps,
        tx_depth: p.tx_depth,
        cq_mod: p.cq_mod,
        outs: p.outs,
        mtu: p.mtu,
        seconds,
        bytes,
        gbytes_per_s: rate(bytes as f64) / 1e9,
        gbits_per_s: rate(bytes as f64) * 8.0 / 1e9,
        mmsgs_per_s: rate(p.iters as f64) / 1e6,
        lat_us,
    }
}

/// `-b`: one report for both directions (bytes and operations added, over
/// the longer of the two times), as perftest sums them.
pub fn both_ways(p: &Params, a: &Report, b: &Report) -> Report {
    let both = Params {
        iters: a.iters + b.iters,
        ..*p
    };
    report(
        &both,
        Duration::from_secs_f64(a.seconds.max(b.seconds)),
        None,
    )
}

/// Statistics of `samples` in ticks, `scale` nanoseconds each (half a
/// tick's time for one-way latencies from round trips).
pub fn lat_stats(samples: &mut [u64], scale: f64) -> LatUs {
    samples.sort_unstable();
    let us = |d: u64| d as f64 * scale / 1e3;
    let n = samples.len();
    // Nearest rank: the smallest sample with at least q of them at or below.
    let pct = |q: f64| {
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        us(samples[rank - 1])
    };
    let sum: f64 = samples.iter().map(|&d| us(d)).sum();
    let mean = sum / n as f64;
    let var = samples.iter().map(|&d| (us(d) - mean).powi(2)).sum::<f64>() / n as f64;
    LatUs {
        min: us(samples[0]),
        p50: pct(0.50),
        p99: pct(0.99),
        p999: pct(0.999),
        max: us(samples[n - 1]),
        mean,
        stdev: var.sqrt(),
    }
}

/// Progress lines on stderr, every second once a run passes two seconds.
pub struct Progress {
    start: Instant,
    next: Instant,
    total: u64,
    size: u32,
    /// Latency runs: the share of a sample that is one-way latency (1 for
    /// READ, 1/2 for ping-pongs); progress then shows the mean so far.
    lat_scale: Option<f64>,
}

impl Progress {
    pub fn new(start: Instant, p: &Params, lat_scale: Option<f64>) -> Self {
        Progress {
            start,
            next: start + PROGRESS_AFTER,
            total: p.iters,
            size: p.size,
            lat_scale,
        }
    }
    pub fn tick(&mut self, done: u64) {
        let now = Instant::now();
        if now < self.next || done == 0 {
            return;
        }
        self.next = now + Duration::from_secs(1);
        let secs = (now - self.start).as_secs_f64();
        match self.lat_scale {
            Some(k) => eprintln!(
                "  {done}/{} messages, {:.2} µs mean latency",
                self.total,
                secs / done as f64 * k * 1e6
            ),
            None => eprintln!(
                "  {done}/{} messages, {:.3} GB/s, {:.4} Mmsg/s",
                self.total,
                done as f64 * f64::from(self.size) / secs / 1e9,
                done as f64 / secs / 1e6
            ),
        }
    }
}

/// One run's results: the full report, or with `-a` one row of perftest's
/// table (the header before the first size, the rule after the last).
pub fn print_run(r: &Report, args: &Args) {
    if !args.all || args.json {
        print_report(r, args.json);
        return;
    }
    let first = r.size == 1 << ALL_SIZES.start();
    let last = r.size == 1 << ALL_SIZES.end();
    if first {
        println!("{PERFTEST_RULE}");
        print_perftest_header(r);
    }
    print_perftest_row(r);
    if last {
        println!("{PERFTEST_RULE}");
    }
}

fn print_report(r: &Report, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("roxe perf: encoding the report: {e}"),
        }
        return;
    }
    println!(
        "  {:>14} {:>10} {:>10} {:>10} {:>10}",
        "bytes", "seconds", "GB/s", "Gbit/s", "Mmsg/s"
    );
    println!(
        "  {:>14} {:>10.4} {:>10.4} {:>10.3} {:>10.4}",
        r.bytes, r.seconds, r.gbytes_per_s, r.gbits_per_s, r.mmsgs_per_s
    );
    if let Some(l) = &r.lat_us {
        let what = if r.op == Op::Read {
            "READ to completion"
        } else {
            "one-way = round trip / 2"
        };
        println!("  latency, µs ({what}):");
        println!(
            "  {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "min", "p50", "p99", "p99.9", "max", "mean"
        );
        println!(
            "  {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            l.min, l.p50, l.p99, l.p999, l.max, l.mean
        );
    }
    print_perftest_table(r);
}

/// The same results in perftest's layout (`ib_write_bw`, `ib_write_lat`),
/// so a script that reads perftest's table reads roxe's. perftest's MB
/// are 2^20 bytes; roxe does not sample a peak, so "BW peak" is the
/// average.
fn print_perftest_table(r: &Report) {
    println!("{PERFTEST_RULE}");
    print_perftest_header(r);
    print_perftest_row(r);
    println!("{PERFTEST_RULE}");
}

const PERFTEST_RULE: &str =
    "---------------------------------------------------------------------------------------";

fn print_perftest_header(r: &Report) {
    if r.lat_us.is_none() {
        println!(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        );
    } else {
        println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        );
    }
}

fn print_perftest_row(r: &Report) {
    match &r.lat_us {
        None => {
            let mb = r.gbytes_per_s * 1e9 / 1_048_576.0;
            println!(
                " {:<10} {:<10}       {:.2}            {:.2}\t\t   {:.6}",
                r.size, r.iters, mb, mb, r.mmsgs_per_s
            );
        }
        Some(l) => {
            println!(
                " {:<7} {:<10}     {:.2}          {:.2}      {:.2}    \t       {:.2}       \t{:.2}  \t\t{:.2}   \t\t{:.2}  ",
                r.size, r.iters, l.min, l.max, l.p50, l.mean, l.stdev, l.p99, l.p999
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics_scale_ticks_to_microseconds() {
        // Round trips of 2,000..=11,000 ticks at 0.5 ns each, halved.
        let mut samples: Vec<u64> = (1..=10).rev().map(|k| 1000 + 1000 * k).collect();
        let l = lat_stats(&mut samples, 0.5 * 0.5);
        assert_eq!(l.min, 0.5);
        assert_eq!(l.max, 2.75);
        assert_eq!(l.p50, 1.5);
        assert!((l.mean - 1.625).abs() < 1e-9);
    }
}
