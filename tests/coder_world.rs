//! The real binary against Coder as it really is (reference NOTES §14), played on the fake:
//! prebuilds, scoped and organization-admin tokens, a token file rotated mid-run, Coder's clock
//! off by two hours, an evicted pod waiting for a GPU, and a stop build no provisioner takes.

use std::time::Duration;

use mocks::{FakeCoder, Load, WorldConfig};
use serde_json::Value;
use uuid::Uuid;

use crate::common::service::{Service, exporter, holds_gpu, running, until, until_with, world};

fn agent_connected(w: &mocks::World, id: Uuid) -> bool {
    w.ws_index(id).and_then(|i| w.workspaces[i].latest()?.agent.clone()).is_some_and(|a| w.agent_status(&a) == "connected")
}

fn stops(coder: &FakeCoder, id: Uuid) -> usize {
    coder.with(|w| w.workspaces.iter().find(|ws| ws.id == id).map_or(0, |ws| ws.builds.iter().filter(|b| b.transition == "stop").count()))
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
    let (code, out) = crate::common::service::exit_of(&args, &scoped).await;
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

/// The audit log's lines about one workspace: their `event` kinds, in order.
fn audit_kinds(path: &std::path::Path, id: Uuid) -> Vec<String> {
    crate::common::audit_lines(path)
        .iter()
        .filter(|v| v["workspace_id"] == id.to_string())
        .map(|v| v["event"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// `PATCH /api/v2/workspacebuilds/{build}/cancel` as `user` (a person canceling a stop): the status.
async fn cancel_as(coder: &FakeCoder, user: &str, build: &str) -> u16 {
    let token = coder.with(|w| w.token_of(user)).unwrap();
    let url = format!("{}/api/v2/workspacebuilds/{build}/cancel", coder.url());
    reqwest::Client::new().patch(url).header("Coder-Session-Token", token).send().await.unwrap().status().as_u16()
}

fn stop_posts(coder: &FakeCoder, id: Uuid) -> usize {
    let path = format!("/api/v2/workspaces/{id}/builds");
    coder.requests().iter().filter(|(m, p)| m == "POST" && *p == path).count()
}

#[tokio::test]
async fn a_reaped_stop_sent_again_stops_the_workspace() {
    let coder = FakeCoder::start(WorldConfig { reaper_pending: Duration::from_secs(5 * 60), ..world(3) }).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| running(w, a)).await;
    coder.with(|w| w.provisioners_down = true);
    let dir = TempDir::new("reaped-ok");
    let config = dir.file("policy.toml", "stop_timeout = \"2s\"\n");
    let audit = dir.0.join("audit.jsonl");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--config", &config, "--audit-log", audit.to_str().unwrap()]);
    svc.wait_event("stop_reaped", Duration::from_secs(30)).await;
    coder.with(|w| w.provisioners_down = false);
    let b = coder.with(|w| w.create_workspace("bob", "b", None)).unwrap();
    until(&coder, "B runs", Duration::from_secs(5), |w| running(w, b)).await;
    until_with(&coder, Some(&svc), "A is stopped by the stop sent again", Duration::from_secs(15), |w| !holds_gpu(w, a)).await;
    svc.wait_event("stop_done", Duration::from_secs(5)).await;
    assert_eq!(stop_posts(&coder, a), 2);
    assert_eq!(
        audit_kinds(&audit, a),
        ["stop_sending", "stop_sent", "stop_stuck", "stop_reaped", "stop_sending", "stop_sent", "stop_done"]
    );
}

/// A stop build canceled by a person (`PATCH /api/v2/workspacebuilds/{id}/cancel`) is their
/// decision about this idle episode: it is never sent again while the workspace stays idle.
/// A new session (started again, idle again) may be stopped.
#[tokio::test]
async fn a_stop_a_person_canceled_is_not_sent_again() {
    // The template lets users cancel their builds (`allow_user_cancel_workspace_jobs`).
    let coder = FakeCoder::start(WorldConfig { allow_user_cancel: true, ..world(1) }).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| running(w, a)).await;
    coder.with(|w| w.stall_next_stop(a));
    let dir = TempDir::new("canceled");
    let audit = dir.0.join("audit.jsonl");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--audit-log", audit.to_str().unwrap()]);
    let sent = svc.wait_event("stop_sent", Duration::from_secs(20)).await;
    let build = sent["build_id"].as_str().unwrap().to_string();
    assert_eq!(cancel_as(&coder, "alice", &build).await, 200);
    svc.wait_event("stop_canceled", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(8)).await; // a failed stop would have been retried twice by now
    assert_eq!(stop_posts(&coder, a), 1, "{}", svc.raw());
    assert!(coder.with(|w| holds_gpu(w, a)));
    assert_eq!(audit_kinds(&audit, a), ["stop_sending", "stop_sent", "stop_canceled"]);
    // Its pod keeps the GPU while Coder lists it `canceled`, not running (reference NOTES §18):
    // the service says so where people look, and does not stop it again.
    let held = svc.wait_event("gpu_held_outside_coder", Duration::from_secs(10)).await;
    assert_eq!(held["workspace_id"], a.to_string(), "{held}");
    svc.passes(1, Duration::from_secs(10)).await; // the pass that said it has published its status
    let doc: Value = reqwest::get(format!("http://{}/api/v1/workspaces", svc.addr().await)).await.unwrap().json().await.unwrap();
    assert_eq!(
        (doc["held_outside"][0]["workspace_id"].as_str(), doc["held_outside"][0]["job_status"].as_str()),
        (Some(a.to_string().as_str()), Some("canceled")),
        "{doc}"
    );
    let metrics = reqwest::get(format!("http://{}/metrics", svc.addr().await)).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "coder_gpu_reclaimer_gpus_held_outside_coder 1"), "{metrics}");
    assert_eq!(stop_posts(&coder, a), 1, "held outside is reported, not stopped again");
    let args = ["check", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url(), "--interval", "1s"];
    let (code, out) = crate::common::service::exit_of(&args, &coder.owner_token()).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL held outside coder: alice/a (latest build: stop, canceled)"), "{out}");
    // Started again by its owner: a new session, idle again, may be stopped.
    coder.with(|w| w.create_build(a, "start", 1, "cli")).unwrap();
    until_with(&coder, Some(&svc), "A's new session is stopped", Duration::from_secs(25), |w| !holds_gpu(w, a)).await;
    assert_eq!(stop_posts(&coder, a), 2);
}

