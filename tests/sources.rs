//! The GPU sources against local servers: exporters down, slow, empty, garbage, one of two
//! failing, and a headless-Service name; Prometheus success, `exported_pod`, an error envelope
//! and a timeout. A failure makes data unknown; it never reads as zero.

use std::time::Duration;

use chrono::Utc;
use coder_gpu_reclaimer::gpu::exporter::{ExporterSource, ExporterTarget};
use coder_gpu_reclaimer::gpu::prometheus::{PrometheusOptions, PrometheusSource};
use coder_gpu_reclaimer::gpu::signals::Signal;
use coder_gpu_reclaimer::gpu::{GpuSource, Ownership};
use serde_json::json;
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::common::{WS_ID, fixture};

async fn exporter_with(resp: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET")).and(path("/metrics")).respond_with(resp).mount(&server).await;
    server
}

fn source(urls: Vec<String>) -> ExporterSource {
    ExporterSource::new(urls.iter().map(|u| ExporterTarget::parse(u).unwrap()).collect(), Ownership::default(), Duration::from_millis(500))
        .unwrap()
}

#[tokio::test]
async fn one_failing_exporter_makes_only_its_gpus_unknown() {
    let good = exporter_with(ResponseTemplate::new(200).set_body_string(fixture("dcgm/exporter-4.8.txt"))).await;
    let empty = exporter_with(ResponseTemplate::new(200).set_body_string("")).await;
    let garbage = exporter_with(ResponseTemplate::new(200).set_body_string("<html>502 Bad Gateway</html>\n")).await;
    let slow =
        exporter_with(ResponseTemplate::new(200).set_body_string(fixture("dcgm/exporter-4.8.txt")).set_delay(Duration::from_secs(3))).await;
    let failing = exporter_with(ResponseTemplate::new(503)).await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/metrics", l.local_addr().unwrap())
    }; // closed when `l` drops: connection refused
    let urls = vec![
        format!("{}/metrics", good.uri()),
        format!("{}/metrics", empty.uri()),
        format!("{}/metrics", garbage.uri()),
        format!("{}/metrics", slow.uri()),
        format!("{}/metrics", failing.uri()),
        down.clone(),
    ];
    let started = std::time::Instant::now();
    let c = source(urls.clone()).collect(Utc::now()).await;
    assert!(started.elapsed() < Duration::from_secs(2), "scrapes run concurrently with a timeout ({:?})", started.elapsed());
    assert_eq!(c.requests, 6);
    assert_eq!(c.series.len(), 4, "the good exporter's GPUs");
    assert!(c.series.iter().all(|r| r.source.as_ref() == urls[0]));
    let why = |u: &str| c.failures.iter().find(|f| f.source == u).map(|f| f.error.clone()).unwrap_or_else(|| panic!("no failure for {u}"));
    assert!(why(&urls[1]).contains("empty body"));
    assert!(why(&urls[2]).contains("unparseable") || why(&urls[2]).contains("no DCGM"), "{}", why(&urls[2]));
    assert!(why(&urls[3]).contains("timed out"), "{}", why(&urls[3]));
    assert!(why(&urls[4]).contains("HTTP 503"));
    assert!(why(&down).contains("no response"), "{}", why(&down));
}

#[tokio::test]
async fn a_headless_service_name_expands_to_each_address() {
    let good = exporter_with(ResponseTemplate::new(200).set_body_string(fixture("dcgm/exporter-4.8.txt"))).await;
    let port = good.address().port();
    let c = source(vec![format!("dns+http://localhost:{port}/metrics")]).collect(Utc::now()).await;
    assert!(c.requests >= 1, "localhost resolves to at least one address");
    assert!(c.series.iter().any(|r| r.workspace_id.as_deref() == Some(WS_ID)), "failures: {:?}", c.failures);
    let c = source(vec!["dns+http://no-such-host.invalid:9400/metrics".into()]).collect(Utc::now()).await;
    assert_eq!(c.failures.len(), 1);
    assert!(c.failures[0].error.contains("cannot resolve"), "{:?}", c.failures);
}

fn matrix(series: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"status": "success", "data": {"resultType": "matrix", "result": series}}))
}

fn prom(server: &MockServer, timeout: Duration) -> PrometheusSource {
    PrometheusSource::new(
        &crate::common::url(&server.uri()),
        Ownership::default(),
        Duration::from_secs(1800),
        Duration::from_secs(60),
        timeout,
    )
    .unwrap()
}

