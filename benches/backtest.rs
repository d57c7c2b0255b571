//! `backtest` against a real Prometheus (issue 35): N workspaces x DAYS days of dcgm-exporter
//! history at 60 s (GPU_UTIL, FB_USED, POWER_USAGE and the energy counter, with the labels a
//! scrape of dcgm-exporter stores), written with `promtool tsdb create-blocks-from openmetrics`
//! in two-hour pieces (promtool holds a piece in memory); Coder's workspace records and build
//! histories served from a child process (each workspace starts once a day at its own hour and
//! its autostop stops it 10 h later; four in five compute for their first 2 h, the rest never).
//! The backtest runs in a process of its own (`commands::backtest::report`: its report made, not written; the default policy but
//! `max_idle_fraction = 1`, no connection source but the probe for coderd's gauges) behind two counting proxies, and prints its wall time, CPU
//! time and peak RSS beside the floor: the same requests, Prometheus's and Coder's, sent again by
//! a minimal client that reads each answer and discards it.
//!
//! Run: `scripts/bench-backtest [N[xDAYS]...]` (default `1000x7 10000x7`; installs Debian's
//! prometheus when missing), or `cargo bench --bench backtest -- 1000x7` with `prometheus` and
//! `promtool` on PATH.

// A measuring harness, not service code: failing loudly is what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[path = "synthetic.rs"]
mod synthetic;

#[path = "floor.rs"]
mod floor;