/// Permissions are per organization (reference NOTES §15): a token that is organization admin
/// in one organization and template admin in another stops idle workspaces in the first only;
/// the second's get `skip`/`no-permission` and no POST, and `check` names the organization.
#[tokio::test]
async fn permission_is_asked_per_organization() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let research = coder.with(|w| {
        let org = w.add_organization("research");
        w.grant("orgadmin", org, mocks::OrgRole::TemplateAdmin);
        org
    });
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    let b = coder.with(|w| w.create_workspace_in(research, "bob", "b")).unwrap();
    until(&coder, "A and B run", Duration::from_secs(5), |w| agent_connected(w, a) && agent_connected(w, b)).await;
    let token = coder.with(|w| w.token_of("orgadmin")).unwrap();
    let (code, out) = crate::common::service::exit_of(&["check", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url()], &token).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL organizations: the token may not stop workspaces in \"research\" (1 running)"), "{out}");
    let svc = Service::start(&coder, &[ex.url()], &token, &[]);
    until_with(&coder, Some(&svc), "A is stopped", Duration::from_secs(20), |w| w.stop_builds_by(a, "orgadmin") == 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(stop_posts(&coder, b), 0, "no stop is sent where the token may not stop\n{}", svc.raw());
    let s = status_of(&svc, b).await;
    assert_eq!((s["verdict"].as_str(), s["reason"].as_str()), (Some("skip"), Some("no-permission")), "{s}");
    let missing = svc.events("permission_missing");
    assert_eq!(missing.len(), 1, "said once, not every pass");
    assert_eq!(missing[0]["organization"], "research");
}

