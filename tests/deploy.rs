//! The Terraform module, the workspace template, the plain manifest and the documented policies
//! agree with the binary: every `.tf` parses (hcl-rs); every variable referenced is declared;
//! every flag the module passes exists in the binary's clap definition (asked of clap); the
//! template's metadata reads the status route; the counters file switches SM_ACTIVE on; the
//! example policies parse with the real policy loader; the audit log outlives a rollout, Secret
//! files are 0400 and an empty namespace list is refused.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::CommandFactory;
use coder_gpu_reclaimer::cli::{Cli, CommonArgs};
use coder_gpu_reclaimer::config::{FileConfig, build_policy};
use hcl::eval::{Context, Evaluate, FuncDef, ParamType};
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

fn labelled<'a>(bodies: &'a [(PathBuf, Body)], ident: &str, label: &str) -> &'a Block {
    bodies
        .iter()
        .flat_map(|(_, b)| blocks(b, ident))
        .find(|x| x.labels.first().is_some_and(|l| l.as_str() == label))
        .unwrap_or_else(|| panic!("no {ident} {label:?}"))
}

fn attr(b: &Body, key: &str) -> Option<Expression> {
    b.attributes().find(|a| a.key.as_str() == key).map(|a| a.expr.clone())
}

/// The bodies of every block `ident` under `b`, a `dynamic "ident"` block's content included.
fn nested<'a>(b: &'a Body, ident: &str) -> Vec<&'a Body> {
    let mut out = Vec::new();
    for x in b.blocks() {
        if x.identifier.as_str() == ident {
            out.push(&x.body);
        } else if x.identifier.as_str() == "dynamic" && x.labels.first().is_some_and(|l| l.as_str() == ident) {
            out.extend(blocks(&x.body, "content").into_iter().map(|c| &c.body));
        }
        out.extend(nested(&x.body, ident));
    }
    out
}

/// Whether `value` passes every validation of the variable (with Terraform's `length`, which
/// refuses null).
fn validates(v: &Block, value: hcl::Value) -> bool {
    let mut ctx = Context::new();
    let length = FuncDef::builder().param(ParamType::array_of(ParamType::Any)).build(|a| Ok(a[0].as_array().map_or(0, Vec::len).into()));
    ctx.declare_func("length", length);
    ctx.declare_var("var", hcl::Value::Object([(v.labels[0].as_str().to_string(), value)].into_iter().collect()));
    blocks(&v.body, "validation")
        .iter()
        .all(|c| matches!(attr(&c.body, "condition").map(|e| e.evaluate(&ctx)), Some(Ok(hcl::Value::Bool(true)))))
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
    let bodies = tf_files("terraform");
    assert_eq!(attr(&labelled(&bodies, "variable", "enforce").body, "default"), Some(Expression::Bool(false)), "observe by default");
    // Only the workspace namespace's pods speak for a workspace, by default; behind Prometheus
    // only the exporter's job.
    for want in ["--namespace", "--prometheus-job"] {
        assert!(passed.iter().any(|(s, _)| s == want), "the module does not pass {want}");
    }
    assert_eq!(attr(&labelled(&bodies, "variable", "workspace_namespace").body, "default"), Some(Expression::String("coder".into())));
    // The plain manifest too.
    let yaml = std::fs::read_to_string(repo("deploy/coder-gpu-reclaimer.yaml")).unwrap();
    let args: Vec<&str> = yaml.lines().filter_map(|l| l.trim().strip_prefix("- ")).collect();
    for flag in args.iter().filter(|s| s.starts_with("--")) {
        assert!(flags.contains(*flag), "deploy/coder-gpu-reclaimer.yaml passes {flag}, which the binary does not have");
    }
    assert!(args.windows(2).any(|w| w[0] == "--namespace" && !w[1].starts_with("--")), "the manifest passes --namespace");
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
    for secret in ["coder_session_token", "notify_webhook", "status_token"] {
        let sensitive = attr(&labelled(&bodies, "variable", secret).body, "sensitive");
        assert_eq!(sensitive, Some(Expression::Bool(true)), "var.{secret} is sensitive");
    }
    // Secret files 0400 (the binary warns on a token file others can read), readable through the
    // pod's fsGroup (the kubelet adds group read).
    let pod = &labelled(&bodies, "resource", "kubernetes_deployment_v1").body;
    let secrets = nested(pod, "secret");
    assert!(secrets.len() >= 2, "the token and the optional Secret volumes");
    for s in secrets {
        assert_eq!(attr(s, "default_mode"), Some(Expression::String("0400".into())), "a Secret volume without default_mode 0400");
    }
    assert!(nested(pod, "security_context").iter().any(|c| attr(c, "fs_group").is_some()), "the pod sets fs_group");
    // An empty namespace list renders an ingress rule with no `from`, which admits every pod.
    for (name, null_admits_any) in [("workspace_namespaces", true), ("metrics_namespaces", false)] {
        let v = labelled(&bodies, "variable", name);
        let coder = hcl::Value::Array(vec!["coder".into()]);
        assert!(validates(v, coder) && !validates(v, hcl::Value::Array(vec![])), "var.{name} must refuse an empty list");
        assert_eq!(validates(v, hcl::Value::Null), null_admits_any, "var.{name} = null");
        let says = blocks(&v.body, "validation")
            .iter()
            .any(|c| matches!(attr(&c.body, "error_message"), Some(Expression::String(m)) if m.contains(name)));
        assert!(says, "var.{name}: the error message names what to set");
    }
    let yaml = std::fs::read_to_string(repo("deploy/coder-gpu-reclaimer.yaml")).unwrap();
    assert!(yaml.contains("kind: NetworkPolicy") && yaml.contains("- --token-file") && !yaml.contains("CODER_SESSION_TOKEN"));
    let secret_volumes: Vec<&str> = yaml.lines().filter(|l| l.contains("secret: {secretName:")).collect();
    assert!(secret_volumes.len() >= 2, "{secret_volumes:?}");
    for l in secret_volumes {
        assert!(l.contains("defaultMode: 256") || l.contains("defaultMode: 0400"), "a Secret volume without defaultMode 0400: {l}");
    }
    assert!(yaml.contains("fsGroup: 65532"), "the manifest's pod sets fsGroup");
}

