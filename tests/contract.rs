//! Contract tests against Coder v2.34.3's OpenAPI spec (`reference/coder/swagger.json`):
//! every fixture, every response of the fake Coder, and every request the client sends must fit
//! its schema. A tiny Swagger 2.0 validator lives here (types, formats, enums, required,
//! unknown fields). Four documented gaps are allowed: the build POST answers 201 where the spec
//! says 200; nullable fields (Go's NullTime, pointers) may be `null`, which Swagger 2.0 cannot
//! express; `uuid.NullUUID` (`task_id`) is documented as its Go struct but marshals as a UUID
//! string or `null` (google/uuid `NullUUID.MarshalJSON`); and an authcheck's `action` carries an
//! inline enum of four CRUD verbs while its type, `codersdk.RBACAction`, has them all
//! (`start`, `stop`, ...), which coderd evaluates (`coderd/authorize.go`; reference NOTES §14).

use std::time::Duration;

use chrono::DateTime;
use coder_gpu_reclaimer::coder::actions::CoderActions;
use coder_gpu_reclaimer::coder::{CoderClient, SessionToken};
use coder_gpu_reclaimer::retry::RetryPolicy;
use serde_json::Value;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::common::{fixture_json, reference};

pub fn spec() -> Value {
    let path = reference("coder/swagger.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn resolve<'a>(spec: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => &spec["definitions"][r.trim_start_matches("#/definitions/")],
        None => schema,
    }
}

/// Pointer fields that Coder reads or writes as `null` although their schema cannot say so
/// (reference NOTES §6: `{"ttl_ms": null}` disables autostop).
const NULLABLE_BY_CODE: &[&str] = &["codersdk.UpdateWorkspaceTTLRequest.ttl_ms"];

/// A property that Go may send as `null` (NullTime, pointer structs, NullUUID).
fn nullable(schema: &Value) -> bool {
    schema.get("$ref").is_some() || schema.get("allOf").is_some() || schema.get("format").and_then(Value::as_str) == Some("date-time")
}

/// An authcheck action: its inline enum lists four CRUD verbs, its type `codersdk.RBACAction`
/// lists every action coderd evaluates.
fn rbac_action(at: &str) -> bool {
    at.starts_with("codersdk.AuthorizationRequest.checks.") && at.ends_with(".action")
}

pub fn validate(spec: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    if let Some(parts) = schema.get("allOf").and_then(Value::as_array) {
        for p in parts {
            validate(spec, p, value, at, errors);
        }
    }
    if schema.get("$ref").and_then(Value::as_str) == Some("#/definitions/uuid.NullUUID") && value.is_string() {
        if value.as_str().and_then(uuid_shape).is_none() {
            errors.push(format!("{at}: {value} is not a UUID"));
        }
        return;
    }
    let schema = resolve(spec, schema);
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array).filter(|_| !(rbac_action(at) && schema.get("allOf").is_some())) {
        if !allowed.contains(value) {
            errors.push(format!("{at}: {value} is not one of {allowed:?}"));
        }
    }
    let Some(ty) = schema.get("type").and_then(Value::as_str) else {
        if schema.get("properties").is_some() {
            validate_object(spec, schema, value, at, errors);
        }
        return;
    };
    match ty {
        "object" => validate_object(spec, schema, value, at, errors),
        "array" => match value.as_array() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    validate(spec, &schema["items"], item, &format!("{at}[{i}]"), errors);
                }
            }
            None => errors.push(format!("{at}: expected an array, got {value}")),
        },
        "string" => match value.as_str() {
            Some(s) => match schema.get("format").and_then(Value::as_str) {
                Some("date-time") if DateTime::parse_from_rfc3339(s).is_err() => errors.push(format!("{at}: {s:?} is not RFC 3339")),
                Some("uuid") if uuid_shape(s).is_none() => errors.push(format!("{at}: {s:?} is not a UUID")),
                _ => {}
            },
            None => errors.push(format!("{at}: expected a string, got {value}")),
        },
        "integer" if !value.is_i64() && !value.is_u64() => errors.push(format!("{at}: expected an integer, got {value}")),
        "number" if !value.is_number() => errors.push(format!("{at}: expected a number, got {value}")),
        "boolean" if !value.is_boolean() => errors.push(format!("{at}: expected a boolean, got {value}")),
        _ => {}
    }
}