use std::io::{BufRead, BufReader, BufWriter, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::routing::get;
use serde_json::{Value, json};

use coder_gpu_reclaimer::cli::{BacktestArgs, BacktestFormat, CommonArgs, ConnectionsArg};
use coder_gpu_reclaimer::config::{DEFAULT_INTERVAL, Settings};
use coder_gpu_reclaimer::gpu::SourceConfig;
use coder_gpu_reclaimer::gpu::prometheus::MAX_QUERIES_IN_FLIGHT;
use coder_gpu_reclaimer::retry::RetryPolicy;
use floor::{Killed, Seen, counting_proxy, which};

const STEP: i64 = 60;
const PIECE: i64 = 2 * 3600;
const RUNS_FOR: i64 = 10 * 3600;
const BUSY_FOR: i64 = 2 * 3600;

/// Workspace `i`'s daily start: its own hour and minute of the day.
fn offset(i: usize) -> i64 {
    (i % 24) as i64 * 3600 + (i % 60) as i64 * 60
}

/// The start times of workspace `i`'s sessions that touch `[from, to]`.
fn sessions(i: usize, from: i64, to: i64) -> impl Iterator<Item = i64> {
    let first = (from - RUNS_FOR).div_euclid(86_400);
    (first..=to.div_euclid(86_400)).map(move |d| d * 86_400 + offset(i)).filter(move |s| *s + RUNS_FOR > from && *s <= to)
}

fn busy(i: usize) -> bool {
    i % 5 != 0
}

/// One piece of the history as OpenMetrics text, `[from, to)`.
fn write_piece(path: &Path, n: usize, from: i64, to: i64) -> u64 {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).expect("piece"));
    for (family, kind) in [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
        ("DCGM_FI_DEV_FB_USED", "gauge"),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ] {
        writeln!(out, "# TYPE {family} {kind}").unwrap();
        for i in 0..n {
            let node = i / synthetic::GPUS_PER_NODE;
            let labels = format!(
                "gpu=\"{}\",UUID=\"GPU-{:08x}-1c2b-4d5e-8f90-{i:012x}\",modelName=\"NVIDIA H200\",Hostname=\"gpu-node-{node}\",exported_container=\"dev\",exported_namespace=\"coder\",exported_pod=\"coder-{}-7d9f8b6c5d-x2x9k\",instance=\"10.0.{}.{}:9400\",job=\"nvidia-dcgm-exporter\"",
                i % synthetic::GPUS_PER_NODE,
                i,
                synthetic::workspace_id(i),
                node / 250,
                node % 250
            );
            for start in sessions(i, from, to) {
                let mut t = (start.max(from) + STEP - 1) / STEP * STEP;
                while t < to.min(start + RUNS_FOR) {
                    let on = busy(i) && t < start + BUSY_FOR;
                    let watts = if on { 299.2 } else { 24.3 };
                    let value = match family {
                        "DCGM_FI_DEV_GPU_UTIL" => 100.0 * f64::from(u8::from(on)),
                        "DCGM_FI_DEV_FB_USED" => 8_000.0 * f64::from(u8::from(on)),
                        "DCGM_FI_DEV_POWER_USAGE" => watts,
                        _ => 1.0e10 + (t - start) as f64 * watts * 1000.0,
                    };
                    writeln!(out, "{family}{{{labels}}} {value} {t}").unwrap();
                    t += STEP;
                }
            }
        }
    }
    out.write_all(b"# EOF\n").unwrap();
    out.flush().unwrap();
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Child mode: Coder's records and build histories of `n` workspaces whose history ends at `end`.
async fn serve(n: usize, end: i64) {
    let list: Value = serde_json::from_str(&synthetic::fixture("workspaces_running.json")).expect("fixture");
    let alice = list["workspaces"].as_array().and_then(|w| w.iter().find(|w| w["name"] == "alice-gpu")).cloned().expect("alice");
    let state = Arc::new((alice, n, end));
    let index = |id: &str| usize::from_str_radix(id.rsplit('-').next().unwrap_or(""), 16).ok();
    let app = Router::new()
        .route(
            "/api/v2/workspaces/{id}",
            get(move |State(s): State<Arc<(Value, usize, i64)>>, UrlPath(id): UrlPath<String>| async move {
                let mut w = s.0.clone();
                let i = index(&id).filter(|i| *i < s.1).unwrap_or(0);
                w["id"] = json!(id);
                w["name"] = json!(format!("ws-{i}"));
                axum::Json(w)
            }),
        )
        .route(
            "/api/v2/workspaces/{id}/builds",
            get(
                move |State(s): State<Arc<(Value, usize, i64)>>,
                      UrlPath(id): UrlPath<String>,
                      Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let i = index(&id).unwrap_or(0);
                    let since = q.get("since").and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.timestamp());
                    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
                    let offset: usize = q.get("offset").and_then(|o| o.parse().ok()).unwrap_or(0);
                    let mut builds = Vec::new();
                    for start in sessions(i, s.2 - 40 * 86_400, s.2) {
                        builds.push(("start", start));
                        if start + RUNS_FOR <= s.2 {
                            builds.push(("stop", start + RUNS_FOR));
                        }
                    }
                    let template = &s.0["latest_build"];
                    let mut out: Vec<Value> = builds
                        .iter()
                        .enumerate()
                        .filter(|(_, (_, at))| since.is_none_or(|t| *at > t))
                        .map(|(k, (transition, at))| {
                            let at = chrono::DateTime::from_timestamp(*at, 0).unwrap().to_rfc3339();
                            let mut b = template.clone();
                            b["id"] = json!(format!("{i:08x}-b000-4000-8000-{k:012x}"));
                            b["build_number"] = json!(k + 1);
                            b["created_at"] = json!(at);
                            b["transition"] = json!(transition);
                            b["status"] = json!(if *transition == "start" { "running" } else { "stopped" });
                            b["job"]["created_at"] = json!(at);
                            b["job"]["completed_at"] = json!(at);
                            if *transition == "stop" {
                                b["resources"] = json!([]);
                            } else if let Some(agent) = b["resources"][1]["agents"][0].as_object_mut() {
                                agent.insert("first_connected_at".into(), json!(at));
                                agent.insert("last_connected_at".into(), json!(at));
                            }
                            b
                        })
                        .collect();
                    out.reverse();
                    let out: Vec<Value> = out.into_iter().skip(offset).take(if limit == 0 { usize::MAX } else { limit }).collect();
                    axum::Json(out)
                },
            ),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{}", listener.local_addr().expect("addr").port());
    std::io::stdout().flush().ok();
    axum::serve(listener, app).await.ok();
}

