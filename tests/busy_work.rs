//! Busy GPU work survives Coder's own autostop (`extend_while_busy`): the real binary against the
//! fake Coder, whose lifecycle executor stops a workspace once its deadline passes, whose
//! activity bump moves it for connections, and whose `PUT .../extend` checks what coderd checks
//! (reference coder NOTES §16). TTLs here are seconds of wall-clock time; Coder's own rules (the
//! 30-minute minimum, the executor's 1-minute poll) run on the fake's accelerated clock.

use std::path::PathBuf;
use std::time::Duration;

use mocks::{ExporterConfig, FakeCoder, FakeExporter, Fault, Load, Stuck, WorldConfig};
use serde_json::Value;
use uuid::Uuid;

use crate::common::service::{Service, exporter, holds_gpu, running, until, until_with, world};

/// A 20-second autostop TTL: Coder's deadline passes within the test.
const TTL_MS: i64 = 20_000;

/// A scratch folder with the test's policy file and its audit log (also `countdown`'s).
pub(crate) struct Dir(PathBuf);

impl Dir {
    pub(crate) fn new(policy: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("cgr-busy-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("policy.toml"), policy).unwrap();
        Dir(dir)
    }

    pub(crate) fn args(&self) -> Vec<String> {
        let path = |f: &str| self.0.join(f).to_string_lossy().into_owned();
        vec!["--config".into(), path("policy.toml"), "--audit-log".into(), path("audit.jsonl")]
    }

    pub(crate) fn audit(&self, event: &str) -> Vec<Value> {
        crate::common::audit_lines(&self.0.join("audit.jsonl")).into_iter().filter(|l| l["event"] == event).collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

pub(crate) fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A workspace with a 20 s TTL (`ttl_ms` unless `None`), holding a GPU with `load`, its user
/// last seen an hour ago (nobody is connected).
async fn left_running(coder: &FakeCoder, name: &str, ttl_ms: Option<i64>, load: Load) -> Uuid {
    let id = coder.with(|w| w.create_workspace("alice", name, ttl_ms)).unwrap();
    until(coder, &format!("{name} holds a GPU"), Duration::from_secs(5), |w| holds_gpu(w, id) && running(w, id)).await;
    coder.with(|w| {
        w.set_load(id, load);
        let i = w.ws_index(id).unwrap();
        w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
    });
    id
}

pub(crate) fn deadline(coder: &FakeCoder, id: Uuid) -> Option<chrono::DateTime<chrono::Utc>> {
    coder.with(|w| w.ws_index(id).and_then(|i| w.workspaces[i].latest()?.deadline))
}

/// Stop builds of the workspace with this reason (`autostop`: Coder's lifecycle executor;
/// `initiator`: this service).
pub(crate) fn stops_by(coder: &FakeCoder, id: Uuid, reason: &str) -> usize {
    coder.with(|w| {
        w.ws_index(id).map_or(0, |i| w.workspaces[i].builds.iter().filter(|b| b.transition == "stop" && b.reason == reason).count())
    })
}

pub(crate) fn extends(coder: &FakeCoder, id: Uuid) -> usize {
    let path = format!("/api/v2/workspaces/{id}/extend");
    coder.requests().iter().filter(|(m, uri)| m == "PUT" && *uri == path).count()
}

/// The workspace's status once a pass has ended since the call: a pass logs its events before
/// it publishes its status, so the document read right after an event may be the pass before.
pub(crate) async fn status_of(svc: &Service, id: Uuid) -> Value {
    svc.passes(1, Duration::from_secs(10)).await;
    let addr = svc.addr().await;
    reqwest::get(format!("http://{addr}/api/v1/workspaces/{id}")).await.unwrap().json().await.unwrap()
}

/// A template whose `activity_bump` is 0: no connection moves the deadline (reference coder NOTES
/// §18), so a busy workspace someone is connected to is extended like an unattended one, read
/// from `GET /api/v2/templates/{id}`.
#[tokio::test]
async fn a_connected_busy_workspace_on_a_template_without_activity_bump_is_extended() {
    let coder = FakeCoder::start(WorldConfig { activity_bump: Duration::ZERO, ..world(1) }).await.unwrap();
    let ex = exporter(&coder).await;
    let train = left_running(&coder, "train", Some(TTL_MS), Load::Matmul).await;
    coder.with(|w| w.open_connection(train));
    until(&coder, "its use is recorded", Duration::from_secs(10), |w| {
        w.ws_index(train).is_some_and(|i| w.now() - w.workspaces[i].last_used_at < chrono::Duration::minutes(2))
    })
    .await;
    let dir = Dir::new("extend_while_busy = true\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &strs(&dir.args()));
    svc.wait_event("deadline_extended", Duration::from_secs(10)).await;
    assert!(deadline(&coder, train).unwrap() > chrono::Utc::now() + chrono::Duration::minutes(59));
    let reads = coder.requests().iter().filter(|(m, uri)| m == "GET" && uri.starts_with("/api/v2/templates/")).count();
    assert_eq!(reads, 1, "the template is read once, not every pass");
    assert_eq!(stops_by(&coder, train, "autostop"), 0);
}

#[tokio::test]
async fn a_busy_disconnected_workspace_outlives_its_deadline_and_is_reclaimed_once_it_idles() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let train = left_running(&coder, "train", Some(TTL_MS), Load::Matmul).await;
    let original = deadline(&coder, train).unwrap();
    let dir = Dir::new("extend_while_busy = true\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &strs(&dir.args()));
    let extended = svc.wait_event("deadline_extended", Duration::from_secs(10)).await;
    let moved = deadline(&coder, train).unwrap();
    assert!(moved > chrono::Utc::now() + chrono::Duration::minutes(59), "now + extend_by (1 h): {moved}; {extended}");
    // Coder's original deadline passes; its lifecycle executor (every second here) leaves it.
    let past = (original - chrono::Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(3);
    tokio::time::sleep(past).await;
    assert!(coder.with(|w| running(w, train)), "still running past its original deadline");
    assert_eq!(stops_by(&coder, train, "autostop"), 0);
    svc.wait_event("autostop_averted", Duration::from_secs(5)).await;
    assert_eq!(extends(&coder, train), 1, "one extension: the new deadline is an hour ahead");
    let s = status_of(&svc, train).await;
    assert_eq!((s["reason"].as_str(), s["kept_running"]["action"].as_str()), (Some("gpu-active"), Some("ahead")), "{s}");
    assert!(s["kept_running"]["text"].as_str().unwrap().starts_with("kept running by GPU work until "), "{s}");
    let line: String =
        reqwest::get(format!("http://{}/api/v1/workspaces/{train}?format=text", svc.addr().await)).await.unwrap().text().await.unwrap();
    assert!(line.contains("; kept running by GPU work until "), "the template's metadata line says it: {line}");
    let doc: Value = reqwest::get(format!("http://{}/api/v1/workspaces", svc.addr().await)).await.unwrap().json().await.unwrap();
    assert_eq!(doc["accounting"]["autostops_averted_7d"], 1, "{doc}");
    let metrics = reqwest::get(format!("http://{}/metrics", svc.addr().await)).await.unwrap().text().await.unwrap();
    for line in [
        "coder_gpu_reclaimer_deadline_extensions_total{template=\"gpu-workspace\"} 1",
        "coder_gpu_reclaimer_autostops_averted_total{template=\"gpu-workspace\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    // The job ends: the GPU idles and the service reclaims it.
    coder.with(|w| w.set_load(train, Load::Idle));
    until_with(&coder, Some(&svc), "the idle GPU is reclaimed", Duration::from_secs(25), |w| !holds_gpu(w, train)).await;
    assert_eq!((stops_by(&coder, train, "initiator"), stops_by(&coder, train, "autostop")), (1, 0));
    let audit = dir.audit("deadline_extended");
    assert_eq!(audit.len(), 1);
    let a = &audit[0];
    assert_eq!((a["limited_by"].as_str(), a["sm_active_peak"].as_f64()), (Some("extend_limit"), Some(0.984)), "{a}");
    assert!(a["deadline_from"].is_string() && a["deadline_to"].is_string() && a["deadline_limit"].is_string(), "{a}");
    assert_eq!(dir.audit("autostop_averted").len(), 1);
    // `report` reads what `run` wrote: one stop, one extension, one autostop averted.
    let out = std::process::Command::new(crate::common::binary())
        .args(["report", "--output", "json", "--audit-log"])
        .arg(dir.0.join("audit.jsonl"))
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &report["total"];
    assert_eq!(
        (t["stops"].as_u64(), t["deadline_extensions"].as_u64(), t["autostops_averted"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{report}"
    );
}

#[tokio::test]
async fn in_observe_mode_coders_autostop_stops_it_and_the_status_says_it_would_have_been_extended() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let train = left_running(&coder, "train", Some(TTL_MS), Load::Matmul).await;
    let dir = Dir::new("extend_while_busy = true\n");
    let svc = Service::start_observing(&coder, &[ex.url()], &coder.owner_token(), &strs(&dir.args()));
    svc.wait_event("would_extend", Duration::from_secs(10)).await;
    let s = status_of(&svc, train).await;
    assert_eq!(s["kept_running"]["action"], "extend", "{s}");
    let text = s["kept_running"]["text"].as_str().unwrap();
    assert!(text.starts_with("would be kept running by GPU work until ") && text.contains("observe mode: Coder stops it at "), "{s}");
    until_with(&coder, Some(&svc), "Coder's autostop stops it", Duration::from_secs(30), |w| !running(w, train)).await;
    assert_eq!((stops_by(&coder, train, "autostop"), extends(&coder, train)), (1, 0), "observe mode sends nothing");
    assert_eq!(svc.events("would_extend").len(), 1, "said once per build");
    assert_eq!(dir.audit("would_extend").len(), 1);
}

#[tokio::test]
async fn phantom_memory_held_and_unknown_workspaces_are_never_extended() {
    let coder = FakeCoder::start(world(3)).await.unwrap();
    let phantom = left_running(&coder, "phantom", Some(TTL_MS), Load::Phantom).await;
    let held = left_running(&coder, "held", Some(TTL_MS), Load::MemoryOnly).await;
    // SM_ACTIVE stuck at 0 under a matmul: the counters contradict each other (unknown).
    let stuck = left_running(&coder, "stuck", Some(TTL_MS), Load::Matmul).await;
    let slot = coder.with(|w| w.gpu_holders.iter().position(|h| *h == Some(stuck))).unwrap();
    let others: Vec<usize> = (0..3).filter(|g| *g != slot).collect();
    let exporters = [
        FakeExporter::start(coder.world.clone(), ExporterConfig { gpus: others, ..ExporterConfig::default() }).await.unwrap(),
        FakeExporter::start(
            coder.world.clone(),
            ExporterConfig { gpus: vec![slot], stuck: Some(Stuck::SmActive), hostname: "gpu-node-2".into(), ..ExporterConfig::default() },
        )
        .await
        .unwrap(),
    ];
    let urls: Vec<String> = exporters.iter().map(FakeExporter::url).collect();
    let dir = Dir::new("extend_while_busy = true\n");
    let svc = Service::start(&coder, &urls, &coder.owner_token(), &strs(&dir.args()));
    until_with(&coder, Some(&svc), "Coder's autostop stops the unknown one", Duration::from_secs(30), |w| !running(w, stuck)).await;
    for id in [phantom, held, stuck] {
        assert_eq!(extends(&coder, id), 0, "{id} was extended:\n{}", svc.raw());
    }
    assert_eq!(stops_by(&coder, stuck, "autostop"), 1, "unknown is kept by the service, and Coder's autostop applies");
    assert!(svc.events("deadline_extended").is_empty() && dir.audit("deadline_extended").is_empty());
}

/// Busy until Coder stops it: the limit leaves no extension of 30 minutes, which is said once.
async fn limited(config: WorldConfig, policy: &str, limited_by: &str) {
    let coder = FakeCoder::start(config).await.unwrap();
    let ex = exporter(&coder).await;
    let train = left_running(&coder, "train", Some(TTL_MS), Load::Matmul).await;
    let dir = Dir::new(policy);
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &strs(&dir.args()));
    let said = svc.wait_event("extend_limit_reached", Duration::from_secs(10)).await;
    assert_eq!(said["limited_by"], limited_by, "{said}");
    let s = status_of(&svc, train).await;
    assert_eq!(s["kept_running"]["action"], "limit_reached", "{s}");
    let text = s["kept_running"]["text"].as_str().unwrap();
    assert!(text.starts_with("Coder will stop it at ") && text.ends_with(&format!(": {limited_by} reached")), "{s}");
    until_with(&coder, Some(&svc), "Coder's autostop stops it", Duration::from_secs(30), |w| !running(w, train)).await;
    assert_eq!((stops_by(&coder, train, "autostop"), extends(&coder, train)), (1, 0), "{limited_by}");
    assert_eq!(svc.events("extend_limit_reached").len(), 1, "said once");
}

#[tokio::test]
async fn max_deadline_clamps_then_coder_stops_it() {
    // The template's autostop requirement: no deadline more than 40 s after the build.
    limited(WorldConfig { max_deadline_after: Some(Duration::from_secs(40)), ..world(1) }, "extend_while_busy = true\n", "max_deadline")
        .await;
}

#[tokio::test]
async fn autostop_off_and_prebuilds_get_no_request_and_a_refusal_is_not_sent_again() {
    let coder = FakeCoder::start(world(4)).await.unwrap();
    let ex = exporter(&coder).await;
    let manual = left_running(&coder, "manual", None, Load::Matmul).await;
    let pre = coder.with(|w| w.create_prebuild("pre")).unwrap();
    coder.with(|w| {
        let i = w.ws_index(pre).unwrap();
        w.workspaces[i].ttl_ms = Some(TTL_MS);
    });
    until(&coder, "the prebuild holds a GPU", Duration::from_secs(5), |w| holds_gpu(w, pre) && running(w, pre)).await;
    coder.with(|w| w.set_load(pre, Load::Matmul));
    assert!(deadline(&coder, pre).is_some(), "the prebuild has a deadline");
    let refused = left_running(&coder, "refused", Some(TTL_MS), Load::Matmul).await;
    coder.set_fault(&format!("/api/v2/workspaces/{refused}/extend"), Fault { fail_next: 1_000, status: 400, ..Fault::default() });
    // Its deadline is later than the refused one's: the one slot goes to the refused one first.
    let other = left_running(&coder, "other", Some(TTL_MS + 5_000), Load::Matmul).await;
    let dir = Dir::new("extend_while_busy = true\nmax_extensions_per_pass = 1\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &strs(&dir.args()));
    svc.wait_event("extend_refused", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!((extends(&coder, manual), extends(&coder, pre)), (0, 0), "no deadline, or a prebuild: nothing to extend");
    assert_eq!(extends(&coder, refused), 1, "a 400 is remembered for the build, not sent every pass");
    assert_eq!(extends(&coder, other), 1, "a refused one takes no slot once refused: the other gets the one slot");
    let metrics = reqwest::get(format!("http://{}/metrics", svc.addr().await)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("coder_gpu_reclaimer_deadline_extension_failures_total{reason=\"refused\"} 1"), "{metrics}");
}
