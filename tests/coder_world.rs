//! The real binary against Coder as it really is (reference NOTES §14), played on the fake:
//! prebuilds, scoped and organization-admin tokens, a token file rotated mid-run, Coder's clock
//! off by two hours, an evicted pod waiting for a GPU, and a stop build no provisioner takes.

use std::time::Duration;

use mocks::{FakeCoder, FakeExporter, Load, WorldConfig};
use serde_json::Value;
use uuid::Uuid;

use crate::e2e::{Service, holds_gpu, until, until_with, world};

fn running(w: &mocks::World, id: Uuid) -> bool {
    w.ws_index(id).is_some_and(|i| w.is_running(&w.workspaces[i]))
}

fn agent_connected(w: &mocks::World, id: Uuid) -> bool {
    w.ws_index(id).and_then(|i| w.workspaces[i].latest()?.agent.clone()).is_some_and(|a| w.agent_status(&a) == "connected")
}

fn stops(coder: &FakeCoder, id: Uuid) -> usize {
    coder.with(|w| w.workspaces.iter().find(|ws| ws.id == id).map_or(0, |ws| ws.builds.iter().filter(|b| b.transition == "stop").count()))
}

async fn exporter(coder: &FakeCoder) -> FakeExporter {
    FakeExporter::start(coder.world.clone(), mocks::ExporterConfig::default()).await.unwrap()
}

async fn status_of(svc: &Service, id: Uuid) -> Value {
    let addr = svc.addr().await;
    reqwest::get(format!("http://{addr}/api/v1/workspaces/{id}")).await.unwrap().json().await.unwrap()
}

/// A temp file that is removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("cgr-{name}-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn file(&self, name: &str, contents: &str) -> String {
        let p = self.0.join(name);
        // Written beside, then renamed: the way Kubernetes swaps a mounted Secret (atomically).
        let tmp = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, contents).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p.to_string_lossy().into()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

#[tokio::test]
async fn prebuilds_are_never_stopped_nor_waited_for() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let held = coder.with(|w| w.create_prebuild("pre-held")).unwrap();
    let user = coder.with(|w| w.create_workspace("alice", "idle", None)).unwrap();
    until(&coder, "both hold a GPU", Duration::from_secs(5), |w| holds_gpu(w, held) && holds_gpu(w, user)).await;
    let pending = coder.with(|w| w.create_prebuild("pre-pending")).unwrap();
    until(&coder, "the second prebuild runs (Pending pod)", Duration::from_secs(5), |w| running(w, pending)).await;
    // Contended: a Pending prebuild is no person waiting, so the idle user is kept.
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended"]);
    svc.wait_event("pass", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(11)).await; // idle_after is 6 s
    assert_eq!((stops(&coder, held), stops(&coder, user), stops(&coder, pending)), (0, 0, 0), "{}", svc.raw());
    let s = status_of(&svc, held).await;
    assert_eq!((s["verdict"].as_str(), s["reason"].as_str()), (Some("skip"), Some("prebuild")), "{s}");
    let u = status_of(&svc, user).await;
    assert_eq!(u["reason"], "no-contention", "{u}");
    drop(svc);
    // Always: the idle user is stopped, the idle prebuild never.
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    until_with(&coder, Some(&svc), "the idle user is stopped", Duration::from_secs(20), |w| !holds_gpu(w, user)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!((stops(&coder, held), stops(&coder, pending)), (0, 0), "prebuilds are never stopped");
}

#[tokio::test]
async fn a_token_that_may_not_stop_exits_2_in_enforce_mode_and_an_org_admin_may() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    // An owner's token with a narrow scope passes `users/me` (the owner role) but may not stop.
    let scoped = coder.with(|w| w.create_token("admin", &["workspace:read"], chrono::Duration::days(7))).unwrap();
    let args = ["run", "--enforce", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url(), "--listen", "127.0.0.1:0"];
    let (code, out) = crate::e2e::exit_of(&args, &scoped).await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("may not stop workspaces") && out.contains("--scope"), "{out}");
    // An organization admin may stop workspaces of its organization.
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| running(w, a)).await;
    let org_admin = coder.with(|w| w.token_of("orgadmin")).unwrap();
    let svc = Service::start(&coder, &[ex.url()], &org_admin, &[]);
    until_with(&coder, Some(&svc), "A is stopped by the org admin", Duration::from_secs(20), |w| w.stop_builds_by(a, "orgadmin") == 1)
        .await;
    assert!(svc.events("permission_missing").is_empty());
}

