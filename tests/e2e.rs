//! End-to-end: the real binary (`run --enforce`) against the stateful fakes over loopback HTTP,
//! playing the seed's scenarios with Coder's clocks 60x faster (1 s = 1 Coder minute) and the
//! policy scaled to match (`--idle-after 6s`, `--interval 1s`).

use std::process::Command;
use std::time::{Duration, Instant};

use mocks::{Behaviour, ExporterConfig, FakeCoder, FakeExporter, Fault, Load, WorldConfig};
use reclaimer_core::history::Change;
use serde_json::Value;
use uuid::Uuid;

use crate::common::binary;
use crate::common::service::{Service, connected, exit_of, exporter, holds_gpu, until, until_with, world};

/// Stage 1, scenarios 1-3 (and stage 3, scenario 1): A holds the only GPU and walks away; B waits;
/// A is reclaimed and B runs; A, started again, waits; B shows phantom utilization and is
/// reclaimed; A runs. Home files survive a stop, /tmp files do not.
#[tokio::test]
async fn seed_story_idle_then_phantom() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A gets the GPU", Duration::from_secs(5), |w| connected(w, a)).await;
    coder.with(|w| {
        w.write_file(a, "/home/coder/notes.md");
        w.write_file(a, "/tmp/cache.bin");
    });
    let b = coder.with(|w| w.create_workspace("bob", "b", None)).unwrap();
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    until(&coder, "B waits (Pending)", Duration::from_secs(5), |w| {
        w.ws_index(b).is_some_and(|i| w.workspaces[i].pod.as_ref().is_some_and(|p| p.gpu.is_none()))
    })
    .await;
    until(&coder, "A is stopped and B gets the GPU", Duration::from_secs(30), |w| holds_gpu(w, b) && connected(w, b)).await;
    assert_eq!(coder.with(|w| w.stop_builds_by(a, "admin")), 1);
    let (home, tmp) =
        coder.with(|w| w.ws_index(a).map(|i| (w.workspaces[i].home_files.clone(), w.workspaces[i].tmp_files.clone()))).unwrap();
    assert_eq!((home, tmp), (vec!["/home/coder/notes.md".to_string()], vec![]));
    coder.with(|w| w.set_load(b, Load::Phantom));
    coder.with(|w| w.create_build(a, "start", w.user_index("alice").unwrap(), "cli")).unwrap();
    until_with(&coder, Some(&svc), "B (phantom) is reclaimed and A runs", Duration::from_secs(30), |w| holds_gpu(w, a) && connected(w, a))
        .await;
    assert_eq!(coder.with(|w| w.stop_builds_by(b, "admin")), 1);
    let stops = svc.events("stop_sent");
    assert_eq!(stops.len(), 2);
    let secret = coder.owner_token().split_once('-').map(|(_, s)| s.to_string()).unwrap();
    assert!(!svc.raw().contains(&secret), "the token never appears in the logs");
    assert_eq!(stops[0]["reason"], "idle");
    assert_eq!(stops[1]["reason"], "phantom-utilization");
    // The workspace and the pass come from their spans, flat on the line as operators grep them.
    assert_eq!(
        (stops[0]["workspace_id"].as_str(), stops[0]["owner"].as_str()),
        (Some(a.to_string().as_str()), Some("alice")),
        "{}",
        stops[0]
    );
    assert_eq!(
        (stops[1]["workspace_id"].as_str(), stops[1]["owner"].as_str()),
        (Some(b.to_string().as_str()), Some("bob")),
        "{}",
        stops[1]
    );
    assert!(stops.iter().all(|s| s["template"].is_string() && s["pass"].as_u64().is_some_and(|n| n > 0)), "{stops:?}");
}

