//! Helpers shared by the integration tests: fixtures, workspaces built from the real-shaped
//! fixture, the path of the built binary, and the real binary as tests run it (`service`).

#![allow(dead_code)]

pub mod service;

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use coder_gpu_reclaimer::coder::types::Workspace;
use serde_json::Value;

pub fn fixture_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel)
}

pub fn fixture(rel: &str) -> String {
    std::fs::read_to_string(fixture_path(rel)).unwrap_or_else(|e| panic!("fixture {rel}: {e}"))
}

pub fn fixture_json(rel: &str) -> Value {
    serde_json::from_str(&fixture(rel)).unwrap()
}

/// A file of the vendored reference data (`reference/` in the repository; see its README).
pub fn reference(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reference").join(rel)
}

/// Parses a URL the test itself made.
pub fn url(s: &str) -> reqwest::Url {
    reqwest::Url::parse(s).unwrap()
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_coder-gpu-reclaimer")
}

pub const WS_ID: &str = "0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70";

/// A running workspace whose agent is connected: `alice-gpu` from the captured listing, with
/// the given id and `last_used_at`.
pub fn running_workspace(id: &str, last_used_at: DateTime<Utc>) -> Workspace {
    let list = fixture_json("coder/workspaces_running.json");
    let mut v = list["workspaces"].as_array().unwrap().iter().find(|w| w["name"] == "alice-gpu").unwrap().clone();
    v["id"] = Value::String(id.into());
    v["last_used_at"] = Value::String(last_used_at.to_rfc3339());
    serde_json::from_value(v).unwrap()
}

/// `bob-gpu`: build succeeded, agent never connected (`timeout`): a Pending pod.
pub fn pending_workspace(id: &str) -> Workspace {
    let list = fixture_json("coder/workspaces_running.json");
    let mut v = list["workspaces"].as_array().unwrap().iter().find(|w| w["name"] == "bob-gpu").unwrap().clone();
    v["id"] = Value::String(id.into());
    serde_json::from_value(v).unwrap()
}

/// A workspace whose start succeeded and whose agent, created at `created`, never connected:
/// `timeout` once Coder says so (past `connection_timeout` seconds), else `connecting`.
pub fn never_connected_workspace(created: chrono::DateTime<chrono::Utc>, connection_timeout: i64, timeout: bool) -> Workspace {
    use coder_gpu_reclaimer::coder::types::AgentStatus;
    let mut w = pending_workspace(WS_ID);
    for a in w.latest_build.resources.iter_mut().flat_map(|r| r.agents.iter_mut()) {
        a.created_at = Some(created);
        a.connection_timeout_seconds = connection_timeout;
        a.status = if timeout { AgentStatus::Timeout } else { AgentStatus::Connecting };
    }
    w
}

/// One idle GPU of `ws`'s pod, as a source reports it: a point every minute from `from_min` to
/// `to_min` minutes after `at0`, its energy counter moving (not frozen).
pub fn idle_gpu_series(ws: &Workspace, at0: DateTime<Utc>, from_min: i64, to_min: i64) -> coder_gpu_reclaimer::gpu::GpuSeries {
    use coder_gpu_reclaimer::gpu::signals::{Signal, SignalValues};
    use coder_gpu_reclaimer::gpu::{Attribution, GpuKey, GpuSeries, Point};
    let idle = SignalValues::default().with(Signal::GpuUtil, 0.0).with(Signal::FbUsedMib, 0.0).with(Signal::SmActive, 0.0);
    let minute = chrono::Duration::minutes;
    GpuSeries {
        key: GpuKey { uuid: format!("GPU-{}", ws.id), gpu_instance: None, pod: Some(format!("coder-{}-7d9f8b6c5d-x2x9k", ws.id)) },
        workspace_id: Some(ws.id.as_str().into()),
        namespace: Some("coder".into()),
        model: Some("NVIDIA A10G".into()),
        source: std::sync::Arc::from("http://10.0.0.7:9400/metrics"),
        attribution: Attribution::Exclusive,
        real_pod_uid: false,
        points: (from_min..=to_min).map(|m| Point { at: at0 + minute(m), values: idle, energy_joules: Some(1.0e9 + m as f64) }).collect(),
    }
}

/// Readings are stored as f32: compare within its precision. `None` must match `None`.
#[track_caller]
pub fn assert_close(got: Option<f64>, want: Option<f64>, context: impl std::fmt::Debug) {
    match (got, want) {
        (Some(g), Some(w)) => assert!((g - w).abs() <= w.abs() * 1e-6 + 1e-7, "{got:?} != {want:?}: {context:?}"),
        _ => assert_eq!(got, want, "{context:?}"),
    }
}

/// Where `installed_or_skip` notes each skipped test (under `CARGO_TARGET_TMPDIR`), for the
/// `skipped` target to print once at the end of `cargo test`.
pub const SKIPPED_FILE: &str = "skipped-tests.tsv";

/// A Debian package's program a test needs: `None` (the test skips, saying so) when it is
/// missing, unless the `CI` environment variable is set: then a missing one fails the test.
/// (`.ci/run` installs the packages, and exits if it cannot, but does not set `CI` itself.)
pub fn installed_or_skip<T>(found: Option<T>, package: &str) -> Option<T> {
    if found.is_none() {
        assert!(std::env::var("CI").is_err(), "CI must install Debian's {package} package (.ci/run does)");
        eprintln!("skipped: {package} is not installed (apt-get install {package})");
        let test = std::thread::current().name().unwrap_or("a test").to_string();
        let note = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(SKIPPED_FILE);
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(note) {
            use std::io::Write;
            let _ = writeln!(f, "{test}\t{package}");
        }
    }
    found
}

/// The audit log's lines as JSON, but `stop_running`: whether a pass looks while a quick
/// provisioner runs the job is a matter of timing, so tests read the states that always come.
pub fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["event"] != "stop_running")
        .collect()
}

/// A scratch copy of some of the repository's files, for planting a breach in; removed when
/// dropped. `architecture.rs` copies the sources to scan them, `fences.rs` the workspace to build.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Copies `files` (relative to the repository) into a fresh folder named after `prefix`
    /// (none: an empty scratch folder).
    pub fn of(prefix: &str, files: impl IntoIterator<Item = String>) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        std::fs::create_dir_all(&dir).unwrap();
        for file in files {
            let to = dir.join(&file);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(root.join(&file), to).unwrap();
        }
        Scratch(dir)
    }

    /// Inserts `code` after the file's first line that contains `after`.
    pub fn plant(self, file: &str, after: &str, code: &str) -> Self {
        let path = self.0.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let at = text.find(after).unwrap_or_else(|| panic!("{after:?} not in {file}"));
        let at = text[at..].find('\n').map_or(text.len(), |n| at + n + 1);
        std::fs::write(&path, format!("{}{code}\n{}", &text[..at], &text[at..])).unwrap();
        self
    }

    /// Replaces the first `from` in the file with `to`.
    pub fn replace(self, file: &str, from: &str, to: &str) -> Self {
        let path = self.0.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from:?} not in {file}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        self
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
