//! Parse speed: a synthetic exposition for 1,000 GPUs x 30 metrics in the real exporter layout,
//! through this crate's parser and, in the same run, through the `prometheus-parse` crate.
//! Prints MB/s, lines/s and the ratio. Single-threaded. Run: `cargo bench --bench parse`.

// A measuring harness, not service code: failing loudly is what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[path = "synthetic.rs"]
mod synthetic;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coder_gpu_reclaimer::coder::ListedWorkspaces;
use coder_gpu_reclaimer::coder::types::Workspace;
use coder_gpu_reclaimer::gpu::Ownership;
use coder_gpu_reclaimer::gpu::expo::parse_each;
use coder_gpu_reclaimer::gpu::scrape::series_from_exposition;
use coder_gpu_reclaimer::json_split::{OnElement, Splitter};

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
    let budget = Duration::from_secs(3);
    // `cargo bench --bench parse -- listing`: the listing only.
    if std::env::args().any(|a| a == "listing") {
        return listing(budget);
    }
    let text = synthetic::exposition(0, 1000);
    let lines = text.lines().count();
    let mb = text.len() as f64 / 1e6;
    println!("input: 1,000 GPUs x 30 metrics = {lines} lines, {mb:.1} MB");

    let ours = measure(budget, || {
        let mut n = 0;
        let errors = parse_each(&text, |s| n += s.labels.len());
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

    listing(budget);
}

/// One way to read the listing; returns what it read (kept from the optimizer).
type Variant<'a> = Box<dyn FnMut() -> usize + 'a>;

/// The Coder listing of 10,000 running workspaces (the captured fixture repeated), fed in
/// 16 KiB chunks as it arrives from the network.
fn listing(budget: Duration) {
    let list: serde_json::Value = serde_json::from_str(&synthetic::fixture("workspaces_running.json")).expect("fixture json");
    let alice = list["workspaces"].as_array().and_then(|w| w.iter().find(|w| w["name"] == "alice-gpu")).cloned().expect("alice-gpu");
    let body = synthetic::listing(&alice, 10_000);
    let mb = body.len() as f64 / 1e6;
    println!("input: the listing of 10,000 running workspaces, {mb:.1} MB");
    // Hyper hands a loopback body on in chunks of up to 16 KiB or so; a workspace is 4 KB.
    let split = |on_element: &mut dyn OnElement| {
        let mut s = Splitter::new(&["workspaces"], 1 << 20);
        for chunk in body.as_bytes().chunks(16 << 10) {
            s.feed(chunk, on_element).unwrap();
        }
    };
    let mut variants: Vec<(&str, Variant<'_>)> = vec![
        (
            "split only",
            Box::new(|| {
                let mut n = 0;
                split(&mut |_: &[u8]| {
                    n += 1;
                    Ok(())
                });
                n
            }),
        ),
        ("serde_json IgnoredAny, whole", Box::new(|| serde_json::from_str::<serde::de::IgnoredAny>(&body).map(|_| 1).unwrap())),
        (
            "split + serde_json IgnoredAny",
            Box::new(|| {
                let mut n = 0;
                split(&mut |b: &[u8]| {
                    serde_json::from_slice::<serde::de::IgnoredAny>(b).map_err(|e| e.to_string())?;
                    n += 1;
                    Ok(())
                });
                n
            }),
        ),
        (
            "split + serde_json Workspace (before)",
            Box::new(|| {
                let mut n = Vec::new();
                split(&mut |b: &[u8]| {
                    n.push(serde_json::from_slice::<Workspace>(b).map_err(|e| e.to_string())?);
                    Ok(())
                });
                n.len()
            }),
        ),
        (
            "split + json_read Workspace (now)",
            Box::new(|| {
                let mut listed = ListedWorkspaces::default();
                split(&mut listed);
                listed.0.len()
            }),
        ),
    ];
    // `RECLAIMER_BENCH_ONLY=N`: variant N alone (for a profiler).
    if let Some(only) = std::env::var("RECLAIMER_BENCH_ONLY").ok().and_then(|v| v.parse::<usize>().ok()) {
        variants = variants.into_iter().skip(only).take(1).collect();
    }
    // Round robin, best of each: whatever else the machine does falls on every variant alike.
    let mut best = vec![f64::MAX; variants.len()];
    let started = Instant::now();
    while started.elapsed() < budget * 2 {
        for ((_, f), best) in variants.iter_mut().zip(best.iter_mut()) {
            let t = Instant::now();
            black_box(f());
            *best = best.min(t.elapsed().as_secs_f64());
        }
    }
    let row = |what: &str, secs: f64| println!("{what:<48} {:>8.1} MB/s {:>9.2} ms", mb / secs, secs * 1e3);
    for ((what, _), secs) in variants.iter().zip(&best) {
        row(what, *secs);
    }
    if best.len() > 4 {
        println!("listing parse speed-up: {:.1}x (target >= 3x)", best[3] / best[4]);
    }
}