/// Stage 1 scenario 5 and stage 3 scenarios 5 and 6: an open connection refreshes last_used_at
/// about every Coder minute and keeps an idle GPU; after the last connection closes, two more
/// refreshes follow, then the threshold runs from the last one.
#[tokio::test]
async fn a_connection_keeps_and_closing_it_reclaims() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A gets the GPU", Duration::from_secs(5), |w| connected(w, a)).await;
    coder.with(|w| w.open_connection(a));
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    let last_used = || coder.with(|w| w.ws_index(a).map(|i| w.workspaces[i].last_used_at).unwrap());
    let mut seen = vec![last_used()];
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = last_used();
        if Some(&t) != seen.last() {
            seen.push(t);
        }
    }
    assert!(seen.len() >= 7, "last_used_at refreshed about every Coder minute while connected: {seen:?}");
    assert_eq!(coder.with(|w| w.stop_builds_by(a, "admin")), 0, "10 s (> idle_after) with an open connection: kept");
    coder.with(|w| w.close_connection(a));
    let closed_at = chrono::Utc::now();
    until(&coder, "A is stopped", Duration::from_secs(30), |w| w.stop_builds_by(a, "admin") == 1).await;
    let final_used = last_used();
    let tail = (final_used - closed_at).num_milliseconds();
    assert!((500..=3500).contains(&tail), "a couple more refreshes after the close (~80 Coder-seconds): {tail} ms");
    let stop = svc.wait_event("stop_sent", Duration::from_secs(1)).await;
    let stopped_at = chrono::DateTime::parse_from_rfc3339(stop["timestamp"].as_str().unwrap()).unwrap();
    assert!((stopped_at.with_timezone(&chrono::Utc) - final_used).num_milliseconds() >= 6000, "idle_after counts from the last refresh");
}

/// Stage 3 scenario 7: the user extended the deadline (200) or disabled autostop (204); an idle
/// GPU is reclaimed all the same.
#[tokio::test]
async fn extended_deadlines_and_disabled_autostop_do_not_protect_an_idle_gpu() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", Some(8 * 3_600_000))).unwrap();
    let b = coder.with(|w| w.create_workspace("bob", "b", Some(8 * 3_600_000))).unwrap();
    until(&coder, "both run", Duration::from_secs(5), |w| connected(w, a) && connected(w, b)).await;
    let http = reqwest::Client::new();
    let put = |user: &str, path: String, body: Value| {
        let token = coder.with(|w| w.token_of(user)).unwrap();
        http.put(format!("{}{path}", coder.url())).header("Coder-Session-Token", token).json(&body).send()
    };
    let far = (chrono::Utc::now() + chrono::Duration::hours(20)).to_rfc3339();
    let r = put("alice", format!("/api/v2/workspaces/{a}/extend"), serde_json::json!({"deadline": far})).await.unwrap();
    assert_eq!(r.status(), 200, "alice extended her deadline");
    let r = put("bob", format!("/api/v2/workspaces/{b}/ttl"), serde_json::json!({"ttl_ms": null})).await.unwrap();
    assert_eq!(r.status(), 204, "bob switched autostop off");
    let _svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    until(&coder, "both stopped", Duration::from_secs(30), |w| w.stop_builds_by(a, "admin") == 1 && w.stop_builds_by(b, "admin") == 1)
        .await;
}

/// Coder 5xx bursts and 429s: the service recovers, stops the idle workspace exactly once, and
/// never the active one.
#[tokio::test]
async fn coder_5xx_bursts_and_429s_lose_nothing_and_never_double_stop() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let idle = coder.with(|w| w.create_workspace("alice", "idle", None)).unwrap();
    let busy = coder.with(|w| w.create_workspace("bob", "busy", None)).unwrap();
    until(&coder, "both run", Duration::from_secs(5), |w| connected(w, idle) && connected(w, busy)).await;
    coder.with(|w| w.set_load(busy, Load::Matmul));
    coder.set_fault("/api/v2/workspaces", Fault { error_rate: 0.4, status: 503, ..Fault::default() });
    coder.set_fault(&format!("/api/v2/workspaces/{idle}/builds"), Fault { fail_next: 2, status: 500, ..Fault::default() });
    coder.set_fault("/api/v2/workspacebuilds", Fault { fail_next: 2, status: 429, drop_next: 1, ..Fault::default() });
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    until(&coder, "the idle one is stopped", Duration::from_secs(40), |w| w.ws_index(idle).is_some_and(|i| w.workspaces[i].pod.is_none()))
        .await;
    // A 429 defers the follow-up to a later pass (after its Retry-After), and 503s on the listing
    // make passes slow: wait for the follow-up rather than for a fixed time.
    svc.wait_event("stop_done", Duration::from_secs(40)).await;
    assert_eq!(coder.with(|w| (w.stop_builds_by(idle, "admin"), w.stop_builds_by(busy, "admin"))), (1, 0));
    assert!(!svc.events("rate_limited").is_empty(), "the 429s were seen and honoured:\n{}", svc.raw());
}