/// The query a fetch of the whole window (`aggregate = false`) or of new steps sends for `name`.
fn query_with(source: &PrometheusSource, name: &str, aggregate: bool) -> String {
    source.queries(aggregate).into_iter().find(|q| q.contains(&format!("max_over_time({name}{{"))).unwrap()
}

#[tokio::test]
async fn prometheus_reads_raw_samples_per_step_with_a_constant_number_of_queries() {
    let server = MockServer::start().await;
    let source = prom(&server, Duration::from_secs(2));
    let step = 60;
    let now = Utc::now();
    let end = now.timestamp() / step * step;
    // The whole window comes as stored: a dcgm-exporter scrape's labels (the exporter's own pod,
    // instance and job beside the workload's exported_pod). After an exporter restart one GPU
    // has two series, here overlapping in one step.
    let stored = |exporter: &str, instance: &str| {
        json!({"DCGM_FI_DRIVER_VERSION": "570.124.06", "Hostname": "l40s.example.com", "UUID": "GPU-585834da-1c2b-4d5e-8f90-a1b2c3d4e5f6",
            "device": "nvidia0", "pci_bus_id": "00000000:4E:00.0", "exported_container": "dev", "exported_namespace": "coder", "exported_pod": format!("coder-{WS_ID}-7d9f8b6c5d-x2x9k"),
            "gpu": "0", "instance": instance, "job": "nvidia-dcgm-exporter", "modelName": "NVIDIA L40S", "namespace": "gpu-operator", "pod": exporter})
    };
    let (old, new) = (stored("nvidia-dcgm-exporter-x7k2p", "10.0.1.7:9400"), stored("nvidia-dcgm-exporter-q4m9z", "10.0.1.9:9400"));
    for (name, series) in [
        (
            "DCGM_FI_DEV_GPU_UTIL",
            json!([{"metric": old, "values": [[end - 60, "100"]]}, {"metric": new, "values": [[end - 60, "0"], [end, "100"]]}]),
        ),
        ("DCGM_FI_PROF_SM_ACTIVE", json!([{"metric": new, "values": [[end - 60, "0.012"], [end, "NaN"]]}])),
        ("DCGM_FI_DEV_FB_USED", json!([{"metric": new, "values": [[end - 60, "302"], [end, "302"]]}])),
    ] {
        Mock::given(method("GET"))
            .and(path("/api/v1/query_range"))
            .and(query_param("query", query_with(&source, name, false)))
            .and(query_param("step", "60s"))
            .respond_with(matrix(series))
            .expect(1)
            .mount(&server)
            .await;
    }
    // The next fetch is one new step, aggregated: the workload's labels only.
    let aggregated = json!({"UUID": "GPU-585834da-1c2b-4d5e-8f90-a1b2c3d4e5f6", "modelName": "NVIDIA L40S",
        "pod": "nvidia-dcgm-exporter-q4m9z", "namespace": "gpu-operator", "exported_pod": format!("coder-{WS_ID}-7d9f8b6c5d-x2x9k"), "exported_namespace": "coder"});
    Mock::given(method("GET"))
        .and(path("/api/v1/query_range"))
        .and(query_param("query", query_with(&source, "DCGM_FI_PROF_SM_ACTIVE", true)))
        .respond_with(matrix(json!([{"metric": aggregated, "values": [[end + 60, "0.5"]]}])))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET")).and(path("/api/v1/query_range")).respond_with(matrix(json!([]))).mount(&server).await;

    let c = source.collect(now).await;
    assert!(c.failures.is_empty(), "{:?}", c.failures);
    let queries = source.queries(false);
    assert_eq!(c.requests, queries.len(), "a constant number of queries, whatever the fleet size");
    assert_eq!(server.received_requests().await.unwrap().len(), queries.len());
    for q in &queries {
        assert!(
            q.starts_with("max_over_time(DCGM_FI_") && q.ends_with("{job=\"nvidia-dcgm-exporter\"}[60s])"),
            "every raw sample of each step, as stored, of the exporter's job only: {q}"
        );
    }
    assert!(c.step.is_some() && c.series.len() == 1, "one GPU, its two exporters' series folded into one: {:?}", c.series);
    assert_eq!(c.twin_count, 0, "an exporter restart overlaps its old series by one step: no twin");
    let gpu = &c.series[0];
    assert_eq!(gpu.workspace_id.as_deref(), Some(WS_ID), "exported_pod is the workload's pod, not the exporter's");
    assert_eq!(gpu.points.iter().map(|p| p.at.timestamp()).collect::<Vec<_>>(), [end - 60, end], "points sit on the step grid");
    crate::common::assert_close(gpu.points[0].values.get(Signal::GpuUtil), Some(1.0), "the higher of two series in one step");
    crate::common::assert_close(gpu.points[0].values.get(Signal::SmActive), Some(0.012), "");
    crate::common::assert_close(gpu.points[1].values.get(Signal::FbUsedMib), Some(302.0), "");
    assert_eq!(gpu.points[1].values.get(Signal::SmActive), None, "NaN is no reading, not zero");
    let reqs = server.received_requests().await.unwrap();
    let param = |r: &wiremock::Request, name: &str| r.url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.parse::<i64>().unwrap());
    assert_eq!(param(&reqs[0], "start"), Some(end - 1800), "the first pass fetches the whole window, step-aligned");

    // The next pass asks only for steps after the last one it has: none yet, then one.
    let again = source.collect(now).await;
    assert_eq!(again.requests, 0, "nothing new: no query");
    let next = source.collect(now + chrono::Duration::seconds(60)).await;
    assert!(next.failures.is_empty(), "{:?}", next.failures);
    let reqs = server.received_requests().await.unwrap();
    let later = &reqs[queries.len()..];
    assert_eq!(later.len(), queries.len() + 1, "each field, and the count of copies under one target");
    let query = |r: &wiremock::Request| r.url.query_pairs().find(|(k, _)| k == "query").map(|(_, v)| v.to_string()).unwrap_or_default();
    assert_eq!(
        later.iter().filter(|r| query(r).starts_with("count by (UUID, uuid, GPU_I_ID, pod") && query(r).ends_with(") > 1")).count(),
        1
    );
    assert!(later.iter().all(|r| param(r, "start") == Some(end + 60) && param(r, "end") == Some(end + 60)), "one new step");
    for q in source.queries(true) {
        assert!(
            q.starts_with("max by (UUID, uuid, GPU_I_ID, pod, exported_pod") && q.ends_with("{job=\"nvidia-dcgm-exporter\"}[60s]))"),
            "aggregated: {q}"
        );
    }
    assert_eq!(next.series.len(), 1);
    crate::common::assert_close(next.series[0].points[0].values.get(Signal::SmActive), Some(0.5), "");
}

