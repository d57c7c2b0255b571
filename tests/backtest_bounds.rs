//! `backtest` against peers that send what no honest Coder or Prometheus would (issue 44, item 5):
//! made-up pod names that each cost a Coder read, build pages just under the object limit, gauge
//! series with names no Coder has and points off the step grid, gauges in two scrape jobs, and a
//! build in year 1; and a Prometheus that cannot answer one chunk while the chunks after it are
//! fetched ahead. Each run is the real binary; its peak RSS (VmHWM) is printed beside
//! the goal (128 MiB), and what it could not read is counted in its gaps, not listed.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use mocks::prometheus::{Answer, FakePrometheus, RangeQuery};
use mocks::{FakeCoder, WorldConfig};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::backtest::labels;
use crate::common::service::{holds_gpu, until, world};
use crate::hostile::run_measured_with;

/// Four hours ago on the minute: the window is T0 .. T0 + 3 h.
fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp((Utc::now().timestamp() / 60) * 60 - 4 * 3600, 0).unwrap()
}

/// The metric a GPU query reads (`max_over_time(<metric>{...}[...])`), else "".
fn metric_of(q: &RangeQuery) -> &str {
    q.query.split("max_over_time(").nth(1).unwrap_or("").split(['{', '[']).next().unwrap_or("")
}

