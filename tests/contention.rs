//! Contention that is real (`reclaim_when = "contended"`), the real binary against the fake
//! Coder: only GPU templates' workspaces are demand (with `gpu_templates` unset, the templates
//! learned from GPU series), demand is per pool, a task or exempt workspace that waits is demand
//! (it is only never stopped), and a pod that holds a GPU while its agent never connects is
//! judged by its GPU instead of waiting forever. Facts: reference coder NOTES §15-16.

use std::time::Duration;

use mocks::FakeCoder;
use serde_json::Value;
use uuid::Uuid;

use crate::common::service::{Service, exporter, holds_gpu, running, until, until_with, world};

fn stops(coder: &FakeCoder, id: Uuid) -> usize {
    coder.with(|w| w.stop_builds_by(id, "admin"))
}

async fn get(svc: &Service, path: &str) -> Value {
    reqwest::get(format!("http://{}{path}", svc.addr().await)).await.unwrap().json().await.unwrap()
}

/// A workspace that holds a GPU and idles, its owner last seen an hour ago.
async fn idle_on_a_gpu(coder: &FakeCoder, owner: &str, name: &str) -> Uuid {
    let id = coder.with(|w| w.create_workspace(owner, name, None)).unwrap();
    until(coder, &format!("{name} holds a GPU"), Duration::from_secs(5), |w| holds_gpu(w, id) && running(w, id)).await;
    coder.with(|w| {
        let i = w.ws_index(id).unwrap();
        w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
    });
    id
}

fn policy_file(name: &str, text: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("cgr-contention-{name}-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.toml");
    std::fs::write(&path, text).unwrap();
    let arg = path.to_string_lossy().into_owned();
    (dir, arg)
}

/// With `gpu_templates` unset, the GPU template is learned from two workspaces' series over two
/// passes (issue 42); a CPU template's workspace is never demand.
#[tokio::test]
async fn a_cpu_template_starting_is_no_demand_for_a_gpu() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let idle = [idle_on_a_gpu(&coder, "alice", "idle-1").await, idle_on_a_gpu(&coder, "bob", "idle-2").await];
    // A CPU template's workspace whose agent never connects (a crash-looping image): with every
    // template a GPU template it read as waiting for a GPU, and the idle GPU was stopped for it.
    let cpu = coder.with(|w| {
        let id = w.create_workspace_of("bob", "cpu", "cpu-small", false)?;
        w.agent_never_connects(id);
        Ok::<_, mocks::world::ApiError>(id)
    });
    let cpu = cpu.unwrap();
    until(&coder, "the CPU workspace runs", Duration::from_secs(5), |w| running(w, cpu)).await;
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended"]);
    until_kept_for_no_contention(&svc, 2).await;
    svc.passes(2, Duration::from_secs(30)).await;
    assert_eq!(idle.map(|id| stops(&coder, id)), [0, 0], "nobody waits for a GPU:\n{}", svc.raw());
    let s = get(&svc, &format!("/api/v1/workspaces/{cpu}")).await;
    assert_eq!((s["verdict"].as_str(), s["reason"].as_str()), (Some("skip"), Some("no-gpu")), "{s}");
    // A workspace of the GPU template (learned from the idle ones' series) that waits is demand.
    let waiter = coder.with(|w| w.create_workspace("orgadmin", "waiter", None)).unwrap();
    until_with(&coder, Some(&svc), "an idle GPU is given to the waiter", Duration::from_secs(20), |w| holds_gpu(w, waiter)).await;
    assert_eq!(idle.map(|id| stops(&coder, id)).iter().sum::<usize>(), 1);
}

