//! Parse speed: a synthetic exposition for 1,000 GPUs x 30 metrics in the real exporter layout,
//! through this crate's parser and, in the same run, through the `prometheus-parse` crate.
//! Prints MB/s, lines/s and the ratio. Single-threaded. Run: `cargo bench --bench parse`.

// A measuring harness, not service code: failing loudly is what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "synthetic.rs"]
mod synthetic;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coder_gpu_reclaimer::gpu::expo::parse_filtered;
use coder_gpu_reclaimer::gpu::{Ownership, series_from_exposition};

/// Runs `f` repeatedly for at least `budget`; returns seconds per run (best of the batches).
fn measure(budget: Duration, mut f: impl FnMut() -> usize) -> f64 {
    let mut best = f64::MAX;
    let started = Instant::now();
    while started.elapsed() < budget {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let text = synthetic::exposition(0, 1000);
    let lines = text.lines().count();
    let mb = text.len() as f64 / 1e6;
    println!("input: 1,000 GPUs x 30 metrics = {lines} lines, {mb:.1} MB");
    let budget = Duration::from_secs(3);

    let ours = measure(budget, || {
        let mut n = 0;
        let errors = parse_filtered(&text, |_| true, |s| n += s.labels.len());
        assert!(errors.is_empty());
        n
    });
    let src: Arc<str> = Arc::from("bench");
    let mapped = measure(budget, || series_from_exposition(&text, chrono::Utc::now(), &src, &Ownership::default()).0.len());
    let theirs = measure(budget, || {
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("prometheus-parse failed");
        scrape.samples.len()
    });
    let row =
        |what: &str, secs: f64| println!("{what:<48} {:>8.1} MB/s {:>12.0} lines/s {:>9.2} ms", mb / secs, lines as f64 / secs, secs * 1e3);
    row("coder-gpu-reclaimer expo::parse (all samples)", ours);
    row("coder-gpu-reclaimer readings (parse + map)", mapped);
    row("prometheus-parse 0.2 Scrape::parse", theirs);
    println!("speed-up over prometheus-parse: {:.1}x (target >= 3x; >= 150 MB/s)", theirs / ours);
}