#[tokio::test]
async fn prometheus_queries_carry_the_namespace_headers_and_bearer_token() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).respond_with(matrix(json!([]))).mount(&server).await;
    let dir = std::env::temp_dir().join(format!("cgr-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "pr0m-t0ken\n").unwrap();
    let options = PrometheusOptions {
        headers: vec![("X-Scope-OrgID".into(), "team-gpu".into())],
        bearer_token_file: Some(dir.join("token")),
        power: true,
        ..PrometheusOptions::default()
    };
    let own = Ownership { namespace: Some("coder".into()), workspace_id_label: None };
    let source = PrometheusSource::with_options(
        &crate::common::url(&server.uri()),
        own,
        Duration::from_secs(1800),
        Duration::from_secs(60),
        Duration::from_secs(2),
        &Default::default(),
        1 << 20,
        options,
    )
    .unwrap();
    let c = source.collect(Utc::now()).await;
    assert!(c.failures.is_empty(), "{:?}", c.failures);
    let reqs = server.received_requests().await.unwrap();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert_eq!(r.headers.get("X-Scope-OrgID").unwrap(), "team-gpu");
        assert_eq!(r.headers.get("Authorization").unwrap(), "Bearer pr0m-t0ken");
        assert!(r.headers.get("Accept-Encoding").is_some_and(|v| v.to_str().unwrap().contains("gzip")), "gzip accepted");
        let q = r.url.query_pairs().find(|(k, _)| k == "query").unwrap().1.to_string();
        assert!(
            q.contains("{job=\"nvidia-dcgm-exporter\",exported_namespace=\"coder\"}")
                && q.contains("{job=\"nvidia-dcgm-exporter\",namespace=\"coder\"}"),
            "the namespace filter is in the query: {q}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn prometheus_errors_make_data_unknown_never_zero() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(422).set_body_json(
            json!({"status": "error", "errorType": "execution", "error": "query processing would load too many samples into memory"}),
        ))
        .mount(&server)
        .await;
    let c = prom(&server, Duration::from_secs(2)).collect(Utc::now()).await;
    assert!(c.series.is_empty());
    assert!(c.failures.iter().all(|f| f.error.contains("HTTP 422") && f.error.contains("too many samples")), "{:?}", c.failures);
    assert!(c.failures.iter().all(|f| f.source == server.uri()), "failures name the source the windows know");

    let slow = MockServer::start().await;
    Mock::given(method("GET")).respond_with(matrix(json!([])).set_delay(Duration::from_secs(3))).mount(&slow).await;
    let c = prom(&slow, Duration::from_millis(300)).collect(Utc::now()).await;
    assert!(c.series.is_empty() && !c.failures.is_empty());
    assert!(c.failures[0].error.contains("timed out"), "{:?}", c.failures);
}

