//! The status page in a real browser: the binary runs against the fakes, headless Chromium
//! (Debian's package; `.ci/run` installs it) loads `/`, the DOM is checked (rows, verdicts, a
//! countdown, sparklines) and a screenshot is saved as a test artefact
//! (`target/test-artefacts/status-page.png`). The page requires the status token when one is set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mocks::{FakeCoder, FakeExporter, Load};
use uuid::Uuid;

use crate::common::installed_or_skip;
use crate::common::service::{Service, holds_gpu, until, world};

pub fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"].iter().map(PathBuf::from).find(|p| p.exists())
}

/// Runs headless Chromium with the flags this closed network needs; returns stdout.
pub fn browse(chromium: &Path, args: &[&str], url: &str) -> String {
    let profile = std::env::temp_dir().join(format!("cgr-chromium-{}", Uuid::new_v4()));
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&profile).ok();
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test]
async fn the_status_page_in_a_real_browser() {
    let Some(chromium) = installed_or_skip(chromium(), "chromium") else { return };
    let coder = FakeCoder::start(world(3)).await.unwrap();
    let ex = FakeExporter::start(coder.world.clone(), mocks::ExporterConfig::default()).await.unwrap();
    let busy = coder.with(|w| w.create_workspace("alice", "train-llm", None)).unwrap();
    let idle = coder.with(|w| w.create_workspace("bob", "notebook <b>", None)).unwrap();
    let held = coder.with(|w| w.create_workspace("alice", "finetune", None)).unwrap();
    until(&coder, "all hold a GPU", Duration::from_secs(5), |w| [busy, idle, held].iter().all(|id| holds_gpu(w, *id))).await;
    coder.with(|w| {
        w.set_load(busy, Load::Matmul);
        w.set_load(held, Load::MemoryOnly);
    });
    let waiting = coder.with(|w| w.create_workspace("bob", "waits", None)).unwrap();
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--grace", "10m"]);
    let addr = svc.addr().await;
    // Until the idle ones are warned (idle_after 6 s, then a 10-minute grace).
    for _ in 0..60 {
        let doc: serde_json::Value = reqwest::get(format!("http://{addr}/api/v1/workspaces")).await.unwrap().json().await.unwrap();
        let warned = doc["workspaces"].as_array().unwrap().iter().filter(|w| w["verdict"] == "warn").count();
        if warned == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let url = format!("http://{addr}/");
    let dom = tokio::task::spawn_blocking({
        let (chromium, url) = (chromium.clone(), url.clone());
        move || browse(&chromium, &["--dump-dom"], &url)
    })
    .await
    .unwrap();
    assert!(dom.contains(r#"<table id="workspaces">"#), "{dom}");
    for (id, verdict) in [(busy, "keep"), (idle, "warn"), (held, "warn"), (waiting, "waiting")] {
        assert!(dom.contains(&format!(r#"data-verdict="{verdict}" data-id="{id}""#)), "{verdict} row for {id} missing:\n{dom}");
    }
    let first_row = dom.find("<tbody>").map(|i| &dom[i..]).unwrap_or("");
    assert!(first_row.find(r#"data-verdict="warn""#) < first_row.find(r#"data-verdict="keep""#), "what will be stopped comes first");
    // As of the latest pass (the page is rendered once per pass): 10m on the pass that warned,
    // 9m after.
    assert!(
        [r#"<td class="num countdown">10m</td>"#, r#"<td class="num countdown">9m</td>"#].iter().any(|c| dom.contains(c)),
        "the countdown of a warning: {dom}"
    );
    // Enforce mode (the service runs `--enforce`) promises the stop; observe mode's words are
    // unit-tested in `pass/page.rs`.
    assert!(dom.contains("enforce mode") && dom.contains("warned: stops unless it becomes active") && !dom.contains("would"), "{dom}");
    assert!(dom.matches(r#"<svg class="spark""#).count() >= 4, "a sparkline per row");
    assert!(dom.contains("notebook &lt;b&gt;") && !dom.contains("notebook <b>"), "names are escaped");
    assert!(dom.contains(r#"<b id="waiting">1</b>"#), "the fleet summary counts the waiting session");
    let token = coder.owner_token();
    assert!(!dom.contains(token.split('-').nth(1).unwrap()), "nothing secret on the page");
    // The screenshot, as a test artefact (the README's picture is one of these).
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("status-page.png");
    std::fs::remove_file(&shot).ok();
    tokio::task::spawn_blocking({
        let (chromium, url, shot) = (chromium.clone(), url.clone(), shot.clone());
        move || browse(&chromium, &[&format!("--screenshot={}", shot.display()), "--window-size=1280,720"], &url)
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real picture ({} bytes)", png.len());
}

#[tokio::test]
async fn the_status_page_requires_the_status_token_when_one_is_set() {
    let coder = FakeCoder::start(world(1)).await.unwrap();
    let ex = FakeExporter::start(coder.world.clone(), mocks::ExporterConfig::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("cgr-page-token-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "p4ge-t0ken\n").unwrap();
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--status-token-file", dir.join("token").to_str().unwrap()]);
    let addr = svc.addr().await;
    let http = reqwest::Client::new();
    let denied = http.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(denied.status(), 401);
    assert!(!denied.text().await.unwrap().contains("<table"), "no page without the token");
    let page = http.get(format!("http://{addr}/")).bearer_auth("p4ge-t0ken").send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    if let Some(chromium) = chromium() {
        let dom = tokio::task::spawn_blocking(move || browse(&chromium, &["--dump-dom"], &format!("http://{addr}/"))).await.unwrap();
        assert!(dom.contains("needs the status token") && !dom.contains("<table"), "{dom}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The README's first command serves the page while the story plays: a newcomer opens the
/// printed URL and sees the reclaimed session, the waiting one that got its GPU, and what was
/// given back. `--hold` keeps it up until Ctrl-C.
#[tokio::test]
async fn the_demo_serves_its_page_to_a_newcomer() {
    use std::io::{BufRead, BufReader};
    let Some(chromium) = installed_or_skip(chromium(), "chromium") else { return };
    let mut demo = Command::new(crate::common::binary())
        .args(["demo", "--listen", "127.0.0.1:0", "--hold"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = demo.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut url = None;
    let mut done = false;
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !done && std::time::Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) else { continue };
        if let Some(rest) = line.strip_prefix("Status page: ") {
            url = rest.split_whitespace().next().map(str::to_string);
            // Served from the start, while the story plays.
            let healthz = reqwest::get(format!("{}healthz", url.clone().unwrap())).await.unwrap();
            assert_eq!(healthz.status(), 200);
        }
        done = line.starts_with("Done:");
        seen.push_str(&line);
        seen.push('\n');
    }
    let url = url.unwrap_or_else(|| panic!("no URL printed:\n{seen}"));
    assert!(done, "the story did not end:\n{seen}");
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with('/'), "{url}");
    let dom = tokio::task::spawn_blocking({
        let (chromium, url) = (chromium.clone(), url.clone());
        move || browse(&chromium, &["--dump-dom"], &url)
    })
    .await
    .unwrap();
    let row = |name: &str| dom.split("<tr ").find(|r| r.contains(&format!("<td>{name}</td>"))).unwrap_or("").to_string();
    assert!(row("b-notebook").contains(r#"data-verdict="keep""#), "the session that waited has its GPU and computes:\n{dom}");
    assert!(row("a-train").contains(r#"data-verdict="waiting""#), "a-train, started again, waits:\n{dom}");
    let recent = dom.split(r#"<table id="recent-stops">"#).nth(1).unwrap_or_else(|| panic!("no recently stopped table:\n{dom}"));
    let stopped = recent.split("<tr ").find(|r| r.contains("<td>a-train</td>")).unwrap_or_else(|| panic!("a-train not listed:\n{dom}"));
    assert!(stopped.contains("<td>alice</td>") && stopped.contains("after "), "stopped, then started again: {stopped}");
    assert!(dom.contains("GPU-hours given back today"), "{dom}");
    let doc: serde_json::Value = reqwest::get(format!("{url}api/v1/workspaces")).await.unwrap().json().await.unwrap();
    let errors = crate::status_schema::errors(&doc, None);
    assert!(errors.is_empty(), "the demo's status document fits docs/status.schema.json: {errors:#?}");
    let metrics = reqwest::get(format!("{url}metrics")).await.unwrap().text().await.unwrap();
    // a-train, overnight once its training ended (it ran past its deadline first), and c-sweep,
    // stopped by Coder at the end of its countdown; c-notebook's owner came back.
    for line in [
        "coder_gpu_reclaimer_gpus_reclaimed_total{template=\"gpu-workspace\"} 3",
        "coder_gpu_reclaimer_countdowns_set_total{template=\"gpu-workspace\"} 2",
        "coder_gpu_reclaimer_countdowns_averted_total{template=\"gpu-workspace\"} 1",
        "coder_gpu_reclaimer_deadline_extensions_total{template=\"gpu-workspace\"} 1",
        "coder_gpu_reclaimer_autostops_averted_total{template=\"gpu-workspace\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
    assert!(dom.contains(r#"<b id="autostops-averted">1</b>"#), "the page counts the autostop averted:\n{dom}");
    // --hold: still serving after the story, until Ctrl-C.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(reqwest::get(format!("{url}readyz")).await.unwrap().status(), 200, "passes go on while it holds");
    Command::new("kill").args(["-INT", &demo.id().to_string()]).status().unwrap();
    let status = tokio::task::spawn_blocking(move || demo.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status:?}");
}
