//! Passes of the real service against a real Prometheus (issue 13). Writes N GPUs x 70 minutes
//! of 15 s dcgm-exporter history (every field the source reads that the default counters file
//! exports, and SM_ACTIVE; with the labels a scrape of dcgm-exporter stores; with restarts, old
//! pods and deleted workspaces: `pods_of`) with `promtool tsdb create-blocks-from openmetrics`,
//! serves it on loopback behind a byte-counting proxy, serves the Coder listing from a child
//! process, and measures the first pass and steady-state passes
//! (one per new 60 s step): queries, bytes received, wall time, CPU time and the service's peak
//! RSS. The first pass is measured twice, each time by a new process (its peak RSS its own):
//! against the Prometheus just started ("cold first"), then against the same Prometheus once
//! warm, as a Prometheus that has been running is, followed by the steady passes.
//!
//! Run: `scripts/bench-prometheus [GPUS...]` (installs Debian's prometheus when missing), or
//! `cargo bench --bench prometheus -- 1000 10000` with `prometheus` and `promtool` on PATH.
//! While working on the source, `RECLAIMER_BENCH_DIR=/tmp/x` keeps the TSDB there and reuses it
//! (its history reaches 30 minutes past the time it was written; later, the newest steps are
//! empty and the steady passes read stale data), and `RECLAIMER_BENCH_STEADY_PASSES=0` measures
//! the first pass only; `RECLAIMER_BENCH_AHEAD_MINUTES` and `RECLAIMER_BENCH_HISTORY_MINUTES`
//! size the history written (promtool needs about 1 GB of memory per 6 minutes of it at 10,000
//! GPUs). `BENCH_PROFILER` runs each measured process (cold, steady, plan) under a profiler
//! (`floor::measured`); a wrapper script that puts `$2` (the mode) and `$$` in heaptrack's `-o`
//! keeps one file per process.

// A measuring harness, not service code: failing loudly is what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[path = "synthetic.rs"]
mod synthetic;

#[path = "floor.rs"]
mod floor;

use std::io::{BufRead, BufReader, BufWriter, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use coder_gpu_reclaimer::app::{Application, Role};
use coder_gpu_reclaimer::config::{DEFAULT_INTERVAL, Settings};
use coder_gpu_reclaimer::gpu::SourceConfig;
use coder_gpu_reclaimer::gpu::prometheus::MAX_QUERIES_IN_FLIGHT;
use coder_gpu_reclaimer::retry::RetryPolicy;
use floor::{Killed, Seen, counting_proxy, which};

const SCRAPE: i64 = 15;
const HISTORY_MINUTES: i64 = 70;
/// History written past "now", so that each steady-state step has new raw samples, as it would
/// while dcgm-exporter keeps being scraped: writing it takes about 6 minutes at 10,000 GPUs, and
/// the passes 5 more (longer for a kept TSDB, to be reused for a while).
const AHEAD_MINUTES: i64 = 15;
const KEPT_AHEAD_MINUTES: i64 = 30;
const STEADY_PASSES: usize = 4;

/// Writes the history of `n` GPUs (GPU i held by synthetic workspace i; every tenth computes)
/// as OpenMetrics text, the way Prometheus stores a scrape of dcgm-exporter.
fn write_history(path: &std::path::Path, n: usize, now: i64, ahead_minutes: i64) {
    let history = history_minutes();
    let end = now / SCRAPE * SCRAPE + ahead_minutes * 60;
    let start = end - (history + ahead_minutes) * 60;
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).expect("history file"));
    // Every field the source reads that dcgm-exporter's default counters file exports
    // (reference/dcgm/default-counters.csv), and SM_ACTIVE (commented out there, the honest
    // compute signal of FINDINGS.md): one query each.
    let families = [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
        ("DCGM_FI_PROF_SM_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
        ("DCGM_FI_DEV_FB_USED", "gauge"),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
        ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ];
    let now = end - ahead_minutes * 60;
    for (family, kind) in families {
        writeln!(out, "# TYPE {family} {kind}").unwrap();
        for g in 0..n {
            let node = g / synthetic::GPUS_PER_NODE;
            let local = g % synthetic::GPUS_PER_NODE;
            let busy = g % 10 == 0;
            let on = f64::from(u8::from(busy));
            let mut energy_mj = 1.0e10;
            for (pod, from, to) in pods_of(g, n, start, now, end) {
                let labels = format!(
                    "gpu=\"{local}\",UUID=\"GPU-{:08x}-1c2b-4d5e-8f90-{g:012x}\",device=\"nvidia{local}\",modelName=\"NVIDIA H200\",Hostname=\"gpu-node-{node}\",exported_container=\"dev\",exported_namespace=\"coder\",exported_pod=\"{pod}\",instance=\"10.0.{}.{}:9400\",job=\"nvidia-dcgm-exporter\",namespace=\"gpu-operator\",pod=\"nvidia-dcgm-exporter-{node:05x}\"",
                    g,
                    node / 250,
                    node % 250
                );
                for t in (from..=to).step_by(SCRAPE as usize) {
                    let watts = if busy { 299.2 } else { 24.3 };
                    energy_mj += watts * SCRAPE as f64 * 1000.0;
                    let value = match family {
                        "DCGM_FI_DEV_GPU_UTIL" => 100.0 * on,
                        "DCGM_FI_PROF_SM_ACTIVE" => 0.91 * on,
                        "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => on,
                        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => 0.42 * on,
                        "DCGM_FI_PROF_DRAM_ACTIVE" => 0.37 * on,
                        "DCGM_FI_DEV_FB_USED" => 8_000.0 * on,
                        "DCGM_FI_DEV_POWER_USAGE" => watts,
                        "DCGM_FI_DEV_ENC_UTIL" | "DCGM_FI_DEV_DEC_UTIL" => 0.0,
                        _ => energy_mj,
                    };
                    writeln!(out, "{family}{{{labels}}} {value} {t}").unwrap();
                }
            }
        }
    }
    out.write_all(b"# EOF\n").unwrap();
    out.flush().unwrap();
}

