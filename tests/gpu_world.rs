//! The real binary against GPU readings as real exporters produce them (reference dcgm NOTES §9):
//! bursts that fall between passes, shared GPUs, stuck counters, video work and frozen data.
//! Each would read as idle to a naive reader; none may be stopped. An idle GPU beside them is.

use std::time::Duration;

use mocks::{ExporterConfig, FakeCoder, FakeExporter, Load, Stuck};
use serde_json::Value;
use uuid::Uuid;

use crate::common::service::{Service, holds_gpu, until, until_with, world};

fn stops(coder: &FakeCoder, id: Uuid) -> usize {
    coder.with(|w| w.stop_builds_by(id, "admin"))
}

/// A workspace that holds a GPU with `load`, and that GPU's pool slot.
async fn on_gpu(coder: &FakeCoder, name: &str, load: Load) -> (Uuid, usize) {
    let id = coder.with(|w| w.create_workspace("alice", name, None)).unwrap();
    until(coder, &format!("{name} holds a GPU"), Duration::from_secs(5), |w| holds_gpu(w, id)).await;
    coder.with(|w| w.set_load(id, load));
    let slot = coder.with(|w| w.gpu_holders.iter().position(|h| *h == Some(id))).unwrap();
    (id, slot)
}

/// One exporter per node: this one serves only GPU `slot`, configured by `tune`.
async fn exporter_for(coder: &FakeCoder, slot: usize, tune: impl FnOnce(&mut ExporterConfig)) -> FakeExporter {
    let mut cfg = ExporterConfig { gpus: vec![slot], hostname: format!("gpu-node-{slot}"), ..ExporterConfig::default() };
    tune(&mut cfg);
    FakeExporter::start(coder.world.clone(), cfg).await.unwrap()
}

async fn reason_of(addr: &str, id: Uuid) -> (String, String) {
    let v: Value = reqwest::get(format!("http://{addr}/api/v1/workspaces/{id}")).await.unwrap().json().await.unwrap();
    (v["verdict"].as_str().unwrap_or("").to_string(), v["reason"].as_str().unwrap_or("").to_string())
}

#[tokio::test]
async fn a_bursty_workload_is_never_stopped_while_an_idle_one_beside_it_is() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    // 2 s of compute every 5 s (twice the sampling step, so a sample always lands in a burst);
    // the exporter collects every second.
    let bursty = Load::Bursty { period: Duration::from_secs(5), busy: Duration::from_secs(2) };
    let (notebook, a) = on_gpu(&coder, "notebook", bursty).await;
    let (idle, b) = on_gpu(&coder, "idle", Load::MemoryOnly).await;
    let collect = |c: &mut ExporterConfig| c.collect_interval = Duration::from_secs(1);
    let (ea, eb) = (exporter_for(&coder, a, collect).await, exporter_for(&coder, b, collect).await);
    // Passes every 5 s keep one phase of the 5 s cycle: three times in five they never see a
    // burst, and without sampling the notebook is stopped (checked by hand with
    // --sample-interval 5s). idle_after is three bursts long: a busy machine that delays a sample
    // (CI runs many tests at once) must not read as a missed burst.
    let args = ["--interval", "5s", "--sample-interval", "1s", "--idle-after", "15s"];
    let svc = Service::start(&coder, &[ea.url(), eb.url()], &coder.owner_token(), &args);
    until_with(&coder, Some(&svc), "the idle one is stopped", Duration::from_secs(60), |w| !holds_gpu(w, idle)).await;
    // Half a minute more of passes and samples: the bursts keep the notebook from being stopped.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(stops(&coder, notebook), 0, "every burst was seen between passes:\n{}", svc.raw());
    let addr = svc.addr().await;
    let (verdict, reason) = reason_of(&addr, notebook).await;
    assert_ne!(verdict, "reclaim", "{reason}");
}