/// Every start passes through agent `connecting` (image pull, container start) while its pod
/// already has its GPU: in contended mode that is no reason to stop an idle workspace.
#[tokio::test]
async fn a_starting_workspace_that_has_its_gpu_is_not_waiting() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let idle = coder.with(|w| w.create_workspace("alice", "idle", None)).unwrap();
    until(&coder, "I runs", Duration::from_secs(5), |w| agent_connected(w, idle)).await;
    // A slow image pull: the next pod's agent connects 30 minutes (30 s here) after its GPU.
    coder.with(|w| w.config.agent_connect = Duration::from_secs(30 * 60));
    let new = coder.with(|w| w.create_workspace("bob", "new", None)).unwrap();
    until(&coder, "N has its GPU", Duration::from_secs(5), |w| holds_gpu(w, new)).await;
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended"]);
    tokio::time::sleep(Duration::from_secs(12)).await; // idle_after is 6 s
    assert_eq!(stops(&coder, idle), 0, "nobody waits: N is starting\n{}", svc.raw());
    let s = status_of(&svc, new).await;
    assert_eq!((s["verdict"].as_str(), s["reason"].as_str()), (Some("keep"), Some("starting")), "{s}");
    assert_eq!(status_of(&svc, idle).await["reason"], "no-contention");
}

/// A pod gone for good (a bare pod after an eviction, a lost node) leaves its agent
/// `disconnected` forever: after `agent_lost_after` it stops counting as demand, and the
/// status page says so.
#[tokio::test]
async fn an_agent_lost_for_good_is_not_demand_forever() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let lost = coder.with(|w| w.create_workspace("alice", "lost", None)).unwrap();
    let idle = coder.with(|w| w.create_workspace("bob", "idle", None)).unwrap();
    until(&coder, "both run", Duration::from_secs(5), |w| agent_connected(w, lost) && agent_connected(w, idle)).await;
    coder.with(|w| w.lose_pod(lost));
    let dir = TempDir::new("lost");
    let config = dir.file("policy.toml", "agent_lost_after = \"3s\"\ngpu_templates = [\"gpu-*\"]\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended", "--config", &config]);
    tokio::time::sleep(Duration::from_secs(12)).await; // idle_after is 6 s
    assert_eq!(stops(&coder, idle), 0, "a lost agent is no demand\n{}", svc.raw());
    let s = status_of(&svc, lost).await;
    assert_eq!((s["verdict"].as_str(), s["reason"].as_str()), (Some("unknown"), Some("agent-lost")), "{s}");
    let addr = svc.addr().await;
    let page = reqwest::get(format!("http://{addr}/")).await.unwrap().text().await.unwrap();
    assert!(page.contains("its agent is gone"), "the status page shows it");
}

/// `restore_autostop` on a template that forbids user TTLs: coderd answers 400 (reference
/// NOTES §15). The PUT is sent once, not every pass.
#[tokio::test]
async fn a_ttl_the_template_refuses_is_asked_for_once() {
    let coder = FakeCoder::start(WorldConfig { allow_user_autostop: false, ..world(1) }).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| agent_connected(w, a)).await;
    coder.with(|w| {
        w.set_load(a, Load::Matmul);
        w.open_connection(a);
    });
    let dir = TempDir::new("ttl");
    let config = dir.file("policy.toml", "restore_autostop = \"1h\"\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--config", &config]);
    let refused = svc.wait_event("restore_ttl_refused", Duration::from_secs(10)).await;
    assert!(refused["error"].as_str().unwrap().contains("Custom autostop TTL is not allowed"), "{refused}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let path = format!("/api/v2/workspaces/{a}/ttl");
    let puts = coder.requests().iter().filter(|(m, p)| m == "PUT" && *p == path).count();
    assert_eq!(puts, 1, "{}", svc.raw());
    assert!(svc.events("restore_ttl_failed").is_empty());
}

