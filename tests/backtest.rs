//! `backtest` against a history whose stops are known by construction: the fake Coder holds
//! the builds (rewritten into the past, as coderd stores them), a fake Prometheus answers the GPU
//! and coderd-gauge queries from the same timeline, and a journal holds the moments of use. Each
//! connection source (journal, coderd's gauges with their repeats, none) and a sweep report
//! exactly the stops, GPU-hours and regrets the construction implies; and `run` in observe mode
//! over a live timeline names the workspaces a backtest of it names.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use mocks::prometheus::{Answer, FakePrometheus, RangeQuery};
use mocks::{FakeCoder, WorldConfig};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::common::binary;
use crate::common::service::{holds_gpu, until, world};

/// One workspace of the construction: when it really ran, when its GPU computed (grid times in
/// minutes from T0), and its name.
struct Story {
    owner: &'static str,
    name: &'static str,
    /// Intervals of real running, in minutes from T0 (`None`: to the end of time).
    runs: Vec<(i64, Option<i64>)>,
    /// Its GPU computes at grid times `t <= busy_until` (minutes from T0).
    busy_until: Option<i64>,
}

impl Story {
    fn running(&self, m: f64) -> bool {
        self.runs.iter().any(|&(a, z)| m >= a as f64 && z.is_none_or(|z| m < z as f64))
    }
}

fn minutes(t0: DateTime<Utc>, m: i64) -> DateTime<Utc> {
    t0 + chrono::Duration::minutes(m)
}

pub(crate) fn labels(uuid: &str, pod: &str) -> String {
    format!(
        r#"{{"UUID":"{uuid}","gpu":"0","modelName":"NVIDIA A10G","exported_container":"dev","exported_namespace":"coder","exported_pod":"{pod}","container":"nvidia-dcgm-exporter","namespace":"gpu-operator","pod":"nvidia-dcgm-exporter-7xk2p","job":"nvidia-dcgm-exporter","instance":"10.0.3.7:9400"}}"#
    )
}

/// The store: every GPU field of each story's pod while it really runs (busy or idle), and
/// coderd's gauges from `gauges(t)` (per (owner, workspace): connection count and rx bytes),
/// both by the metric the query names, as Prometheus selects.
type Gauges = Arc<dyn Fn(i64) -> Vec<(&'static str, &'static str, f64, f64)> + Send + Sync>;

