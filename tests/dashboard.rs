//! The Grafana dashboard's queries against a real Prometheus (Debian's package) that scrapes the
//! real binary during a demo-like story on the fakes: an idle GPU whose first stop build fails
//! and is retried, a session waiting for a GPU that gets it, an exporter that is down. Every
//! PromQL expression in `deploy/grafana/coder-gpu-reclaimer.json` must return data.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use mocks::{FakeCoder, FakeExporter, Load};
use serde_json::Value;

use crate::common::installed_or_skip;
use crate::common::service::{Service, holds_gpu, until, until_with, world};
use crate::prometheus_world::Prometheus;

fn dashboard_queries() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/coder-gpu-reclaimer.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("").to_string();
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_string()))
        })
        .collect()
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_of_this_services_metrics() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    for (title, expr) in &queries {
        assert!(expr.contains("coder_gpu_reclaimer_"), "{title}: {expr}");
    }
}

#[tokio::test]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let Some((prometheus, _)) = installed_or_skip(crate::prometheus_world::installed(), "prometheus") else { return };
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let ex = FakeExporter::start(coder.world.clone(), mocks::ExporterConfig::default()).await.unwrap();
    let busy = coder.with(|w| w.create_workspace("alice", "train", None)).unwrap();
    let idle = coder.with(|w| w.create_workspace("bob", "notebook", None)).unwrap();
    until(&coder, "both hold a GPU", Duration::from_secs(5), |w| holds_gpu(w, busy) && holds_gpu(w, idle)).await;
    coder.with(|w| {
        w.set_load(busy, Load::Matmul);
        w.fail_next_stop(idle);
    });
    let waiter = coder.with(|w| w.create_workspace("alice", "waits", None)).unwrap();
    let dead = format!("http://{}/metrics", TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap());
    // Priced GPU time, for the money panel.
    let policy = std::env::temp_dir().join(format!("cgr-dashboard-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&policy, "gpu_hour_price = { \"NVIDIA A10G\" = 0.75 }\n").unwrap();
    let svc = Service::start(&coder, &[ex.url(), dead], &coder.owner_token(), &["--config", policy.to_str().unwrap()]);
    let addr = svc.addr().await;

    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: reclaimer\n    static_configs:\n      - targets: [\"{addr}\"]\n"
    );
    let prom = Prometheus::start(&prometheus, Prometheus::folder(), &config).await;
    until_with(&coder, Some(&svc), "the waiter gets the idle one's GPU", Duration::from_secs(40), |w| holds_gpu(w, waiter)).await;
    let http = reqwest::Client::new();
    let base = prom.url.clone();
    let query = |expr: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let r: Value = http.get(format!("{base}/api/v1/query")).query(&[("query", expr)]).send().await.ok()?.json().await.ok()?;
            Some(r)
        }
    };
    let started = Instant::now();
    let mut empty: Vec<(String, String)> = dashboard_queries();
    while !empty.is_empty() && started.elapsed() < Duration::from_secs(40) {
        let mut still = Vec::new();
        for (title, expr) in empty {
            let r = query(expr.clone()).await;
            let has_data =
                r.as_ref().is_some_and(|r| r["status"] == "success" && r["data"]["result"].as_array().is_some_and(|a| !a.is_empty()));
            if !has_data {
                still.push((title, expr));
            }
        }
        empty = still;
        if !empty.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    drop(prom);
    std::fs::remove_file(&policy).ok();
    assert!(empty.is_empty(), "queries without data: {empty:#?}");
}
