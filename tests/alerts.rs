//! The shipped alert rules (`deploy/prometheus/`): promtool checks them and runs their unit
//! tests (every alert firing and quiet, with its exact annotations), the PrometheusRule is the
//! same rules file, and every metric an alert reads is one the binary registers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::installed_or_skip;

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(folder().join(name)).unwrap()
}

/// The alert names, in file order.
fn alerts() -> Vec<String> {
    read("coder-gpu-reclaimer.rules.yaml").lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).map(str::to_string).collect()
}

#[test]
fn promtool_checks_the_rules_and_runs_their_tests() {
    let Some((_, promtool)) = installed_or_skip(crate::prometheus_world::installed(), "prometheus") else { return };
    for args in [["check", "rules", "coder-gpu-reclaimer.rules.yaml"], ["test", "rules", "coder-gpu-reclaimer.rules.test.yaml"]] {
        let out = Command::new(&promtool).args(args).current_dir(folder()).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "promtool {}: {text}", args.join(" "));
        assert!(text.contains("SUCCESS"), "{text}");
    }
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_case_and_says_what_to_do() {
    let tests = read("coder-gpu-reclaimer.rules.test.yaml");
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in tests.split("alertname: ").skip(1) {
        let name = case.lines().next().unwrap().trim().to_string();
        let expectation = case.lines().nth(1).unwrap_or("").trim();
        if expectation == "exp_alerts: []" {
            quiet.insert(name);
        } else {
            assert!(case.contains("exp_annotations:"), "{name}: a firing case checks the annotations too");
            firing.insert(name);
        }
    }
    let alerts = alerts();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for a in &alerts {
        assert!(firing.contains(a) && quiet.contains(a), "{a}: needs a firing and a quiet case (firing {firing:?}, quiet {quiet:?})");
    }
    let rules = read("coder-gpu-reclaimer.rules.yaml");
    for block in rules.split("- alert: ").skip(1) {
        let name = block.lines().next().unwrap();
        assert!(block.contains("summary:") && block.contains("description:"), "{name}: a summary and a description");
        assert!(
            ["coder-gpu-reclaimer check", "coder tokens create", "policy", "Coder"].iter().any(|fix| block.contains(fix)),
            "{name}: the description names the fix"
        );
    }
}

#[test]
fn the_prometheusrule_is_the_rules_file() {
    let rules = read("coder-gpu-reclaimer.rules.yaml");
    let spec: Vec<String> =
        rules.lines().filter(|l| !l.starts_with('#')).map(|l| if l.is_empty() { String::new() } else { format!("  {l}") }).collect();
    let manifest = read("prometheusrule.yaml");
    let (head, body) = manifest.split_once("\nspec:\n").unwrap();
    assert!(head.contains("kind: PrometheusRule") && head.contains("apiVersion: monitoring.coreos.com/v1"), "{head}");
    assert_eq!(body.trim_end(), spec.join("\n").trim_end(), "prometheusrule.yaml's spec must be the rules file, indented by two");
    let module = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("terraform/main.tf")).unwrap();
    assert!(
        module.contains("file(\"${path.module}/../deploy/prometheus/coder-gpu-reclaimer.rules.yaml\")")
            && module.contains("yamldecode(var.runbook_base_url == \"\" ? local.rules"),
        "the module reads the same file"
    );
}

#[test]
fn every_metric_an_alert_reads_is_registered() {
    // Every family the registry registers (families without a series yet are not encoded).
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pass/metrics.rs")).unwrap();
    let exported: BTreeSet<String> = source
        .split("registry.register(")
        .skip(1)
        .filter_map(|r| r.split('"').nth(1))
        .map(|name| format!("coder_gpu_reclaimer_{name}"))
        .collect();
    assert!(exported.len() >= 15, "{exported:?}");
    let rules = read("coder-gpu-reclaimer.rules.yaml");
    let mut read_names = BTreeSet::new();
    for part in rules.split("coder_gpu_reclaimer_").skip(1) {
        let name: String = part.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let family = ["_total", "_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name).to_string();
        read_names.insert(format!("coder_gpu_reclaimer_{family}"));
    }
    assert!(read_names.len() >= 7, "{read_names:?}");
    for name in read_names {
        assert!(exported.contains(&name), "{name} is not a metric of the binary: {exported:?}");
    }
}

/// Every alert carries a `runbook_url` to its own section of `docs/runbooks.md`, and that section
/// says what it means, how to check and how to fix; the manifest's pod carries the annotations
/// Coder's observability chart finds scrape targets by.
#[test]
fn every_alert_has_a_runbook_section_and_the_pod_can_be_found_by_annotation() {
    let rules = read("coder-gpu-reclaimer.rules.yaml");
    let runbooks = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/runbooks.md")).unwrap();
    for block in rules.split("- alert: ").skip(1) {
        let name = block.lines().next().unwrap().trim();
        let want = format!("runbook_url: docs/runbooks.md#{}", name.to_lowercase());
        assert!(block.contains(&want), "{name}: {want}");
        let section = runbooks.split(&format!("\n## {name}\n")).nth(1).unwrap_or_else(|| panic!("{name}: no section in docs/runbooks.md"));
        let section = section.split("\n## ").next().unwrap();
        for part in ["**Means:**", "**Check:**", "**Fix:**"] {
            assert!(section.contains(part), "{name}: its runbook says {part}");
        }
    }
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/coder-gpu-reclaimer.yaml")).unwrap();
    assert!(
        manifest.contains("annotations: {prometheus.io/scrape: \"true\", prometheus.io/port: \"9465\", prometheus.io/path: /metrics}"),
        "the pod's scrape annotations, on the health port that serves /metrics"
    );
    let module = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("terraform/main.tf")).unwrap();
    assert!(module.contains("\"prometheus.io/scrape\" = \"true\"") && module.contains("var.runbook_base_url"), "the module too");
}