#[tokio::test]
async fn busy_gpus_that_read_idle_are_never_stopped() {
    let coder = FakeCoder::start(world(6)).await.unwrap();
    let (idle, s0) = on_gpu(&coder, "idle", Load::Idle).await;
    let (shared, s1) = on_gpu(&coder, "shared", Load::Matmul).await;
    let (stuck_gr, s2) = on_gpu(&coder, "stuck-gr", Load::Matmul).await;
    let (stuck_sm, s3) = on_gpu(&coder, "stuck-sm", Load::Matmul).await;
    let (encode, s4) = on_gpu(&coder, "encode", Load::Encode).await;
    let (frozen, s5) = on_gpu(&coder, "frozen", Load::Idle).await;
    let exporters = [
        exporter_for(&coder, s0, |_| {}).await,
        // Time-slicing in virtual-GPU mode without hostPID: the pod's own utilization and memory read 0.
        exporter_for(&coder, s1, |c| c.virtual_gpus = mocks::VirtualGpus::TimeSliced).await,
        // The default counters file: no SM_ACTIVE, and GR_ENGINE_ACTIVE stuck at 0 under load.
        exporter_for(&coder, s2, |c| {
            c.sm_active = false;
            c.stuck = Some(Stuck::GrEngine);
        })
        .await,
        exporter_for(&coder, s3, |c| c.stuck = Some(Stuck::SmActive)).await,
        exporter_for(&coder, s4, |_| {}).await,
        // A hung hostengine: the first collection is served forever.
        exporter_for(&coder, s5, |c| c.frozen = true).await,
    ];
    let urls: Vec<String> = exporters.iter().map(FakeExporter::url).collect();
    let dir = std::env::temp_dir().join(format!("cgr-gpu-world-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("policy.toml");
    // The fakes collect at every scrape: as an exporter run with `-c 1000`.
    std::fs::write(&config, "frozen_after = \"4s\"\nexporter_collect_interval = \"1s\"\n").unwrap();
    let svc = Service::start(&coder, &urls, &coder.owner_token(), &["--config", config.to_str().unwrap()]);
    until_with(&coder, Some(&svc), "the idle GPU is given back", Duration::from_secs(25), |w| !holds_gpu(w, idle)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let addr = svc.addr().await;
    for (id, what, want) in [
        (shared, "a shared GPU whose device computes", ("keep", "gpu-active")),
        (stuck_gr, "GR stuck at 0 while utilization reads 100%", ("unknown", "metrics-disagree")),
        (stuck_sm, "SM stuck at 0 while GR reads 1.0", ("unknown", "metrics-disagree")),
        (encode, "video encoding only", ("keep", "gpu-active")),
        (frozen, "frozen readings", ("unknown", "frozen-data")),
    ] {
        assert_eq!(stops(&coder, id), 0, "{what} was stopped:\n{}", svc.raw());
        let (verdict, reason) = reason_of(&addr, id).await;
        assert_eq!((verdict.as_str(), reason.as_str()), want, "{what}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A reclaim needs fresh data (reference dcgm NOTES §3, §10): with `idle_after` (6 s) shorter than
/// two exporter collections (`exporter_collect_interval` 10 s, so frozen detection waits 20 s
/// or `frozen_after`, 3 minutes), a GPU whose hostengine serves its last idle collection was
/// reclaimed on the idle clock alone. Its energy counter has not risen: `unknown`, never stopped.
/// The idle GPU beside it, whose counter rises, is.
#[tokio::test]
async fn a_frozen_exporter_is_not_stopped_when_idle_after_is_shorter_than_two_collections() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let (frozen, s0) = on_gpu(&coder, "frozen", Load::Idle).await;
    let (idle, s1) = on_gpu(&coder, "idle", Load::Idle).await;
    let exporters = [exporter_for(&coder, s0, |c| c.frozen = true).await, exporter_for(&coder, s1, |_| {}).await];
    let urls: Vec<String> = exporters.iter().map(FakeExporter::url).collect();
    let dir = std::env::temp_dir().join(format!("cgr-gpu-world-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("policy.toml");
    std::fs::write(&config, "exporter_collect_interval = \"10s\"\n").unwrap();
    let svc = Service::start(&coder, &urls, &coder.owner_token(), &["--config", config.to_str().unwrap()]);
    until_with(&coder, Some(&svc), "the idle GPU is given back", Duration::from_secs(25), |w| !holds_gpu(w, idle)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(stops(&coder, frozen), 0, "a frozen exporter's GPU was stopped:\n{}", svc.raw());
    let (verdict, reason) = reason_of(&svc.addr().await, frozen).await;
    assert_eq!((verdict.as_str(), reason.as_str()), ("unknown", "frozen-data"));
    std::fs::remove_dir_all(&dir).ok();
}
