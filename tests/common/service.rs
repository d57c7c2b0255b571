//! The real binary as tests run it: `Service` (a `run` process against the fakes, its log lines
//! parsed), `exit_of` (a one-shot subcommand's exit code and output), and the waits and world
//! predicates the end-to-end tests share.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mocks::{ExporterConfig, FakeCoder, FakeExporter, WorldConfig};
use serde_json::Value;
use uuid::Uuid;

use super::binary;

pub fn world(gpus: usize) -> WorldConfig {
    WorldConfig { gpus, scale: 60.0, ..WorldConfig::default() }
}

/// The story's clock for the policy keys that have no flag: the fake exporter collects at every
/// scrape and a fake pod is bound at once unless a test says otherwise, so a start is demand a
/// second after its agent was created, not a minute (`exporter_collect_interval` plus
/// `bind_allowance`). Keys the test's own `--config` sets are left as they are.
const STORY_POLICY: [(&str, &str); 2] = [("exporter_collect_interval", "\"1s\""), ("bind_allowance", "\"0s\"")];

/// `extra` with `--config` pointing at the test's file (or none) with `STORY_POLICY` added in
/// front of its own keys, and the folder that file was written in (the `Service` removes it).
fn with_story_policy(extra: &[&str]) -> (Vec<String>, std::path::PathBuf) {
    let mut out: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let given = out.iter().position(|a| a == "--config").and_then(|i| out.get(i + 1).cloned().map(|p| (i + 1, p)));
    let own = given.as_ref().map(|(_, p)| std::fs::read_to_string(p).unwrap_or_default()).unwrap_or_default();
    let mut text: String = STORY_POLICY
        .iter()
        .filter(|(key, _)| !own.lines().any(|l| l.trim_start().starts_with(key)))
        .map(|(key, value)| format!("{key} = {value}\n"))
        .collect();
    text.push_str(&own);
    let dir = std::env::temp_dir().join(format!("cgr-story-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.toml");
    std::fs::write(&path, text).unwrap();
    let path = path.to_string_lossy().into_owned();
    match given {
        Some((i, _)) => out[i] = path,
        None => out.extend(["--config".to_string(), path]),
    }
    (out, dir)
}

pub struct Service {
    child: Child,
    logs: Arc<Mutex<Vec<Value>>>,
    raw: Arc<Mutex<String>>,
    /// The story's policy file's folder, removed with the process.
    policy_dir: std::path::PathBuf,
}

impl Service {
    pub fn start(coder: &FakeCoder, exporters: &[String], token: &str, extra: &[&str]) -> Service {
        Self::start_url(&coder.url(), exporters, token, extra)
    }

    /// `run --enforce` against any Coder URL (a hostile peer's, say).
    pub fn start_url(coder_url: &str, exporters: &[String], token: &str, extra: &[&str]) -> Service {
        Self::spawn(coder_url, exporters, token, extra, &["--enforce"])
    }

    /// `run` in observe mode (no `--enforce`).
    pub fn start_observing(coder: &FakeCoder, exporters: &[String], token: &str, extra: &[&str]) -> Service {
        Self::spawn(&coder.url(), exporters, token, extra, &[])
    }

    fn spawn(coder_url: &str, exporters: &[String], token: &str, extra: &[&str], mode: &[&str]) -> Service {
        let mut cmd = Command::new(binary());
        cmd.arg("run").args(mode).args(["--coder-url", coder_url, "--listen", "127.0.0.1:0", "--log-format", "json"]);
        // The story's clock (1 s = 1 Coder minute), unless the test sets its own.
        for (flag, value) in [("--interval", "1s"), ("--idle-after", "6s")] {
            if !extra.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
        for e in exporters {
            cmd.args(["--dcgm-exporter", e]);
        }
        let (extra, policy_dir) = with_story_policy(extra);
        cmd.args(&extra)
            .env("CODER_SESSION_TOKEN", token)
            .env_remove("CODER_URL")
            .env_remove("DCGM_EXPORTER_URLS")
            .env_remove("CODER_GPU_RECLAIMER_CONFIG");
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let raw = Arc::new(Mutex::new(String::new()));
        let (l, r) = (logs.clone(), raw.clone());
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                r.lock().unwrap().push_str(&(line.clone() + "\n"));
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    l.lock().unwrap().push(v);
                }
            }
        });
        Service { child, logs, raw, policy_dir }
    }

    pub fn events(&self, name: &str) -> Vec<Value> {
        self.logs.lock().unwrap().iter().filter(|v| v["event"] == name).cloned().collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn raw(&self) -> String {
        self.raw.lock().unwrap().clone()
    }

    /// The address the HTTP server bound (`--listen 127.0.0.1:0`).
    pub async fn addr(&self) -> String {
        for _ in 0..100 {
            if let Some(e) = self.events("starting").first() {
                return e["listen"].as_str().unwrap().to_string();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the service never started:\n{}", self.raw());
    }

    pub async fn wait_event(&self, name: &str, timeout: Duration) -> Value {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(e) = self.events(name).into_iter().next() {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no {name} event within {timeout:?}:\n{}", self.raw());
    }

    /// Waits until `n` more passes have ended than had when it was called (`wait_event` returns
    /// the first event of a name ever seen, so it waits for nothing once one pass has ended).
    pub async fn passes(&self, n: usize, timeout: Duration) {
        let (start, seen) = (Instant::now(), self.events("pass").len());
        while self.events("pass").len() < seen + n {
            assert!(start.elapsed() < timeout, "{n} more passes did not end within {timeout:?}:\n{}", self.raw());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGTERM and waits (asynchronously: the fakes share this test's runtime).
    pub async fn terminate(&mut self) -> ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < Duration::from_secs(12), "no exit within 12 s of SIGTERM");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.policy_dir);
    }
}

/// Waits until `cond` holds on the world, or panics with the event log.
pub async fn until(coder: &FakeCoder, what: &str, timeout: Duration, cond: impl Fn(&mocks::World) -> bool) {
    until_with(coder, None, what, timeout, cond).await
}

/// Like `until`, and on timeout also shows the service's last log lines.
pub async fn until_with(coder: &FakeCoder, svc: Option<&Service>, what: &str, timeout: Duration, cond: impl Fn(&mocks::World) -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if coder.with(|w| cond(w)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = coder.with(|w| {
        w.events
            .iter()
            .map(|e| format!("{} {} {} {}", e.at.format("%H:%M:%S%.3f"), e.workspace, e.kind, e.detail))
            .collect::<Vec<_>>()
            .join("\n")
    });
    let logs = svc
        .map(|s| s.raw().lines().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n"))
        .unwrap_or_default();
    panic!("timed out waiting for: {what}\n{events}\n--- service log tail ---\n{logs}");
}

pub fn holds_gpu(w: &mocks::World, id: Uuid) -> bool {
    w.gpu_holders.contains(&Some(id))
}

/// The workspace's agent has connected.
pub fn connected(w: &mocks::World, id: Uuid) -> bool {
    w.ws_index(id).and_then(|i| w.workspaces[i].latest()?.agent.clone()).is_some_and(|a| a.first_connected_at.is_some())
}

/// A fake exporter over the world, in its default set-up.
pub async fn exporter(coder: &FakeCoder) -> FakeExporter {
    FakeExporter::start(coder.world.clone(), ExporterConfig::default()).await.unwrap()
}

/// The workspace's latest build is a running start.
pub fn running(w: &mocks::World, id: Uuid) -> bool {
    w.ws_index(id).is_some_and(|i| w.is_running(&w.workspaces[i]))
}

pub async fn exit_of(args: &[&str], token: &str) -> (i32, String) {
    let (args, token): (Vec<String>, String) = (args.iter().map(|s| s.to_string()).collect(), token.to_string());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(binary()).args(&args).env("CODER_SESSION_TOKEN", token).env_remove("CODER_URL").output().unwrap()
    })
    .await
    .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout))
}
