//! The invariants ARCHITECTURE.md states, checked on the sources: which module may import what,
//! which code may read the clock or touch the network, where side effects and the mode check
//! live, and that the code map lists every source file.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` (relative to the repository), recursively, sorted.
fn rust_files(dir: &str) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root().join(dir), &mut found);
    let mut rel: Vec<String> = found.iter().map(|p| p.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/")).collect();
    rel.sort();
    rel
}

/// The file's code, without comments and outside `#[cfg(test)]` modules.
fn code(rel: &str) -> String {
    let text = std::fs::read_to_string(root().join(rel)).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The crate modules a file names (`crate::x::...` gives `x`; `super::` inside `gpu/` stays).
fn crate_imports(rel: &str) -> Vec<String> {
    let code = code(rel);
    let mut out: Vec<String> = code
        .match_indices("crate::")
        .map(|(i, _)| code[i + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
        .collect();
    out.sort();
    out.dedup();
    out
}

fn files_mentioning(needle: &str) -> Vec<String> {
    rust_files("src").into_iter().filter(|f| code(f).contains(needle)).collect()
}

#[test]
fn dependencies_point_down() {
    let allowed = |dir: &str, own: &str, others: &[&str]| {
        for file in rust_files(dir) {
            for m in crate_imports(&file) {
                assert!(m == own || others.contains(&m.as_str()), "{file} imports crate::{m}; {dir} may use only {own} and {others:?}");
            }
        }
    };
    allowed("src/gpu", "gpu", &["error", "http", "json_split"]);
    allowed("src/coder", "coder", &["retry", "error", "http"]);
    for leaf in ["src/duration.rs", "src/error.rs", "src/http.rs", "src/json_split.rs", "src/retry.rs"] {
        for m in crate_imports(leaf) {
            assert!(["duration", "error", "http", "json_split", "retry"].contains(&m.as_str()), "{leaf} is a leaf but imports crate::{m}");
        }
    }
    assert!(crate_imports("src/json_split.rs").is_empty(), "the JSON splitter uses nothing of this crate");
}

#[test]
fn the_decision_code_does_no_io_and_reads_no_clock() {
    for file in ["src/decide.rs", "src/policy.rs", "src/duration.rs", "src/stop_lifecycle.rs"] {
        let code = code(file);
        for banned in ["tokio", "reqwest", "std::fs", "std::net", "Utc::now", "Local::now", "Instant::now", "SystemTime"] {
            assert!(!code.contains(banned), "{file} mentions {banned}: decisions are pure");
        }
    }
}

#[test]
fn only_the_actuator_acts() {
    for needle in [".stop_workspace(", ".set_ttl(", "AuditLog", "Notifier"] {
        let users: Vec<String> = files_mentioning(needle)
            .into_iter()
            .filter(|f| !matches!(f.as_str(), "src/actuator.rs" | "src/audit.rs" | "src/coder/mod.rs"))
            .collect();
        assert!(users.is_empty(), "{needle} is used outside the actuator: {users:?}");
    }
}

#[test]
fn the_mode_is_checked_in_exactly_one_place() {
    let mut checks = Vec::new();
    for file in rust_files("src") {
        let code = code(&file);
        for pattern in ["== Mode::", "!= Mode::", "Mode::Observe =>", "Mode::Enforce =>"] {
            checks.extend(code.matches(pattern).map(|_| (file.clone(), pattern)));
        }
    }
    // `Mode`'s own methods phrase texts per mode (match arms in actuator.rs); the one decision
    // to act or not is the single comparison.
    let comparisons: Vec<_> = checks.iter().filter(|(_, p)| p.contains("=")).filter(|(_, p)| !p.ends_with("=>")).collect();
    assert_eq!(comparisons.len(), 1, "one mode comparison in the crate: {comparisons:?}");
    assert!(checks.iter().all(|(f, _)| f == "src/actuator.rs"), "mode checks outside the actuator: {checks:?}");
}

#[test]
fn the_code_map_lists_every_source_file() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut files = rust_files("src");
    files.extend(rust_files("mocks/src"));
    files.extend(rust_files("tests"));
    files.extend(rust_files("benches"));
    let missing: Vec<&String> = files.iter().filter(|f| !map.contains(&format!("`{f}`"))).collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md's code map does not list {missing:?}");
}

#[test]
fn every_outgoing_client_refuses_redirects_and_every_body_is_bounded() {
    let builders: Vec<String> = files_mentioning("Client::builder()").into_iter().filter(|f| f != "src/http.rs").collect();
    assert!(builders.is_empty(), "build HTTP clients with http::client (no redirects, the configured CAs): {builders:?}");
    assert!(code("src/http.rs").contains("redirect::Policy::none()"));
    for unbounded in [".bytes().await", ".text().await", ".json().await"] {
        let users = files_mentioning(unbounded);
        assert!(users.is_empty(), "{unbounded} reads a peer's body whole; use http::read_limited: {users:?}");
    }
}