/// Child mode: one backtest of `days` days ending at `end`, behind counting proxies; then the
/// floor.
async fn measure(n: usize, days: i64, end: i64, coder_port: u16, prom_port: u16, prom_pid: u32) {
    let prom_cpu = || synthetic::cpu_seconds_of(&prom_pid.to_string());
    for _ in 0..600 {
        if reqwest::get(format!("http://127.0.0.1:{prom_port}/-/ready")).await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (prom_seen, coder_seen) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let prom_proxy = counting_proxy(format!("127.0.0.1:{prom_port}"), prom_seen.clone()).await;
    let coder_proxy = counting_proxy(format!("127.0.0.1:{coder_port}"), coder_seen.clone()).await;
    let gpu = SourceConfig::prometheus_at("prometheus_url", &format!("http://127.0.0.1:{prom_proxy}")).expect("url");
    let mut settings =
        Settings::local(&format!("http://127.0.0.1:{coder_proxy}"), "benchkey01-benchsecret", gpu, DEFAULT_INTERVAL).expect("settings");
    settings.request_timeout = Duration::from_secs(120);
    settings.api_retry = RetryPolicy::none();
    // Most of this fleet idles at once (every session idles after its first 2 h): the default
    // breaker would hold every stop, and the replay would measure nothing but keeps.
    settings.policy.max_idle_fraction = 1.0;
    let until = chrono::DateTime::from_timestamp(end, 0).unwrap();
    let args = BacktestArgs {
        common: CommonArgs::default(),
        since: Duration::from_secs(days as u64 * 86_400),
        until: Some(until),
        regret_window: Duration::from_secs(1800),
        sweep: None,
        journal: None,
        connections: ConnectionsArg::Auto,
        output: BacktestFormat::Json,
    };
    let before = synthetic::proc_status("VmRSS:") as f64 / 1024.0;
    // The report as the command makes it, not written: its size is the stops', not the fetch's.
    let prom_before = prom_cpu();
    let (done, wall, cpu) = floor::timed(coder_gpu_reclaimer::commands::backtest::report(settings, &args, until)).await;
    let prom_backtest = prom_cpu() - prom_before;
    let report = done.expect("backtest");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let peak = synthetic::proc_status("VmHWM:") as f64 / 1024.0;
    let report: Value = serde_json::to_value(&report).expect("report");
    let v = &report["variants"][0];
    let prom_requests: Vec<String> =
        std::mem::take(&mut *prom_seen.requests.lock().unwrap()).iter().map(|t| format!("http://127.0.0.1:{prom_proxy}{t}")).collect();
    let coder_requests: Vec<String> =
        std::mem::take(&mut *coder_seen.requests.lock().unwrap()).iter().map(|t| format!("http://127.0.0.1:{coder_proxy}{t}")).collect();
    let (received, coder_received) = (prom_seen.received.load(Ordering::Relaxed), coder_seen.received.load(Ordering::Relaxed));
    let client = floor::client();
    let gzip = [("accept-encoding", "gzip")];
    let prom_before = prom_cpu();
    let (_, floor_wall, floor_cpu) = floor::timed(async {
        floor::discard_all(&client, &prom_requests, MAX_QUERIES_IN_FLIGHT, &gzip).await;
        floor::discard_all(&client, &coder_requests, 8, &gzip).await;
    })
    .await;
    let prom_floor = prom_cpu() - prom_before;
    println!(
        "{n:>6} workspaces x {days} d | {} passes, {} stops, {:.0} GPU-h given back of {:.0} reported, verdicts {} | {} Prometheus queries ({:.1} MB), {} Coder reads ({:.1} MB) | backtest: wall {:.1} s, CPU {:.1} s, peak RSS {:.1} MiB (before {:.1}), Prometheus's CPU {:.1} s | floor: wall {:.1} s, CPU {:.1} s, Prometheus's CPU {:.1} s | wall {:.2}x the floor",
        report["passes"],
        v["stop_count"],
        v["gpu_hours_given_back"].as_f64().unwrap_or(0.0),
        report["gpu_hours_reported"].as_f64().unwrap_or(0.0),
        v["verdicts"],
        prom_requests.len(),
        received as f64 / 1e6,
        coder_requests.len(),
        coder_received as f64 / 1e6,
        wall,
        cpu,
        peak,
        before,
        prom_backtest,
        floor_wall,
        floor_cpu,
        prom_floor,
        wall / floor_wall
    );
}

fn run(exe: &Path, n: usize, days: i64, prometheus: &Path, promtool: &Path) {
    // `BENCH_KEEP_TSDB=1` keeps the written TSDB (and the end it was written for) between runs,
    // for profiling the same history again without writing it again.
    let keep = std::env::var("BENCH_KEEP_TSDB").is_ok_and(|v| v == "1");
    let dir = match keep {
        true => std::env::temp_dir().join(format!("reclaimer-backtest-bench-kept-{n}x{days}")),
        false => std::env::temp_dir().join(format!("reclaimer-backtest-bench-{}-{n}x{days}", std::process::id())),
    };
    let kept_end = std::fs::read_to_string(dir.join("end")).ok().and_then(|e| e.trim().parse::<i64>().ok()).filter(|_| keep);
    if kept_end.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::fs::create_dir_all(dir.join("data")).expect("dir");
    // History to the last full piece before now; the look-back before the window too.
    let end = kept_end.unwrap_or(chrono::Utc::now().timestamp() / PIECE * PIECE);
    let from = end - days * 86_400 - PIECE;
    let t = Instant::now();
    let (mut text, mut pieces) = (0u64, 0);
    let mut at = if kept_end.is_some() { end } else { from };
    while at < end {
        let piece = dir.join("piece.om");
        text += write_piece(&piece, n, at, at + PIECE);
        let out = Command::new(promtool).args(["tsdb", "create-blocks-from", "openmetrics"]).arg(&piece).arg(dir.join("data")).output();
        let out = out.expect("promtool");
        assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stderr));
        pieces += 1;
        at += PIECE;
    }
    let _ = std::fs::remove_file(dir.join("piece.om"));
    if keep {
        std::fs::write(dir.join("end"), end.to_string()).expect("end");
    }
    println!(
        "{n:>6} workspaces x {days} d | TSDB from {:.1} GB of OpenMetrics in {pieces} pieces, written in {:.0} s",
        text as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    let (prom, port) = floor::prometheus(prometheus, &dir, "60s", "60d");
    let mut server =
        Killed(Command::new(exe).args(["--serve", &n.to_string(), &end.to_string()]).stdout(Stdio::piped()).spawn().expect("server"));
    let mut coder_port = String::new();
    BufReader::new(server.0.stdout.take().expect("stdout")).read_line(&mut coder_port).expect("port");
    // `BENCH_PROFILER="perf record -g -o /tmp/backtest.perf --"` runs the measured process under
    // a profiler (`floor::measured`).
    let mut measured = floor::measured(exe);
    let status = measured
        .args(["--measure", &n.to_string(), &days.to_string(), &end.to_string(), coder_port.trim(), &port.to_string()])
        .arg(prom.0.id().to_string())
        .env("MALLOC_ARENA_MAX", std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "2".into()))
        .status()
        .expect("measure");
    assert!(status.success());
    drop(server);
    drop(prom);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let arg = |i: usize| args.get(i).and_then(|a| a.parse::<i64>().ok()).expect("a number");
    match args.get(1).map(String::as_str) {
        Some("--serve") => return rt.block_on(serve(arg(2) as usize, arg(3))),
        Some("--measure") => return rt.block_on(measure(arg(2) as usize, arg(3), arg(4), arg(5) as u16, arg(6) as u16, arg(7) as u32)),
        _ => {}
    }
    let (Some(prometheus), Some(promtool)) = (which("prometheus"), which("promtool")) else {
        println!("skipped: prometheus and promtool are not on PATH (scripts/bench-backtest installs Debian's package)");
        return;
    };
    let sizes: Vec<(usize, i64)> = args
        .iter()
        .skip(1)
        .filter_map(|a| {
            let (n, d) = a.split_once('x').unwrap_or((a, "7"));
            Some((n.parse().ok()?, d.parse().ok()?))
        })
        .collect();
    let sizes = if sizes.is_empty() { vec![(1_000, 7), (10_000, 7)] } else { sizes };
    let exe = std::env::current_exe().expect("exe");
    println!("backtest against a real Prometheus (60 s history and passes, policy defaults: idle_after 30m); Coder in a child process");
    for (n, days) in sizes {
        run(&exe, n, days, &prometheus, &promtool);
    }
}
