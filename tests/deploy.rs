//! The Terraform module, the workspace template, the plain manifest and the documented policies
//! agree with the binary: every `.tf` parses (hcl-rs); every variable referenced is declared;
//! every flag the module passes exists in the binary's clap definition (asked of clap); the
//! template's metadata reads the status route; the counters file switches SM_ACTIVE on; the
//! example policies parse with the real policy loader.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::CommandFactory;
use coder_gpu_reclaimer::cli::{Cli, CommonArgs};
use coder_gpu_reclaimer::config::{FileConfig, build_policy};
use hcl::expr::{Expression, Operation, TemplateExpr, TraversalOperator};
use hcl::template::{Directive, Element, Template};
use hcl::{Block, Body};

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn tf_files(dir: &str) -> Vec<(PathBuf, Body)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo(dir)).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "tf") {
            let text = std::fs::read_to_string(&path).unwrap();
            let body = hcl::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path, body));
        }
    }
    assert!(!out.is_empty(), "no .tf files in {dir}");
    out
}

/// What a walk over expressions found.
#[derive(Default)]
struct Found {
    vars: BTreeSet<String>,
    /// (literal, inside a conditional?)
    strings: Vec<(String, bool)>,
    raw_templates: Vec<String>,
}

fn visit_template(t: &Template, cond: bool, f: &mut Found) {
    for el in t.elements() {
        match el {
            Element::Literal(s) => f.strings.push((s.clone(), cond)),
            Element::Interpolation(i) => visit(&i.expr, cond, f),
            Element::Directive(d) => match &**d {
                Directive::If(x) => {
                    visit(&x.cond_expr, cond, f);
                    visit_template(&x.true_template, true, f);
                    if let Some(t) = &x.false_template {
                        visit_template(t, true, f);
                    }
                }
                Directive::For(x) => {
                    visit(&x.collection_expr, cond, f);
                    visit_template(&x.template, cond, f);
                }
            },
        }
    }
}

fn visit(e: &Expression, cond: bool, f: &mut Found) {
    match e {
        Expression::String(s) => f.strings.push((s.clone(), cond)),
        Expression::Array(a) => a.iter().for_each(|x| visit(x, cond, f)),
        Expression::Object(o) => {
            for (k, v) in o {
                if let hcl::ObjectKey::Expression(k) = k {
                    visit(k, cond, f);
                }
                visit(v, cond, f);
            }
        }
        Expression::TemplateExpr(t) => {
            let raw = match &**t {
                TemplateExpr::QuotedString(s) => s.clone(),
                TemplateExpr::Heredoc(h) => h.template.clone(),
            };
            f.raw_templates.push(raw);
            if let Ok(tpl) = Template::from_expr(t) {
                visit_template(&tpl, cond, f);
            }
        }
        Expression::Traversal(t) => {
            if let Expression::Variable(v) = &t.expr {
                if v.as_str() == "var" {
                    if let Some(TraversalOperator::GetAttr(name)) = t.operators.first() {
                        f.vars.insert(name.to_string());
                    }
                }
            }
            visit(&t.expr, cond, f);
            for op in &t.operators {
                if let TraversalOperator::Index(i) = op {
                    visit(i, cond, f);
                }
            }
        }
        Expression::FuncCall(c) => c.args.iter().for_each(|x| visit(x, cond, f)),
        Expression::Parenthesis(p) => visit(p, cond, f),
        Expression::Conditional(c) => {
            visit(&c.cond_expr, cond, f);
            visit(&c.true_expr, true, f);
            visit(&c.false_expr, true, f);
        }
        Expression::Operation(op) => match &**op {
            Operation::Unary(u) => visit(&u.expr, cond, f),
            Operation::Binary(b) => {
                visit(&b.lhs_expr, cond, f);
                visit(&b.rhs_expr, cond, f);
            }
        },
        Expression::ForExpr(x) => {
            visit(&x.collection_expr, cond, f);
            visit(&x.value_expr, cond, f);
            for e in x.key_expr.iter().chain(x.cond_expr.iter()) {
                visit(e, cond, f);
            }
        }
        _ => {}
    }
}