/// The audit trail outlives a rollout: by default on a PersistentVolumeClaim, never an emptyDir.
#[test]
fn the_audit_log_lives_on_a_persistent_volume_claim_by_default() {
    let bodies = tf_files("terraform");
    assert_eq!(attr(&labelled(&bodies, "variable", "audit_log_persistent").body, "default"), Some(Expression::Bool(true)));
    labelled(&bodies, "resource", "kubernetes_persistent_volume_claim_v1");
    let pod = &labelled(&bodies, "resource", "kubernetes_deployment_v1").body;
    let audit =
        nested(pod, "volume").into_iter().find(|v| attr(v, "name") == Some(Expression::String("audit".into()))).expect("audit volume");
    assert!(blocks(audit, "empty_dir").is_empty(), "the module's audit volume is an emptyDir whatever audit_log_persistent says");
    assert!(!nested(audit, "persistent_volume_claim").is_empty(), "the module's audit volume is never on a claim");
    let yaml = std::fs::read_to_string(repo("deploy/coder-gpu-reclaimer.yaml")).unwrap();
    let volume = yaml.lines().find(|l| l.contains("{name: audit,") && !l.contains("mountPath")).expect("the manifest's audit volume");
    assert!(volume.contains("persistentVolumeClaim: {claimName: coder-gpu-reclaimer-audit}"), "the manifest's audit volume: {volume}");
    assert!(yaml.contains("kind: PersistentVolumeClaim\nmetadata:\n  name: coder-gpu-reclaimer-audit\n"), "the manifest's claim");
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

/// The shipped configurations name the GPU templates (issue 42): the module's `gpu_templates`
/// variable has an example default written into the policy file, and the README's policy for
/// the manifest sets the key.
#[test]
fn the_shipped_configurations_set_gpu_templates() {
    let read = |p: &str| std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p)).unwrap();
    let variables = read("terraform/variables.tf");
    let block = variables.split("variable \"gpu_templates\" {").nth(1).unwrap_or_default();
    assert!(block.split("\n}").next().unwrap_or_default().contains("default     = [\"gpu-*\"]"), "{block}");
    let main = read("terraform/main.tf");
    assert!(
        main.contains("config_toml        = \"${local.selector_toml}${local.gpu_templates_toml}${var.policy_toml}\""),
        "the module writes it"
    );
    let team = FileConfig::parse(&read("docs/examples/team-policy.toml")).unwrap();
    let policy = build_policy(&CommonArgs::default(), &team, std::time::Duration::from_secs(60)).unwrap();
    assert!(!policy.gpu_templates.is_empty(), "the manifest's policy (the README's ConfigMap) names them");
}
