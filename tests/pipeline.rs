//! The pipeline (evaluate, act, publish) built by `Application::build`, in-process against the
//! stateful fakes: observe sends no stop and promises none, enforce sends exactly one per
//! reclaimable workspace, a 409 is decided again next pass, no double stop across passes, a
//! refused stop backs off and is abandoned, a lost reply counts once, a repeated listing entry,
//! the cap (retries included), the breaker, a failed listing, a failed stop build, the audit log
//! and webhook, and what the status API and /metrics serve.

use std::time::Duration;

use coder_gpu_reclaimer::app::{Application, Role};
use coder_gpu_reclaimer::config::Settings;
use coder_gpu_reclaimer::gpu::SourceConfig;
use coder_gpu_reclaimer::pass::decide::{Decision, Reason, Verdict};
use coder_gpu_reclaimer::pass::mode::Mode;
use coder_gpu_reclaimer::pass::policy::Policy;
use coder_gpu_reclaimer::pass::publish::PassOutcome;
use coder_gpu_reclaimer::retry::RetryPolicy;
use mocks::{Behaviour, ExporterConfig, FakeCoder, FakeExporter, Fault, Load, WorldConfig};
use tokio::sync::watch;
use uuid::Uuid;

use crate::common::{audit_lines, url};

pub const INTERVAL: Duration = Duration::from_millis(150);

/// The real service, built by `Application::build` like `run`, against the fakes in-process.
pub struct Harness {
    pub coder: FakeCoder,
    pub exporter: FakeExporter,
    pub app: Application,
    stop: watch::Receiver<bool>,
    _tx: watch::Sender<bool>,
}

impl Harness {
    pub async fn new(gpus: usize, mode: Mode, tune: impl FnOnce(&mut Policy)) -> Self {
        Self::with_world(WorldConfig { gpus, scale: 600.0, ..WorldConfig::default() }, mode, tune).await
    }

    pub async fn with_world(world: WorldConfig, mode: Mode, tune: impl FnOnce(&mut Policy)) -> Self {
        Self::build(world, |s| {
            s.mode = mode;
            tune(&mut s.policy);
        })
        .await
    }

    /// Settings as `run` would resolve them, pointed at the fakes; `tune` changes any of them.
    pub async fn build(world: WorldConfig, tune: impl FnOnce(&mut Settings)) -> Self {
        let coder = FakeCoder::start(world).await.unwrap();
        let exporter = FakeExporter::start(coder.world.clone(), ExporterConfig::default()).await.unwrap();
        let gpu = SourceConfig::exporters_at(&[exporter.url()]).unwrap();
        let mut settings = Settings::local(&coder.url(), &coder.owner_token(), gpu, INTERVAL).unwrap();
        settings.request_timeout = Duration::from_secs(2);
        settings.api_retry = RetryPolicy {
            initial: Duration::from_millis(10),
            max_interval: Duration::from_millis(50),
            max_elapsed: Duration::from_millis(300),
        };
        settings.policy.thresholds.idle_after = Duration::from_millis(1200);
        tune(&mut settings);
        let app = Application::build(&settings, Role::Run).await.unwrap();
        let (tx, stop) = watch::channel(false);
        Harness { coder, exporter, app, stop, _tx: tx }
    }

    pub fn state(&self) -> &coder_gpu_reclaimer::pass::publish::State {
        &self.app.state
    }