fn uuid_shape(s: &str) -> Option<()> {
    let ok = s.len() == 36 && s.char_indices().all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() });
    ok.then_some(())
}

fn validate_object(spec: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(obj) = value.as_object() else {
        errors.push(format!("{at}: expected an object, got {value}"));
        return;
    };
    for req in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
        if let Some(k) = req.as_str().filter(|k| !obj.contains_key(*k)) {
            errors.push(format!("{at}: required field {k} is missing"));
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, v) in obj {
        let path = format!("{at}.{k}");
        match (props.and_then(|p| p.get(k)), schema.get("additionalProperties")) {
            (Some(p), _) if v.is_null() && (nullable(p) || NULLABLE_BY_CODE.contains(&path.as_str())) => {}
            (Some(p), _) => validate(spec, p, v, &path, errors),
            (None, Some(extra)) if extra.is_object() => validate(spec, extra, v, &path, errors),
            (None, _) => errors.push(format!("{path}: not in the spec")),
        }
    }
}

pub fn check(spec: &Value, definition: &str, value: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    validate(spec, &serde_json::json!({ "$ref": format!("#/definitions/{definition}") }), value, definition, &mut errors);
    // A property's own enum and its allOf'd type may both object: report each place once.
    let mut seen = std::collections::HashSet::new();
    errors.retain(|e| {
        let key = if e.contains(" is not one of ") { e.split(": ").next().unwrap_or(e) } else { e.as_str() };
        seen.insert(key.to_string())
    });
    errors
}

#[test]
fn the_validator_catches_what_it_should() {
    let spec = spec();
    let mut ws = fixture_json("coder/workspaces_running.json")["workspaces"][0].clone();
    assert!(check(&spec, "codersdk.Workspace", &ws).is_empty());
    ws["latest_build"]["transition"] = "pause".into();
    ws["made_up_field"] = 1.into();
    ws["id"] = "not-a-uuid".into();
    ws["last_used_at"] = "yesterday".into();
    let errors = check(&spec, "codersdk.Workspace", &ws).join("\n");
    for want in [
        "transition: \"pause\" is not one of",
        "made_up_field: not in the spec",
        "\"not-a-uuid\" is not a UUID",
        "\"yesterday\" is not RFC 3339",
    ] {
        assert!(errors.contains(want), "missing {want:?} in\n{errors}");
    }
    let errors = check(&spec, "codersdk.User", &serde_json::json!({"id": "0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70"}));
    assert!(errors.iter().any(|e| e.contains("required field username")), "{errors:?}");
}

#[test]
fn every_fixture_fits_its_schema() {
    let spec = spec();
    let cases = [
        ("coder/workspaces_running.json", "codersdk.WorkspacesResponse"),
        ("coder/user_owner.json", "codersdk.User"),
        ("coder/user_member.json", "codersdk.User"),
        ("coder/api_key.json", "codersdk.APIKey"),
        ("coder/buildinfo.json", "codersdk.BuildInfoResponse"),
        ("coder/workspace_build_stop_queued.json", "codersdk.WorkspaceBuild"),
        ("coder/workspace_build_stop_succeeded.json", "codersdk.WorkspaceBuild"),
        ("coder/error_409_build_active.json", "codersdk.Response"),
        ("coder/error_401.json", "codersdk.Response"),
    ];
    for p in fixture_json("coder/build_parameters.json").as_array().unwrap() {
        let errors = check(&spec, "codersdk.WorkspaceBuildParameter", p);
        assert!(errors.is_empty(), "build_parameters.json: {p} does not fit: {errors:?}");
    }
    for (file, def) in cases {
        let errors = check(&spec, def, &fixture_json(file));
        assert!(errors.is_empty(), "{file} does not fit {def}:\n{}", errors.join("\n"));
    }
    // The hand-made variant breaks the spec exactly where real Coder does, and nowhere else.
    let errors = check(&spec, "codersdk.Workspace", &fixture_json("coder/workspace_unknown_enums.json"));
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors.iter().any(|e| e.contains("latest_build.reason: \"failedstop\"")));
    assert!(errors.iter().any(|e| e.contains("lifecycle_state: \"a_future_state\"")));
}