#[tokio::test]
async fn a_rotated_token_file_keeps_the_service_working_without_a_restart() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let dir = TempDir::new("rotate");
    let first = coder.owner_token();
    let path = dir.file("token", &format!("{first}\n"));
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| running(w, a)).await;
    coder.with(|w| w.set_load(a, Load::Matmul));
    let svc = Service::start(&coder, &[ex.url()], "", &["--token-file", &path]);
    let addr = svc.addr().await;
    svc.wait_event("pass", Duration::from_secs(5)).await;
    // The token is revoked before the Secret is updated: passes fail with 401, /readyz says why.
    coder.with(|w| w.revoke_token(&first));
    let rejected = svc.wait_event("token_rejected", Duration::from_secs(10)).await;
    assert!(rejected["message"].as_str().unwrap().contains("put a new one in the token file"), "{rejected}");
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503);
    assert!(ready.text().await.unwrap().contains("Coder rejects the token"));
    // The Secret is rotated in place: the service picks the new token up by itself.
    let second = coder.with(|w| w.create_token("admin", &[], chrono::Duration::days(7))).unwrap();
    dir.file("token", &format!("{second}\n"));
    svc.wait_event("token_accepted", Duration::from_secs(10)).await;
    assert!(!svc.events("token_reloaded").is_empty());
    assert_eq!(reqwest::get(format!("http://{addr}/readyz")).await.unwrap().status(), 200);
    coder.with(|w| w.set_load(a, Load::Idle));
    until_with(&coder, Some(&svc), "A is stopped with the new token", Duration::from_secs(20), |w| w.stop_builds_by(a, "admin") == 1).await;
    let logs = svc.raw();
    assert!(!logs.contains(first.split('-').nth(1).unwrap()) && !logs.contains(second.split('-').nth(1).unwrap()), "no token in the logs");
}

#[tokio::test]
async fn coders_clock_two_hours_behind_does_not_stop_a_connected_user() {
    let coder = FakeCoder::start(WorldConfig { clock_offset: chrono::Duration::hours(-2), ..world(2) }).await.unwrap();
    let ex = exporter(&coder).await;
    let connected = coder.with(|w| w.create_workspace("alice", "connected", None)).unwrap();
    let away = coder.with(|w| w.create_workspace("bob", "away", None)).unwrap();
    until(&coder, "both run", Duration::from_secs(5), |w| agent_connected(w, connected) && agent_connected(w, away)).await;
    coder.with(|w| w.open_connection(connected));
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    until_with(&coder, Some(&svc), "the disconnected idle one is stopped", Duration::from_secs(25), |w| !holds_gpu(w, away)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stops(&coder, connected), 0, "a connected user is kept although last_used_at reads 2 h old here:\n{}", svc.raw());
    let skew = svc.wait_event("clock_skew", Duration::from_secs(1)).await;
    let offset = skew["offset_seconds"].as_i64().unwrap();
    assert!((offset + 7200).abs() <= 2, "{skew}");
    let addr = svc.addr().await;
    let metrics = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("coder_gpu_reclaimer_coder_clock_offset_seconds -72"), "{metrics}");
}

#[tokio::test]
async fn an_evicted_workspace_counts_as_demand() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let evicted = coder.with(|w| w.create_workspace("alice", "evicted", None)).unwrap();
    until(&coder, "E runs", Duration::from_secs(5), |w| agent_connected(w, evicted)).await;
    let idle = coder.with(|w| w.create_workspace("bob", "idle", None)).unwrap();
    until(&coder, "I runs", Duration::from_secs(5), |w| agent_connected(w, idle)).await;
    coder.with(|w| w.set_load(evicted, Load::Matmul));
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended"]);
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(stops(&coder, idle), 0, "nobody waits yet: contended mode keeps the idle one");
    // E's node is drained: its pod is evicted and waits; its agent shows `disconnected`.
    let node = coder.with(|w| w.gpu_holders.iter().position(|h| *h == Some(evicted))).unwrap();
    coder.with(|w| w.drain_gpu(node));
    until_with(&coder, Some(&svc), "I is stopped for E, and E gets its GPU", Duration::from_secs(25), |w| {
        holds_gpu(w, evicted) && agent_connected(w, evicted)
    })
    .await;
    assert_eq!(stops(&coder, idle), 1);
    assert_eq!(stops(&coder, evicted), 0);
}

#[tokio::test]
async fn a_stuck_stop_build_is_reported_once_and_never_resent() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| running(w, a)).await;
    coder.with(|w| w.stall_next_stop(a));
    let dir = TempDir::new("stuck");
    let config = dir.file("policy.toml", "stop_timeout = \"3s\"\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--config", &config]);
    let stuck = svc.wait_event("stop_stuck", Duration::from_secs(25)).await;
    assert_eq!(stuck["workspace_id"], a.to_string());
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(svc.events("stop_stuck").len(), 1, "reported once");
    assert_eq!(coder.with(|w| w.stop_builds_by(a, "admin")), 1, "never sent again while pending");
    let addr = svc.addr().await;
    let doc: Value = reqwest::get(format!("http://{addr}/api/v1/workspaces")).await.unwrap().json().await.unwrap();
    assert_eq!(doc["stuck_stops"][0]["workspace_id"], a.to_string(), "{doc}");
    let metrics = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("coder_gpu_reclaimer_stuck_stops 1") && metrics.contains("kind=\"stuck\"} 1"), "{metrics}");
}