/// An exporter dies: its workspaces become unknown and stay up; the other exporter's idle
/// workspace is still reclaimed.
#[tokio::test]
async fn a_dead_exporter_keeps_its_workspaces_up() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let a = coder.with(|w| w.create_workspace("alice", "on-dead-node", None)).unwrap();
    until(&coder, "A gets GPU 0", Duration::from_secs(5), |w| connected(w, a)).await;
    let b = coder.with(|w| w.create_workspace("bob", "on-live-node", None)).unwrap();
    until(&coder, "B gets GPU 1", Duration::from_secs(5), |w| connected(w, b)).await;
    let mut node0 =
        FakeExporter::start(coder.world.clone(), ExporterConfig { gpus: vec![0], hostname: "node-0".into(), ..ExporterConfig::default() })
            .await
            .unwrap();
    let node1 =
        FakeExporter::start(coder.world.clone(), ExporterConfig { gpus: vec![1], hostname: "node-1".into(), ..ExporterConfig::default() })
            .await
            .unwrap();
    let svc = Service::start(&coder, &[node0.url(), node1.url()], &coder.owner_token(), &[]);
    svc.wait_event("pass", Duration::from_secs(5)).await;
    node0.kill();
    until(&coder, "B is stopped", Duration::from_secs(30), |w| w.stop_builds_by(b, "admin") == 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(coder.with(|w| w.stop_builds_by(a, "admin")), 0, "no data is no reason to stop");
    assert!(svc.events("scrape_failed").iter().any(|e| e["source"] == node0.url()));
}

/// Every exporter reads zero (broken): the breaker holds, nobody is stopped.
#[tokio::test]
async fn all_zero_readings_trip_the_breaker() {
    let coder = FakeCoder::start(world(4)).await.unwrap();
    let ex = exporter(&coder).await;
    let ids: Vec<Uuid> = (0..4).map(|i| coder.with(|w| w.create_workspace("alice", &format!("w{i}"), None)).unwrap()).collect();
    until(&coder, "all run", Duration::from_secs(5), |w| ids.iter().all(|id| connected(w, *id))).await;
    for id in &ids {
        coder.with(|w| {
            w.set_load(*id, Load::Matmul);
            w.open_connection(*id);
            w.close_connection(*id);
        });
    }
    ex.set(|c| c.behaviour = Behaviour::AllZero);
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    let tripped = svc.wait_event("breaker_tripped", Duration::from_secs(25)).await;
    assert_eq!((tripped["reclaimable"].as_u64(), tripped["gpu_workspaces"].as_u64()), (Some(4), Some(4)), "{tripped}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ids.iter().map(|id| coder.with(|w| w.stop_builds_by(*id, "admin"))).sum::<usize>(), 0);
}

/// The service is killed right after sending a stop and started again: no second stop for the
/// workspace being stopped, and the active workspace is never stopped.
#[tokio::test]
async fn killed_and_restarted_mid_story() {
    let world = WorldConfig { build_run: Duration::from_secs(240), ..world(2) };
    let coder = FakeCoder::start(world).await.unwrap();
    let ex = exporter(&coder).await;
    let idle = coder.with(|w| w.create_workspace("alice", "idle", None)).unwrap();
    let busy = coder.with(|w| w.create_workspace("bob", "busy", None)).unwrap();
    until(&coder, "both run", Duration::from_secs(15), |w| connected(w, idle) && connected(w, busy)).await;
    coder.with(|w| w.set_load(busy, Load::Matmul));
    let mut first = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    first.wait_event("stop_sent", Duration::from_secs(30)).await;
    first.kill();
    let second = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    second.wait_event("pass", Duration::from_secs(5)).await;
    until(&coder, "the stop completes", Duration::from_secs(15), |w| w.ws_index(idle).is_some_and(|i| w.workspaces[i].pod.is_none())).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(coder.with(|w| (w.stop_builds_by(idle, "admin"), w.stop_builds_by(busy, "admin"))), (1, 0));
    assert!(second.events("stop_sent").is_empty(), "{}", second.raw());
}

#[tokio::test]
async fn a_member_or_expired_token_exits_2_with_a_clear_message() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let url = coder.url();
    let member = coder.with(|w| w.token_of("alice")).unwrap();
    let (code, text) = exit_of(&["run", "--coder-url", &url, "--dcgm-exporter", &ex.url(), "--listen", "127.0.0.1:0"], &member).await;
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("the token of \"alice\" may not read workspaces") && text.contains("coder tokens create"), "{text}");
    assert!(!text.contains(member.split('-').nth(1).unwrap()), "the token never appears");
    let expired = FakeCoder::start(WorldConfig { owner_token_lifetime: chrono::Duration::hours(-1), ..world(1) }).await.unwrap();
    let token = expired.owner_token();
    let (code, text) = exit_of(&["plan", "--coder-url", &expired.url(), "--dcgm-exporter", &ex.url()], &token).await;
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("API key expired at") && text.contains("expired or revoked"), "{text}");
    assert!(!text.contains(token.split('-').nth(1).unwrap()));
}

