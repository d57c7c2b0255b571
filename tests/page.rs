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
use crate::e2e::{Service, holds_gpu, until, world};

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"].iter().map(PathBuf::from).find(|p| p.exists())
}

/// Runs headless Chromium with the flags this closed network needs; returns stdout.
fn browse(chromium: &Path, args: &[&str], url: &str) -> String {
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
    assert!(dom.contains(r#"<td class="num countdown">9m</td>"#), "the countdown of a warning: {dom}");
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