fn store(t0: DateTime<Utc>, stories: Arc<Vec<(Story, String)>>, gauges: Gauges) -> Answer {
    Arc::new(move |q: &RangeQuery| {
        let inner = q.query.split("max_over_time(").nth(1).unwrap_or("");
        let name = inner.split(['{', '[']).next().unwrap_or("");
        let grid = |q: &RangeQuery| (q.start..=q.end).step_by(q.step as usize).collect::<Vec<i64>>();
        if name.starts_with("coderd_agentstats") {
            let count = q.query.starts_with("count(");
            let mut by: std::collections::BTreeMap<(&str, &str), Vec<String>> = Default::default();
            for t in grid(q) {
                for (owner, ws, connections, rx) in gauges(t) {
                    let v = match name {
                        "coderd_agentstats_connection_count" => connections,
                        "coderd_agentstats_rx_bytes" => rx,
                        _ => continue,
                    };
                    let key = if count { ("", "") } else { (owner, ws) };
                    by.entry(key).or_default().push(format!("[{t},\"{v}\"]"));
                }
            }
            return by
                .into_iter()
                .map(|((o, w), values)| {
                    let metric = if count { "{}".to_string() } else { format!(r#"{{"username":"{o}","workspace_name":"{w}"}}"#) };
                    let mut values = values;
                    values.dedup_by(|a, b| a.split(',').next() == b.split(',').next());
                    format!(r#"{{"metric":{metric},"values":[{}]}}"#, values.join(","))
                })
                .collect();
        }
        stories
            .iter()
            .enumerate()
            .filter_map(|(i, (story, pod))| {
                let values: Vec<String> = grid(q)
                    .into_iter()
                    .filter_map(|t| {
                        let m = (t - t0.timestamp()) as f64 / 60.0;
                        if !story.running(m) {
                            return None;
                        }
                        let busy = story.busy_until.is_some_and(|b| m <= b as f64);
                        let on = f64::from(u8::from(busy));
                        let v = match name {
                            "DCGM_FI_DEV_GPU_UTIL" => 100.0 * on,
                            "DCGM_FI_DEV_FB_USED" => 8000.0 * on,
                            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => 1.0e12 + t as f64 * (24_300.0 + 274_700.0 * on),
                            _ => return None,
                        };
                        Some(format!("[{t},\"{v}\"]"))
                    })
                    .collect();
                let uuid = format!("GPU-b{i:07x}-0000-4000-8000-000000000000");
                (!values.is_empty()).then(|| format!(r#"{{"metric":{},"values":[{}]}}"#, labels(&uuid, pod), values.join(",")))
            })
            .collect()
    })
}

fn backtest(coder: &FakeCoder, prom: &FakePrometheus, config: &std::path::Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args: Vec<String> =
        ["backtest", "--coder-url", &coder.url(), "--prometheus-url", &prom.url(), "--config", config.to_str().unwrap()]
            .map(String::from)
            .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = Command::new(binary())
        .args(&args)
        .env("CODER_SESSION_TOKEN", coder.owner_token())
        .env_remove("CODER_URL")
        .env_remove("CODER_GPU_RECLAIMER_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// (workspace name, stop minute from T0, GPU-hours given back ×60 (GPU-minutes), regret kind).
fn stops_of(
    v: &Value,
    names: &std::collections::HashMap<String, &'static str>,
    t0: DateTime<Utc>,
) -> Vec<(String, i64, i64, Option<String>)> {
    let mut out: Vec<_> = v["stops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let at: DateTime<Utc> = s["at"].as_str().unwrap().parse().unwrap();
            (
                names[s["workspace_id"].as_str().unwrap()].to_string(),
                (at - t0).num_minutes(),
                (s["gpu_hours_given_back"].as_f64().unwrap() * 60.0).round() as i64,
                s["regret"]["kind"].as_str().map(String::from),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backtest_reports_what_the_constructed_history_implies_for_each_connection_source() {
    let coder = FakeCoder::start(WorldConfig { gpus: 5, ..world(5) }).await.unwrap();
    // T0: five hours ago on the minute; the window is T0 .. T0 + 4 h.
    let now = Utc::now();
    let t0 = DateTime::from_timestamp((now.timestamp() / 60) * 60 - 5 * 3600, 0).unwrap();
    let stories = vec![
        // Idle all along, nobody connected: stopped at T0; ran to the end: 240 GPU-minutes.
        Story { owner: "alice", name: "idle", runs: vec![(-360, None)], busy_until: None },
        // Busy until T0+60, then idle; really stopped at T0+180. Stopped at T0+91 (first idle
        // sample T0+61, plus idle_after 30m): 89 GPU-minutes; bob connects at T0+121, the last minute
        // of the regret window and the next fetched chunk's first: regretted.
        Story { owner: "bob", name: "comeback", runs: vec![(-360, Some(180))], busy_until: Some(60) },
        // Idle, but alice connected until T0+180: kept while connected, stopped at T0+210 (30
        // GPU-minutes). With no connection source: stopped at T0 (240).
        Story { owner: "alice", name: "connected", runs: vec![(-360, None)], busy_until: None },
        // Idle; really stopped at T0+30 and started again by bob at T0+120. Stopped at T0 until
        // that start (30 GPU-minutes held meanwhile), then again at T0+151 (first sample of the
        // new session T0+121, plus 30m) to the end: 89.
        Story { owner: "bob", name: "restart", runs: vec![(-360, Some(30)), (120, None)], busy_until: None },
        // Busy all along: never stopped.
        Story { owner: "alice", name: "busy", runs: vec![(-360, None)], busy_until: Some(100_000) },
    ];
    let mut ids = Vec::new();
    for s in &stories {
        ids.push(coder.with(|w| w.create_workspace(s.owner, s.name, None)).unwrap());
    }
    until(&coder, "all hold a GPU", Duration::from_secs(10), |w| ids.iter().all(|id| holds_gpu(w, *id))).await;
    let mut names = std::collections::HashMap::new();
    let mut with_pods = Vec::new();
    for (s, id) in stories.into_iter().zip(&ids) {
        let user = coder.with(|w| w.user_index(s.owner).unwrap());
        let builds: Vec<(&'static str, usize, DateTime<Utc>)> = s
            .runs
            .iter()
            .flat_map(|&(a, z)| std::iter::once(("start", user, minutes(t0, a))).chain(z.map(|z| ("stop", 0, minutes(t0, z)))))
            .collect();
        coder.with(|w| w.rewrite_history(*id, &builds));
        names.insert(id.to_string(), s.name);
        with_pods.push((s, format!("coder-{id}-6d9f8b7c5-x2x9k")));
    }
    let stories = Arc::new(with_pods);
    // coderd's gauges: connected alice/connected each minute to T0+180 (rx bytes move each tick),
    // bob/comeback at T0+50 and T0+121 only (idle agents are absent); after T0+180 nobody in the
    // deployment is connected and every gauge repeats its last committed values.
    let frozen = t0.timestamp() + 180 * 60;
    let gauges: Gauges = Arc::new(move |t| {
        let m = (t.min(frozen) - t0.timestamp()) / 60;
        let mut g = vec![("alice", "connected", 1.0, 1000.0 + (m.rem_euclid(977)) as f64)];
        if t <= frozen && (m == 50 || m == 121) {
            g.push(("bob", "comeback", 1.0, 5000.0 + m as f64));
        }
        g
    });
    let prom = FakePrometheus::start(store(t0, stories.clone(), gauges)).await.unwrap();
    let dir = std::env::temp_dir().join(format!("cgr-backtest-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("policy.toml");
    std::fs::write(&config, "idle_after = \"30m\"\nmax_idle_fraction = 0.9\ngpu_templates = [\"gpu-workspace\"]\n").unwrap();
    // The journal as `run` writes it: a `used` line each time last_used_at moved.
    let journal = dir.join("history.jsonl");
    let mut lines = String::new();
    let mut used = |id: &Uuid, owner: &str, name: &str, m: i64| {
        let line = json!({"time": minutes(t0, m + 1), "change": "used", "workspace_id": id.to_string(), "owner": owner,
            "workspace": name, "template": "gpu-workspace", "last_used_at": minutes(t0, m), "build_id": "", "agent": "connected"});
        lines.push_str(&format!("{line}\n"));
    };
    for m in (-60..=180).step_by(10) {
        used(&ids[2], "alice", "connected", m);
        if m == 50 {
            used(&ids[1], "bob", "comeback", 50);
        }
        if m == 120 {
            used(&ids[1], "bob", "comeback", 121);
        }
    }
    std::fs::write(&journal, lines).unwrap();
    let until_arg = minutes(t0, 240).to_rfc3339();
    let window = ["--since", "4h", "--until", until_arg.as_str(), "--output", "json"];

    let run = |connections: &'static str, extra: Vec<&'static str>| {
        let mut args: Vec<&str> = window.to_vec();
        args.extend(["--connections", connections, "--journal", journal.to_str().unwrap()]);
        args.extend(extra);
        let (code, out, err) = backtest(&coder, &prom, &config, &args);
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("backtest: history fetched to"), "a progress line on stderr: {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        v
    };
    let ws = |s: &str, m: i64, gm: i64, r: Option<&str>| (s.to_string(), m, gm, r.map(String::from));
    let with_connections = vec![
        ws("comeback", 91, 89, Some("connection")),
        ws("connected", 210, 30, None),
        ws("idle", 0, 240, None),
        ws("restart", 0, 30, None),
        ws("restart", 151, 89, None),
    ];
    for source in ["journal", "coderd"] {
        let report = tokio::task::block_in_place(|| run(source, vec![]));
        assert_eq!(report["connections"]["name"], if source == "journal" { "journal" } else { "coderd_metrics" });
        assert_eq!(report["upper_bound"], false);
        let v = &report["variants"][0];
        assert_eq!(stops_of(v, &names, t0), with_connections, "{source}: {}", report["connections"]);
        assert_eq!((v["stop_count"].as_u64(), v["regretted"].as_u64()), (Some(5), Some(1)), "{source}");
        assert!((v["gpu_hours_given_back"].as_f64().unwrap() - 478.0 / 60.0).abs() < 1e-6, "{source}: {v}");
        assert_eq!(report["passes"], 241, "every minute of four hours, both ends");
        assert_eq!(report["workspaces"], 5);
        if source == "coderd" {
            let detail = report["connections"]["detail"].as_str().unwrap();
            assert!(
                detail.contains("60 of 274 steps repeated the last values"),
                "the repeats after T0+180 are no evidence, read from the look-back (33 steps) on: {detail}"
            );
        }
    }
    // No connection source: the GPU alone decides, connected's idle GPU is stopped at T0, and
    // a connection cannot make a stop regretted; the report says these are upper bounds.
    let report = tokio::task::block_in_place(|| run("none", vec![]));
    assert_eq!(report["upper_bound"], true);
    assert!(report["notes"][0].as_str().unwrap().contains("upper bound"), "{}", report["notes"]);
    let v = &report["variants"][0];
    assert_eq!(
        stops_of(v, &names, t0),
        vec![
            ws("comeback", 91, 89, None),
            ws("connected", 0, 240, None),
            ws("idle", 0, 240, None),
            ws("restart", 0, 30, None),
            ws("restart", 151, 89, None)
        ]
    );
    // A sweep replays each value over the same history: at 2h, comeback is stopped for real
    // before it would be (T0+181), connected is never idle long enough, restart's second session
    // is too short.
    // At 15m (a look-back shorter than a fetched chunk: no step of the chunk may be skipped),
    // every idle span ends 15 minutes sooner and comeback's owner returns too late to regret it.
    let report = tokio::task::block_in_place(|| run("journal", vec!["--sweep", "idle_after=30m,2h,15m"]));
    let variants = report["variants"].as_array().unwrap();
    let labels: Vec<&str> = variants.iter().map(|v| v["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["idle_after=30m", "idle_after=2h", "idle_after=15m"]);
    assert_eq!(stops_of(&variants[0], &names, t0), with_connections);
    assert_eq!(stops_of(&variants[1], &names, t0), vec![ws("idle", 0, 240, None), ws("restart", 0, 30, None)]);
    let at_15m = vec![
        ws("comeback", 76, 104, None),
        ws("connected", 195, 45, None),
        ws("idle", 0, 240, None),
        ws("restart", 0, 30, None),
        ws("restart", 136, 104, None),
    ];
    assert_eq!(stops_of(&variants[2], &names, t0), at_15m);
    // Alone, 15m's look-back (18 min) is shorter than a chunk (30 steps): the same stops, so
    // every step of every chunk was fetched.
    let alone = tokio::task::block_in_place(|| run("journal", vec!["--idle-after", "15m"]));
    assert_eq!(stops_of(&alone["variants"][0], &names, t0), at_15m);
    assert_eq!(variants[1]["top_workspaces"][0]["name"], "alice/idle");
    // The table and the page say the same.
    let (code, table, err) = backtest(&coder, &prom, &config, &["--since", "4h", "--until", until_arg.as_str(), "--connections", "none"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(table.contains("NO CONNECTION SOURCE") && table.contains("policy"), "{table}");
    let sweep = ["--since", "4h", "--until", until_arg.as_str(), "--connections", "journal", "--journal", journal.to_str().unwrap()];
    let mut html_args = sweep.to_vec();
    html_args.extend(["--sweep", "idle_after=30m,2h", "--output", "html"]);
    let (code, html, err) = backtest(&coder, &prom, &config, &html_args);
    assert_eq!(code, Some(0), "{err}");
    let page = dir.join("backtest.html");
    std::fs::write(&page, &html).unwrap();
    assert!(!html.contains("src=") && !html.contains("href=") && !html.contains("@import"), "self-contained: no asset is fetched");
    if let Some(chromium) = crate::common::installed_or_skip(crate::page::chromium(), "chromium") {
        let url = format!("file://{}", page.display());
        let dom = tokio::task::block_in_place(|| crate::page::browse(&chromium, &["--dump-dom"], &url));
        assert_eq!(dom.matches("class=\"given-back\"").count(), 2, "one bar per swept value: {dom}");
        assert_eq!(dom.matches("class=\"regretted\"").count(), 2);
        assert!(dom.contains("<title>idle_after=30m: 1 regretted stops</title>"), "{dom}");
        assert!(dom.contains("alice/idle") && dom.contains("gpu-workspace"), "top workspaces and templates");
        assert!(dom.contains("id=\"sources\"") && dom.contains("journal"), "the sources");
        assert!(!dom.contains("id=\"upper-bound\""), "connections seen: no upper-bound banner");
        let shot = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-artefacts/backtest.png");
        std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
        let shot_arg = format!("--screenshot={}", shot.display());
        tokio::task::block_in_place(|| crate::page::browse(&chromium, &[&shot_arg, "--window-size=1280,900"], &url));
        assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000), "a screenshot of the page");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn backtest_without_prometheus_or_with_a_bad_sweep_exits_2_naming_the_fix() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let out = Command::new(binary())
        .args(["backtest", "--coder-url", &coder.url(), "--dcgm-exporter", "http://127.0.0.1:9/metrics"])
        .env("CODER_SESSION_TOKEN", coder.owner_token())
        .env_remove("CODER_GPU_RECLAIMER_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --prometheus-url"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(binary())
        .args(["backtest", "--coder-url", &coder.url(), "--prometheus-url", "http://127.0.0.1:9", "--sweep", "currency=1h"])
        .env("CODER_SESSION_TOKEN", coder.owner_token())
        .env_remove("CODER_GPU_RECLAIMER_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration key of the policy"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `run` in observe mode over a live timeline (its journal on, its would-stops in the audit
/// log), then a backtest of the same window from the same store, Coder and that journal: both
/// name the same workspaces. The idle one is named; the busy one and the one whose owner is
/// connected (seen by the backtest only through the journal `run` wrote) are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_in_observe_mode_and_a_backtest_of_its_window_name_the_same_workspaces() {
    let coder = FakeCoder::start(WorldConfig { gpus: 3, ..world(3) }).await.unwrap();
    let stories = vec![
        Story { owner: "alice", name: "idle", runs: vec![(-60, None)], busy_until: None },
        Story { owner: "bob", name: "busy", runs: vec![(-60, None)], busy_until: Some(100_000) },
        Story { owner: "alice", name: "connected", runs: vec![(-60, None)], busy_until: None },
    ];
    let ids: Vec<Uuid> = stories.iter().map(|s| coder.with(|w| w.create_workspace(s.owner, s.name, None)).unwrap()).collect();
    until(&coder, "all hold a GPU", Duration::from_secs(10), |w| ids.iter().all(|id| holds_gpu(w, *id))).await;
    let t0 = DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap();
    let mut with_pods = Vec::new();
    for (s, id) in stories.into_iter().zip(&ids) {
        let user = coder.with(|w| w.user_index(s.owner).unwrap());
        coder.with(|w| w.rewrite_history(*id, &[("start", user, minutes(t0, -60))]));
        with_pods.push((s, format!("coder-{id}-6d9f8b7c5-x2x9k")));
    }
    coder.with(|w| {
        w.open_connection(ids[2]);
        for id in &ids[..2] {
            let i = w.ws_index(*id).unwrap();
            w.workspaces[i].last_used_at = minutes(t0, -60);
        }
    });
    let prom = FakePrometheus::start(store(t0, Arc::new(with_pods), Arc::new(|_| Vec::new()))).await.unwrap();
    let dir = std::env::temp_dir().join(format!("cgr-backtest-live-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (config, journal, audit) = (dir.join("policy.toml"), dir.join("history.jsonl"), dir.join("audit.jsonl"));
    std::fs::write(&config, "max_idle_fraction = 0.9\ngpu_templates = [\"gpu-workspace\"]\n").unwrap();
    let (prom_url, config_s, journal_s, audit_s) =
        (prom.url(), config.display().to_string(), journal.display().to_string(), audit.display().to_string());
    let timing = ["--interval", "1s", "--idle-after", "6s", "--config", config_s.as_str()];
    let mut args = vec!["--prometheus-url", prom_url.as_str(), "--history-journal", journal_s.as_str(), "--audit-log", audit_s.as_str()];
    args.extend(timing);
    let started = Utc::now();
    let mut svc = crate::common::service::Service::start_observing(&coder, &[], &coder.owner_token(), &args);
    tokio::time::sleep(Duration::from_secs(12)).await;
    svc.terminate().await;
    let ended = Utc::now();
    let named_by_run: std::collections::BTreeSet<String> = std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["event"] == "would_stop")
        .map(|l| l["workspace_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(named_by_run, [ids[0].to_string()].into(), "run names the idle one only:\n{}", svc.raw());
    // The window begins after run's first pass, where the journal begins (aligned down to the
    // step, a window starting one second earlier would begin before any journal line).
    let span = format!("{}s", (ended - started).num_seconds() - 1);
    let until_arg = ended.to_rfc3339();
    let mut bt = vec!["--since", span.as_str(), "--until", until_arg.as_str(), "--connections", "journal", "--journal", journal_s.as_str()];
    bt.extend(["--output", "json", "--interval", "1s", "--idle-after", "6s"]);
    let (code, out, err) = tokio::task::block_in_place(|| backtest(&coder, &prom, &config, &bt));
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let named_by_backtest: std::collections::BTreeSet<String> =
        report["variants"][0]["stops"].as_array().unwrap().iter().map(|s| s["workspace_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(named_by_backtest, named_by_run, "{report}");
    assert!(report["connections"]["detail"].as_str().unwrap().contains("lines from"), "{}", report["connections"]);
    std::fs::remove_dir_all(&dir).ok();
}