/// A pod over its series cap fails only its own workspace (issue 42): 21 series on each of 1,000
/// listed pods (a forged copy per GPU, where the store can be written) are held up to the
/// policy's `max_gpus_per_workspace` plus one each (the one that makes the workspace
/// `too-many-gpu-series`), so the answer stays under `max_gpu_series` and the points budget, and
/// a normal workspace beside them is read. Before, the whole source failed for every workspace.
#[tokio::test]
async fn a_pod_over_its_series_cap_fails_only_its_own_workspace() {
    let server = MockServer::start().await;
    let source = prom(&server, Duration::from_secs(10));
    let end = Utc::now().timestamp() / 60 * 60;
    let id = |i: usize| format!("0b7c1a2e-1f4d-4c9e-9d3b-{i:012x}");
    let labels = |ws: &str, gpu: usize| {
        json!({"UUID": format!("GPU-{gpu:08x}-1c2b-4d5e-8f90-a1b2c3d4e5f6"), "exported_pod": format!("coder-{ws}-7d9f8b6c5d-x2x9k"),
            "exported_namespace": "coder", "instance": "10.0.1.7:9400", "job": "nvidia-dcgm-exporter", "modelName": "NVIDIA A10G"})
    };
    let mut series: Vec<serde_json::Value> = Vec::new();
    for pod in 0..1000 {
        for gpu in 0..21 {
            series.push(json!({"metric": labels(&id(pod), pod * 21 + gpu), "values": [[end, "0"]]}));
        }
    }
    series.push(json!({"metric": labels(WS_ID, 99_999), "values": [[end, "0"]]}));
    Mock::given(method("GET")).and(path("/api/v1/query_range")).respond_with(matrix(json!(series))).mount(&server).await;
    let ids: Vec<String> = (0..1000).map(id).chain([WS_ID.to_string()]).collect();
    source.want(ids.iter().map(String::as_str));
    let c = source.collect(Utc::now()).await;
    assert!(c.failures.is_empty(), "one pod's series fail no other workspace: {:?}", c.failures);
    let of = |ws: &str| c.series.iter().filter(|s| s.workspace_id.as_deref() == Some(ws)).count();
    assert_eq!((of(&id(0)), of(&id(999)), of(WS_ID)), (17, 17, 1), "max_gpus_per_workspace (16) plus one per pod");
    let mut windows = coder_gpu_reclaimer::gpu::window::Windows::new(chrono::Duration::minutes(30), Duration::from_secs(60));
    for s in &c.series {
        windows.record(s, None, true);
    }
    assert!(windows.refused_at(&id(0)).is_some(), "the over-cap workspace is judged on none of its series");
    assert!(windows.refused_at(WS_ID).is_none());
}

/// A twin's `instance` label is bounded (issue 42): a forged copy of a GPU carrying a 1 MB
/// `instance` is still a twin, named by at most 128 bytes of it (the status document and the
/// page list the first few twins, each with its first few targets).
#[tokio::test]
async fn a_twins_instance_label_is_bounded() {
    let server = MockServer::start().await;
    let source = prom(&server, Duration::from_secs(10));
    let end = Utc::now().timestamp() / 60 * 60;
    let labels = |instance: &str| {
        json!({"UUID": "GPU-585834da-1c2b-4d5e-8f90-a1b2c3d4e5f6", "exported_pod": format!("coder-{WS_ID}-7d9f8b6c5d-x2x9k"),
            "exported_namespace": "coder", "instance": instance, "job": "nvidia-dcgm-exporter"})
    };
    let huge = "x".repeat(1 << 20);
    let series = json!([
        {"metric": labels("10.0.1.7:9400"), "values": [[end - 60, "0"], [end, "0"]]},
        {"metric": labels(&huge), "values": [[end - 60, "0"], [end, "0"]]},
    ]);
    Mock::given(method("GET")).and(path("/api/v1/query_range")).respond_with(matrix(series)).mount(&server).await;
    source.want([WS_ID].into_iter());
    let c = source.collect(Utc::now()).await;
    assert_eq!(c.twin_count, 1, "{:?}", c.failures);
    let targets = &c.twins[0].reported_by;
    assert!(targets.iter().any(|t| t == "10.0.1.7:9400"), "{targets:?}");
    assert!(targets.iter().all(|t| t.len() <= 160), "bounded: {:?}", targets.iter().map(String::len).collect::<Vec<_>>());
    assert!(targets.iter().any(|t| t.ends_with("… (1048576 bytes)")), "marked as cut");
    assert!(c.twinned.contains(WS_ID), "its workspace is twinned: no deadline of its is moved");
}