#[tokio::test]
async fn demand_is_per_pool_and_only_that_pools_idle_workspaces_are_stopped() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let idle = idle_on_a_gpu(&coder, "alice", "a10g-idle").await;
    let policy = "gpu_templates = [\"gpu-*\"]\n\n[[rule]]\nworkspace = \"h100-*\"\npool = \"h100\"\n\n[[rule]]\nworkspace = \"a10g-*\"\npool = \"a10g\"\n";
    let (dir, policy) = policy_file("pools", policy);
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended", "--config", &policy]);
    // Someone waits for 8 H100s: the A10G workspace cannot serve them.
    let h100 = coder.with(|w| w.create_workspace("bob", "h100-wait", None)).unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(stops(&coder, idle), 0, "a waiter in another pool stops nothing here:\n{}", svc.raw());
    let s = get(&svc, &format!("/api/v1/workspaces/{h100}")).await;
    assert_eq!(s["verdict"], "waiting", "{s}");
    let doc = get(&svc, "/api/v1/workspaces").await;
    let pool = |name: &str| doc["pools"].as_array().unwrap().iter().find(|p| p["pool"] == name).cloned().unwrap_or_default();
    assert_eq!((pool("h100")["waiting"].as_u64(), pool("h100")["idle"].as_u64()), (Some(1), Some(0)), "{doc}");
    assert_eq!((pool("a10g")["waiting"].as_u64(), pool("a10g")["idle"].as_u64()), (Some(0), Some(1)), "{doc}");
    let idle_status = get(&svc, &format!("/api/v1/workspaces/{idle}")).await;
    assert!(
        idle_status["message"].as_str().unwrap().ends_with("kept: no workspace is waiting for a GPU in its pool \"a10g\""),
        "{idle_status}"
    );
    let metrics = reqwest::get(format!("http://{}/metrics", svc.addr().await)).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "coder_gpu_reclaimer_waiting_workspaces{pool=\"h100\"} 1"), "{metrics}");
    // An A10G waiter: exactly one stop, of the A10G pool's idle workspace.
    coder.with(|w| w.create_workspace("orgadmin", "a10g-wait", None)).unwrap();
    until_with(&coder, Some(&svc), "the A10G waiter gets the idle A10G", Duration::from_secs(20), |w| !holds_gpu(w, idle)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(stops(&coder, idle), 1);
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_task_or_an_exempt_workspace_that_waits_is_demand() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let first = idle_on_a_gpu(&coder, "alice", "idle-1").await;
    let second = idle_on_a_gpu(&coder, "bob", "idle-2").await;
    let (dir, policy) = policy_file("exempt", "[[rule]]\nworkspace = \"vip-*\"\nexempt = true\n");
    let task = coder.with(|w| {
        let id = w.create_workspace("orgadmin", "agent-task", None)?;
        w.make_task(id);
        Ok::<_, mocks::world::ApiError>(id)
    });
    let task = task.unwrap();
    let vip = coder.with(|w| w.create_workspace("orgadmin", "vip-notebook", None)).unwrap();
    until(&coder, "both wait (Pending pods)", Duration::from_secs(5), |w| running(w, task) && running(w, vip)).await;
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended", "--config", &policy]);
    until_with(&coder, Some(&svc), "both idle GPUs are given back", Duration::from_secs(25), |w| {
        !holds_gpu(w, first) && !holds_gpu(w, second)
    })
    .await;
    assert_eq!((stops(&coder, first), stops(&coder, second), stops(&coder, task), stops(&coder, vip)), (1, 1, 0, 0));
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_pod_that_holds_a_gpu_while_its_agent_never_connects_is_judged_by_its_gpu() {
    // The allowance is the longer of start_allowance and the agent's connection_timeout: 2 s.
    let coder = FakeCoder::start(mocks::WorldConfig { connection_timeout_seconds: 2, ..world(1) }).await.unwrap();
    let ex = exporter(&coder).await;
    // An image that never pulls: kubelet keeps the GPU allocated to the pod, the agent never
    // connects. Past start_allowance it used to be `waiting` forever, its GPU never given back.
    let stuck = coder.with(|w| {
        let id = w.create_workspace("alice", "stuck", None)?;
        w.agent_never_connects(id);
        Ok::<_, mocks::world::ApiError>(id)
    });
    let stuck = stuck.unwrap();
    until(&coder, "its pod holds the GPU", Duration::from_secs(5), |w| holds_gpu(w, stuck) && running(w, stuck)).await;
    coder.with(|w| {
        let i = w.ws_index(stuck).unwrap();
        w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
    });
    let (dir, policy) = policy_file("stuck", "start_allowance = \"3s\"\ngpu_templates = [\"gpu-*\"]\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--config", &policy]);
    svc.wait_event("pass", Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    while coder.with(|w| holds_gpu(w, stuck)) && started.elapsed() < Duration::from_secs(25) {
        let s = get(&svc, &format!("/api/v1/workspaces/{stuck}")).await;
        assert_ne!(s["verdict"], "waiting", "a pod that reports a GPU is never waiting: {s}");
        seen.push(format!("{} {}", s["verdict"], s["reason"]));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    until_with(&coder, Some(&svc), "its idle GPU is given back", Duration::from_secs(5), |w| !holds_gpu(w, stuck)).await;
    assert_eq!(stops(&coder, stuck), 1, "{seen:?}");
    assert!(seen.iter().any(|s| s == "\"keep\" \"starting\""), "young, it was starting: {seen:?}");
    std::fs::remove_dir_all(dir).ok();
}

/// The whole picture behind a real Prometheus scraping the fake exporter: in `contended` mode,
/// with a CPU template starting, an H100 waiter and an idle A10G workspace in different pools,
/// and a new A10G start whose pod has its GPU but whose series Prometheus cannot show yet (it
/// answers for complete steps only), no stop is sent; an A10G waiter gets exactly one.
#[tokio::test]
async fn behind_prometheus_only_real_demand_in_the_same_pool_stops_an_idle_gpu() {
    let Some((prometheus, _)) = crate::common::installed_or_skip(crate::prometheus_world::installed(), "prometheus") else { return };
    // Agents take 10 s to connect (600 Coder seconds): a new start stays `connecting` a while.
    let coder = FakeCoder::start(mocks::WorldConfig { agent_connect: Duration::from_secs(600), ..world(2) }).await.unwrap();
    let ex = exporter(&coder).await;
    let idle = coder.with(|w| w.create_workspace("alice", "a10g-idle", None)).unwrap();
    until(&coder, "the idle one's agent connects", Duration::from_secs(20), |w| {
        w.ws_index(idle).and_then(|i| w.workspaces[i].latest()?.agent.clone()).is_some_and(|a| a.first_connected_at.is_some())
    })
    .await;
    coder.with(|w| {
        let i = w.ws_index(idle).unwrap();
        w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
    });
    let target = ex.url().trim_start_matches("http://").trim_end_matches("/metrics").to_string();
    // The GPU Operator's job name: the service reads only the exporter's job (`prometheus_job`).
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: nvidia-dcgm-exporter\n    static_configs:\n      - targets: [\"{target}\"]\n"
    );
    let prom = crate::prometheus_world::Prometheus::start(&prometheus, crate::prometheus_world::Prometheus::folder(), &config).await;
    let policy = "gpu_templates = [\"gpu-*\"]\nexporter_collect_interval = \"1s\"\n\n[[rule]]\nworkspace = \"h100-*\"\npool = \"h100\"\n\n[[rule]]\nworkspace = \"a10g-*\"\npool = \"a10g\"\n";
    let (dir, policy) = policy_file("prometheus", policy);
    let args =
        ["--prometheus-url", &prom.url, "--interval", "2s", "--idle-after", "10s", "--reclaim-when", "contended", "--config", &policy];
    let svc = Service::start(&coder, &[], &coder.owner_token(), &args);
    let eligible = std::time::Instant::now();
    loop {
        let s = get(&svc, &format!("/api/v1/workspaces/{idle}")).await;
        if s["reason"] == "no-contention" {
            break;
        }
        assert!(eligible.elapsed() < Duration::from_secs(40), "the idle A10G never became reclaimable: {s}\n{}", svc.raw());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Now anything counted as demand in the A10G pool would stop it.
    // The new start first: the free GPU goes to the oldest pod, and the H100 one must wait.
    coder.with(|w| {
        let new = w.create_workspace("orgadmin", "a10g-new", None).unwrap();
        w.set_load(new, mocks::Load::Matmul);
        let cpu = w.create_workspace_of("bob", "cpu-notebook", "cpu-small", false).unwrap();
        w.agent_never_connects(cpu);
        w.create_workspace("bob", "h100-train", None).unwrap();
    });
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(stops(&coder, idle), 0, "nobody waits for an A10G:\n{}", svc.raw());
    let doc = get(&svc, "/api/v1/workspaces").await;
    let verdict = |name: &str| {
        let w = doc["workspaces"].as_array().unwrap().iter().find(|w| w["name"] == name).cloned().unwrap_or_default();
        format!("{} {}", w["verdict"].as_str().unwrap_or("-"), w["reason"].as_str().unwrap_or("-"))
    };
    assert_eq!(verdict("h100-train"), "waiting waiting-for-gpu", "{doc}");
    assert_eq!(verdict("cpu-notebook"), "skip no-gpu", "{doc}");
    // The one workspace that really waits for an A10G.
    coder.with(|w| w.create_workspace("alice", "a10g-wait", None)).unwrap();
    until_with(&coder, Some(&svc), "the idle A10G is given back", Duration::from_secs(30), |w| !holds_gpu(w, idle)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let all_stops: usize = coder.with(|w| w.workspaces.iter().map(|ws| w.stop_builds_by(ws.id, "admin")).sum());
    assert_eq!((stops(&coder, idle), all_stops), (1, 1), "exactly one stop");
    std::fs::remove_dir_all(dir).ok();
}

/// One waiter, one stop (issue 41): three idle workspaces and one waiter, and stop builds that run
/// 3 s (180 Coder seconds: the GPU takes several passes to reach the waiter). Every pass sees the
/// waiter still waiting; the stop already sent serves it, and the other idle workspaces are kept.
/// (The job reaper fails a build hung 300 Coder seconds: 180 stays under it.) `source` is the GPU source's flags (`None`: the exporter, scraped directly).
async fn one_waiter_costs_one_stop(source: Option<&std::path::Path>) {
    let coder = FakeCoder::start(mocks::WorldConfig { build_run: Duration::from_secs(180), ..world(3) }).await.unwrap();
    let ex = exporter(&coder).await;
    let idle: Vec<Uuid> =
        ["gpu-a", "gpu-b", "gpu-c"].iter().map(|n| coder.with(|w| w.create_workspace("alice", n, None)).unwrap()).collect();
    until(&coder, "the three hold a GPU", Duration::from_secs(30), |w| idle.iter().all(|id| holds_gpu(w, *id) && running(w, *id))).await;
    coder.with(|w| {
        for id in &idle {
            let i = w.ws_index(*id).unwrap();
            w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
        }
    });
    let prom = match source {
        Some(prometheus) => {
            let target = ex.url().trim_start_matches("http://").trim_end_matches("/metrics").to_string();
            let config = format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: nvidia-dcgm-exporter\n    static_configs:\n      - targets: [\"{target}\"]\n"
            );
            Some(crate::prometheus_world::Prometheus::start(prometheus, crate::prometheus_world::Prometheus::folder(), &config).await)
        }
        None => None,
    };
    let (dir, policy) = policy_file("one-waiter", "exporter_collect_interval = \"1s\"\n");
    let mut args = vec!["--reclaim-when", "contended", "--config", &policy];
    let exporters = match &prom {
        Some(p) => {
            args.extend(["--prometheus-url", p.url.as_str(), "--interval", "2s", "--idle-after", "10s"]);
            vec![]
        }
        None => vec![ex.url()],
    };
    let svc = Service::start(&coder, &exporters, &coder.owner_token(), &args);
    let reclaimable = std::time::Instant::now();
    loop {
        let doc = get(&svc, "/api/v1/workspaces").await;
        let kept = doc["workspaces"].as_array().map_or(0, |ws| ws.iter().filter(|w| w["reason"] == "no-contention").count());
        if kept == 3 {
            break;
        }
        assert!(reclaimable.elapsed() < Duration::from_secs(40), "the idle workspaces never became reclaimable: {doc}\n{}", svc.raw());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let waiter = coder.with(|w| w.create_workspace("orgadmin", "gpu-waiter", None)).unwrap();
    until_with(&coder, Some(&svc), "the waiter gets a GPU", Duration::from_secs(40), |w| holds_gpu(w, waiter)).await;
    svc.passes(2, Duration::from_secs(30)).await;
    let stopped: Vec<usize> = idle.iter().map(|id| stops(&coder, *id)).collect();
    assert_eq!(stopped.iter().sum::<usize>(), 1, "one waiter, one stop: {stopped:?}\n{}", svc.raw());
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn one_waiter_costs_one_stop_while_its_gpu_is_on_the_way() {
    one_waiter_costs_one_stop(None).await;
}

#[tokio::test]
async fn behind_prometheus_one_waiter_costs_one_stop_while_its_gpu_is_on_the_way() {
    let Some((prometheus, _)) = crate::common::installed_or_skip(crate::prometheus_world::installed(), "prometheus") else { return };
    one_waiter_costs_one_stop(Some(&prometheus)).await;
}

/// Waits until the service keeps `n` idle workspaces only for want of a waiter (`no-contention`).
async fn until_kept_for_no_contention(svc: &Service, n: usize) {
    let since = std::time::Instant::now();
    loop {
        let doc = get(svc, "/api/v1/workspaces").await;
        let kept = doc["workspaces"].as_array().map_or(0, |ws| ws.iter().filter(|w| w["reason"] == "no-contention").count());
        if kept == n {
            return;
        }
        assert!(since.elapsed() < Duration::from_secs(40), "never reclaimable: {doc}\n{}", svc.raw());
        svc.passes(1, Duration::from_secs(10)).await;
    }
}

/// A first start whose pod waits for its volume (issue 47; the official template's home PVC,
/// `wait_until_bound = false`, on a `WaitForFirstConsumer` class): for 3 s (180 Coder seconds)
/// its pod is not scheduled and reports no GPU, though a GPU is free. It is `starting`, not a
/// waiter, so the idle workspace is kept. (With `bind_allowance = "0s"` it read as waiting from
/// its second pass on, and the idle GPU was stopped for a start that had a free GPU coming.)
/// The agent's `connection_timeout` is 10 real seconds here (600 Coder seconds): a `timeout`
/// agent is a waiter at once.
#[tokio::test]
async fn a_first_start_binding_its_volume_is_no_demand() {
    let coder = FakeCoder::start(mocks::WorldConfig { connection_timeout_seconds: 600, ..world(2) }).await.unwrap();
    let ex = exporter(&coder).await;
    let idle = idle_on_a_gpu(&coder, "alice", "idle").await;
    coder.with(|w| w.config.volume_bind = Duration::from_secs(180));
    let (dir, policy) = policy_file("binding", "bind_allowance = \"6s\"\n");
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended", "--config", &policy]);
    until_kept_for_no_contention(&svc, 1).await;
    let new = coder.with(|w| w.create_workspace("bob", "first-start", None)).unwrap();
    until(&coder, "its start succeeds, its pod binding", Duration::from_secs(5), |w| running(w, new)).await;
    let s = get(&svc, &format!("/api/v1/workspaces/{new}")).await;
    assert_ne!(s["verdict"], "waiting", "{s}");
    until_with(&coder, Some(&svc), "its pod gets the free GPU once bound", Duration::from_secs(15), |w| holds_gpu(w, new)).await;
    svc.passes(3, Duration::from_secs(30)).await;
    assert_eq!(stops(&coder, idle), 0, "a start whose volume binds is no demand:\n{:?}\n{}", coder.with(|w| w.events.clone()), svc.raw());
    let waited: Vec<Value> = svc.events("pass").iter().filter(|p| p["waiting"].as_u64().unwrap_or(0) > 0).cloned().collect();
    assert!(waited.is_empty(), "no pass counted a waiter: {waited:?}");
    std::fs::remove_dir_all(dir).ok();
}

/// One template with a GPU variant and a CPU variant (`gpu_count` a build parameter, issue 47):
/// the GPU variants' series teach the template (two workspaces over two passes); the CPU
/// variant's start, whose agent never connects (a long image pull), is `skip`/`no-gpu` after one
/// parameter read, and the idle GPUs stay. A GPU variant's start of the same template is demand
/// and gets one.
#[tokio::test]
async fn a_templates_cpu_variant_starting_is_no_demand() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = exporter(&coder).await;
    let idle: Vec<Uuid> = ["ml-gpu-1", "ml-gpu-2"]
        .iter()
        .map(|name| coder.with(|w| w.create_workspace_variant("alice", name, "ml", &[("gpu_count", "1")], true)).unwrap())
        .collect();
    until(&coder, "the GPU variants hold the GPUs", Duration::from_secs(5), |w| idle.iter().all(|id| holds_gpu(w, *id) && running(w, *id)))
        .await;
    coder.with(|w| {
        for id in &idle {
            let i = w.ws_index(*id).unwrap();
            w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
        }
    });
    let cpu = coder.with(|w| {
        let id = w.create_workspace_variant("bob", "ml-cpu", "ml", &[("cpu", "4"), ("gpu_count", "0")], false)?;
        w.agent_never_connects(id);
        Ok::<_, mocks::world::ApiError>(id)
    });
    let cpu = cpu.unwrap();
    until(&coder, "the CPU variant runs", Duration::from_secs(5), |w| running(w, cpu)).await;
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--reclaim-when", "contended"]);
    until_kept_for_no_contention(&svc, 2).await;
    svc.passes(2, Duration::from_secs(30)).await;
    let stopped = |coder: &FakeCoder| idle.iter().map(|id| stops(coder, *id)).sum::<usize>();
    assert_eq!(stopped(&coder), 0, "a CPU variant starting waits for no GPU:\n{}", svc.raw());
    let s = get(&svc, &format!("/api/v1/workspaces/{cpu}")).await;
    assert_eq!((s["verdict"].as_str(), s["reason"].as_str()), (Some("skip"), Some("no-gpu")), "{s}");
    assert!(s["message"].as_str().unwrap().contains("\"gpu_count\" = \"0\""), "{s}");
    let reads = |coder: &FakeCoder| coder.requests().iter().filter(|(m, uri)| m == "GET" && uri.ends_with("/parameters")).count();
    assert_eq!(reads(&coder), 1, "one read per build, not one per pass");
    let waiter = coder.with(|w| w.create_workspace_variant("orgadmin", "ml-gpu-3", "ml", &[("gpu_count", "1")], true)).unwrap();
    until_with(&coder, Some(&svc), "the GPU variant's start gets an idle GPU", Duration::from_secs(20), |w| holds_gpu(w, waiter)).await;
    assert_eq!((stopped(&coder), stops(&coder, cpu)), (1, 0));
    assert_eq!(reads(&coder), 2, "the waiter's build was read too (a GPU variant)");
}

/// `check` names the parameter that tells a template's CPU variants apart (its running
/// workspaces differ in it, one value says no GPU), and says how long a start without a GPU
/// is not yet a waiter.
#[tokio::test]
async fn check_names_the_parameter_that_marks_cpu_variants() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = exporter(&coder).await;
    let gpu = coder.with(|w| w.create_workspace_variant("alice", "ml-gpu", "ml", &[("gpu_count", "1")], true)).unwrap();
    let cpu = coder.with(|w| w.create_workspace_variant("bob", "ml-cpu", "ml", &[("gpu_count", "0")], false)).unwrap();
    until(&coder, "both run", Duration::from_secs(5), |w| holds_gpu(w, gpu) && running(w, cpu)).await;
    let args = ["check", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url(), "--interval", "1s"];
    let (_, out) = crate::common::service::exit_of(&args, &coder.owner_token()).await;
    assert!(out.contains("ok   cpu variants: template \"ml\": gpu_count marks CPU variants (values 0, 1) (2 builds read)"), "{out}");
    assert!(
        out.contains("ok   start grace: a start whose pod reports no GPU yet is starting, not waiting, for 60s after its agent's creation"),
        "{out}"
    );
}