fn visit_body(b: &Body, f: &mut Found) {
    for a in b.attributes() {
        visit(&a.expr, false, f);
    }
    for block in b.blocks() {
        visit_body(&block.body, f);
    }
}

fn blocks<'a>(b: &'a Body, ident: &str) -> Vec<&'a Block> {
    b.blocks().filter(|x| x.identifier.as_str() == ident).collect()
}

fn declared(bodies: &[(PathBuf, Body)]) -> BTreeSet<String> {
    bodies.iter().flat_map(|(_, b)| blocks(b, "variable")).filter_map(|v| v.labels.first().map(|l| l.as_str().to_string())).collect()
}

#[test]
fn every_tf_file_parses_and_every_variable_referenced_is_declared() {
    for dir in ["terraform", "terraform/examples/basic", "coder"] {
        let bodies = tf_files(dir);
        let mut f = Found::default();
        bodies.iter().for_each(|(_, b)| visit_body(b, &mut f));
        let declared = declared(&bodies);
        let missing: Vec<&String> = f.vars.iter().filter(|v| !declared.contains(*v)).collect();
        assert!(missing.is_empty(), "{dir}: var.{missing:?} used but not declared");
        assert!(!f.vars.is_empty(), "{dir}: the walk found no variable references at all");
    }
}

fn run_flags() -> BTreeSet<String> {
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").expect("run subcommand");
    run.get_arguments().filter_map(|a| a.get_long().map(|l| format!("--{l}"))).collect()
}

#[test]
fn every_flag_the_module_passes_exists_in_the_binary() {
    let flags = run_flags();
    assert!(flags.contains("--enforce") && flags.contains("--coder-url"), "asked clap: {flags:?}");
    let mut f = Found::default();
    for (_, b) in tf_files("terraform") {
        visit_body(&b, &mut f);
    }
    let passed: Vec<&(String, bool)> = f.strings.iter().filter(|(s, _)| s.starts_with("--")).collect();
    assert!(passed.len() >= 10, "{passed:?}");
    for (flag, _) in &passed {
        assert!(flags.contains(flag.as_str()), "the module passes {flag}, which `coder-gpu-reclaimer run` does not have");
    }
    assert!(passed.iter().any(|(s, c)| s == "--enforce" && *c), "--enforce is passed only under a condition");
    assert!(!passed.iter().any(|(s, c)| s == "--enforce" && !*c), "--enforce must never be passed unconditionally");
    let enforce = blocks(&tf_files("terraform").into_iter().find(|(p, _)| p.ends_with("variables.tf")).unwrap().1, "variable")
        .into_iter()
        .find(|v| v.labels.first().is_some_and(|l| l.as_str() == "enforce"))
        .map(|v| v.body.attributes().find(|a| a.key.as_str() == "default").map(|a| a.expr.clone()))
        .unwrap();
    assert_eq!(enforce, Some(Expression::Bool(false)), "observe by default");
    // The plain manifest too.
    let yaml = std::fs::read_to_string(repo("deploy/coder-gpu-reclaimer.yaml")).unwrap();
    for flag in yaml.lines().filter_map(|l| l.trim().strip_prefix("- ").filter(|s| s.starts_with("--"))) {
        assert!(flags.contains(flag), "deploy/coder-gpu-reclaimer.yaml passes {flag}, which the binary does not have");
    }
}