/// A copy of a GPU that carries the real exporter's `instance` plus a label of its own (issue
/// 42) folds into the GPU in a steady pass's `max by`; the count of series per GPU shows it, and
/// from its second step it is a twin, its workspace twinned.
#[tokio::test]
async fn a_copy_under_the_real_target_with_one_more_label_is_a_twin() {
    let server = MockServer::start().await;
    let source = prom(&server, Duration::from_secs(10));
    let mut end = Utc::now().timestamp() / 60 * 60;
    let labels = json!({"UUID": "GPU-585834da-1c2b-4d5e-8f90-a1b2c3d4e5f6", "exported_pod": format!("coder-{WS_ID}-7d9f8b6c5d-x2x9k"),
        "exported_namespace": "coder", "instance": "10.0.1.7:9400"});
    source.want([WS_ID].into_iter());
    for pass in 0..3 {
        server.reset().await;
        let at = end;
        Mock::given(method("GET"))
            .and(path("/api/v1/query_range"))
            .and(wiremock::matchers::query_param_contains("query", "count by ("))
            .respond_with(matrix(json!([{"metric": labels, "values": [[at, "2"]]}])))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/api/v1/query_range"))
            .respond_with(matrix(json!([{"metric": labels, "values": [[at, "0.5"]]}])))
            .mount(&server)
            .await;
        let c = source.collect(chrono::DateTime::from_timestamp(at, 0).unwrap()).await;
        assert!(c.failures.is_empty(), "{:?}", c.failures);
        // The first pass reads the whole window as stored (no count); each later pass one step.
        let want = if pass == 2 { 1 } else { 0 };
        assert_eq!((c.twin_count, c.twinned.contains(WS_ID)), (want, want == 1), "pass {pass}");
        end += 60;
    }
}

/// Scrapes in flight: with more exporters than scrapes at once, each exporter is scraped once a
/// collection and exactly `MAX_CONCURRENT_SCRAPES` (32) are in flight at the busiest moment;
/// every body is folded into its GPUs' series. Each exporter answers only once 31 more scrapes
/// have started after it (or every scrape has), so the scrapes overlap by construction: a
/// client that ran fewer at once never finishes (the timeout fails it), one that ran more shows
/// a higher peak.
#[tokio::test]
async fn every_exporter_is_scraped_once_a_collection_and_32_at_a_time() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    const EXPORTERS: usize = 100;
    let at_once = coder_gpu_reclaimer::gpu::exporter::MAX_CONCURRENT_SCRAPES;
    let (started, _) = tokio::sync::watch::channel(0usize);
    let (started, in_flight, peak, asked) =
        (Arc::new(started), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
    let body = fixture("dcgm/exporter-4.8.txt");
    let handler = {
        let (started, in_flight, peak, asked) = (started.clone(), in_flight.clone(), peak.clone(), asked.clone());
        move |axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>| {
            let (started, in_flight, peak, asked, body) = (started.clone(), in_flight.clone(), peak.clone(), asked.clone(), body.clone());
            async move {
                peak.fetch_max(in_flight.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                let mut me = 0;
                started.send_modify(|n| {
                    me = *n;
                    *n += 1;
                });
                let release = (me + at_once).min(EXPORTERS);
                started.subscribe().wait_for(|&n| n >= release).await.unwrap();
                asked.lock().unwrap().push(q.get("node").cloned().unwrap_or_default());
                in_flight.fetch_sub(1, Ordering::SeqCst);
                body
            }
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().route("/metrics", axum::routing::get(handler))).await });
    let urls: Vec<String> = (0..EXPORTERS).map(|i| format!("{base}/metrics?node={i}")).collect();
    let c = tokio::time::timeout(Duration::from_secs(60), source(urls).collect(Utc::now())).await.expect("fewer than 32 scrapes at once");
    assert_eq!((c.requests, c.failures.len()), (EXPORTERS, 0), "{:?}", c.failures);
    assert_eq!(c.series.len(), 4 * EXPORTERS, "four GPUs an exporter");
    let mut asked = asked.lock().unwrap().clone();
    asked.sort_by_key(|n| n.parse::<usize>().unwrap());
    assert_eq!(asked, (0..EXPORTERS).map(|i| i.to_string()).collect::<Vec<_>>(), "each once");
    assert_eq!(peak.load(Ordering::SeqCst), at_once, "scrapes in flight at the busiest moment");
}
