//! `plan --prometheus-url` against a real Prometheus (Debian's package; `.ci/run` installs it)
//! holding 70 minutes of 15 s dcgm-exporter history written with `promtool tsdb
//! create-blocks-from openmetrics`, as Prometheus stores a scrape with `honorLabels: false`
//! (`exported_pod`, `exported_namespace`, the exporter's own `pod`, `instance`, `job`). Each
//! workload is one that the old `query_range` reading got wrong in the unsafe direction, or one
//! of the plain cases beside them; the exporter source, fed the same scrapes, must agree.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use coder_gpu_reclaimer::coder::types::Workspace;
use coder_gpu_reclaimer::coder::{CoderClient, SessionToken};
use coder_gpu_reclaimer::config::Settings;
use coder_gpu_reclaimer::duration;
use coder_gpu_reclaimer::gpu::SourceConfig;
use coder_gpu_reclaimer::gpu::expo::parse;
use coder_gpu_reclaimer::gpu::scrape::series_from_exposition;
use coder_gpu_reclaimer::gpu::window::Windows;
use coder_gpu_reclaimer::gpu::{Collection, GpuSeries, Ownership};
use coder_gpu_reclaimer::pass::decide::{PassFacts, decide_with};
use coder_gpu_reclaimer::pass::evaluate::merge_collection;
use coder_gpu_reclaimer::pass::policy::Policy;
use coder_gpu_reclaimer::retry::RetryPolicy;
use mocks::{FakeCoder, WorldConfig};
use serde_json::Value;
use uuid::Uuid;

use crate::common::{binary, installed_or_skip};

/// Prometheus' and promtool's paths, or `None` when they are not installed (outside CI).
pub fn installed() -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| ["/usr/bin", "/usr/local/bin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.exists());
    Some((find("prometheus")?, find("promtool")?))
}

/// A Prometheus serving a TSDB in a temp folder on a loopback port; killed and removed on drop.
pub struct Prometheus {
    child: Child,
    pub url: String,
    dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

impl Prometheus {
    /// A fresh folder for a TSDB and its config (`prepare` fills `data/` before the start).
    pub fn folder() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cgr-prom-{}", Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        dir
    }