/// A suspended user's token is refused with 401 "User is not active" (`httpmw/apikey.go`): the
/// fix is to reactivate the account, not a new token.
#[tokio::test]
async fn a_suspended_owner_is_told_to_reactivate_the_account() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    let addr = svc.addr().await;
    svc.wait_event("pass", Duration::from_secs(5)).await;
    coder.with(|w| w.set_user_status("admin", "suspended"));
    let rejected = svc.wait_event("token_rejected", Duration::from_secs(10)).await;
    let message = rejected["message"].as_str().unwrap();
    assert!(message.contains("reactivate the account") && message.contains("does not help"), "{rejected}");
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap().text().await.unwrap();
    assert!(ready.contains("reactivate"), "{ready}");
    coder.with(|w| w.set_user_status("admin", "active"));
    svc.wait_event("token_accepted", Duration::from_secs(10)).await;
}

/// A stop no provisioner takes yet stays pending, and its workspace's `last_used_at` moves after
/// the POST (coderd writes the time of its 60-s flush, not of the use: a use just before the stop
/// reads as after it; reference NOTES §18). Canceling would strand the GPU outside Coder's running
/// workspaces; the service never does: the stop runs once a provisioner frees up and the
/// workspace ends `stopped`, never `canceled`.
#[tokio::test]
async fn a_stop_whose_workspace_is_used_while_pending_ends_stopped_never_canceled() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "it runs", Duration::from_secs(5), |w| running(w, a)).await;
    coder.with(|w| w.stall_next_stop(a));
    let dir = TempDir::new("pending-used");
    let audit = dir.0.join("audit.jsonl");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--audit-log", audit.to_str().unwrap()]);
    until_with(&coder, Some(&svc), "the stop is sent", Duration::from_secs(20), |w| w.stop_builds_by(a, "admin") == 1).await;
    // The usage tracker's flush lands after the POST.
    coder.with(|w| {
        let i = w.ws_index(a).unwrap();
        w.workspaces[i].last_used_at = w.now();
    });
    svc.passes(2, Duration::from_secs(30)).await;
    coder.with(|w| w.release_stalled_stop(a));
    until_with(&coder, Some(&svc), "the stop runs to its end", Duration::from_secs(20), |w| {
        w.workspaces[w.ws_index(a).unwrap()].latest().is_some_and(|b| b.transition == "stop" && b.job.status == "succeeded")
    })
    .await;
    svc.wait_event("stop_done", Duration::from_secs(10)).await;
    let patches = coder.requests().iter().filter(|(m, _)| m == "PATCH").count();
    assert_eq!((patches, stop_posts(&coder, a)), (0, 1), "never canceled, sent once");
    let kinds = audit_kinds(&audit, a);
    assert_eq!(kinds.first().map(String::as_str), Some("stop_sending"), "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("stop_done"), "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "stop_canceled" || k == "stop_withdrawn"), "{kinds:?}");
}