    /// Creates a running workspace for `owner` whose pod holds a GPU, with `load`.
    pub async fn workspace(&self, owner: &str, name: &str, load: Load) -> Uuid {
        let id = self.coder.with(|w| w.create_workspace(owner, name, None)).unwrap();
        for _ in 0..400 {
            let ready = self.coder.with(|w| {
                w.ws_index(id).and_then(|i| w.workspaces[i].latest()?.agent.clone()).is_some_and(|a| a.first_connected_at.is_some())
            });
            if ready {
                self.coder.with(|w| w.set_load(id, load));
                return id;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("workspace {name} never got its GPU");
    }

    /// One full pass (evaluate, act, publish), then an interval's sleep.
    pub async fn pass(&mut self) -> PassOutcome {
        let r = self.app.pass(&self.stop).await.unwrap();
        tokio::time::sleep(INTERVAL).await;
        r
    }

    /// Evaluates only: decisions, no action (as `plan` does).
    pub async fn evaluate(&mut self) -> Vec<Decision> {
        self.app.evaluator.evaluate().await.map_err(|(e, _)| e).unwrap().into_decisions()
    }

    pub fn posts(&self) -> usize {
        self.coder.requests().iter().filter(|(m, p)| m == "POST" && p.ends_with("/builds")).count()
    }

    pub fn stops_by_admin(&self, id: Uuid) -> usize {
        self.coder.with(|w| w.stop_builds_by(id, "admin"))
    }
}

fn verdict(decisions: &[Decision], id: Uuid) -> (Verdict, Reason) {
    let d = decisions.iter().find(|d| d.workspace_id == id.to_string()).unwrap();
    (d.verdict, d.reason)
}

#[tokio::test]
async fn observe_mode_reports_but_never_posts() {
    let mut h = Harness::new(2, Mode::Observe, |_| {}).await;
    let idle = h.workspace("alice", "idle", Load::Idle).await;
    h.workspace("bob", "busy", Load::Matmul).await;
    let mut reported = 0;
    for _ in 0..14 {
        let r = h.pass().await;
        reported += r.acted.would_stop.len();
    }
    assert_eq!(h.posts(), 0, "observe mode sends no stop build");
    assert_eq!(reported, 1, "one would-stop per idle episode, not one per pass");
    let doc = h.state().status();
    assert_eq!(doc.mode, "observe");
    let entry = doc.workspaces.iter().find(|w| w.id == idle.to_string()).unwrap();
    assert_eq!((entry.verdict, entry.reason), (Verdict::Reclaim, Reason::Idle));
}

#[tokio::test]
async fn enforce_stops_each_idle_workspace_exactly_once() {
    let mut h = Harness::new(3, Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    let b = h.workspace("bob", "b", Load::MemoryOnly).await;
    let c = h.workspace("alice", "c", Load::Matmul).await;
    for _ in 0..20 {
        h.pass().await;
    }
    assert_eq!((h.stops_by_admin(a), h.stops_by_admin(b), h.stops_by_admin(c)), (1, 1, 0));
    assert_eq!(h.posts(), 2);
    let stopped = h.coder.with(|w| {
        w.workspaces.iter().filter(|ws| ws.latest().is_some_and(|b| b.transition == "stop" && b.job.status == "succeeded")).count()
    });
    assert_eq!(stopped, 2, "both stop builds were followed to success");
}

#[tokio::test]
async fn a_409_is_decided_again_next_pass() {
    // Builds that take 0.5 s, so the owner's build is still active when the stop arrives.
    let world = WorldConfig { gpus: 1, scale: 600.0, build_queue: Duration::from_secs(300), ..WorldConfig::default() };
    let mut h = Harness::with_world(world, Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    // Wait until it is reclaimable, then make the stop race with the owner's own build.
    for _ in 0..12 {
        let r = h.evaluate().await;
        tokio::time::sleep(INTERVAL).await;
        if verdict(&r, a).0 == Verdict::Reclaim {
            break;
        }
    }
    let prefix = format!("/api/v2/workspaces/{a}/builds");
    h.coder.set_fault(&prefix, Fault { latency: Duration::from_millis(300), ..Fault::default() });
    let world = h.coder.world.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut w = world.lock().unwrap();
        let owner = w.user_index("alice").unwrap();
        w.create_build(a, "start", owner, "cli").unwrap();
    });
    let r = h.pass().await;
    assert_eq!(r.acted.build_active, vec![a.to_string()], "409: a build is already active");
    h.coder.set_fault(&prefix, Fault::default());
    let mut sent = 0;
    for _ in 0..20 {
        sent += h.pass().await.acted.stops_sent.len();
    }
    assert_eq!(sent, 1, "stopped on a later pass, once");
    assert_eq!(h.stops_by_admin(a), 1);
}

#[tokio::test]
async fn a_failed_stop_build_is_retried_on_a_later_pass() {
    let mut h = Harness::new(1, Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    h.coder.with(|w| w.fail_next_stop(a));
    for _ in 0..30 {
        h.pass().await;
        if h.stops_by_admin(a) >= 2 && h.coder.with(|w| w.ws_index(a).map(|i| w.workspaces[i].pod.is_none())).unwrap() {
            break;
        }
    }
    assert_eq!(h.stops_by_admin(a), 2, "the failed stop was retried once, then succeeded");
    let freed = h.coder.with(|w| w.gpu_holders.iter().all(Option::is_none));
    assert!(freed, "the GPU is free after the retry");
    assert!(h.state().metrics.encode().contains("coder_gpu_reclaimer_stop_failures_total{kind=\"build_failed\"} 1"));
}

/// Enforce mode with a cap of one stop per pass (the breaker off) and three idle workspaces.
async fn three_idle_one_stop_per_pass() -> (Harness, Vec<Uuid>) {
    let h = Harness::new(6, Mode::Enforce, |p| {
        p.max_stops_per_pass = 1;
        p.max_idle_fraction = 1.0;
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(h.workspace("alice", &format!("w{i}"), Load::Idle).await);
    }
    (h, ids)
}

#[tokio::test]
async fn the_cap_limits_stops_per_pass() {
    let (mut h, _) = three_idle_one_stop_per_pass().await;
    let mut per_pass = Vec::new();
    for _ in 0..20 {
        per_pass.push(h.pass().await.acted.stops_sent.len());
    }
    assert!(per_pass.iter().all(|n| *n <= 1), "{per_pass:?}");
    assert_eq!(per_pass.iter().sum::<usize>(), 3, "{per_pass:?}");
}

#[tokio::test]
async fn the_cap_counts_retries_of_failed_stops() {
    let (mut h, ids) = three_idle_one_stop_per_pass().await;
    for &id in &ids {
        h.coder.with(|w| w.fail_next_stop(id));
    }
    // Each first stop build fails: its retry (the workspace is no longer listed running) and the
    // next reclaim in the stop order share the pass's one stop slot.
    let mut per_pass = Vec::new();
    for _ in 0..60 {
        let before = h.posts();
        h.pass().await;
        per_pass.push(h.posts() - before);
        if ids.iter().all(|&id| h.stops_by_admin(id) >= 2) {
            break;
        }
    }
    assert!(per_pass.iter().all(|n| *n <= 1), "at most one stop build per pass, retries included: {per_pass:?}");
    let stops: Vec<usize> = ids.iter().map(|&id| h.stops_by_admin(id)).collect();
    assert_eq!(stops, [2, 2, 2], "each failed stop was retried once: {per_pass:?}");
}

#[tokio::test]
async fn the_breaker_holds_when_every_exporter_reads_zero() {
    let mut h = Harness::new(5, Mode::Enforce, |_| {}).await;
    for i in 0..5 {
        h.workspace("alice", &format!("w{i}"), Load::Matmul).await;
    }
    h.exporter.set(|c| c.behaviour = Behaviour::AllZero);
    let mut tripped = 0;
    for _ in 0..16 {
        tripped += usize::from(h.pass().await.eval.fleet.breaker.is_some());
    }
    assert!(tripped > 0, "the breaker tripped");
    assert_eq!(h.posts(), 0, "a broken exporter stops nobody");
    assert!(h.state().metrics.encode().contains(&format!("coder_gpu_reclaimer_breaker_trips_total {tripped}")));
    assert!(h.state().status().breaker.is_some());
}

#[tokio::test]
async fn a_failed_listing_stops_nothing() {
    let mut h = Harness::new(1, Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    // Decide without acting until the workspace is reclaimable...
    for _ in 0..20 {
        let r = h.evaluate().await;
        if verdict(&r, a).0 == Verdict::Reclaim {
            break;
        }
        tokio::time::sleep(INTERVAL).await;
    }
    // ...then the listing fails: the pass errs and nothing is stopped.
    h.coder.set_fault("/api/v2/workspaces", Fault { fail_next: 1000, status: 500, ..Fault::default() });
    for _ in 0..3 {
        assert!(h.app.pass(&h.stop).await.is_err());
    }
    assert_eq!(h.posts(), 0, "no stop while the listing fails");
    assert!(h.state().metrics.encode().contains("coder_gpu_reclaimer_passes_total{result=\"failed\"} 3"));
}

#[tokio::test]
async fn the_status_api_and_metrics_serve_what_they_promise() {
    let mut h = Harness::new(2, Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Matmul).await;
    h.workspace("bob", "b", Load::OneThread).await;
    let waiting = h.coder.with(|w| w.create_workspace("bob", "waits", None)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_tx, rx) = watch::channel(false);
    tokio::spawn(coder_gpu_reclaimer::serve::serve(listener, h.app.state.clone(), None, rx));
    let http = reqwest::Client::new();
    let get = |p: &str| http.get(format!("http://{addr}{p}")).send();
    assert_eq!(get("/readyz").await.unwrap().status(), 503, "not ready before the first pass");
    for _ in 0..4 {
        h.pass().await;
    }
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    let doc: serde_json::Value = get("/api/v1/workspaces").await.unwrap().json().await.unwrap();
    assert_eq!(doc["mode"], "enforce");
    assert!(doc["generated_at"].is_string());
    let ws = doc["workspaces"].as_array().unwrap();
    assert_eq!(ws.len(), 3, "{doc}");
    for key in ["id", "name", "owner", "template", "verdict", "reason", "message", "gpu_idle_seconds", "last_used_at", "stop_at", "gpus"] {
        assert!(ws.iter().all(|w| w.get(key).is_some()), "every entry has {key}");
    }
    let one: serde_json::Value = get(&format!("/api/v1/workspaces/{a}")).await.unwrap().json().await.unwrap();
    assert_eq!((one["verdict"].as_str(), one["reason"].as_str()), (Some("keep"), Some("gpu-active")));
    assert_eq!(one["gpus"][0]["sm_active"], 0.984);
    let text = get(&format!("/api/v1/workspaces/{waiting}?format=text")).await.unwrap().text().await.unwrap();
    assert!(text.starts_with("waiting (waiting-for-gpu): "), "{text}");
    assert_eq!(get(&format!("/api/v1/workspaces/{}", Uuid::new_v4())).await.unwrap().status(), 404);
    let body = serde_json::to_string(&doc).unwrap();
    let token = h.coder.owner_token();
    assert!(!body.contains(&token) && !body.contains(token.split('-').nth(1).unwrap()), "no token in the status API");
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    for want in [
        "coder_gpu_reclaimer_passes_total{result=\"ok\"} 4",
        "coder_gpu_reclaimer_workspaces{verdict=\"waiting\",reason=\"waiting-for-gpu\"} 1",
        "coder_gpu_reclaimer_workspaces{verdict=\"keep\",reason=\"gpu-active\"} 1",
        "coder_gpu_reclaimer_waiting_workspaces{pool=\"default\"} 1",
        "coder_gpu_reclaimer_coder_requests_total{endpoint=\"GET /api/v2/workspaces\",code=\"200\"} 4",
        "coder_gpu_reclaimer_pass_duration_seconds_count 4",
        "# TYPE coder_gpu_reclaimer_token_expiry_timestamp_seconds gauge",
    ] {
        assert!(metrics.contains(want), "missing {want:?} in\n{metrics}");
    }
    assert!(!metrics.contains(&a.to_string()), "no per-workspace labels");
}

#[tokio::test]
async fn a_workspace_restarted_right_after_its_stop_is_not_stopped_again() {
    let mut h = Harness::new(1, Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    let old_pod = h.coder.with(|w| w.ws_index(a).and_then(|i| w.workspaces[i].pod.as_ref().map(|p| p.name.clone()))).unwrap();
    for _ in 0..30 {
        h.app.pass(&h.stop).await.unwrap();
        if h.stops_by_admin(a) == 1 {
            break;
        }
        tokio::time::sleep(INTERVAL).await;
    }
    assert_eq!(h.stops_by_admin(a), 1);
    let gone = |w: &mocks::World| w.ws_index(a).is_some_and(|i| w.workspaces[i].pod.is_none());
    while !h.coder.with(|w| gone(w)) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Alice starts it again before the next pass: no listing ever showed it stopped.
    h.coder.with(|w| w.create_build(a, "start", w.user_index("alice").unwrap(), "cli")).unwrap();
    while !h.coder.with(|w| w.ws_index(a).is_some_and(|i| w.is_running(&w.workspaces[i]))) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut verdicts = Vec::new();
    for _ in 0..6 {
        let r = h.pass().await;
        if let Some(d) = r.eval.decisions().find(|d| d.workspace_id == a.to_string()) {
            verdicts.push(d.reason);
        }
        let doc = h.state().status();
        let entry = doc.workspaces.iter().find(|w| w.id == a.to_string()).unwrap();
        assert!(entry.gpus.iter().all(|g| g.key.pod.as_deref() != Some(old_pod.as_str())), "the old session's samples are gone: {entry:?}");
    }
    assert_eq!(h.stops_by_admin(a), 1, "a fresh session is not judged by the old one's samples: {verdicts:?}");
}

/// The audit log records the stop (`stop_sending`, then `stop_sent`); the webhook gets the
/// warning and the stop (`warn`, `stop_sent`). Warnings are not audit lines.
#[tokio::test]
async fn the_audit_log_records_the_stop_and_the_webhook_the_warning_too() {
    let hook = webhook().await;
    let (mut h, path) = audited(Mode::Enforce, |s| {
        s.notify_webhook = Some(url(&hook.uri()));
        s.policy.thresholds.grace = Duration::from_millis(450);
    })
    .await;
    let a = h.workspace("alice", "a", Load::MemoryOnly).await;
    for _ in 0..30 {
        h.pass().await;
        if h.stops_by_admin(a) == 1 {
            break;
        }
    }
    assert_eq!(h.stops_by_admin(a), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // One line before the stop's POST and one for the stop, written before the next pass;
    // warnings go to the webhook only.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["event"], "stop_sending");
    let e = &lines[1];
    assert_eq!(
        (e["event"].as_str(), e["mode"].as_str(), e["reason"].as_str()),
        (Some("stop_sent"), Some("enforce"), Some("memory-held-idle"))
    );
    assert_eq!((e["workspace"].as_str(), e["owner"].as_str(), e["template"].as_str()), (Some("a"), Some("alice"), Some("gpu-workspace")));
    assert!(
        e["build_id"].is_string() && e["gpu_idle_seconds"].is_number() && e["connection_idle_seconds"].is_number() && e["time"].is_string(),
        "{e}"
    );
    let posts: Vec<serde_json::Value> =
        hook.received_requests().await.unwrap().iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    let kinds: Vec<&str> = posts.iter().filter_map(|p| p["event"].as_str()).collect();
    assert_eq!(kinds, vec!["warn", "stop_sent"], "{posts:?}");
    assert!(posts[0]["text"].as_str().unwrap().starts_with("Workspace alice/a will be stopped in "), "{}", posts[0]["text"]);
    assert!(posts[1]["stop_at"].is_string());
    std::fs::remove_file(&path).ok();
}

#[tokio::test]
async fn an_unreachable_webhook_never_blocks_a_stop() {
    let dead = format!("http://{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap());
    let world = WorldConfig { gpus: 1, scale: 600.0, ..WorldConfig::default() };
    let mut h = Harness::build(world, |s| {
        s.mode = Mode::Enforce;
        s.notify_webhook = Some(url(&dead));
    })
    .await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    for _ in 0..20 {
        h.pass().await;
    }
    assert_eq!(h.stops_by_admin(a), 1);
}

/// The webhook's received events, as JSON.
async fn hook_events(hook: &wiremock::MockServer) -> Vec<serde_json::Value> {
    hook.received_requests().await.unwrap().iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect()
}

async fn webhook() -> wiremock::MockServer {
    let hook = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST")).respond_with(wiremock::ResponseTemplate::new(200)).mount(&hook).await;
    hook
}

/// One GPU at 600x speed, in `mode`, with an audit log in a fresh file (its path returned);
/// `tune` sets the rest.
async fn audited(mode: Mode, tune: impl FnOnce(&mut Settings)) -> (Harness, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("cgr-audit-{}.jsonl", Uuid::new_v4()));
    let world = WorldConfig { gpus: 1, scale: 600.0, ..WorldConfig::default() };
    let h = Harness::build(world, |s| {
        s.mode = mode;
        s.audit_log = Some(path.clone());
        tune(s);
    })
    .await;
    (h, path)
}

#[tokio::test]
async fn a_refused_stop_backs_off_and_is_abandoned_after_five_attempts() {
    let (mut h, path) = audited(Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    // Coder refuses every stop of this workspace (403: the token may not stop it).
    h.coder.set_fault(&format!("/api/v2/workspaces/{a}/builds"), Fault { fail_next: 10_000, status: 403, ..Fault::default() });
    let mut post_times = Vec::new();
    let mut abandoned = Vec::new();
    for _ in 0..60 {
        let before = h.posts();
        let r = h.pass().await;
        if h.posts() > before {
            post_times.push(std::time::Instant::now());
        }
        abandoned.extend(r.acted.abandoned);
        if !abandoned.is_empty() && post_times.len() >= 5 {
            // A few more passes: nothing more may be sent.
            for _ in 0..8 {
                h.pass().await;
            }
            break;
        }
    }
    assert_eq!(h.posts(), 5, "five attempts, then abandoned");
    assert_eq!(abandoned, vec![a.to_string()]);
    // The waits double from one interval: each gap is at least the backoff before it.
    let gaps: Vec<Duration> = post_times.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, gap) in gaps.iter().enumerate() {
        assert!(*gap >= INTERVAL * 2u32.pow(i as u32), "gap {i} is {gap:?}: {gaps:?}");
    }
    let metrics = h.state().metrics.encode();
    assert!(metrics.contains("coder_gpu_reclaimer_stop_failures_total{kind=\"rejected\"} 5"), "{metrics}");
    assert!(metrics.contains("coder_gpu_reclaimer_stop_failures_total{kind=\"abandoned\"} 1"), "{metrics}");
    let lines = audit_lines(&path);
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    // Each change of state is one audit line, each attempt announced before its POST: four
    // failures, then the abandonment.
    let sending = ["stop_sending"];
    let want: Vec<&str> = ["stop_failed", "stop_failed", "stop_failed", "stop_failed", "stop_abandoned"]
        .iter()
        .flat_map(|k| sending.iter().chain([k]))
        .copied()
        .collect();
    assert_eq!(kinds, want, "{lines:?}");
    let attempts: Vec<i64> = lines.iter().filter_map(|l| l["attempts"].as_i64()).collect();
    assert_eq!(attempts, vec![1, 2, 3, 4, 5]);

    // A new build is a new session: stopping starts afresh.
    h.coder.with(|w| w.create_build(a, "start", w.user_index("alice").unwrap(), "cli")).unwrap();
    for _ in 0..40 {
        h.pass().await;
        if h.posts() > 5 {
            break;
        }
    }
    assert_eq!(h.posts(), 6, "after the user's new build, one new attempt");
    std::fs::remove_file(&path).ok();
}

#[tokio::test]
async fn a_stop_whose_reply_was_lost_is_recorded_once_and_followed() {
    let hook = webhook().await;
    let (mut h, path) = audited(Mode::Enforce, |s| {
        s.notify_webhook = Some(url(&hook.uri()));
        s.request_timeout = Duration::from_millis(500);
    })
    .await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    // Coder creates the stop build, but its 201 arrives after the client gave up.
    h.coder.set_fault(
        &format!("/api/v2/workspaces/{a}/builds"),
        Fault { delay_reply_next: 1, reply_delay: Duration::from_millis(1500), ..Fault::default() },
    );
    for _ in 0..40 {
        h.pass().await;
        let stopped = h.coder.with(|w| w.ws_index(a).is_some_and(|i| w.workspaces[i].pod.is_none()));
        if stopped && h.app.actuator.as_ref().unwrap().tracked_count() == 0 {
            break;
        }
    }
    assert_eq!(h.posts(), 1, "never a blind second POST: Coder would queue a second stop");
    assert_eq!(h.stops_by_admin(a), 1, "Coder created one stop build");
    assert_eq!(h.app.actuator.as_ref().unwrap().tracked_count(), 0, "the build was followed to its end");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = audit_lines(&path);
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    assert_eq!(kinds, vec!["stop_sending", "stop_sent", "stop_done"], "exactly one stop line, then its completion: {lines:?}");
    assert_eq!(lines[1]["build_id"], lines[2]["build_id"]);
    let build_id = h.coder.with(|w| w.ws_index(a).map(|i| w.workspaces[i].builds.last().unwrap().id.to_string())).unwrap();
    assert_eq!(lines[1]["build_id"].as_str(), Some(build_id.as_str()), "the audit line names the build Coder created");
    let events = hook_events(&hook).await;
    let stops: Vec<_> = events.iter().filter(|e| e["event"] == "stop_sent").collect();
    assert_eq!(stops.len(), 1, "exactly one webhook event: {events:?}");
    assert!(h.state().metrics.encode().contains("coder_gpu_reclaimer_stops_total{reason=\"idle\",mode=\"enforce\"} 1"));
    std::fs::remove_file(&path).ok();
}

#[tokio::test]
async fn observe_mode_never_tells_anyone_a_stop_will_happen() {
    let hook = webhook().await;
    let (mut h, path) = audited(Mode::Observe, |s| {
        s.notify_webhook = Some(url(&hook.uri()));
        s.policy.thresholds.grace = Duration::from_millis(900);
    })
    .await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    let mut warned_message = None;
    let mut would_stop = 0;
    for _ in 0..40 {
        let r = h.pass().await;
        if r.eval.decisions().any(|d| d.workspace_id == a.to_string() && d.verdict == Verdict::Warn) {
            let doc = h.state().status();
            warned_message = doc.workspaces.iter().find(|w| w.id == a.to_string()).map(|w| w.message.clone());
        }
        would_stop += r.acted.would_stop.len();
        if would_stop > 0 {
            break;
        }
    }
    assert_eq!(would_stop, 1);
    assert_eq!(h.posts(), 0);
    let message = warned_message.expect("a warning was shown during grace");
    assert!(message.contains("would stop in") && message.contains("observe mode") && !message.contains("stops in"), "{message}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let events = hook_events(&hook).await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(kinds, vec!["would_warn", "would_stop"], "{events:?}");
    for e in &events {
        let text = e["text"].as_str().unwrap();
        assert_eq!(e["mode"], "observe", "{e}");
        assert!(text.contains("would be stopped") && text.contains("observe mode"), "{text}");
        assert!(!text.contains("will be stopped") && !text.contains("stops in"), "no promise of a stop: {text}");
    }
    let lines = audit_lines(&path);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!((lines[0]["event"].as_str(), lines[0]["mode"].as_str()), (Some("would_stop"), Some("observe")));
    std::fs::remove_file(&path).ok();
}

#[tokio::test]
async fn a_workspace_listed_twice_is_judged_and_stopped_once() {
    let mut h = Harness::new(1, Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    h.coder.repeat_in_listing(true);
    let mut sizes = Vec::new();
    for _ in 0..20 {
        let r = h.pass().await;
        sizes.push(r.eval.len());
        if h.stops_by_admin(a) > 0 {
            break;
        }
    }
    assert!(sizes.iter().all(|n| *n == 1), "one decision per workspace: {sizes:?}");
    for _ in 0..4 {
        h.pass().await;
    }
    assert_eq!(h.posts(), 1, "one stop POST");
    assert_eq!(h.stops_by_admin(a), 1);
}

#[tokio::test]
async fn the_audit_log_records_the_gpu_time_given_back_until_the_workspace_runs_again() {
    let (mut h, path) = audited(Mode::Enforce, |_| {}).await;
    let a = h.workspace("alice", "a", Load::Idle).await;
    for _ in 0..40 {
        h.pass().await;
        if audit_lines(&path).iter().any(|l| l["event"] == "stop_done") {
            break;
        }
    }
    // Two passes with the GPU given back, then alice starts it again.
    h.pass().await;
    h.pass().await;
    h.coder.with(|w| w.create_build(a, "start", w.user_index("alice").unwrap(), "cli")).unwrap();
    for _ in 0..40 {
        h.pass().await;
        if audit_lines(&path).iter().any(|l| l["event"] == "resumed") {
            break;
        }
    }
    let lines = audit_lines(&path);
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    assert_eq!(kinds, vec!["stop_sending", "stop_sent", "stop_done", "resumed"], "{lines:?}");
    assert_eq!(lines[2]["gpus"], 1);
    assert!(lines[3]["gpu_seconds_given_back"].as_i64().is_some_and(|s| s >= 0), "{}", lines[3]);
    let metrics = h.state().metrics.encode();
    assert!(metrics.contains("coder_gpu_reclaimer_gpus_reclaimed_total{template=\"gpu-workspace\"} 1"), "{metrics}");
    assert!(metrics.contains("coder_gpu_reclaimer_gpu_seconds_given_back_total{template=\"gpu-workspace\"}"), "{metrics}");
    std::fs::remove_file(&path).ok();
}
