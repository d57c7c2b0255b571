//! The status API as a contract: `docs/status.schema.json` (JSON Schema 2020-12) describes the
//! document `run` serves, `plan --output json` prints and the demo serves, and each of them is
//! validated against it here. The validator covers the keywords the schema uses (`$ref` into
//! `$defs`, `type` with `null`, `enum`, `required`, `additionalProperties: false`, `items`,
//! `minimum`, `format: date-time`); a keyword it does not know fails the test, so the schema
//! cannot quietly outgrow it.

use std::path::Path;
use std::time::Duration;

use chrono::DateTime;
use mocks::{FakeCoder, FakeExporter, Load};
use serde_json::Value;

use crate::common::service::{Service, exit_of, holds_gpu, until, world};

pub fn schema() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const KNOWN: &[&str] = &[
    "$schema",
    "$ref",
    "$defs",
    "title",
    "description",
    "type",
    "enum",
    "required",
    "additionalProperties",
    "properties",
    "items",
    "minimum",
    "format",
];

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

fn validate(root: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(s) = schema.as_object() else { return errors.push(format!("{at}: the schema is not an object")) };
    if let Some(unknown) = s.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        errors.push(format!("{at}: the validator does not know the keyword {unknown}"));
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/$defs/");
        return match root["$defs"].get(name) {
            Some(def) => validate(root, def, v, at, errors),
            None => errors.push(format!("{at}: no definition {r}")),
        };
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !types.is_empty() && !types.iter().any(|t| type_matches(t, v)) {
        return errors.push(format!("{at}: {v} is not of type {types:?}"));
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array).filter(|a| !a.contains(v)) {
        errors.push(format!("{at}: {v} is not one of {allowed:?}"));
    }
    if let (Some(min), Some(x)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if x < min {
            errors.push(format!("{at}: {x} is below {min}"));
        }
    }
    if let (Some("date-time"), Some(t)) = (s.get("format").and_then(Value::as_str), v.as_str()) {
        if DateTime::parse_from_rfc3339(t).is_err() {
            errors.push(format!("{at}: {t:?} is not an RFC 3339 time"));
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            validate(root, items, item, &format!("{at}[{i}]"), errors);
        }
    }
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for req in s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            if !obj.contains_key(req) {
                errors.push(format!("{at}: the required field {req} is missing"));
            }
        }
        for (k, field) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(p) => validate(root, p, field, &format!("{at}.{k}"), errors),
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => errors.push(format!("{at}.{k}: not in the schema")),
                None => {}
            }
        }
    }
}

/// The errors of a status document (or, with `def`, of one of its `$defs`).
pub fn errors(doc: &Value, def: Option<&str>) -> Vec<String> {
    let root = schema();
    let mut errors = Vec::new();
    let schema = def.map_or(root.clone(), |d| serde_json::json!({ "$ref": format!("#/$defs/{d}") }));
    validate(&root, &schema, doc, "$", &mut errors);
    errors
}

#[test]
fn the_schema_names_every_verdict_and_reason_code() {
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src/pass/decide.rs")).unwrap();
    let codes = |prefix: &str| -> Vec<String> {
        source
            .split(prefix)
            .skip(1)
            .filter_map(|s| s.split_once(" => \""))
            .filter_map(|(_, r)| r.split('"').next())
            // Codes only (lowercase words), not the messages other matches return.
            .filter(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '-'))
            .map(str::to_string)
            .collect()
    };
    let s = schema();
    let listed = |v: &Value| -> Vec<String> { v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect() };
    assert_eq!(listed(&s["$defs"]["workspace"]["properties"]["verdict"]["enum"]), codes("Verdict::"));
    assert_eq!(listed(&s["$defs"]["workspace"]["properties"]["reason"]["enum"]), codes("Reason::"));
    // The validator catches what it should.
    let doc = serde_json::json!({"generated_at": "yesterday", "mode": "maybe", "accounting": {}, "workspaces": [{}], "extra": 1});
    let e = errors(&doc, None);
    for want in
        ["$.generated_at", "$.mode", "$.accounting: the required field recent_stops", "$.workspaces[0]: the required field id", "$.extra"]
    {
        assert!(e.iter().any(|x| x.starts_with(want)), "{want} not caught: {e:#?}");
    }
}

#[tokio::test]
async fn run_and_plan_serve_documents_that_fit_the_schema() {
    let coder = FakeCoder::start(world(3)).await.unwrap();
    let ex = FakeExporter::start(coder.world.clone(), mocks::ExporterConfig::default()).await.unwrap();
    let busy = coder.with(|w| w.create_workspace("alice", "train", None)).unwrap();
    let idle = coder.with(|w| w.create_workspace("bob", "notebook", None)).unwrap();
    let stopped = coder.with(|w| w.create_workspace("alice", "gone", None)).unwrap();
    until(&coder, "all hold a GPU", Duration::from_secs(5), |w| [busy, idle, stopped].iter().all(|id| holds_gpu(w, *id))).await;
    coder.with(|w| w.set_load(busy, Load::Matmul));
    coder.with(|w| w.create_workspace("bob", "waits", None)).unwrap();
    coder.with(|w| w.create_prebuild("pre")).unwrap();
    let dir = std::env::temp_dir().join(format!("cgr-schema-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    // A price, a warning for one of them and an immediate stop for the other: every part of the
    // document is filled in.
    std::fs::write(&policy, "gpu_hour_price = { \"NVIDIA A10G\" = 0.75 }\n[[rule]]\nowner = \"bob\"\ngrace = \"10m\"\n").unwrap();
    let svc = Service::start(&coder, &[ex.url()], &coder.owner_token(), &["--config", policy.to_str().unwrap()]);
    let addr = svc.addr().await;
    let mut doc = Value::Null;
    for _ in 0..60 {
        doc = reqwest::get(format!("http://{addr}/api/v1/workspaces")).await.unwrap().json().await.unwrap();
        let warned = doc["workspaces"].as_array().unwrap().iter().any(|w| w["verdict"] == "warn");
        if warned && !doc["accounting"]["recent_stops"].as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(doc["accounting"]["cost"].is_object() && !doc["accounting"]["recent_stops"].as_array().unwrap().is_empty(), "{doc}");
    let e = errors(&doc, None);
    assert!(e.is_empty(), "run's document: {e:#?}\n{doc}");
    let one: Value = reqwest::get(format!("http://{addr}/api/v1/workspaces/{busy}")).await.unwrap().json().await.unwrap();
    assert!(errors(&one, Some("workspace")).is_empty(), "{one}");
    drop(svc);
    let args = ["plan", "--coder-url", &coder.url(), "--dcgm-exporter", &ex.url(), "--output", "json", "--sample-for", "2s"];
    let (code, out) = exit_of(&args, &coder.owner_token()).await;
    assert_eq!(code, 0, "{out}");
    let plan: Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
    assert_eq!(plan["mode"], "plan");
    let e = errors(&plan, None);
    assert!(e.is_empty(), "plan's document: {e:#?}\n{plan}");
    std::fs::remove_dir_all(&dir).ok();
}
