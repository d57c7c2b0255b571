//! Behind a real Prometheus, the exporter's scrape job is found wherever it is put (issue 42):
//! with `prometheus_job` unset, the one job that carries dcgm-exporter's series is read (NVIDIA's
//! kube-prometheus-stack recipe names it `gpu-metrics`); two such jobs read nothing, the status
//! document and the page say why, and `check` names both with their series counts; a list of
//! jobs reads each. Facts: reference dcgm NOTES §12.

use std::time::Duration;

use mocks::{ExporterConfig, FakeCoder, FakeExporter};
use serde_json::Value;
use uuid::Uuid;

use crate::common::service::{Service, exit_of, holds_gpu, running, until, until_with, world};
use crate::prometheus_world::Prometheus;

async fn get(svc: &Service, path: &str) -> Value {
    reqwest::get(format!("http://{}{path}", svc.addr().await)).await.unwrap().json().await.unwrap()
}

/// Idle workspaces on GPUs, their owners last seen an hour ago.
async fn idle_on_gpus(coder: &FakeCoder, names: &[&str]) -> Vec<Uuid> {
    let ids: Vec<Uuid> = names.iter().map(|n| coder.with(|w| w.create_workspace("alice", n, None)).unwrap()).collect();
    until(coder, "they hold GPUs", Duration::from_secs(10), |w| ids.iter().all(|id| holds_gpu(w, *id) && running(w, *id))).await;
    coder.with(|w| {
        for id in &ids {
            let i = w.ws_index(*id).unwrap();
            w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
        }
    });
    ids
}

fn target(ex: &FakeExporter) -> String {
    ex.url().trim_start_matches("http://").trim_end_matches("/metrics").to_string()
}

/// A Prometheus scraping every second, one scrape job per `(job, exporter)`, returned once it
/// holds a series of each job (a discovery before a job's first scrape finds the others only).
async fn prometheus(jobs: &[(&str, &FakeExporter)]) -> Option<Prometheus> {
    let (bin, _) = crate::common::installed_or_skip(crate::prometheus_world::installed(), "prometheus")?;
    let mut config = "global:\n  scrape_interval: 1s\nscrape_configs:\n".to_string();
    for (job, ex) in jobs {
        config.push_str(&format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"{}\"]\n", target(ex)));
    }
    let prom = Prometheus::start(&bin, Prometheus::folder(), &config).await;
    let since = std::time::Instant::now();
    loop {
        let url = format!("{}/api/v1/query?query=count%20by%20(job)%20(DCGM_FI_DEV_FB_USED)", prom.url);
        let answer: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        if answer["data"]["result"].as_array().is_some_and(|r| r.len() == jobs.len()) {
            return Some(prom);
        }
        assert!(since.elapsed() < Duration::from_secs(20), "Prometheus never scraped every job: {answer}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn behind<'a>(prom: &'a Prometheus, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--prometheus-url", prom.url.as_str(), "--interval", "2s", "--idle-after", "10s"];
    args.extend(extra);
    args
}

#[tokio::test]
async fn a_single_job_named_otherwise_is_found_and_its_idle_gpu_reclaimed() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = crate::common::service::exporter(&coder).await;
    let Some(prom) = prometheus(&[("gpu-metrics", &ex)]).await else { return };
    let idle = idle_on_gpus(&coder, &["idle"]).await;
    let svc = Service::start(&coder, &[], &coder.owner_token(), &behind(&prom, &[]));
    until_with(&coder, Some(&svc), "the idle GPU is given back", Duration::from_secs(40), |w| !holds_gpu(w, idle[0])).await;
    let found = svc.events("prometheus_job_discovered");
    assert_eq!(found.len(), 1, "logged once: {found:?}");
    assert_eq!(found[0]["jobs"], "[\"gpu-metrics\"]", "{found:?}");
    let doc = get(&svc, "/api/v1/workspaces").await;
    assert_eq!((doc["gpu_jobs"]["how"].as_str(), doc["gpu_jobs"]["jobs"][0].as_str()), (Some("discovered"), Some("gpu-metrics")), "{doc}");
    let (code, out) = exit_of(&["check", "--coder-url", &coder.url(), "--prometheus-url", &prom.url], &coder.owner_token()).await;
    assert!(
        out.contains("ok   prometheus job: reading [\"gpu-metrics\"] (discovered); jobs with dcgm-exporter series: \"gpu-metrics\" ("),
        "{code}: {out}"
    );
    assert!(out.contains("warn gpu templates: gpu_templates is unset behind Prometheus"), "{out}");
    assert_eq!(svc.events("gpu_templates_unset").len(), 1, "run says it once, at start");
}