#[test]
fn every_path_the_client_calls_is_in_the_spec() {
    let spec = spec();
    for (method, path) in [
        ("get", "/api/v2/buildinfo"),
        ("get", "/api/v2/users/{user}"),
        ("get", "/api/v2/users/{user}/keys/{keyid}"),
        ("get", "/api/v2/workspaces"),
        ("post", "/api/v2/workspaces/{workspace}/builds"),
        ("get", "/api/v2/workspacebuilds/{workspacebuild}"),
        ("get", "/api/v2/workspacebuilds/{workspacebuild}/parameters"),
        ("put", "/api/v2/workspaces/{workspace}/ttl"),
        ("put", "/api/v2/workspaces/{workspace}/extend"),
        ("patch", "/api/v2/workspacebuilds/{workspacebuild}/cancel"),
        ("get", "/api/v2/organizations/{organization}/provisionerdaemons"),
        ("get", "/api/v2/workspaces/{workspace}"),
        ("get", "/api/v2/workspaces/{workspace}/builds"),
        ("post", "/api/v2/authcheck"),
    ] {
        let op = &spec["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is not in the spec");
        assert_eq!(spec["securityDefinitions"]["CoderSessionToken"]["name"], "Coder-Session-Token");
    }
    let params = spec["paths"]["/api/v2/workspaces"]["get"]["parameters"].as_array().unwrap();
    assert!(params.iter().any(|p| p["name"] == "q" && p["in"] == "query"));
    // The query parameters the history reads send.
    let query = |path: &str| -> Vec<String> {
        spec["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] == "query")
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    let builds = query("/api/v2/workspaces/{workspace}/builds");
    assert!(["since", "limit", "offset"].iter().all(|p| builds.iter().any(|b| b == p)), "{builds:?}");
    assert!(query("/api/v2/workspaces/{workspace}").iter().any(|p| p == "include_deleted"));
    // The documented gap: the spec says 200, the server writes 201 (and the client accepts both).
    assert!(spec["paths"]["/api/v2/workspaces/{workspace}/builds"]["post"]["responses"]["200"].is_object());
}

/// Every body the client can send, captured off the wire, fits its request schema.
#[tokio::test]
async fn every_request_body_fits_its_schema() {
    let spec = spec();
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(201).set_body_json(fixture_json("coder/workspace_build_stop_queued.json")))
        .mount(&server)
        .await;
    let client = CoderActions::new(
        CoderClient::new(
            &crate::common::url(&server.uri()),
            SessionToken::new("abc-def").unwrap(),
            Duration::from_secs(2),
            RetryPolicy::none(),
        )
        .unwrap(),
    );
    client.stop_workspace(crate::common::WS_ID).await.unwrap();
    client.set_ttl(crate::common::WS_ID, Some(8 * 3_600_000)).await.ok();
    client.set_ttl(crate::common::WS_ID, None).await.ok();
    let deadline = chrono::DateTime::parse_from_rfc3339("2026-12-01T23:30:00Z").unwrap().with_timezone(&chrono::Utc);
    client.extend_deadline(crate::common::WS_ID, deadline).await.ok();
    client.authcheck(&["read", "stop"], "workspace").await.ok();
    client.may_stop_in(&["42638e23-9859-4dec-8568-7bc6436fa29d", "7c1f0a2b-3d4e-4f5a-8b6c-9d0e1f2a3b4c"]).await.ok();
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 6);
    let extend: Value = serde_json::from_slice(&requests[3].body).unwrap();
    assert_eq!(extend, serde_json::json!({"deadline": "2026-12-01T23:30:00Z"}), "RFC 3339, whole seconds, UTC");
    for (req, def) in requests.iter().zip([
        "codersdk.CreateWorkspaceBuildRequest",
        "codersdk.UpdateWorkspaceTTLRequest",
        "codersdk.UpdateWorkspaceTTLRequest",
        "codersdk.PutExtendWorkspaceRequest",
        "codersdk.AuthorizationRequest",
        "codersdk.AuthorizationRequest",
    ]) {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let errors = check(&spec, def, &body);
        assert!(errors.is_empty(), "{} {} body {body} does not fit {def}: {errors:?}", req.method, req.url.path());
    }
}