/// Idle readings of one GPU of `pod` at every grid point of the query.
fn idle_series(q: &RangeQuery, i: usize, pod: &str) -> Option<String> {
    let v = match metric_of(q) {
        "DCGM_FI_DEV_GPU_UTIL" | "DCGM_FI_DEV_FB_USED" => 0.0,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => 1.0e12,
        _ => return None,
    };
    let values: Vec<String> = (q.start..=q.end).step_by(q.step as usize).map(|t| format!("[{t},\"{}\"]", v + t as f64)).collect();
    let uuid = format!("GPU-c{i:07x}-0000-4000-8000-000000000000");
    Some(format!(r#"{{"metric":{},"values":[{}]}}"#, labels(&uuid, pod), values.join(",")))
}

/// A backtest of the window against `coder_url` and `prom` with this policy: exit status,
/// the JSON report (or the output when there is none), peak RSS in KiB.
async fn backtest(coder_url: String, token: String, prom: &FakePrometheus, policy: &str, connections: &str) -> (bool, Value, String, u64) {
    let dir = std::env::temp_dir().join(format!("cgr-bounds-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("policy.toml");
    std::fs::write(&config, format!("prometheus_job = \"nvidia-dcgm-exporter\"\nidle_after = \"30m\"\nmax_idle_fraction = 0.9\n{policy}"))
        .unwrap();
    let until = (t0() + chrono::Duration::minutes(180)).to_rfc3339();
    let (prom_url, connections) = (prom.url(), connections.to_string());
    let (status, out, peak) = tokio::task::spawn_blocking(move || {
        let args = [
            "backtest",
            "--coder-url",
            coder_url.as_str(),
            "--prometheus-url",
            prom_url.as_str(),
            "--config",
            config.to_str().unwrap(),
            "--since",
            "3h",
            "--until",
            until.as_str(),
            "--output",
            "json",
            "--connections",
            connections.as_str(),
        ];
        run_measured_with(&args, &[("CODER_SESSION_TOKEN", token.as_str())])
    })
    .await
    .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let json = out.find('{').and_then(|i| serde_json::Deserializer::from_str(&out[i..]).into_iter::<Value>().next()?.ok());
    (status.success(), json.unwrap_or(Value::Null), out, peak)
}

fn gaps(report: &Value) -> Vec<String> {
    report["gpu_source"]["gaps"].as_array().map_or_else(Vec::new, |g| g.iter().filter_map(|s| s.as_str().map(String::from)).collect())
}

/// 1,000 new made-up `coder-<uuid>` pods in every chunk: each id is one Coder read (404). After
/// the first chunk (the running fleet) at most 256 new ids a chunk are read; the rest are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_pod_names_cost_a_bounded_number_of_coder_reads() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    // One real workspace beside the made-up ones.
    let ws = coder.with(|w| w.create_workspace("alice", "idle", None)).unwrap();
    until(&coder, "it holds a GPU", Duration::from_secs(5), |w| holds_gpu(w, ws)).await;
    let pod = format!("coder-{ws}-6d9f8b7c5-x2x9k");
    let answer: Answer = Arc::new(move |q: &RangeQuery| {
        let chunk = q.end / 1800;
        let made_up =
            (0..1000).filter_map(|i| idle_series(q, i + 1, &format!("coder-{chunk:08x}-0000-4000-8000-{i:012x}-6d9f8b7c5-x2x9k")));
        idle_series(q, 0, &pod).into_iter().chain(made_up).collect()
    });
    let prom = FakePrometheus::start(answer).await.unwrap();
    let (ok, report, out, peak) = backtest(coder.url(), coder.owner_token(), &prom, "", "none").await;
    assert!(ok, "{out}");
    let reads = coder.requests().iter().filter(|(m, uri)| m == "GET" && uri.contains("include_deleted=true")).count();
    let chunks = report["gpu_source"]["detail"]
        .as_str()
        .unwrap_or("")
        .split(" chunks")
        .next()
        .and_then(|s| s.rsplit('(').next()?.parse::<usize>().ok());
    let chunks = chunks.unwrap_or_else(|| panic!("chunks in {report}"));
    println!(
        "made-up pod names: {chunks} chunks, {reads} Coder reads (unbounded: {}), peak RSS {} MiB (goal: under 128)",
        chunks * 1000,
        peak / 1024
    );
    assert!(reads <= 1001 + 256 * (chunks - 1), "{reads} reads over {chunks} chunks (1,000 made up and one real in the first)");
    assert!(reads < chunks * 1000, "fewer than one per made-up id");
    let g = gaps(&report);
    assert!(g.len() <= 12, "counted, not listed: {} gap lines", g.len());
    assert!(g.iter().any(|l| l.contains("more workspaces Coder did not answer for")), "{g:?}");
    assert!(g.iter().any(|l| l.contains("workspace ids the GPU series name were not read from Coder")), "{g:?}");
    assert!(peak < 128 * 1024, "peak RSS {peak} KiB");
}

/// A workspace whose build pages are just under the object limit (100 builds of 40 agents each):
/// its history is read up to 8 MiB of pages and refused, not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_pages_under_the_object_limit_are_read_within_a_byte_budget() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};
    let id = "d0000000-0000-4000-8000-000000000001";
    let listed = crate::common::fixture_json("coder/workspaces_running.json");
    let mut record = listed["workspaces"][0].clone();
    record["id"] = json!(id);
    let build = record["latest_build"].clone();
    // An agent as the builds route sends it, its directory padded (a field this service skips).
    let agent = json!({"id": "", "name": "main", "status": "connected", "lifecycle_state": "ready",
        "operating_system": "linux", "architecture": "amd64", "directory": "x".repeat(700)});
    struct Pages {
        build: Value,
        agent: Value,
        t0: DateTime<Utc>,
    }
    impl Respond for Pages {
        fn respond(&self, req: &Request) -> ResponseTemplate {
            let offset: usize = req.url.query_pairs().find(|(k, _)| k == "offset").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
            let page: Vec<Value> = (0..100)
                .map(|i| {
                    let n = offset + i;
                    let mut b = self.build.clone();
                    b["id"] = json!(format!("e{n:07x}-0000-4000-8000-000000000000"));
                    b["created_at"] = json!((self.t0 + chrono::Duration::seconds(n as i64)).to_rfc3339());
                    let agents: Vec<Value> = (0..40)
                        .map(|k| {
                            let mut a = self.agent.clone();
                            a["id"] = json!(format!("a{n:07x}-{k:04x}-4000-8000-000000000000"));
                            a
                        })
                        .collect();
                    b["resources"] = json!([{"id": "r", "name": "dev", "type": "kubernetes_pod", "agents": agents}]);
                    b
                })
                .collect();
            ResponseTemplate::new(200).set_body_json(page)
        }
    }
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspaces/{id}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(record))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspaces/{id}/builds")))
        .respond_with(Pages { build, agent, t0: t0() })
        .mount(&server)
        .await;
    let answer: Answer = Arc::new(move |q: &RangeQuery| idle_series(q, 0, &format!("coder-{id}-6d9f8b7c5-x2x9k")).into_iter().collect());
    let prom = FakePrometheus::start(answer).await.unwrap();
    let (ok, report, out, peak) = backtest(server.uri(), "t0k3n-bounds".into(), &prom, "", "none").await;
    let pages = server.received_requests().await.unwrap().iter().filter(|r| r.url.path().ends_with("/builds")).count();
    println!("build pages under the object limit: {pages} pages read, peak RSS {} MiB (goal: under 128)", peak / 1024);
    assert!(!ok, "no workspace could be read: the run says so\n{out}");
    assert!(out.contains("its build history is larger than 8 MiB"), "{out}\n{report}");
    assert!(pages <= 4, "{pages} pages");
    assert!(peak < 128 * 1024, "peak RSS {peak} KiB");
}

/// coderd's gauges: 6,000 series whose usernames no Coder has (200 bytes) and, for the one real
/// workspace, points off the step grid; then the same gauges in a second scrape job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_are_read_from_coderds_job_for_known_workspaces_on_the_grid_only() {
    let coder = FakeCoder::start(WorldConfig { gpus: 1, ..world(1) }).await.unwrap();
    let ws = coder.with(|w| w.create_workspace("alice", "idle", None)).unwrap();
    until(&coder, "it holds a GPU", Duration::from_secs(5), |w| holds_gpu(w, ws)).await;
    let alice = coder.with(|w| w.user_index("alice").unwrap());
    let t0 = t0();
    // Its history: running since before the window (and, in the last run, since year 1).
    coder.with(|w| w.rewrite_history(ws, &[("start", alice, t0 - chrono::Duration::hours(6))]));
    let pod = format!("coder-{ws}-6d9f8b7c5-x2x9k");
    let jobs: Arc<std::sync::Mutex<Vec<&'static str>>> = Arc::new(std::sync::Mutex::new(vec!["coder"]));
    let served = jobs.clone();
    let answer: Answer = Arc::new(move |q: &RangeQuery| {
        if q.query.starts_with("count by (job)") {
            return served.lock().unwrap().iter().map(|j| format!(r#"{{"metric":{{"job":"{j}"}},"values":[[{},"1"]]}}"#, q.end)).collect();
        }
        if metric_of(q).starts_with("coderd_agentstats") {
            let long = "u".repeat(200);
            let mut out: Vec<String> = (0..6000)
                .map(|i| format!(r#"{{"metric":{{"username":"{long}{i}","workspace_name":"w{i}"}},"values":[[{},"1"]]}}"#, q.start))
                .collect();
            // The real workspace: on the grid, and 20,000 points between its steps.
            let off: Vec<String> = (0..20_000).map(|k| format!("[{}.5,\"1\"]", q.start + k % (q.end - q.start).max(1))).collect();
            out.push(format!(r#"{{"metric":{{"username":"alice","workspace_name":"idle"}},"values":[{}]}}"#, off.join(",")));
            return out;
        }
        idle_series(q, 0, &pod).into_iter().collect()
    });
    let prom = FakePrometheus::start(answer).await.unwrap();
    let (ok, report, out, peak) = backtest(coder.url(), coder.owner_token(), &prom, "", "coderd").await;
    println!("hostile coderd gauges: peak RSS {} MiB (goal: under 128)", peak / 1024);
    assert!(ok, "{out}");
    let detail = report["connections"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("of job \"coder\"") && detail.contains("up to 6000 gauge series a chunk named no workspace the history holds"),
        "{detail}"
    );
    assert!(peak < 128 * 1024, "peak RSS {peak} KiB");
    // The same gauges in two jobs: none is read as coderd's, and the gap names the fix.
    jobs.lock().unwrap().push("pushgateway");
    let (ok, report, out, _) = backtest(coder.url(), coder.owner_token(), &prom, "", "coderd").await;
    assert!(ok, "{out}");
    let g = gaps(&report);
    assert!(g.iter().any(|l| l.contains("several scrape jobs (coder, pushgateway)") && l.contains("set coderd_job")), "{g:?}");
    assert_eq!(report["connections"]["name"], "none", "{report}");
    jobs.lock().unwrap().pop();
    let (ok, report, _, _) = backtest(coder.url(), coder.owner_token(), &prom, "coderd_job = \"coder\"\n", "coderd").await;
    assert!(ok && report["connections"]["name"] == "coderd_metrics", "named, it is read: {report}");
    // Its start in year 1 (Go's zero time): a gap, not a fact.
    let zero = DateTime::parse_from_rfc3339("0001-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
    coder.with(|w| w.rewrite_history(ws, &[("start", alice, zero)]));
    let (_, report, out, _) = backtest(coder.url(), coder.owner_token(), &prom, "", "none").await;
    assert!(out.contains("was created at 0001-01-01") && out.contains("a record no Coder writes is not replayed"), "{out}\n{report}");
}

/// Prometheus cannot answer one chunk of the window (503 to every query over t0+61m..t0+90m)
/// while the chunks after it are fetched ahead of the replay: that chunk is one gap and its
/// passes see the source failed (unknown, nothing stopped on it); every chunk is asked for once,
/// and the chunks after the failure are replayed (a workspace idle from t0+100m is stopped 30
/// minutes later; one busy all along is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_prometheus_cannot_answer_is_one_gap_and_the_chunks_after_it_are_replayed() {
    let coder = FakeCoder::start(WorldConfig { gpus: 2, ..world(2) }).await.unwrap();
    let busy = coder.with(|w| w.create_workspace("alice", "busy", None)).unwrap();
    let leaves = coder.with(|w| w.create_workspace("bob", "leaves", None)).unwrap();
    until(&coder, "both hold a GPU", Duration::from_secs(5), |w| holds_gpu(w, busy) && holds_gpu(w, leaves)).await;
    let t0 = t0();
    for (ws, owner) in [(busy, "alice"), (leaves, "bob")] {
        let user = coder.with(|w| w.user_index(owner).unwrap());
        coder.with(|w| w.rewrite_history(ws, &[("start", user, t0 - chrono::Duration::hours(6))]));
    }
    let minute = |m: i64| (t0 + chrono::Duration::minutes(m)).timestamp();
    let pods = [(format!("coder-{busy}-6d9f8b7c5-x2x9k"), i64::MAX), (format!("coder-{leaves}-6d9f8b7c5-x2x9k"), minute(100))];
    let asked: Arc<std::sync::Mutex<Vec<(i64, i64)>>> = Arc::default();
    let seen = asked.clone();
    let answer: Answer = Arc::new(move |q: &RangeQuery| {
        if metric_of(q) == "DCGM_FI_DEV_GPU_UTIL" {
            seen.lock().unwrap().push((q.start, q.end));
        }
        let series = pods.iter().enumerate().filter_map(|(i, (pod, busy_until))| {
            let value = |t: i64| match metric_of(q) {
                "DCGM_FI_DEV_GPU_UTIL" => Some(if t < *busy_until { 100.0 } else { 0.0 }),
                "DCGM_FI_DEV_FB_USED" => Some(if t < *busy_until { 8000.0 } else { 0.0 }),
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => Some(1.0e12 + t as f64 * 100.0),
                _ => None,
            };
            value(q.start)?;
            let values: Vec<String> =
                (q.start..=q.end).step_by(q.step as usize).filter_map(|t| Some(format!("[{t},\"{}\"]", value(t)?))).collect();
            let uuid = format!("GPU-c{i:07x}-0000-4000-8000-000000000000");
            Some(format!(r#"{{"metric":{},"values":[{}]}}"#, labels(&uuid, pod), values.join(",")))
        });
        series.collect()
    });
    let down = minute(75);
    let prom = FakePrometheus::start_with(answer, Arc::new(move |q: &RangeQuery| q.start <= down && down <= q.end)).await.unwrap();
    let (ok, report, out, _) = backtest(coder.url(), coder.owner_token(), &prom, "", "none").await;
    assert!(ok, "{out}");
    let at = |m: i64| (t0 + chrono::Duration::minutes(m)).to_rfc3339();
    let g = gaps(&report);
    assert_eq!(g.iter().filter(|l| l.contains("query")).count(), 1, "one gap: {g:?}");
    assert!(g[0].starts_with(&format!("{} to {}: ", at(61), at(90))), "the failed chunk's steps: {g:?}");
    let stops = report["variants"][0]["stops"].as_array().cloned().unwrap_or_default();
    let stopped: Vec<(String, String)> =
        stops.iter().map(|s| (s["workspace"].as_str().unwrap_or("").to_string(), s["at"].as_str().unwrap_or("").to_string())).collect();
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0].0, "leaves", "{stopped:?}");
    let stop_at = DateTime::parse_from_rfc3339(&stopped[0].1).unwrap().timestamp();
    assert!((minute(129)..=minute(131)).contains(&stop_at), "idle from t0+100m, stopped 30 minutes later: {stopped:?}");
    assert!(report["variants"][0]["verdicts"]["unknown"].as_u64().unwrap_or(0) >= 2 * 30, "{report}");
    let asked = asked.lock().unwrap().clone();
    let mut spans = asked.clone();
    spans.sort();
    spans.dedup();
    assert_eq!(spans.len(), asked.len(), "every chunk asked for once: {asked:?}");
    assert!(asked.iter().any(|(_, end)| *end == minute(180)), "fetched to the window's end: {asked:?}");
}
