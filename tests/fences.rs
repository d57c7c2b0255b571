//! The fences the compiler keeps, shown: a copy of the workspace with breaches planted is built
//! by cargo, and each breach must fail the build with the error that names it. `cargo check`
//! shows what types refuse (writes on the read-only client, the core crate's missing runtime,
//! logger and clock); `cargo clippy -D warnings` shows clippy's bans (`clippy.toml`: clients and
//! whole-body reads by type, however spelled; `core/clippy.toml`: the environment, files and
//! every `now`). `architecture.rs` checks what no type can say.
//!
//! The copies build in `<target>/fences`, apart from the suite's own build; the first run there
//! compiles the dependencies once, in check mode. Cargo names a workspace member's artifacts
//! without its path and judges them fresh by the sources' times, so one copy is made and built at
//! a time (`ONE_AT_A_TIME`), each after the last build ended: its files are newer than any
//! artifact and are always built.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::Scratch;

/// Held while a copy is made and built.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The suite's target folder (`CARGO_TARGET_DIR` in CI, else `target/`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}

/// A buildable copy of the workspace: manifests, the lock, both clippy configurations and every
/// `.rs` file of the crates and their declared targets.
type Workspace = Scratch;

impl Scratch {
    fn whole() -> Self {
        let mut files: Vec<String> =
            ["Cargo.toml", "Cargo.lock", "clippy.toml", "core/Cargo.toml", "core/clippy.toml", "mocks/Cargo.toml"].map(String::from).into();
        for folder in ["src", "core/src", "mocks/src", "benches", "tests"] {
            collect(&root(), &root().join(folder), &mut files);
        }
        Scratch::of("fences", files)
    }

    /// Runs `cargo <command> <args>` in the copy; its exit status and what it printed.
    fn cargo(&self, command: &str, args: &[&str]) -> (bool, String) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args([command, "--offline", "--message-format", "short"])
            .args(args)
            .current_dir(&self.0)
            .env("CARGO_TARGET_DIR", target_dir().join("fences"))
            .env("CARGO_TERM_COLOR", "never")
            .output()
            .unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// Every `.rs` file under `dir`, relative to `base`.
fn collect(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let p = entry.unwrap().path();
        if p.is_dir() {
            collect(base, &p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
        }
    }
}

/// The build failed, and for each breach some error line names its file and says `says`.
fn refused(build: (bool, String), breaches: &[(&str, &str)]) {
    let (ok, out) = build;
    assert!(!ok, "the planted build must fail:\n{out}");
    for (file, says) in breaches {
        assert!(
            out.lines().any(|l| l.starts_with(file) && l.contains("error") && l.contains(says)),
            "{file}: an error saying {says:?}:\n{out}"
        );
    }
}

// The service crate: a stop spelled on the read-only client, from the evaluator and from
// `publish`; a write to `Outputs`' private audit log from `publish`.
#[test]
fn the_compiler_refuses_writes_without_the_capability() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    assert!(Workspace::whole().cargo("check", &["-p", "coder-gpu-reclaimer", "--lib"]).0, "the unchanged copy builds");
    let copy = Workspace::whole()
        .plant(
            "src/pass/evaluate.rs",
            "\nuse ",
            "async fn breach(c: &crate::coder::CoderClient) { let _ = crate::coder::CoderClient::stop_workspace(c, \"id\").await; }",
        )
        .plant(
            "src/pass/publish.rs",
            "\nuse ",
            "async fn breach(c: &crate::coder::CoderClient, t: chrono::DateTime<chrono::Utc>) { let _ = c.extend_deadline(\"id\", t).await; }",
        )
        .plant(
            "src/pass/status.rs",
            "\nuse ",
            "fn breach(o: &crate::pass::actuator::Outputs) -> bool { o.audit.is_some() }",
        );
    refused(
        copy.cargo("check", &["-p", "coder-gpu-reclaimer", "--lib"]),
        &[
            ("src/pass/evaluate.rs", "no function or associated item named `stop_workspace`"),
            ("src/pass/publish.rs", "no method named `extend_deadline`"),
            ("src/pass/status.rs", "field `audit` of struct `Outputs` is private"),
        ],
    );
}