/// The fake Coder's answers fit the spec too (the fakes must behave like Coder).
#[tokio::test]
async fn the_fake_coder_answers_in_the_spec_shapes() {
    let spec = spec();
    let fake = mocks::FakeCoder::start(mocks::WorldConfig { scale: 600.0, gpus: 1, ..mocks::WorldConfig::default() }).await.unwrap();
    let a = fake.with(|w| w.create_workspace("alice", "a", Some(3_600_000))).unwrap();
    fake.with(|w| w.create_workspace("bob", "b", None)).unwrap();
    // Prebuilds, tasks and evicted pods (disconnected agents) are in the listing too.
    let p = fake.with(|w| w.create_prebuild("pre")).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    fake.with(|w| {
        w.make_task(a);
        w.evict(a);
    });
    let token = fake.owner_token();
    let http = reqwest::Client::new();
    let get = |path: String| {
        let (http, token, url) = (http.clone(), token.clone(), fake.url());
        async move { http.get(format!("{url}{path}")).header("Coder-Session-Token", token).send().await.unwrap() }
    };
    let resp = get("/api/v2/workspaces?q=status:running".into()).await;
    assert!(resp.headers().get("date").is_some(), "every coderd response has a Date header");
    let list: Value = resp.json().await.unwrap();
    assert_eq!(list["count"], 3, "{list}");
    let errors = check(&spec, "codersdk.WorkspacesResponse", &list);
    assert!(errors.is_empty(), "{errors:#?}");
    let ws = list["workspaces"].as_array().unwrap();
    let pre = ws.iter().find(|w| w["id"] == p.to_string()).unwrap();
    assert_eq!((pre["is_prebuild"].as_bool(), pre["owner_id"].as_str()), (Some(true), Some(mocks::world::PREBUILDS_USER_ID)));
    let evicted = ws.iter().find(|w| w["id"] == a.to_string()).unwrap();
    assert!(evicted["task_id"].is_string());
    assert_eq!(evicted["latest_build"]["resources"][1]["agents"][0]["status"], "disconnected", "{evicted}");
    let auth: Value = http
        .post(format!("{}/api/v2/authcheck", fake.url()))
        .header("Coder-Session-Token", &token)
        .json(&serde_json::json!({"checks": {"stop": {"object": {"resource_type": "workspace", "any_org": true}, "action": "stop"}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(check(&spec, "codersdk.AuthorizationResponse", &auth).is_empty());
    assert_eq!(auth["stop"], true);
    let me: Value = get("/api/v2/users/me".into()).await.json().await.unwrap();
    assert!(check(&spec, "codersdk.User", &me).is_empty());
    let key_id = token.split('-').next().unwrap().to_string();
    let key: Value = get(format!("/api/v2/users/me/keys/{key_id}")).await.json().await.unwrap();
    assert!(check(&spec, "codersdk.APIKey", &key).is_empty());
    // `PUT .../extend` answers a codersdk.Response, success or refusal (NOTES §16).
    let extend = |id: uuid::Uuid, hours: i64| {
        let deadline = (chrono::Utc::now() + chrono::Duration::hours(hours)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        http.put(format!("{}/api/v2/workspaces/{id}/extend", fake.url()))
            .header("Coder-Session-Token", &token)
            .json(&serde_json::json!({ "deadline": deadline }))
            .send()
    };
    for (id, status, message) in [(a, 200, "Deadline updated to "), (p, 409, "Deadline extension is not supported for prebuilt workspaces")]
    {
        let resp = extend(id, 2).await.unwrap();
        assert_eq!(resp.status().as_u16(), status);
        let body: Value = resp.json().await.unwrap();
        assert!(check(&spec, "codersdk.Response", &body).is_empty(), "{body}");
        assert!(body["message"].as_str().unwrap().starts_with(message), "{body}");
    }
    // No provisioner takes the stop, so it can still be canceled below.
    fake.with(|w| w.provisioners_down = true);
    let stop = || {
        http.post(format!("{}/api/v2/workspaces/{a}/builds", fake.url()))
            .header("Coder-Session-Token", &token)
            .json(&serde_json::json!({"transition": "stop"}))
            .send()
    };
    let resp = stop().await.unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let build: Value = resp.json().await.unwrap();
    assert!(check(&spec, "codersdk.WorkspaceBuild", &build).is_empty());
    let history: Value = get(format!("/api/v2/workspaces/{a}/builds")).await.json().await.unwrap();
    assert!(history.as_array().is_some_and(|h| h.len() >= 2), "{history}");
    for b in history.as_array().unwrap() {
        let errors = check(&spec, "codersdk.WorkspaceBuild", b);
        assert!(errors.is_empty(), "{errors:#?}");
    }
    let again = stop().await.unwrap();
    assert_eq!(again.status().as_u16(), 409);
    let body: Value = again.json().await.unwrap();
    assert!(check(&spec, "codersdk.Response", &body).is_empty());
    assert_eq!(body["message"], "A workspace build is already active.");
    let canceled = http
        .patch(format!("{}/api/v2/workspacebuilds/{}/cancel", fake.url(), build["id"].as_str().unwrap()))
        .header("Coder-Session-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(canceled.status().as_u16(), 200);
    assert!(check(&spec, "codersdk.Response", &canceled.json::<Value>().await.unwrap()).is_empty());
}

/// The fake's build parameters (reference NOTES §19): the values each build was made with, in
/// the spec's shape; a later build copies them; 400 for an id that is no UUID, 404 for a build
/// that does not exist or that the caller may not read.
#[tokio::test]
async fn the_fake_coder_serves_build_parameters_as_coderd_does() {
    let spec = spec();
    let fake = mocks::FakeCoder::start(mocks::WorldConfig { scale: 600.0, gpus: 1, ..mocks::WorldConfig::default() }).await.unwrap();
    let id = fake.with(|w| w.create_workspace_variant("bob", "cpu", "ml", &[("gpu_count", "0"), ("cpu", "4")], false)).unwrap();
    let http = reqwest::Client::new();
    let get = |build: String, token: String| {
        let (http, url) = (http.clone(), fake.url());
        async move {
            http.get(format!("{url}/api/v2/workspacebuilds/{build}/parameters")).header("Coder-Session-Token", token).send().await.unwrap()
        }
    };
    let first = fake.with(|w| w.latest_build_id(id)).unwrap();
    let resp = get(first.to_string(), fake.owner_token()).await;
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body, serde_json::json!([{"name": "gpu_count", "value": "0"}, {"name": "cpu", "value": "4"}]));
    for p in body.as_array().unwrap() {
        assert!(check(&spec, "codersdk.WorkspaceBuildParameter", p).is_empty(), "{p}");
    }
    let op = &spec["paths"]["/api/v2/workspacebuilds/{workspacebuild}/parameters"]["get"]["responses"]["200"]["schema"];
    assert_eq!(op["items"]["$ref"], "#/definitions/codersdk.WorkspaceBuildParameter");
    crate::common::service::until(&fake, "the start succeeds", Duration::from_secs(5), |w| crate::common::service::running(w, id)).await;
    let stop = fake.with(|w| w.create_build(id, "stop", 0, "initiator")).unwrap();
    let copied: Value = get(stop.to_string(), fake.owner_token()).await.json().await.unwrap();
    assert_eq!(copied, body, "a new build copies the previous build's values");
    let alice = fake.with(|w| w.token_of("alice")).unwrap();
    for (build, token, status) in [
        ("not-a-uuid".to_string(), fake.owner_token(), 400),
        (uuid::Uuid::new_v4().to_string(), fake.owner_token(), 404),
        (first.to_string(), alice, 404),
    ] {
        let resp = get(build.clone(), token).await;
        assert_eq!(resp.status().as_u16(), status, "{build}");
        let body: Value = resp.json().await.unwrap();
        assert!(check(&spec, "codersdk.Response", &body).is_empty(), "{body}");
    }
}