    /// Starts `prometheus` on `dir/data` with `config` (prometheus.yml) and waits until ready.
    pub async fn start(prometheus: &Path, dir: PathBuf, config: &str) -> Prometheus {
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(prometheus)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Dropping it kills and waits for the process.
        let prom = Prometheus { child, url: format!("http://127.0.0.1:{port}"), dir };
        for _ in 0..100 {
            if reqwest::get(format!("{}/-/ready", prom.url)).await.is_ok_and(|r| r.status().is_success()) {
                return prom;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("Prometheus did not become ready");
    }
}

/// Writes `openmetrics` into a fresh TSDB and serves it on a loopback port.
pub async fn prometheus_with(openmetrics: &str) -> Prometheus {
    let (prometheus, promtool) = installed().expect("prometheus and promtool");
    let dir = Prometheus::folder();
    let input = dir.join("history.om");
    std::fs::write(&input, openmetrics).unwrap();
    let out =
        Command::new(&promtool).args(["tsdb", "create-blocks-from", "openmetrics"]).arg(&input).arg(dir.join("data")).output().unwrap();
    assert!(out.status.success(), "promtool: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Prometheus::start(&prometheus, dir, "global:\n  scrape_interval: 15s\n").await
}

/// One GPU's history: `value(seconds_ago) -> Some((sm_active, fb_mib))`, `None` for no scrape.
struct History {
    pod: String,
    uuid: String,
    value: Box<dyn Fn(i64) -> Option<(f64, f64)>>,
}

/// The six fields of one scrape of one GPU, as dcgm-exporter reports them.
type Fields = [(&'static str, f64); 6];

/// One scrape of one GPU: when (unix seconds), which GPU (index into the histories), what.
struct Scrape {
    at: i64,
    gpu: usize,
    fields: Fields,
}

const HISTORY: i64 = 70 * 60;

/// Every scrape of every GPU over the 70 minutes up to `end`, 15 s apart. Compute shows in
/// every engine; the energy counter rises with the power drawn.
fn scrapes(end: i64, gpus: &[History]) -> Vec<Scrape> {
    let mut out = Vec::new();
    for (gpu, g) in gpus.iter().enumerate() {
        let mut energy_mj = 1.0e10;
        for at in (end - HISTORY..=end).step_by(15) {
            let Some((sm, fb)) = (g.value)(end - at) else { continue };
            let busy = f64::from(u8::from(sm >= 0.05));
            let watts = 24.3 + busy * 274.9;
            energy_mj += watts * 15.0 * 1000.0;
            let fields = [
                ("DCGM_FI_PROF_SM_ACTIVE", sm),
                ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", busy),
                ("DCGM_FI_DEV_GPU_UTIL", 100.0 * busy),
                ("DCGM_FI_DEV_FB_USED", fb),
                ("DCGM_FI_DEV_POWER_USAGE", watts),
                ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy_mj),
            ];
            out.push(Scrape { at, gpu, fields });
        }
    }
    out
}

/// The target labels a ServiceMonitor adds (LAYOUTS §6): with `honorLabels: false` a workload
/// label they collide with is renamed `exported_*`; with `true` the workload's stays and the
/// target's is dropped; a series without it gets the target's (Prometheus' target-label rules).
fn as_stored(text: &str, honor_labels: bool) -> StoredLines {
    const TARGET: [(&str, &str); 7] = [
        ("container", "nvidia-dcgm-exporter"),
        ("namespace", "gpu-operator"),
        ("pod", "nvidia-dcgm-exporter-7xk2p"),
        ("endpoint", "gpu-metrics"),
        ("service", "nvidia-dcgm-exporter"),
        ("job", "nvidia-dcgm-exporter"),
        ("instance", "10.0.3.7:9400"),
    ];
    let (samples, errors) = parse(text);
    assert!(errors.is_empty(), "{errors:?}");
    samples
        .into_iter()
        .map(|s| {
            let mut labels: Vec<(String, String)> = s.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            for (k, v) in TARGET {
                match labels.iter().position(|(n, _)| n == k) {
                    Some(i) if !honor_labels => {
                        labels[i].0 = format!("exported_{k}");
                        labels.push((k.to_string(), v.to_string()));
                    }
                    Some(_) => {}
                    None => labels.push((k.to_string(), v.to_string())),
                }
            }
            // Empty-valued labels are dropped at ingestion, after relabeling (prometheus/docs#548,
            // prometheus/prometheus#3706; reference dcgm NOTES §11.3): `pod_uid=""` is not stored.
            labels.retain(|(_, v)| !v.is_empty());
            let rendered = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect::<Vec<_>>().join(",");
            (s.name.to_string(), rendered, s.value)
        })
        .collect()
}

/// The exposition as a store keeps it when a relabeling drops the series without a workload
/// pod: the device-level series go (reference dcgm NOTES §11.3).
pub fn without_device_series(text: &str) -> String {
    text.lines().filter(|l| l.starts_with('#') || l.contains("pod=\"")).flat_map(|l| [l, "\n"]).collect()
}

/// Every stored sample: family -> labels -> (time, value) in time order.
pub type Stored = BTreeMap<String, BTreeMap<String, Points>>;

/// One series' samples: (time, value) in time order.
pub type Points = Vec<(i64, f64)>;

/// One scrape's samples as Prometheus stores them: (family, labels, value).
type StoredLines = Vec<(String, String, f64)>;

/// Adds one exporter's scrapes (each a time and dcgm-exporter's exposition) as Prometheus stores
/// them. A scrape that repeats the one before (the exporter serves its latest collection until the
/// next, reference dcgm NOTES §3) is stored from the same parse.
pub fn store<'a>(stored: &mut Stored, scrapes: impl IntoIterator<Item = (i64, &'a str)>, honor_labels: bool) {
    // This exporter's series in the order it writes them (the same in every scrape, as a rule).
    let mut mine: Vec<(String, String, Points)> = Vec::new();
    let mut last: Option<(&str, StoredLines)> = None;
    for (at, text) in scrapes {
        if last.as_ref().is_none_or(|(before, _)| *before != text) {
            last = Some((text, as_stored(text, honor_labels)));
        }
        for (i, (family, labels, v)) in last.iter().flat_map(|(_, lines)| lines).enumerate() {
            let same = |(f, l, _): &(String, String, Points)| f == family && l == labels;
            let at_i = mine.get(i).is_some_and(same).then_some(i).or_else(|| mine.iter().position(same));
            match at_i {
                Some(j) => mine[j].2.push((at, *v)),
                None => mine.push((family.clone(), labels.clone(), vec![(at, *v)])),
            }
        }
    }
    for (family, labels, points) in mine {
        stored.entry(family).or_default().entry(labels).or_default().extend(points);
    }
}

/// The scrapes as OpenMetrics for `promtool tsdb create-blocks-from openmetrics`: one
/// family at a time, each series' samples in time order.
pub fn openmetrics(stored: &Stored) -> String {
    let mut out = String::new();
    for (family, series) in stored {
        let _ = writeln!(out, "# TYPE {family} gauge");
        for (labels, points) in series {
            for (at, v) in points {
                let _ = writeln!(out, "{family}{{{labels}}} {v} {at}");
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// What dcgm-exporter (`--kubernetes`) serves at `at`: the same scrapes in its own text, the
/// workload's pod labels as it writes them.
fn exposition(at: i64, gpus: &[History], scrapes: &[Scrape]) -> String {
    let now: Vec<&Scrape> = scrapes.iter().filter(|s| s.at == at).collect();
    let mut out = String::new();
    for (k, (family, _)) in scrapes[0].fields.iter().enumerate() {
        let _ = writeln!(out, "# HELP {family} \n# TYPE {family} {}", if family.contains("ENERGY") { "counter" } else { "gauge" });
        for s in &now {
            let (i, g) = (s.gpu, &gpus[s.gpu]);
            let _ = writeln!(
                out,
                "{family}{{gpu=\"{i}\",UUID=\"{}\",device=\"nvidia{i}\",modelName=\"NVIDIA A10G\",Hostname=\"gpu-node-{i}\",container=\"dev\",namespace=\"coder\",pod=\"{}\"}} {}",
                g.uuid, g.pod, s.fields[k].1
            );
        }
    }
    out
}

/// What the exporter source holds after the same history: every scrape (its time, and the texts
/// of the exporters scraped then) parsed as dcgm-exporter's text and merged as a pass does
/// (`merge_collection`), one sample per pass of `interval` (`run --sample-interval 15s`), the
/// windows kept as `policy` needs them at `now`.
pub fn exporter_windows(
    now: DateTime<Utc>,
    scrapes: &[(i64, Vec<String>)],
    workspaces: &[Workspace],
    policy: &Policy,
    interval: Duration,
    ownership: &Ownership,
) -> Windows {
    let step = interval.as_secs() as i64;
    let mut windows = Windows::new(duration::chrono(policy.longest_lookback()), interval);
    let live: HashSet<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
    let source: Arc<str> = Arc::from("http://10.0.3.1:9400/metrics");
    // Each exporter's last parse: a scrape that repeats the one before (the exporter serves its
    // latest collection until the next) reads the same, only at its own time.
    let mut last: Vec<Option<(&str, Vec<GpuSeries>)>> = Vec::new();
    for (at, texts) in scrapes {
        let when = DateTime::from_timestamp(*at, 0).unwrap();
        let mut series = Vec::new();
        last.resize_with(texts.len(), || None);
        for (text, last) in texts.iter().zip(last.iter_mut()) {
            if last.as_ref().is_none_or(|(before, _)| *before != text.as_str()) {
                let (parsed, errors) = series_from_exposition(text, when, &source, ownership);
                assert!(errors.is_empty(), "{errors:?}");
                *last = Some((text.as_str(), parsed));
            }
            series.extend(last.iter().flat_map(|(_, parsed)| parsed).cloned().map(|mut gpu| {
                gpu.points.iter_mut().for_each(|p| p.at = when);
                gpu
            }));
        }
        merge_collection(
            &mut windows,
            &mut Collection { series, requests: texts.len(), ..Collection::default() },
            workspaces,
            chrono::Duration::zero(),
        );
        if at % step == 0 {
            windows.flush();
            windows.prune(when, |id| live.contains(id));
        }
    }
    windows.flush();
    windows.prune(now, |id| live.contains(id));
    windows
}

#[tokio::test]
async fn plan_over_a_real_prometheus_judges_raw_samples_and_the_current_session() {
    if installed_or_skip(installed(), "prometheus").is_none() {
        return;
    }
    let coder = FakeCoder::start(WorldConfig { gpus: 8, scale: 600.0, ..WorldConfig::default() }).await.unwrap();
    let names = ["bursty", "idle", "stale", "gap", "restarted", "busy", "memory-held"];
    let ids: Vec<Uuid> = names.iter().map(|n| coder.with(|w| w.create_workspace("alice", n, None)).unwrap()).collect();
    for _ in 0..200 {
        if coder.with(|w| ids.iter().all(|id| w.ws_index(*id).is_some_and(|i| w.is_running(&w.workspaces[i])))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let now = Utc::now();
    // Coder's records as they would be: every session started 70 minutes ago, but the restarted
    // one, whose new build is 32 minutes old (its old pod's series ends inside the 33-minute
    // window the decisions read); nobody connected for an hour.
    let mut pods = Vec::new();
    coder.with(|w| {
        for (i, id) in ids.iter().enumerate() {
            let wi = w.ws_index(*id).unwrap();
            let ws = &mut w.workspaces[wi];
            let started = now - chrono::Duration::seconds(if i == 4 { 32 * 60 } else { 70 * 60 });
            let build = ws.builds.last_mut().unwrap();
            build.created_at = started;
            build.job.completed_at = Some(started);
            ws.last_used_at = now - chrono::Duration::minutes(60);
            pods.push(ws.pod.as_ref().unwrap().name.clone());
        }
    });
    let uuid = |i: usize| format!("GPU-{:08x}-1c2b-4d5e-8f90-a1b2c3d4e5f6", i);
    let idle = |_: i64| Some((0.0, 0.0));
    let gpus = vec![
        // A notebook computes for one scrape in five (every 75 s): a 60 s step reading one
        // sample in four missed most bursts.
        History {
            pod: pods[0].clone(),
            uuid: uuid(0),
            value: Box::new(|ago| Some(if (ago / 15) % 5 == 0 { (0.91, 8_000.0) } else { (0.0, 8_000.0) })),
        },
        History { pod: pods[1].clone(), uuid: uuid(1), value: Box::new(idle) },
        // The exporter stopped 9 minutes ago: the lookback repeats its last value for 5 minutes.
        History { pod: pods[2].clone(), uuid: uuid(2), value: Box::new(|ago| (ago >= 9 * 60).then_some((0.0, 0.0))) },
        // An 8.5-minute hole 20 minutes ago.
        History {
            pod: pods[3].clone(),
            uuid: uuid(3),
            value: Box::new(|ago| (!(12 * 60..20 * 60 + 30).contains(&ago)).then_some((0.0, 0.0))),
        },
        // Restarted 32 minutes ago: the old pod's series ends then, the new pod has been idle since.
        History {
            pod: format!("coder-{}-5d4c3b2a1-old00", ids[4]),
            uuid: uuid(4),
            value: Box::new(|ago| (ago >= 32 * 60 + 30).then_some((0.0, 4_000.0))),
        },
        History { pod: pods[4].clone(), uuid: uuid(5), value: Box::new(|ago| (ago <= 31 * 60 + 30).then_some((0.0, 0.0))) },
        History { pod: pods[5].clone(), uuid: uuid(6), value: Box::new(|_| Some((0.91, 20_000.0))) },
        // A process holds 19 GiB and computes nothing (FINDINGS: utilization reads 0).
        History { pod: pods[6].clone(), uuid: uuid(7), value: Box::new(|_| Some((0.0, 19_376.0))) },
    ];
    let end = now.timestamp() / 15 * 15;
    let scrapes = scrapes(end, &gpus);
    let texts: Vec<(i64, Vec<String>)> = (end - HISTORY..=end).step_by(15).map(|at| (at, vec![exposition(at, &gpus, &scrapes)])).collect();
    let mut stored = Stored::new();
    store(&mut stored, texts.iter().map(|(at, t)| (*at, t[0].as_str())), false);
    let prom = prometheus_with(&openmetrics(&stored)).await;
    let token = coder.owner_token();
    let (coder_url, prom_url) = (coder.url(), prom.url.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(binary())
            .args(["plan", "--output", "json", "--coder-url", &coder_url, "--prometheus-url", &prom_url])
            .env("CODER_SESSION_TOKEN", token)
            .env_remove("CODER_URL")
            .env_remove("CODER_GPU_RECLAIMER_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    let planned = |id: &str| doc["workspaces"].as_array().unwrap().iter().find(|w| w["id"] == id).unwrap().clone();
    let verdict = |id: Uuid| {
        let w = planned(&id.to_string());
        (w["verdict"].as_str().unwrap().to_string(), w["reason"].as_str().unwrap().to_string(), w["message"].as_str().unwrap().to_string())
    };
    for (i, want) in [
        (0, ("keep", "gpu-active")),
        (1, ("reclaim", "idle")),
        (2, ("unknown", "stale-data")),
        (3, ("unknown", "sample-gap")),
        (4, ("reclaim", "idle")),
        (5, ("keep", "gpu-active")),
        (6, ("reclaim", "memory-held-idle")),
    ] {
        let (v, r, m) = verdict(ids[i]);
        assert_eq!((v.as_str(), r.as_str()), want, "{}: {m}", names[i]);
    }
    let (_, _, m) = verdict(ids[4]);
    assert!(m.starts_with("GPU idle 3"), "judged by the new session's 31 minutes only: {m}");

    // Both sources agree on the same workloads: the exporter source, fed the same scrapes as
    // dcgm-exporter's text, reaches the same verdict and reason, and the same idle time within
    // one pass interval.
    let client = CoderClient::new(
        &crate::common::url(&coder.url()),
        SessionToken::new(&coder.owner_token()).unwrap(),
        Duration::from_secs(5),
        RetryPolicy::none(),
    )
    .unwrap();
    let workspaces = client.running_workspaces().await.unwrap();
    let settings = Settings::local(
        "http://coder.invalid",
        "x-y",
        SourceConfig::exporters_at(&[]).unwrap(),
        coder_gpu_reclaimer::config::DEFAULT_INTERVAL,
    )
    .unwrap();
    let windows = exporter_windows(now, &texts, &workspaces, &settings.policy, settings.interval, &Ownership::default());
    for ws in &workspaces {
        let d = decide_with(now, ws, windows.get(&ws.id), &settings.policy, None, PassFacts { gpu_template: true, ..PassFacts::default() });
        let Some(i) = ids.iter().position(|id| id.to_string() == d.workspace_id) else { continue };
        let p = planned(&d.workspace_id);
        let exporter = (serde_json::to_value(d.verdict).unwrap(), serde_json::to_value(d.reason).unwrap());
        assert_eq!(
            (&p["verdict"], &p["reason"]),
            (&exporter.0, &exporter.1),
            "{}: Prometheus said {}, the exporter {}",
            names[i],
            p["message"],
            d.message
        );
        let prom_idle = p["gpu_idle_seconds"].as_i64();
        let exp_idle = d.gpu_idle.map(|g| g.num_seconds());
        assert!(
            match (prom_idle, exp_idle) {
                (Some(a), Some(b)) => (a - b).abs() <= 60,
                (a, b) => a == b,
            },
            "{}: GPU idle {prom_idle:?} s from Prometheus, {exp_idle:?} s from the exporter",
            names[i]
        );
    }
}

/// `check` behind Prometheus names what the store lacks (issue 34, reference dcgm NOTES §11.3):
/// virtual-GPU copies stored without their device-level series (a relabeling dropped the series
/// without a workload pod), and a scrape interval (5 minutes) longer than `max_sample_gap`, read
/// from the steps between stored samples. `plan` over the same store leaves the busy GPU
/// `unknown`, never `phantom-utilization`.
#[tokio::test]
async fn check_names_a_missing_device_series_and_a_scrape_interval_too_long() {
    if installed_or_skip(installed(), "prometheus").is_none() {
        return;
    }
    let coder = FakeCoder::start(WorldConfig { gpus: 1, scale: 600.0, ..WorldConfig::default() }).await.unwrap();
    let id = coder.with(|w| w.create_workspace("alice", "train", None)).unwrap();
    let mut pod = None;
    for _ in 0..200 {
        pod = coder.with(|w| w.ws_index(id).and_then(|i| w.workspaces[i].pod.as_ref().map(|p| p.name.clone())));
        if pod.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let now = Utc::now();
    coder.with(|w| {
        let wi = w.ws_index(id).unwrap();
        let ws = &mut w.workspaces[wi];
        let started = now - chrono::Duration::minutes(70);
        let build = ws.builds.last_mut().unwrap();
        build.created_at = started;
        build.job.completed_at = Some(started);
        ws.last_used_at = now - chrono::Duration::minutes(60);
    });
    let device = mocks::Device {
        uuid: "GPU-5b3e1a2c-7d4f-4e8a-9c1b-2f6d8e0a4b71".into(),
        model: "NVIDIA A10G".into(),
        holder: Some(mocks::Holder { pod: pod.unwrap(), load: mocks::Load::Matmul }),
        sharer: None,
    };
    let cfg = mocks::ExporterConfig { virtual_gpus: mocks::VirtualGpus::Exclusive, sm_active: false, ..Default::default() };
    let end = now.timestamp() / 300 * 300;
    let texts: Vec<(i64, String)> = (end - HISTORY..=end)
        .step_by(300)
        .map(|at| {
            let energy = 1.0e10 + (at - end + HISTORY) as f64 * 299_200.0;
            (at, without_device_series(&mocks::exporter::render_devices(std::slice::from_ref(&device), &cfg, &[energy], at as u128 * 1000)))
        })
        .collect();
    let mut stored = Stored::new();
    store(&mut stored, texts.iter().map(|(at, t)| (*at, t.as_str())), false);
    let prom = prometheus_with(&openmetrics(&stored)).await;
    let run = |args: Vec<String>| {
        let token = coder.owner_token();
        tokio::task::spawn_blocking(move || {
            let out = Command::new(binary())
                .args(&args)
                .env("CODER_SESSION_TOKEN", token)
                .env_remove("CODER_URL")
                .env_remove("CODER_GPU_RECLAIMER_CONFIG")
                .output()
                .unwrap();
            (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        })
    };
    let base = ["--coder-url".to_string(), coder.url(), "--prometheus-url".to_string(), prom.url.clone()];
    let (code, out) = run(["check".to_string()].into_iter().chain(base.clone()).collect()).await.unwrap();
    assert_eq!(code, Some(1), "{out}");
    for want in [
        "FAIL device-level series: 1 GPU series read as virtual-GPU per-pod copies",
        "no metricRelabelings drop of series without exported_pod",
        "FAIL sample interval: the store's samples of a GPU are up to 4m apart (9 in 10 gaps between stored samples: the scrape interval shows there), longer than max_sample_gap 3m",
    ] {
        assert!(out.contains(want), "want {want:?} in\n{out}");
    }
    let (code, out) = run(["plan", "--output", "json"].map(String::from).into_iter().chain(base).collect()).await.unwrap();
    assert_eq!(code, Some(0), "{out}");
    // The document, then what was logged (gpu_templates_unset: this policy names none).
    let doc: Value = serde_json::Deserializer::from_str(&out[out.find('{').unwrap()..]).into_iter().next().unwrap().unwrap();
    let w = &doc["workspaces"][0];
    assert_eq!(w["verdict"], "unknown", "{w}");
    // Every five minutes the newest sample is also stale at times: either way, never stopped.
    assert!(["no-device-series", "stale-data"].contains(&w["reason"].as_str().unwrap()), "never phantom-utilization: {w}");
}
