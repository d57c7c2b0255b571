//! Coder's own countdown (`countdown_in_coder`): the real binary against the fake Coder, whose
//! `PUT .../extend` lets a deadline move earlier while it stays 29 minutes ahead, whose lifecycle
//! executor stops a workspace once its deadline passes (reason `autostop`), whose activity bump
//! moves the deadline on a connection, and whose autostop reminder is sent once per deadline value
//! (reference coder NOTES §16, §18). Deadlines are wall-clock; Coder's clock is moved forward
//! (`clock_offset`) to reach a deadline 30 minutes away, and the service follows it through
//! coderd's `Date` header.

use std::time::Duration;

use mocks::{FakeCoder, WorldConfig};
use serde_json::Value;
use uuid::Uuid;

use crate::busy_work::{Dir, deadline, extends, status_of, stops_by, strs};
use crate::common::service::{Service, exporter, holds_gpu, running, until, until_with, world};

/// An 8 h autostop TTL: Coder's own deadline is far off.
const EIGHT_HOURS_MS: i64 = 8 * 3600 * 1000;

const COUNTDOWN: &str = "countdown_in_coder = \"30m\"\n";

/// An idle workspace with autostop (`ttl_ms`), nobody connected, holding a GPU.
async fn idle(coder: &FakeCoder, ttl_ms: Option<i64>) -> Uuid {
    let id = coder.with(|w| w.create_workspace("alice", "idle", ttl_ms)).unwrap();
    until(coder, "it holds a GPU", Duration::from_secs(5), |w| holds_gpu(w, id) && running(w, id)).await;
    id
}

/// Moves Coder's clock to `past` after the workspace's deadline.
fn past_the_deadline(coder: &FakeCoder, id: Uuid, past: chrono::Duration) {
    let to = deadline(coder, id).unwrap() + past;
    coder.with(|w| w.config.clock_offset += to - w.now());
}

fn stops_by_the_service(coder: &FakeCoder, id: Uuid) -> usize {
    coder.with(|w| w.stop_builds_by(id, "admin"))
}

/// A story: the fake Coder (`config`), its exporter, one idle workspace with `ttl_ms`, and the
/// service with `countdown_in_coder = "30m"` (enforce mode unless `observing`).
struct Story {
    coder: FakeCoder,
    _exporter: mocks::FakeExporter,
    id: Uuid,
    dir: Dir,
    svc: Service,
}

async fn story(config: WorldConfig, ttl_ms: Option<i64>, observing: bool) -> Story {
    let coder = FakeCoder::start(config).await.unwrap();
    let ex = exporter(&coder).await;
    let id = idle(&coder, ttl_ms).await;
    let dir = Dir::new(COUNTDOWN);
    let start = if observing { Service::start_observing } else { Service::start };
    let svc = start(&coder, &[ex.url()], &coder.owner_token(), &strs(&dir.args()));
    Story { coder, _exporter: ex, id, dir, svc }
}

#[tokio::test]
async fn an_idle_workspace_gets_coders_countdown_and_coder_stops_it() {
    let reminder = WorldConfig { autostop_notify: Some(Duration::from_secs(3600)), ..world(1) };
    let Story { coder, _exporter, id, dir, svc } = story(reminder, Some(EIGHT_HOURS_MS), false).await;
    svc.wait_event("countdown_set", Duration::from_secs(20)).await;
    let (set, now) = (deadline(&coder, id).unwrap(), coder.with(|w| w.now()));
    let ahead = (set - now).num_seconds();
    assert!((30 * 60 - 5..=30 * 60).contains(&ahead), "Coder's now + 30 min: {ahead} s ahead");
    let s = status_of(&svc, id).await;
    assert_eq!(s["verdict"], "warn", "{s}");
    assert!(s["message"].as_str().unwrap().contains("Coder stops it at "), "{s}");
    svc.passes(3, Duration::from_secs(10)).await;
    assert_eq!((extends(&coder, id), stops_by_the_service(&coder, id)), (1, 0), "one move, no stop of its own");
    let reminded = coder.with(|w| w.reminders.clone());
    assert_eq!(reminded, [(id, set)], "Coder's reminder, once for the new deadline");
    // Coder's clock reaches the deadline: its lifecycle executor stops it.
    past_the_deadline(&coder, id, chrono::Duration::seconds(5));
    until_with(&coder, Some(&svc), "Coder's autostop stops it", Duration::from_secs(20), |w| !running(w, id)).await;
    let done = svc.wait_event("countdown_done", Duration::from_secs(20)).await;
    assert_eq!(done["reason"], "idle", "{done}");
    assert_eq!((stops_by(&coder, id, "autostop"), stops_by_the_service(&coder, id)), (1, 0));
    assert_eq!((dir.audit("countdown_set").len(), dir.audit("countdown_done").len()), (1, 1));
    assert_eq!(dir.audit("countdown_done")[0]["gpus"], 1);
}

#[tokio::test]
async fn coming_back_within_the_countdown_averts_it() {
    let Story { coder, _exporter, id, dir, svc } = story(world(1), Some(EIGHT_HOURS_MS), false).await;
    svc.wait_event("countdown_set", Duration::from_secs(20)).await;
    let set = deadline(&coder, id).unwrap();
    coder.with(|w| w.open_connection(id));
    svc.wait_event("countdown_averted", Duration::from_secs(20)).await;
    assert!(deadline(&coder, id).unwrap() > set, "Coder's activity bump moved it");
    past_the_deadline(&coder, id, chrono::Duration::minutes(5));
    svc.passes(3, Duration::from_secs(10)).await;
    assert!(coder.with(|w| running(w, id)), "kept running past the countdown's deadline");
    let all_stops = coder.with(|w| w.workspaces.iter().flat_map(|ws| &ws.builds).filter(|b| b.transition == "stop").count());
    assert_eq!(all_stops, 0, "no stop of any kind");
    let doc: Value = reqwest::get(format!("http://{}/api/v1/workspaces", svc.addr().await)).await.unwrap().json().await.unwrap();
    assert_eq!(doc["accounting"]["countdowns_averted_7d"], 1, "{doc}");
    assert_eq!(dir.audit("countdown_averted").len(), 1);
}

