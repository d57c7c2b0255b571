//! One pass at fleet scale: 1,000 and 10,000 running workspaces, one GPU each (30 metrics per
//! GPU), 8 GPUs per exporter, served by a child process so only the service is measured. Each
//! pass is preceded by three samples of every exporter (15 s sampling, 60 s passes). Prints
//! requests per pass, wall time, CPU time and peak RSS over 33 passes (windows full, as in
//! steady state), then the same for the floor (benches/floor.rs: the same requests, bodies read
//! and discarded) and the ratio of the two. Run: `cargo bench --bench pass`.

// A measuring harness, not service code: failing loudly is what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[path = "synthetic.rs"]
mod synthetic;

#[path = "floor.rs"]
mod floor;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use coder_gpu_reclaimer::app::{Application, Role};
use coder_gpu_reclaimer::config::{DEFAULT_INTERVAL, Settings};
use coder_gpu_reclaimer::gpu::SourceConfig;
use coder_gpu_reclaimer::gpu::exporter::MAX_CONCURRENT_SCRAPES;
use coder_gpu_reclaimer::retry::RetryPolicy;

/// `--sample-interval 15s` with `--interval 60s`.
const SAMPLES_BETWEEN_PASSES: usize = 3;

/// Passes of the floor client, after the service's (the median is printed).
const FLOOR_PASSES: usize = 9;

/// Child mode: measure passes against the server on `port`.
async fn measure(n: usize, port: u16) {
    let base = format!("http://127.0.0.1:{port}");
    let nodes = n.div_ceil(synthetic::GPUS_PER_NODE);
    let targets: Vec<String> = (0..nodes).map(|i| format!("{base}/node/{i}/metrics")).collect();
    let gpu = SourceConfig::exporters_at(&targets).expect("targets");
    let mut settings = Settings::local(&base, "benchkey01-benchsecret", gpu, DEFAULT_INTERVAL).expect("settings");
    settings.request_timeout = Duration::from_secs(30);
    settings.api_retry = RetryPolicy::none();
    // The same build as `run` (observe mode: the actuator only reports).
    let mut app = Application::build(&settings, Role::Run).await.expect("build");
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let rss_before = synthetic::proc_status("VmRSS:");
    let mut walls = Vec::new();
    let mut requests = 0;
    let cpu0 = synthetic::cpu_seconds();
    // With 60 s passes, the default 30 m look-back and a 3 m gap margin, a window holds at most
    // 33 samples: 33 passes is the steady state's memory, not a cold start's. (The passes run
    // back to back here, so pruning never drops a sample; more passes would overfill windows.)
    const PASSES: usize = 33;
    for _ in 0..PASSES {
        let t = Instant::now();
        // With the default 15 s sampling and 60 s passes, three samples come between passes.
        for _ in 0..SAMPLES_BETWEEN_PASSES {
            app.evaluator.sample().await;
        }
        let pass = app.pass(&rx).await.expect("pass");
        walls.push(t.elapsed().as_secs_f64());
        requests = 1 + pass.eval.gpu_requests * (1 + SAMPLES_BETWEEN_PASSES);
        assert_eq!(pass.eval.len(), n);
    }
    let cpu = (synthetic::cpu_seconds() - cpu0) / PASSES as f64;
    let peak = synthetic::proc_status("VmHWM:") as f64 / 1024.0;
    let wall = floor::median(walls.clone());
    let wall_max = walls.iter().copied().fold(0.0, f64::max);

    // The floor: the same requests (the three samples, then the listing beside the pass's
    // scrape), 32 exporters in flight as the service, every body read and discarded.
    let client = floor::client();
    let scrapes: Vec<String> = (0..nodes).map(|i| format!("{base}/node/{i}/metrics")).collect();
    let listing = format!("{base}/api/v2/workspaces?q=status%3Arunning");
    let (mut floor_walls, mut floor_cpus) = (Vec::new(), Vec::new());
    for _ in 0..FLOOR_PASSES {
        let (_, w, c) = floor::timed(async {
            for _ in 0..SAMPLES_BETWEEN_PASSES {
                floor::discard_all(&client, &scrapes, MAX_CONCURRENT_SCRAPES, &[]).await;
            }
            tokio::join!(floor::discard(&client, &listing, &[]), floor::discard_all(&client, &scrapes, MAX_CONCURRENT_SCRAPES, &[]))
        })
        .await;
        floor_walls.push(w);
        floor_cpus.push(c);
    }
    // Wall times as medians for both; CPU as the mean for both (the clock ticks in 10 ms).
    let floor_cpu = floor_cpus.iter().sum::<f64>() / floor_cpus.len() as f64;
    let floor_wall = floor::median(floor_walls);
    println!(
        "{n:>6} workspaces | {requests:>5} requests/pass (1 listing + {nodes} exporters x 4 samples) | service: wall median {:>5.0} ms (max {:>5.0}), CPU {:>5.0} ms/pass, peak RSS {:>5.1} MiB (at start {:.1}) | floor: wall {:>5.0} ms, CPU {:>5.0} ms | service/floor: wall {:.2}x, CPU {:.2}x",
        wall * 1e3,
        wall_max * 1e3,
        cpu * 1e3,
        peak,
        rss_before as f64 / 1024.0,
        floor_wall * 1e3,
        floor_cpu * 1e3,
        wall / floor_wall,
        cpu / floor_cpu,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    match args.get(1).map(String::as_str) {
        Some("--serve") => return rt.block_on(synthetic::serve(args[2].parse().expect("n"))),
        Some("--measure") => return rt.block_on(measure(args[2].parse().expect("n"), args[3].parse().expect("port"))),
        _ => {}
    }
    let exe = std::env::current_exe().expect("exe");
    println!(
        "one pass (3 samples between passes, then gather, merge, decide, act, publish) in observe mode; fake servers in a child process"
    );
    for n in [1_000usize, 10_000] {
        let mut server = Command::new(&exe).args(["--serve", &n.to_string()]).stdout(Stdio::piped()).spawn().expect("server");
        let mut port = String::new();
        BufReader::new(server.stdout.take().expect("stdout")).read_line(&mut port).expect("port");
        let status = Command::new(&exe).args(["--measure", &n.to_string(), port.trim()]).status().expect("measure");
        let _ = server.kill();
        let _ = server.wait();
        assert!(status.success());
    }
}