/// SIGTERM during a slow pass: no new stop starts, the process exits 0 within 10 s.
#[tokio::test]
async fn sigterm_during_a_pass_exits_cleanly() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let mut svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &[]);
    svc.wait_event("pass", Duration::from_secs(5)).await;
    coder.set_fault("/api/v2/workspaces", Fault { latency: Duration::from_secs(3), ..Fault::default() });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = Instant::now();
    let status = svc.terminate().await;
    assert!(status.success(), "{status:?}\n{}", svc.raw());
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}:\n{}", started.elapsed(), svc.raw());
    assert!(!svc.events("shutdown").is_empty(), "{}", svc.raw());
}

/// `plan --output json` prints the status API's document; `check` passes against the fakes.
#[tokio::test]
async fn plan_json_matches_the_status_api_and_check_passes() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A runs", Duration::from_secs(5), |w| connected(w, a)).await;
    coder.with(|w| w.create_workspace("bob", "b", None)).unwrap();
    let token = coder.owner_token();
    let (code, out) =
        exit_of(&["plan", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url(), "--output", "json", "--sample-for", "2s"], &token)
            .await;
    assert_eq!(code, 0, "{out}");
    let json_start = out.find('{').unwrap();
    let plan: Value = serde_json::from_str(&out[json_start..]).unwrap();
    assert_eq!(plan["mode"], "plan");
    assert!(plan["notes"][0].as_str().unwrap().starts_with("history is short"));
    let svc = Service::start(&coder, &[ex.url()], &token, &[]);
    let addr = svc.addr().await;
    svc.wait_event("pass", Duration::from_secs(5)).await;
    let api: Value = reqwest::get(format!("http://{addr}/api/v1/workspaces")).await.unwrap().json().await.unwrap();
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&plan["workspaces"][0]), keys(&api["workspaces"][0]));
    assert_eq!(plan["workspaces"].as_array().unwrap().len(), api["workspaces"].as_array().unwrap().len());
    // A plan that cannot be written (a full disk, a closed pipe) is an error that says so.
    let args = ["plan", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url(), "--sample-for", "0s"].map(String::from);
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let env_token = token.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(binary()).args(&args).env("CODER_SESSION_TOKEN", env_token).env_remove("CODER_URL").stdout(full).output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("writing the plan: No space left on device"), "{stderr}");
    let (code, out) = exit_of(&["check", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url()], &token).await;
    assert_eq!(code, 0, "{out}");
    for want in [
        "ok   token: belongs to \"admin\"",
        "ok   permission: the token may read and stop workspaces",
        "ok   token expiry: expires",
        "ok   clock: Coder's clock is 0s off this machine's",
        "ok   coverage: 1 of 2 running workspaces",
        "ok   frozen detection: every one of 1 GPU series carries an energy counter",
    ] {
        assert!(out.contains(want), "want {want:?} in\n{out}");
    }
    // No running GPU workspace maps to a series: nothing could ever be judged, so check fails
    // and names the likely cause (here a namespace filter that matches no workspace pod). A
    // workspace id label the series do not carry is no such cause: the pod name maps them.
    for (file, fails) in [("namespace = \"ml\"\n", true), ("workspace_id_label = \"com_coder_workspace_id\"\n", false)] {
        let config = std::env::temp_dir().join(format!("cgr-check-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&config, file).unwrap();
        let args = ["check", "--config", &config.display().to_string(), "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url()];
        let (code, out) = exit_of(&args, &token).await;
        std::fs::remove_file(&config).ok();
        if fails {
            assert_eq!(code, 1, "{out}");
            assert!(out.contains("FAIL coverage: 0 of 2 running workspaces") && out.contains("not the namespace filter \"ml\""), "{out}");
        } else {
            assert_eq!(code, 0, "{out}");
            assert!(out.contains("ok   coverage: 1 of 2 running workspaces"), "{file}: {out}");
        }
    }
    // A trimmed counters file (no energy counter): frozen detection is off, and check says so.
    ex.set(|c| c.counters = mocks::Counters::Trimmed);
    let (code, out) = exit_of(&["check", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url()], &token).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok   frozen detection: off for 1 of 1 GPU series"), "{out}");

    assert!(out.contains(&format!("ok   gpu source: {}: 1 GPU series", ex.url())), "per source, not a total: {out}");
    let (code, out) = exit_of(&["check", "--coder-url", &coder.url(), "--dcgm-exporter", "http://127.0.0.1:9/metrics"], &token).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL gpu source: http://127.0.0.1:9/metrics"), "{out}");
    // A headless-Service name whose every address fails is a failure, not "ok".
    let (code, out) = exit_of(
        &["check", "--coder-url", &coder.url(), "--dcgm-exporter", "dns+http://localhost:9/metrics", "--dcgm-exporter", &ex.url()],
        &token,
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(":9/metrics: no response") && !out.contains("ok   gpu source: dns+"), "{out}");
}

/// The README's first command: `demo` plays the seed story and exits 0 within a minute.
#[tokio::test]
async fn the_demo_plays_the_seed_story() {
    let started = Instant::now();
    let (code, out) = exit_of(&["demo", "--listen", "127.0.0.1:0"], "").await;
    assert_eq!(code, 0, "{out}");
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    for want in [
        "b-notebook (bob)       waiting  waiting-for-gpu",
        "a-train (alice)        reclaim  memory-held-idle",
        "ACTION    stop build sent for a-train (alice)",
        "b-notebook             gpu_assigned GPU 0",
        "a-train (alice)        waiting  waiting-for-gpu",
        "Done: 1 stop build sent for a-train",
        // Busy work survives Coder's autostop, and is reclaimed once it idles.
        "ACTION    Coder's autostop deadline of overnight (bob) moved to ",
        "overnight is past the deadline Coder had set and still training: autostop averted",
        "overnight (bob)        reclaim  idle",
        "ACTION    stop build sent for overnight (bob)",
        "overnight ran past its Coder autostop deadline while training (0 autostop builds)",
        // Coder's countdown: one averted by a return, one stopped by Coder, none by the service.
        "ACTION    Coder's countdown for c-notebook (alice): its deadline moved to ",
        "ACTION    Coder's countdown for c-sweep (bob): its deadline moved to ",
        "c-notebook's countdown is averted",
        "Coder's lifecycle executor stopped c-sweep at its deadline",
        "c-sweep was stopped by Coder at its deadline (0 stop builds by the reclaimer)",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

/// With `gpu_hour_price`, idle and given-back GPU time are counted in money too: the metrics,
/// the page and the audit line of the stop (which `report` prices with).
#[tokio::test]
async fn priced_gpu_time_shows_as_money() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A holds its GPU", Duration::from_secs(5), |w| holds_gpu(w, a)).await;
    let dir = std::env::temp_dir().join(format!("cgr-priced-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    // The fake's GPUs are A10Gs (the seed's).
    std::fs::write(&policy, "gpu_hour_price = { \"NVIDIA A10G\" = 0.75, \"NVIDIA H100*\" = 2.5 }\ncurrency = \"EUR\"\n").unwrap();
    let audit = dir.join("audit.jsonl");
    let svc = Service::start(
        &coder,
        &[ex.url()],
        &coder.owner_token(),
        &["--config", policy.to_str().unwrap(), "--audit-log", audit.to_str().unwrap()],
    );
    until_with(&coder, Some(&svc), "A is stopped", Duration::from_secs(25), |w| !holds_gpu(w, a)).await;
    svc.wait_event("stop_done", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let addr = svc.addr().await;
    let metrics = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    let value = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{template=\"gpu-workspace\",currency=\"EUR\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let idle = value("coder_gpu_reclaimer_gpu_cost_idle_total").unwrap_or_else(|| panic!("{metrics}"));
    let back = value("coder_gpu_reclaimer_gpu_cost_given_back_total").unwrap_or_else(|| panic!("{metrics}"));
    // Seconds of one A10G at 0.75 an hour: small, but counted.
    assert!(idle > 0.0 && idle < 0.75 && back > 0.0 && back < 0.75, "idle {idle}, given back {back}");
    let doc: Value = reqwest::get(format!("http://{addr}/api/v1/workspaces")).await.unwrap().json().await.unwrap();
    assert_eq!(doc["accounting"]["cost"]["currency"], "EUR", "{doc}");
    assert_eq!(doc["accounting"]["recent_stops"][0]["workspace"], "a", "{doc}");
    let page = reqwest::get(format!("http://{addr}/")).await.unwrap().text().await.unwrap();
    assert!(page.contains(r#"id="cost-idle-today""#) && page.contains(" EUR</b>"), "{page}");
    let done = crate::common::audit_lines(&audit).into_iter().find(|l| l["event"] == "stop_done").unwrap();
    assert_eq!((done["gpu_hour_price"].as_f64(), done["currency"].as_str()), (Some(0.75), Some("EUR")), "{done}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `run --history-journal` writes one line per change of a running workspace, not one per pass:
/// first seen running, then (walked away, reclaimed) gone.
#[tokio::test]
async fn the_history_journal_records_each_change_once() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let a = coder.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    until(&coder, "A gets the GPU", Duration::from_secs(5), |w| connected(w, a)).await;
    let dir = crate::common::Scratch::of("cgr-journal", []);
    let path = dir.0.join("history.jsonl");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--history-journal", path.to_str().unwrap()]);
    until_with(&coder, Some(&svc), "A is stopped", Duration::from_secs(30), |w| w.stop_builds_by(a, "admin") == 1).await;
    until_with(&coder, Some(&svc), "the journal says A is gone", Duration::from_secs(10), |_| {
        let mut gone = false;
        let _ = coder_gpu_reclaimer::pass::journal::read_lines(&path, |l| gone |= l.change == Change::Gone);
        gone
    })
    .await;
    let passes = svc.events("pass").len();
    let mut lines = Vec::new();
    let unreadable = coder_gpu_reclaimer::pass::journal::read_lines(&path, |l| lines.push(l)).unwrap();
    assert_eq!(unreadable, 0);
    let mine: Vec<_> = lines.iter().filter(|l| l.workspace_id == a.to_string()).collect();
    assert_eq!(mine.first().map(|l| l.change), Some(Change::Running), "{mine:?}");
    assert_eq!(mine.last().map(|l| l.change), Some(Change::Gone), "{mine:?}");
    assert_eq!((mine[0].owner.as_str(), mine[0].workspace.as_str()), ("alice", "a"));
    assert!(mine.len() < passes, "one line per change ({} lines), not per pass ({passes} passes)", mine.len());
    // Each line but `gone` changes the state the one before it had (the time alone is no change).
    let state = |l: &reclaimer_core::history::JournalLine| (l.build_id.clone(), l.last_used_at, l.agent.clone());
    for pair in mine.windows(2) {
        assert!(pair[1].change == Change::Gone || state(pair[1]) != state(pair[0]), "each line is a change: {pair:?}");
    }
    drop(svc);
}