#[tokio::test]
async fn with_coders_executor_silent_the_service_stops_it_after_the_deadline() {
    let Story { coder, _exporter, id, dir, svc } = story(world(1), Some(EIGHT_HOURS_MS), false).await;
    svc.wait_event("countdown_set", Duration::from_secs(20)).await;
    coder.with(|w| w.executor_paused = true);
    // Two 1 s intervals and a minute past the deadline, and Coder has not stopped it.
    past_the_deadline(&coder, id, chrono::Duration::seconds(90));
    until_with(&coder, Some(&svc), "the service stops it", Duration::from_secs(20), |w| w.stop_builds_by(id, "admin") == 1).await;
    assert_eq!(dir.audit("countdown_expired").len(), 1);
    assert_eq!(stops_by(&coder, id, "autostop"), 0);
}

#[tokio::test]
async fn with_autostop_off_the_service_stops_it_itself() {
    let Story { coder, _exporter, id, dir: _dir, svc } = story(world(1), None, false).await;
    until_with(&coder, Some(&svc), "the service stops it", Duration::from_secs(20), |w| w.stop_builds_by(id, "admin") == 1).await;
    assert_eq!(extends(&coder, id), 0, "no deadline to move");
    let said = svc.wait_event("countdown_not_set", Duration::from_secs(1)).await;
    assert!(said["message"].as_str().unwrap_or_default().contains("autostop is off"), "{said}");
}

#[tokio::test]
async fn observe_mode_says_it_would_start_the_countdown_and_sends_nothing() {
    let Story { coder, _exporter, id, dir, svc } = story(world(1), Some(EIGHT_HOURS_MS), true).await;
    svc.wait_event("would_countdown", Duration::from_secs(20)).await;
    let s = status_of(&svc, id).await;
    assert!(s["message"].as_str().unwrap().contains("would start Coder's countdown to "), "{s}");
    svc.passes(3, Duration::from_secs(10)).await;
    assert_eq!((extends(&coder, id), stops_by_the_service(&coder, id)), (0, 0));
    assert_eq!((svc.events("would_countdown").len(), svc.events("would_stop").len()), (1, 0), "said once, no would-stop");
    assert_eq!(dir.audit("would_countdown").len(), 1);
}

/// `backtest` models the countdown as `run` acts: the stop of a reclaim handed to Coder comes at
/// its deadline (30 minutes later than the service's own would), and a use within it averts it:
/// no stop, nothing regretted.
#[test]
fn the_backtest_stops_at_the_countdowns_deadline_unless_someone_comes_back() {
    use chrono::{DateTime, Utc};
    use coder_gpu_reclaimer::pass::policy::Policy;
    use reclaimer_core::backtest::replay::{Chunk, Replay};
    use reclaimer_core::backtest::timeline::{Use, WorkspaceTimeline};

    let now: DateTime<Utc> = DateTime::parse_from_rfc3339("2026-11-29T18:00:00Z").unwrap().with_timezone(&Utc);
    let minute = chrono::Duration::minutes;
    let mut ws = crate::common::running_workspace("1c1d2e3f-0000-4000-8000-000000000001", now - minute(120));
    ws.latest_build.deadline = Some(now + minute(8 * 60));
    let series = [crate::common::idle_gpu_series(&ws, now, -60, 90)];
    // (countdown_in_coder, a use at this minute, the stop's minute after the first reclaim, averted)
    type Row = (Option<u64>, Option<i64>, Option<i64>, u64);
    let rows: [Row; 4] =
        [(None, None, Some(0), 0), (Some(30), None, Some(30), 0), (Some(45), None, Some(45), 0), (Some(30), Some(10), None, 1)];
    for (countdown, used_at, want, averted) in rows {
        let mut policy = Policy { gpu_templates: vec!["gpu-*".into()], ..Policy::defaults(Duration::from_secs(60)) };
        policy.thresholds.countdown_in_coder = countdown.map(|m| Duration::from_secs(m * 60));
        let mut timeline = WorkspaceTimeline::new(ws.clone(), vec![ws.latest_build.clone()]);
        timeline.uses = used_at.map(|m| Use { seen: now + minute(m), last_used_at: now + minute(m) }).into_iter().collect();
        let timelines = [timeline];
        let mut replay = Replay::new("policy".into(), policy, Duration::from_secs(60), Duration::from_secs(3600));
        let chunk = Chunk::new(&series, &timelines, None);
        for m in 0..=60 {
            let since = (m > 0).then(|| now + minute(m - 1));
            replay.pass(now + minute(m), since, &timelines, &chunk, Duration::from_secs(60), now + minute(90));
        }
        let stops: Vec<i64> = replay.stops.iter().map(|s| (s.at - now).num_minutes()).collect();
        assert_eq!((stops.first().copied(), replay.countdowns_averted), (want, averted), "countdown {countdown:?}, use {used_at:?}");
        assert!(replay.stops.iter().all(|s| s.regret.is_none()), "{countdown:?}: an averted countdown is no regret");
    }
}