/// The pods that held GPU `g` over `start..=end` ("now" is `now`), each a series of its own as
/// Prometheus stores them: most GPUs one pod of the workspace listed; every tenth workspace was
/// restarted 20 minutes ago (its old pod's series end, a new pod's begin, the same GPU); every
/// twentieth GPU was held until 28 minutes ago by a workspace since deleted (not in the listing),
/// then by the listed one. All of them fall inside the first pass's window.
fn pods_of(g: usize, n: usize, start: i64, now: i64, end: i64) -> Vec<(String, i64, i64)> {
    let pod = |workspace: usize, replica: &str| format!("coder-{}-{replica}", synthetic::workspace_id(workspace));
    let current = pod(g, "7d9f8b6c5d-x2x9k");
    if g % 10 == 3 {
        let restart = now - 20 * 60;
        return vec![(pod(g, "6c8e7a5b4f-q7w3z"), start, restart - 60), (current, restart, end)];
    }
    if g % 20 == 7 {
        let handover = now - 28 * 60;
        return vec![(pod(n + g, "59b7d6c8f4-m4n8p"), start, handover - 60), (current, handover, end)];
    }
    vec![(current, start, end)]
}

/// Minutes of history written before "now" (`RECLAIMER_BENCH_HISTORY_MINUTES`, else 70).
fn history_minutes() -> i64 {
    std::env::var("RECLAIMER_BENCH_HISTORY_MINUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(HISTORY_MINUTES)
}

/// Where the floor sends its requests: the listing and the proxy the service's queries went to.
struct Floor {
    client: reqwest::Client,
    listing: String,
    proxy: String,
}

/// One pass, printed with what it cost; then the floor: the same requests (the listing, and
/// the pass's queries as the proxy saw them, 6 at a time as the service sends them, gzip as it
/// asks) read and discarded. The floor goes second, on caches the pass warmed: if anything,
/// that flatters the floor.
async fn one_pass(app: &mut Application, rx: &tokio::sync::watch::Receiver<bool>, seen: &Seen, floor: &Floor, n: usize, label: &str) {
    seen.requests.lock().unwrap().clear();
    let bytes0 = seen.received.load(Ordering::Relaxed);
    let (report, wall, cpu) = floor::timed(app.pass(rx)).await;
    let pass = report.expect("pass");
    // The proxy counts a chunk after relaying it: give the last one a moment.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let bytes = seen.received.load(Ordering::Relaxed) - bytes0;
    let mut verdicts = std::collections::BTreeMap::new();
    for d in pass.eval.decisions() {
        *verdicts
            .entry(serde_json::to_value(d.verdict).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default())
            .or_insert(0usize) += 1;
    }
    let gpu_requests = pass.eval.gpu_requests;
    // A running service drops the pass's result here (`Application::run`): the floor's client
    // reads beside what stays between passes, not beside this pass's listing and decisions.
    drop(pass);
    let queries: Vec<String> = std::mem::take(&mut *seen.requests.lock().unwrap()).iter().map(|t| format!("{}{t}", floor.proxy)).collect();
    let gzip = [("accept-encoding", "gzip")];
    let (_, floor_wall, floor_cpu) = floor::timed(async {
        tokio::join!(
            floor::discard(&floor.client, &floor.listing, &[]),
            floor::discard_all(&floor.client, &queries, MAX_QUERIES_IN_FLIGHT, &gzip)
        )
    })
    .await;
    println!(
        "{n:>6} GPUs | {label:<14} | {:>2} queries | {:>7.1} KB received | service: wall {:>5.0} ms, CPU {:>4.0} ms, peak RSS {:>5.1} MiB | floor: wall {:>5.0} ms, CPU {:>4.0} ms | wall {:.2}x the floor | {verdicts:?}",
        gpu_requests,
        bytes as f64 / 1e3,
        wall * 1e3,
        cpu * 1e3,
        synthetic::proc_status("VmHWM:") as f64 / 1024.0,
        floor_wall * 1e3,
        floor_cpu * 1e3,
        wall / floor_wall,
    );
}

fn settings(coder_port: u16, prometheus_port: u16) -> Settings {
    let gpu = SourceConfig::prometheus_at("prometheus_url", &format!("http://127.0.0.1:{prometheus_port}")).expect("url");
    let mut settings =
        Settings::local(&format!("http://127.0.0.1:{coder_port}"), "benchkey01-benchsecret", gpu, DEFAULT_INTERVAL).expect("settings");
    settings.request_timeout = Duration::from_secs(60);
    settings.api_retry = RetryPolicy::none();
    settings
}

/// Child mode: `plan` (one first pass, then the JSON document it writes, counted and dropped)
/// in a process of its own, for its peak RSS.
async fn measure_plan(n: usize, coder_port: u16, prom_port: u16) {
    /// Counts what `plan` writes, and keeps none of it.
    struct Counted(usize);
    impl std::io::Write for Counted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Counted(0);
    let (done, wall, cpu) = floor::timed(coder_gpu_reclaimer::commands::plan::run(
        settings(coder_port, prom_port),
        coder_gpu_reclaimer::cli::OutputFormat::Json,
        None,
        &mut out,
    ))
    .await;
    done.expect("plan");
    println!(
        "{n:>6} GPUs | plan (JSON)    | service: wall {:>5.0} ms, CPU {:>4.0} ms, peak RSS {:>5.1} MiB | {:.1} MB written",
        wall * 1e3,
        cpu * 1e3,
        synthetic::proc_status("VmHWM:") as f64 / 1024.0,
        out.0 as f64 / 1e6
    );
}

/// Child mode: measure passes of `n` workspaces against Coder on `coder_port` and Prometheus
/// on `prom_port`. `cold`: one first pass against the Prometheus just started, alone in this
/// process; else a first pass and steady passes, as a service runs them. Each in a process of
/// its own: the cold pass's peak RSS is its own; a steady pass's is the peak of the process so
/// far (its first pass and the floor's client included), as a running service's would be.
async fn measure(n: usize, coder_port: u16, prom_port: u16, cold: bool) {
    for _ in 0..600 {
        if reqwest::get(format!("http://127.0.0.1:{prom_port}/-/ready")).await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = Arc::new(Seen::default());
    let proxy = counting_proxy(format!("127.0.0.1:{prom_port}"), seen.clone()).await;
    let settings = settings(coder_port, proxy);
    let floor = Floor {
        client: floor::client(),
        listing: format!("http://127.0.0.1:{coder_port}/api/v2/workspaces?q=status%3Arunning"),
        proxy: format!("http://127.0.0.1:{proxy}"),
    };
    let step = settings.interval.as_secs() as i64;
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let mut app = Application::build(&settings, Role::Run).await.expect("build");
    println!(
        "{n:>6} GPUs | RSS before the first pass: {:.1} MiB (the runtime, the clients, this harness)",
        synthetic::proc_status("VmRSS:") as f64 / 1024.0
    );
    // A Prometheus just started reads the history from its disk blocks for the first time (its
    // first queries cost it about 1 s more CPU: curl, 5 whole-window queries); one that has run
    // a while has warm caches. The service's first pass is measured against both: a cold one,
    // then a new service's first pass (no state carried over) against the Prometheus it warmed.
    if cold {
        one_pass(&mut app, &rx, &seen, &floor, n, "cold first").await;
        return;
    }
    one_pass(&mut app, &rx, &seen, &floor, n, "first pass").await;
    let steady = std::env::var("RECLAIMER_BENCH_STEADY_PASSES").ok().and_then(|v| v.parse().ok()).unwrap_or(STEADY_PASSES);
    for i in 1..=steady {
        // Wait for the next step to complete, as a 60 s pass interval would.
        let now = chrono::Utc::now().timestamp();
        let next = (now / step + 1) * step + 1;
        tokio::time::sleep(Duration::from_secs((next - now) as u64)).await;
        one_pass(&mut app, &rx, &seen, &floor, n, &format!("steady pass {i}")).await;
    }
}

fn run(exe: &std::path::Path, n: usize, prometheus: &std::path::Path, promtool: &std::path::Path) {
    let kept = std::env::var_os("RECLAIMER_BENCH_DIR").filter(|d| !d.is_empty()).map(|d| PathBuf::from(d).join(n.to_string()));
    let dir = kept.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("reclaimer-prom-bench-{}-{n}", std::process::id())));
    if kept.is_none() || !dir.join("data").is_dir() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let now = chrono::Utc::now().timestamp();
        let t = Instant::now();
        let input = dir.join("history.om");
        let ahead = std::env::var("RECLAIMER_BENCH_AHEAD_MINUTES").ok().and_then(|v| v.parse().ok());
        write_history(&input, n, now, ahead.unwrap_or(if kept.is_some() { KEPT_AHEAD_MINUTES } else { AHEAD_MINUTES }));
        let size = std::fs::metadata(&input).map(|m| m.len()).unwrap_or(0);
        let out = Command::new(promtool)
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&input)
            .arg(dir.join("data"))
            .output()
            .expect("promtool");
        assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_file(&input);
        println!("{n:>6} GPUs | TSDB of {:.0} MB OpenMetrics written in {:.0} s", size as f64 / 1e6, t.elapsed().as_secs_f64());
    }
    let (_prom, port) = floor::prometheus(prometheus, &dir, "15s", "30d");
    let mut server = Killed(Command::new(exe).args(["--serve", &n.to_string()]).stdout(Stdio::piped()).spawn().expect("server"));
    let mut coder_port = String::new();
    BufReader::new(server.0.stdout.take().expect("stdout")).read_line(&mut coder_port).expect("port");
    // glibc's allocator as the container image configures it (Dockerfile): the service's own
    // allocations go to jemalloc (src/lib.rs); this is what the C runtime allocates.
    for mode in ["--cold", "--measure", "--plan"] {
        // `BENCH_PROFILER` runs each measured process under a profiler (`floor::measured`).
        let mut measured = floor::measured(exe);
        let status = measured
            .args([mode, &n.to_string(), coder_port.trim(), &port.to_string()])
            .env("MALLOC_ARENA_MAX", std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "2".into()))
            .status()
            .expect("measure");
        assert!(status.success());
    }
    drop(server);
    drop(_prom);
    if kept.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    match args.get(1).map(String::as_str) {
        Some("--serve") => return rt.block_on(synthetic::serve(args[2].parse().expect("n"))),
        Some("--plan") => {
            return rt.block_on(measure_plan(args[2].parse().expect("n"), args[3].parse().expect("port"), args[4].parse().expect("port")));
        }
        Some(mode @ ("--measure" | "--cold")) => {
            let (n, coder, prometheus) = (args[2].parse().expect("n"), args[3].parse().expect("port"), args[4].parse().expect("port"));
            return rt.block_on(measure(n, coder, prometheus, mode == "--cold"));
        }
        _ => {}
    }
    let (Some(prometheus), Some(promtool)) = (which("prometheus"), which("promtool")) else {
        println!("skipped: prometheus and promtool are not on PATH (scripts/bench-prometheus installs Debian's package)");
        return;
    };
    let sizes: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![1_000, 10_000] } else { sizes };
    let exe = std::env::current_exe().expect("exe");
    println!(
        "passes in observe mode against a real Prometheus ({} min of {SCRAPE} s history, 60 s passes); Coder in a child process; the service's allocator: jemalloc, one arena (src/lib.rs); MALLOC_ARENA_MAX={} for glibc's own",
        history_minutes(),
        std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "2 (as the image sets it)".into())
    );
    for n in sizes {
        run(&exe, n, &prometheus, &promtool);
    }
}