#[test]
fn the_templates_metadata_reads_the_status_route() {
    let bodies = tf_files("coder");
    let body = &bodies[0].1;
    let agent =
        blocks(body, "resource").into_iter().find(|r| r.labels.first().is_some_and(|l| l.as_str() == "coder_agent")).expect("coder_agent");
    let mut f = Found::default();
    visit_body(&agent.body, &mut f);
    let want = coder_gpu_reclaimer::serve::WORKSPACE_ROUTE.replace("{id}", "${data.coder_workspace.me.id}");
    assert!(
        f.raw_templates.iter().any(|t| t.contains(&format!("{want}?format=text"))),
        "no metadata script reads {want}: {:?}",
        f.raw_templates
    );
    let timeout = agent.body.attributes().find(|a| a.key.as_str() == "connection_timeout").map(|a| a.expr.clone());
    assert!(matches!(timeout, Some(Expression::Number(_))), "an explicit agent connection_timeout");
    let deployment = blocks(body, "resource")
        .into_iter()
        .find(|r| r.labels.first().is_some_and(|l| l.as_str() == "kubernetes_deployment_v1"))
        .expect("deployment");
    let wait = deployment.body.attributes().find(|a| a.key.as_str() == "wait_for_rollout").map(|a| a.expr.clone());
    assert_eq!(wait, Some(Expression::Bool(false)));
    let mut d = Found::default();
    visit_body(&deployment.body, &mut d);
    assert!(d.raw_templates.iter().any(|t| t == "coder-${data.coder_workspace.me.id}"), "the official Deployment name");
    let text = std::fs::read_to_string(repo("coder/main.tf")).unwrap();
    for label in ["\"nvidia.com/gpu\"", "\"com.coder.workspace.id\"", "\"com.coder.workspace.name\""] {
        assert!(text.contains(label), "{label}");
    }
}

fn enabled_fields(csv: &str) -> Vec<String> {
    csv.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(',').next().map(|f| f.trim().to_string()))
        .collect()
}

#[test]
fn the_counters_configmap_is_the_real_default_with_sm_active_on() {
    let ours = std::fs::read_to_string(repo("terraform/dcgm-counters.csv")).unwrap();
    let fields = enabled_fields(&ours);
    for want in [
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
    ] {
        assert!(fields.iter().any(|f| f == want), "{want} is not enabled");
    }
    let upstream = std::fs::read_to_string(crate::common::reference("dcgm/default-counters.csv")).unwrap();
    let mut theirs = enabled_fields(&upstream);
    theirs.push("DCGM_FI_PROF_SM_ACTIVE".into());
    let (mut a, mut b) = (fields.clone(), theirs);
    a.sort();
    b.sort();
    assert_eq!(a, b, "exactly the upstream default counters plus SM_ACTIVE");
    let module = std::fs::read_to_string(repo("terraform/main.tf")).unwrap();
    assert!(module.contains("file(\"${path.module}/dcgm-counters.csv\")"), "the ConfigMap ships this file");
}

fn policy_examples() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo("docs/examples")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "toml") {
            out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
        }
    }
    for doc in ["README.md", "docs/policy.md"] {
        let text = std::fs::read_to_string(repo(doc)).unwrap_or_default();
        for (n, block) in text.split("```toml\n").skip(1).enumerate() {
            if let Some(end) = block.find("```") {
                out.push((format!("{doc} block {}", n + 1), block[..end].to_string()));
            }
        }
    }
    out
}

#[test]
fn every_documented_policy_parses_with_the_real_loader() {
    let examples = policy_examples();
    assert!(examples.len() >= 4, "{:?}", examples.iter().map(|e| &e.0).collect::<Vec<_>>());
    for (name, text) in examples {
        let file = FileConfig::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let interval = file.interval.unwrap_or(std::time::Duration::from_secs(60));
        build_policy(&CommonArgs::default(), &file, interval).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let team = FileConfig::parse(&std::fs::read_to_string(repo("docs/examples/team-policy.toml")).unwrap()).unwrap();
    let p = build_policy(&CommonArgs::default(), &team, std::time::Duration::from_secs(60)).unwrap();
    assert_eq!((p.rules.len(), p.thresholds.grace.as_secs(), p.max_stops_per_pass), (2, 600, 5));
}

#[test]
fn the_policy_reference_names_every_key() {
    let reference = std::fs::read_to_string(repo("docs/policy.md")).unwrap();
    // Every key the file accepts, taken from a file that sets them all (the parser rejects
    // unknown keys, so this list cannot name one that does not exist).
    let all = std::fs::read_to_string(repo("docs/examples/all-keys.toml")).unwrap();
    FileConfig::parse(&all).unwrap();
    for key in all.lines().filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim())).filter(|k| !k.starts_with('#')) {
        assert!(reference.contains(&format!("`{key}`")), "docs/policy.md does not describe `{key}`");
    }
}