/// coderd matches a job to provisioners by organization and tags (reference NOTES §16): a start
/// that completed on an untagged provisioner says nothing about the `gpu=true` one its stop needs.
/// A stop Coder answers with `matched_provisioners.available = 0` holds every new stop that needs
/// the same tags; once reaped it is sent again only when the organization's daemon listing shows
/// a matching provisioner, not because some other build completed; stops of other tags go on.
#[tokio::test]
async fn stops_wait_for_a_provisioner_that_matches_their_tags() {
    // coderd's reaper fails a job pending 30 minutes: 6 here (6 s at 60x).
    let coder = FakeCoder::start(WorldConfig { reaper_pending: Duration::from_secs(6 * 60), ..world(3) }).await.unwrap();
    let ex = exporter(&coder).await;
    let gpu_daemon = coder.with(|w| w.add_provisioner("gpu-provisioner", 0, &[("gpu", "true")], true));
    let tagged = |w: &mut mocks::World, owner: &str, name: &str| {
        let id = w.create_workspace(owner, name, None).unwrap();
        w.set_job_tags(id, &[("gpu", "true")]);
        id
    };
    let a = coder.with(|w| tagged(w, "alice", "a"));
    let b = coder.with(|w| tagged(w, "bob", "b"));
    let plain = coder.with(|w| w.create_workspace("orgadmin", "plain", None)).unwrap();
    until(&coder, "all three run", Duration::from_secs(5), |w| running(w, a) && running(w, b) && running(w, plain)).await;
    // The GPU provisioner goes away, long enough to be unseen (90 Coder seconds: 1.5 s).
    coder.with(|w| w.provisioners[gpu_daemon].online = false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dir = TempDir::new("provisioners");
    let audit = dir.0.join("audit.jsonl");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--audit-log", audit.to_str().unwrap()]);
    svc.wait_event("no_provisioner", Duration::from_secs(20)).await;
    until_with(&coder, Some(&svc), "the untagged one is stopped", Duration::from_secs(10), |w| !holds_gpu(w, plain)).await;
    assert_eq!(stop_posts(&coder, a) + stop_posts(&coder, b), 1, "one gpu=true stop is sent, the other held:\n{}", svc.raw());
    let (first, held) = if stop_posts(&coder, a) == 1 { (a, b) } else { (b, a) };
    assert!(!svc.events("stop_held").is_empty());
    let doc: Value = reqwest::get(format!("http://{}/api/v1/workspaces", svc.addr().await)).await.unwrap().json().await.unwrap();
    assert_eq!(doc["no_provisioner"][0]["tags"]["gpu"], "true", "{doc}");
    svc.wait_event("stop_reaped", Duration::from_secs(15)).await;
    // Another build completes in the organization: no sign of a gpu=true provisioner.
    let other = coder.with(|w| w.create_workspace("alice", "other", None)).unwrap();
    until(&coder, "another build completes", Duration::from_secs(5), |w| running(w, other)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!((stop_posts(&coder, first), stop_posts(&coder, held)), (1, 0), "not sent into the same outage:\n{}", svc.raw());
    assert!(coder.with(|w| holds_gpu(w, first)), "the reaped one keeps its GPU meanwhile");
    // The GPU provisioner answers again: the reaped stop is sent once more, the held one goes.
    coder.with(|w| w.provisioners[gpu_daemon].online = true);
    until_with(&coder, Some(&svc), "both gpu=true workspaces are stopped", Duration::from_secs(20), |w| {
        !holds_gpu(w, first) && !holds_gpu(w, held)
    })
    .await;
    assert_eq!((stop_posts(&coder, first), stop_posts(&coder, held)), (2, 1));
}

/// Behind nginx the `Date` header is the proxy's clock, not coderd's (`ngx_http_proxy_module`
/// does not pass the upstream's `Date`): `check` says so when the header is earlier than times
/// Coder itself wrote into the listing (issue 34), and says nothing without a proxy.
#[tokio::test]
async fn check_names_a_proxys_date_header() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| agent_connected(w, a)).await;
    let token = coder.owner_token();
    let args = ["check", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url()];
    let (_, out) = crate::common::service::exit_of(&args, &token).await;
    assert!(!out.contains("warn clock"), "coderd's own Date: {out}");
    coder.with(|w| w.config.proxy_clock_offset = Some(chrono::Duration::minutes(-10)));
    let (_, out) = crate::common::service::exit_of(&args, &token).await;
    let behind: i64 =
        out.split("warn clock: the Date header is ").nth(1).and_then(|r| r.split('s').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!((590..=610).contains(&behind), "ten minutes behind: {out}");
    assert!(out.contains("a proxy's in front of it (nginx writes its own Date)"), "{out}");
}