// The service crate under clippy: a whole-body read inside a timeout (the spelling the old
// scan missed), a JSON read, and a client built by hand.
#[test]
fn clippy_refuses_unbounded_reads_and_hand_built_clients() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let copy = Workspace::whole()
        .plant(
            "src/gpu/exporter.rs",
            "\nuse ",
            "async fn breach(r: reqwest::Response) -> Option<String> { tokio::time::timeout(std::time::Duration::from_secs(1), r.text()).await.ok()?.ok() }",
        )
        .plant(
            "src/coder/identity.rs",
            "\nuse ",
            "async fn breach(r: reqwest::Response) -> Option<serde_json::Value> { r.json().await.ok() }",
        )
        .plant("src/pass/audit.rs", "\nuse ", "fn breach() -> reqwest::Client { reqwest::Client::new() }")
        .plant(
            "src/serve.rs",
            "\nuse ",
            "async fn breach(b: axum::body::Body) -> Option<bytes::Bytes> { axum::body::to_bytes(b, usize::MAX).await.ok() }",
        );
    refused(
        copy.cargo("clippy", &["-p", "coder-gpu-reclaimer", "--lib", "--", "-D", "warnings"]),
        &[
            ("src/gpu/exporter.rs", "disallowed method `reqwest::Response::text`"),
            ("src/coder/identity.rs", "disallowed method `reqwest::Response::json`"),
            ("src/pass/audit.rs", "disallowed method `reqwest::Client::new`"),
            ("src/serve.rs", "disallowed method `axum::body::to_bytes`"),
        ],
    );
}

// The core crate built alone (as CI builds it too): no logger or runtime to call, and chrono
// without its clock.
#[test]
fn the_core_crate_has_no_logger_no_runtime_and_no_clock() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    assert!(Workspace::whole().cargo("check", &["-p", "coder-gpu-reclaimer-core", "--lib"]).0, "the unchanged core builds");
    let copy = Workspace::whole()
        .plant("core/src/pass/decide.rs", "\nuse ", "fn breach() { tracing::warn!(\"from the decision code\"); }")
        .plant("core/src/pass/policy.rs", "\nuse ", "fn breach() { let _ = tokio::spawn(async {}); }")
        .plant(
            "core/src/gpu/window.rs",
            "\nuse ",
            "fn breach() -> chrono::DateTime<chrono::Utc> { one_helper_away() }\nfn one_helper_away() -> chrono::DateTime<chrono::Utc> { chrono::Utc::now() }",
        );
    refused(
        copy.cargo("check", &["-p", "coder-gpu-reclaimer-core", "--lib"]),
        &[("core/src/pass/decide.rs", "`tracing`"), ("core/src/pass/policy.rs", "`tokio`"), ("core/src/gpu/window.rs", "`now`")],
    );
}

// The core crate under clippy: the environment, the file system and the std clocks.
#[test]
fn clippy_keeps_the_core_crate_away_from_the_environment_files_and_clocks() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let copy = Workspace::whole()
        .plant("core/src/pass/policy.rs", "\nuse ", "fn breach() -> Option<String> { std::env::var(\"IDLE_AFTER\").ok() }")
        .plant("core/src/pass/deadline.rs", "\nuse ", "fn breach() -> std::time::Duration { std::time::Instant::now().elapsed() }")
        .plant("core/src/coder/types.rs", "\nuse ", "fn breach() -> Option<String> { std::fs::read_to_string(\"/etc/hostname\").ok() }")
        .plant("core/src/ledger/intent.rs", "\nuse ", "fn breach() -> bool { std::path::Path::new(\"/var/log/audit.jsonl\").exists() }")
        .plant(
            "core/src/gpu/window.rs",
            "\nuse ",
            "fn breach() -> bool { println!(\"from the windows\"); std::time::UNIX_EPOCH.elapsed().is_ok() }",
        );
    refused(
        copy.cargo("clippy", &["-p", "coder-gpu-reclaimer-core", "--lib", "--", "-D", "warnings"]),
        &[
            ("core/src/pass/policy.rs", "disallowed method `std::env::var`"),
            ("core/src/pass/deadline.rs", "disallowed method `std::time::Instant::now`"),
            ("core/src/coder/types.rs", "disallowed method `std::fs::read_to_string`"),
            ("core/src/ledger/intent.rs", "disallowed method `std::path::Path::exists`"),
            ("core/src/gpu/window.rs", "disallowed macro `std::println`"),
            ("core/src/gpu/window.rs", "disallowed method `std::time::SystemTime::elapsed`"),
        ],
    );
}