#[test]
fn secrets_are_mounted_files_and_a_network_policy_guards_the_pod() {
    let bodies = tf_files("terraform");
    let mut f = Found::default();
    bodies.iter().for_each(|(_, b)| visit_body(b, &mut f));
    let flags: Vec<&str> = f.strings.iter().map(|(s, _)| s.as_str()).filter(|s| s.starts_with("--")).collect();
    for file_flag in ["--token-file", "--notify-webhook-file", "--status-token-file"] {
        assert!(flags.contains(&file_flag), "the module passes {file_flag}: {flags:?}");
    }
    assert!(!flags.contains(&"--notify-webhook"), "the webhook URL is a secret: never an argument");
    let main = std::fs::read_to_string(repo("terraform/main.tf")).unwrap();
    assert!(!main.contains("CODER_SESSION_TOKEN"), "the token is a mounted file, not an env var");
    let resources: Vec<String> =
        bodies.iter().flat_map(|(_, b)| blocks(b, "resource")).filter_map(|r| r.labels.first().map(|l| l.as_str().to_string())).collect();
    assert!(resources.iter().any(|r| r == "kubernetes_network_policy_v1"), "{resources:?}");
    let variables = blocks(&bodies.iter().find(|(p, _)| p.ends_with("variables.tf")).unwrap().1, "variable");
    for secret in ["coder_session_token", "notify_webhook", "status_token"] {
        let v = variables.iter().find(|v| v.labels.first().is_some_and(|l| l.as_str() == secret)).unwrap();
        let sensitive = v.body.attributes().find(|a| a.key.as_str() == "sensitive").map(|a| a.expr.clone());
        assert_eq!(sensitive, Some(Expression::Bool(true)), "var.{secret} is sensitive");
    }
    let yaml = std::fs::read_to_string(repo("deploy/coder-gpu-reclaimer.yaml")).unwrap();
    assert!(yaml.contains("kind: NetworkPolicy") && yaml.contains("- --token-file") && !yaml.contains("CODER_SESSION_TOKEN"));
}

#[test]
fn the_dockerfile_pins_every_base_image_by_digest() {
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let froms: Vec<&str> = dockerfile.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    for from in froms {
        let image = from.split_whitespace().nth(1).unwrap();
        let digest = image.split_once("@sha256:").map(|(_, d)| d).unwrap_or("");
        assert!(digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()), "{from}: pin it by digest");
    }
}

/// The module and the manifest point the probes (and the ServiceMonitor) at a port of their own,
/// require the status token on the fleet routes, and name who may reach each port.
#[test]
fn probes_have_a_port_of_their_own_and_the_fleet_routes_a_token() {
    let bodies = tf_files("terraform");
    let mut f = Found::default();
    bodies.iter().for_each(|(_, b)| visit_body(b, &mut f));
    let flags: Vec<&str> = f.strings.iter().map(|(s, _)| s.as_str()).collect();
    assert!(flags.contains(&"--health-listen") && flags.contains(&"--status-token-file"), "{flags:?}");
    let status_flag = f.strings.iter().find(|(s, _)| s == "--status-token-file").unwrap();
    assert!(!status_flag.1, "the status token is not conditional: {status_flag:?}");
    let main = std::fs::read_to_string(repo("terraform/main.tf")).unwrap();
    for probe in ["liveness_probe", "readiness_probe"] {
        let block = &main[main.find(probe).unwrap()..];
        let port = block.split("port = \"").nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(port, "health", "{probe} uses the health port");
    }
    assert!(main.contains(r#"endpoints = [{ port = "health", path = "/metrics""#), "Prometheus scrapes the health port");
    assert!(main.matches("namespace_selector").count() >= 2, "the NetworkPolicy names who may reach each port");
    assert!(main.contains("resource \"random_password\" \"status_token\""), "a status token is generated when none is given");
    let manifest = std::fs::read_to_string(repo("deploy/coder-gpu-reclaimer.yaml")).unwrap();
    for want in [
        "- --health-listen",
        "- --status-token-file",
        "livenessProbe: {httpGet: {path: /healthz, port: health}",
        "readinessProbe: {httpGet: {path: /readyz, port: health}",
        "namespaceSelector",
    ] {
        assert!(manifest.contains(want), "the manifest lacks {want:?}");
    }
}