#[tokio::test]
async fn two_jobs_read_nothing_and_say_so_and_a_list_of_them_reads_both() {
    let coder = FakeCoder::start(world(2)).await.unwrap();
    let a = FakeExporter::start(coder.world.clone(), ExporterConfig { gpus: vec![0], ..ExporterConfig::default() }).await.unwrap();
    let b = FakeExporter::start(coder.world.clone(), ExporterConfig { gpus: vec![1], ..ExporterConfig::default() }).await.unwrap();
    let Some(prom) = prometheus(&[("dcgm-a", &a), ("gpu-metrics", &b)]).await else { return };
    let idle = idle_on_gpus(&coder, &["idle-1", "idle-2"]).await;
    let svc = Service::start(&coder, &[], &coder.owner_token(), &behind(&prom, &[]));
    let since = std::time::Instant::now();
    let doc = loop {
        let doc = get(&svc, "/api/v1/workspaces").await;
        if doc["gpu_jobs"]["problem"].is_string() {
            break doc;
        }
        assert!(since.elapsed() < Duration::from_secs(20), "never said: {doc}\n{}", svc.raw());
        svc.passes(1, Duration::from_secs(10)).await;
    };
    let problem = doc["gpu_jobs"]["problem"].as_str().unwrap();
    assert!(problem.contains("2 scrape jobs") && problem.contains("\"dcgm-a\" (") && problem.contains("\"gpu-metrics\" ("), "{problem}");
    svc.passes(8, Duration::from_secs(30)).await;
    assert_eq!(coder.with(|w| idle.iter().map(|id| w.stop_builds_by(*id, "admin")).sum::<usize>()), 0, "nothing read, nothing stopped");
    assert!(!svc.events("prometheus_job_unknown").is_empty());
    let page = reqwest::get(format!("http://{}/", svc.addr().await)).await.unwrap().text().await.unwrap();
    assert!(page.contains("The service cannot see GPUs:") && page.contains("dcgm-a"), "the page's banner");
    let (code, out) = exit_of(&["check", "--coder-url", &coder.url(), "--prometheus-url", &prom.url], &coder.owner_token()).await;
    assert_eq!(code, 1, "{out}");
    let line = out.lines().find(|l| l.starts_with("FAIL prometheus job: 2 scrape jobs carry dcgm-exporter series (")).unwrap_or_default();
    assert!(line.contains("\"dcgm-a\" (") && line.contains("\"gpu-metrics\" ("), "{out}");
    drop(svc);
    // Both named: each is read, and both idle GPUs are given back.
    let svc = Service::start(&coder, &[], &coder.owner_token(), &behind(&prom, &["--prometheus-job", "dcgm-a,gpu-metrics"]));
    until_with(&coder, Some(&svc), "both idle GPUs are given back", Duration::from_secs(40), |w| idle.iter().all(|id| !holds_gpu(w, *id)))
        .await;
    let doc = get(&svc, "/api/v1/workspaces").await;
    assert_eq!(doc["gpu_jobs"]["how"], "configured", "{doc}");
}

/// Blind is loud (issue 42): a source that answers while no running GPU workspace maps to its
/// series says so from its third pass: a WARN line naming the likely cause, the status
/// document's `problems`, the page's banner and the gauge the alert reads.
async fn blind_is_said(svc: &Service, cause: &str) {
    let since = std::time::Instant::now();
    while svc.events("gpu_series_missing").is_empty() {
        assert!(since.elapsed() < Duration::from_secs(30), "never said:\n{}", svc.raw());
        svc.passes(1, Duration::from_secs(10)).await;
    }
    let said = svc.events("gpu_series_missing");
    let message = said[0]["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.starts_with("no GPU series maps to any of the 1 running GPU workspace(s) for 3 passes") && message.contains(cause),
        "{message}"
    );
    svc.passes(1, Duration::from_secs(10)).await;
    assert_eq!(svc.events("gpu_series_missing").len(), 1, "at most once an hour");
    let doc = get(svc, "/api/v1/workspaces").await;
    assert!(doc["problems"][0].as_str().is_some_and(|p| p.contains(cause)), "{doc}");
    let page = reqwest::get(format!("http://{}/", svc.addr().await)).await.unwrap().text().await.unwrap();
    assert!(page.contains("The service cannot see GPUs:"), "the page's banner");
    let metrics = reqwest::get(format!("http://{}/metrics", svc.addr().await)).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "coder_gpu_reclaimer_gpu_workspaces_without_series 1"), "{metrics}");
}

#[tokio::test]
async fn an_exporter_whose_series_name_no_running_workspace_is_said_to_be_blind() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = crate::common::service::exporter(&coder).await;
    idle_on_gpus(&coder, &["idle"]).await;
    // The pods run in `coder`; the filter says `ml`.
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--namespace", "ml"]);
    blind_is_said(&svc, "in namespace \"coder\", not the namespace filter \"ml\": fix `namespace`").await;
}

#[tokio::test]
async fn behind_prometheus_a_job_that_holds_no_series_is_said_with_the_one_that_does() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = crate::common::service::exporter(&coder).await;
    let Some(prom) = prometheus(&[("nvidia-dcgm-exporter", &ex)]).await else { return };
    idle_on_gpus(&coder, &["idle"]).await;
    let svc = Service::start(&coder, &[], &coder.owner_token(), &behind(&prom, &["--prometheus-job", "dcgm"]));
    blind_is_said(&svc, "under scrape jobs [\"dcgm\"], but other jobs carry dcgm-exporter series: \"nvidia-dcgm-exporter\" (").await;
}
