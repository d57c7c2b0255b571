//! The fake Coder's HTTP API: the endpoints coder-gpu-reclaimer uses, in the shapes of Coder
//! v2.34.3's `swagger.json`, with its status codes and error bodies; token auth; the per-user,
//! per-path rate limit with the owner-only bypass header; fault injection per path; and a small
//! control API (`/control/...`) for driving the story from outside the process.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post, put};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::world::{ApiError, Build, Load, NOT_FOUND, Workspace, World};

/// Faults for requests whose path starts with a prefix.
#[derive(Debug, Clone, Default)]
pub struct Fault {
    /// The next this-many requests get `status` (a deterministic burst).
    pub fail_next: usize,
    pub status: u16,
    /// The next this-many requests get a 200 header, then the connection drops mid-body.
    pub drop_next: usize,
    /// Added to every matching request.
    pub latency: Duration,
    /// A share (0..1) of matching requests that get `status`, at random.
    pub error_rate: f64,
    /// The next this-many requests are handled (a stop build is created), then their reply is
    /// held back this long: a client whose timeout is shorter never sees the 201.
    pub delay_reply_next: usize,
    pub reply_delay: Duration,
    /// Every matching request is answered `307 Temporary Redirect` to this URL (an ingress or
    /// proxy in front of Coder that redirects; a client that follows it replays the request,
    /// token header included, to the other host).
    pub redirect_to: Option<String>,
}

#[derive(Default)]
pub struct Controls {
    pub faults: Vec<(String, Fault)>,
    /// The listing repeats its first entry at the end. coderd's listing is offset-paged and
    /// sorted by a "running" flag that changes while states change, so a client that pages can
    /// see one workspace twice (`coderd/database/queries/workspaces.sql`, GetWorkspaces order;
    /// `reference/coder/NOTES.md` section 3).
    pub repeat_in_listing: bool,
    ratelimit: HashMap<(usize, String), VecDeque<Instant>>,
    pub requests: Vec<(String, String)>,
    rng: u64,
}

#[derive(Clone)]
pub struct CoderState {
    pub world: Arc<Mutex<World>>,
    pub controls: Arc<Mutex<Controls>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A stable id derived from another (resource ids of a workspace's build).
fn derived(id: &Uuid, salt: u128) -> Uuid {
    Uuid::from_u128(id.as_u128() ^ (salt << 64))
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn opt_ts(t: Option<DateTime<Utc>>) -> Value {
    t.map_or(Value::Null, |t| Value::String(ts(t)))
}

fn coder_error(e: ApiError) -> Response {
    let mut body = json!({ "message": e.message });
    if !e.detail.is_empty() {
        if let Some((field, detail)) = e.detail.split_once(": ").filter(|_| e.message.starts_with("Error updating")) {
            body["validations"] = json!([{ "field": field, "detail": detail }]);
        } else {
            body["detail"] = json!(e.detail);
        }
    }
    (StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

fn status_of(b: &Build) -> &'static str {
    match (b.job.status, b.transition) {
        ("pending", _) => "pending",
        ("running", "start") => "starting",
        ("running", "stop") => "stopping",
        ("running", _) => "deleting",
        ("succeeded", "start") => "running",
        ("succeeded", "stop") => "stopped",
        ("succeeded", _) => "deleted",
        (other, _) => other,
    }
}

pub fn build_json(w: &World, ws: &Workspace, b: &Build) -> Value {
    let (count, available, seen) = w.matched_provisioners(ws, &b.job);
    let mut matched = json!({"count": count, "available": available});
    if let Some(t) = seen {
        matched["most_recently_seen"] = json!(ts(t));
    }
    let initiator = &w.users[b.initiator];
    let owner = &w.users[ws.owner];
    let pvc = json!({
        "id": derived(&ws.id, 1), "job_id": b.job.id, "created_at": ts(b.created_at),
        "workspace_transition": b.transition, "type": "kubernetes_persistent_volume_claim_v1", "name": "home",
        "hide": false, "icon": "", "metadata": [], "daily_cost": 0
    });
    let mut resources = vec![pvc];
    if let Some(a) = &b.agent {
        let status = w.agent_status(a);
        let mut agent = json!({
            "id": a.id, "parent_id": null, "created_at": ts(a.created_at), "updated_at": ts(a.last_connected_at.unwrap_or(a.created_at)),
            "status": status, "lifecycle_state": a.lifecycle, "name": "main", "resource_id": derived(&ws.id, 2),
            "version": "v2.34.3", "api_version": "2.6", "apps": [], "architecture": "amd64", "operating_system": "linux",
            "connection_timeout_seconds": a.connection_timeout_seconds, "troubleshooting_url": "https://coder.com/docs/admin/templates/troubleshooting",
            "health": if status == "connected" { json!({"healthy": true}) } else { json!({"healthy": false, "reason": match status { "timeout" => "agent is taking too long to connect", "disconnected" => "agent has lost connection", _ => "agent has not yet connected" }}) },
            "startup_script_behavior": "non-blocking", "scripts": [], "log_sources": [], "logs_length": 0, "logs_overflowed": false,
            "display_apps": ["vscode", "web_terminal"], "environment_variables": {}, "subsystems": [], "latency": {},
            "directory": "/home/coder", "expanded_directory": "/home/coder", "instance_id": ""
        });
        // Coder omits these while null (omitempty).
        for (k, v) in [
            ("first_connected_at", a.first_connected_at),
            ("last_connected_at", a.last_connected_at),
            ("disconnected_at", a.disconnected_at),
            ("started_at", a.first_connected_at),
            ("ready_at", a.first_connected_at),
        ] {
            if let Some(t) = v {
                agent[k] = json!(ts(t));
            }
        }
        resources.push(json!({
            "id": derived(&ws.id, 2), "job_id": b.job.id, "created_at": ts(b.created_at),
            "workspace_transition": b.transition, "type": "kubernetes_deployment_v1", "name": "main",
            "hide": false, "icon": "", "metadata": [], "daily_cost": 0, "agents": [agent]
        }));
    }
    let mut job = json!({
        "id": b.job.id, "created_at": ts(b.job.created_at), "status": b.job.status, "queue_position": 0, "queue_size": 0,
        "initiator_id": initiator.id, "organization_id": w.organizations[ws.org].0, "type": "workspace_build", "tags": b.job.tags,
        "file_id": derived(&w.template_version_id, 3), "available_workers": [], "logs_overflowed": false,
        "input": {"workspace_build_id": b.id}, "metadata": {"template_version_name": "v1", "template_id": w.template_id, "template_name": ws.template, "template_display_name": ws.template, "template_icon": "", "workspace_id": ws.id, "workspace_name": ws.name}
    });
    for (k, v) in [("started_at", b.job.started_at), ("completed_at", b.job.completed_at), ("canceled_at", b.job.canceled_at)] {
        if let Some(t) = v {
            job[k] = json!(ts(t));
        }
    }
    if let Some(e) = &b.job.error {
        job["error"] = json!(e);
    }
    json!({
        "id": b.id, "build_number": b.number, "created_at": ts(b.created_at), "updated_at": ts(b.job.completed_at.unwrap_or(b.created_at)),
        "workspace_id": ws.id, "workspace_name": ws.name, "workspace_owner_id": owner.id, "workspace_owner_name": owner.username,
        "workspace_owner_avatar_url": "", "template_version_id": w.template_version_id, "template_version_name": "v1",
        "transition": b.transition, "initiator_id": initiator.id, "initiator_name": initiator.username, "reason": b.reason,
        "status": status_of(b), "job": job, "resources": resources, "deadline": opt_ts(b.deadline), "max_deadline": opt_ts(b.max_deadline),
        "daily_cost": 0, "matched_provisioners": matched, "has_ai_task": false, "has_external_agent": false
    })
}

pub fn workspace_json(w: &World, ws: &Workspace) -> Value {
    let owner = &w.users[ws.owner];
    let latest = ws.latest().map(|b| build_json(w, ws, b)).unwrap_or(Value::Null);
    let failing: Vec<Value> = latest["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["agents"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["status"] != "connected")
        .map(|a| a["id"].clone())
        .collect();
    let mut out = json!({
        "id": ws.id, "created_at": ts(ws.created_at), "updated_at": ts(ws.last_used_at), "owner_id": owner.id, "owner_name": owner.username,
        "owner_avatar_url": "", "organization_id": w.organizations[ws.org].0, "organization_name": w.organizations[ws.org].1, "template_id": w.template_id,
        "template_name": ws.template, "template_display_name": ws.template, "template_icon": "", "template_allow_user_cancel_workspace_jobs": w.config.allow_user_cancel,
        "template_active_version_id": w.template_version_id, "template_require_active_version": false, "template_use_classic_parameter_flow": false,
        "latest_build": latest, "latest_app_status": null, "outdated": false, "name": ws.name, "last_used_at": ts(ws.last_used_at),
        "deleting_at": null, "dormant_at": null, "health": {"healthy": failing.is_empty(), "failing_agents": failing},
        "automatic_updates": "never", "allow_renames": false, "favorite": false, "next_start_at": null, "is_prebuild": ws.prebuild,
        "task_id": ws.task_id, "shared_with": []
    });
    if let Some(ttl) = ws.ttl_ms {
        out["ttl_ms"] = json!(ttl); // omitempty: absent when autostop is off
    }
    out
}

fn user_json(w: &World, i: usize) -> Value {
    let u = &w.users[i];
    let roles: Vec<Value> = if u.owner { vec![json!({"name": "owner", "display_name": "Owner"})] } else { vec![] };
    let mut orgs = vec![w.organization_id];
    orgs.extend(u.org_roles.iter().map(|(i, _)| w.organizations[*i].0).filter(|id| *id != w.organization_id));
    json!({
        "id": u.id, "username": u.username, "name": u.username, "email": format!("{}@example.com", u.username),
        "created_at": ts(u.created_at), "updated_at": ts(u.created_at), "last_seen_at": ts(w.now()), "status": u.status,
        "login_type": if u.system { "none" } else { "password" }, "roles": roles, "organization_ids": orgs, "theme_preference": "", "avatar_url": "",
        "has_ai_seat": false, "is_service_account": u.system
    })
}

/// The caller, once authenticated.
#[derive(Clone, Copy)]
struct Caller(usize);

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Auth, the rate limit and faults, in Coder's order: token, then rate limit, then the handler.
async fn gate(State(s): State<CoderState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let mut delay_reply = Duration::ZERO;
    let mut redirect = None;
    let fault = {
        let mut c = lock(&s.controls);
        c.requests.push((req.method().to_string(), req.uri().to_string()));
        let mut hit = None;
        let roll = {
            c.rng = c.rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (c.rng >> 33) as f64 / (1u64 << 31) as f64
        };
        if let Some((_, f)) = c.faults.iter_mut().find(|(p, _)| path.starts_with(p.as_str())) {
            let latency = f.latency;
            redirect.clone_from(&f.redirect_to);
            if f.delay_reply_next > 0 {
                f.delay_reply_next -= 1;
                delay_reply = f.reply_delay;
            }
            if f.drop_next > 0 {
                f.drop_next -= 1;
                hit = Some((latency, 0));
            } else if f.fail_next > 0 {
                f.fail_next -= 1;
                hit = Some((latency, f.status));
            } else if f.error_rate > 0.0 && roll < f.error_rate {
                hit = Some((latency, f.status));
            } else {
                hit = Some((latency, u16::MAX));
            }
        }
        hit
    };
    if let Some(to) = redirect {
        return (StatusCode::TEMPORARY_REDIRECT, [("Location", to)]).into_response();
    }
    if let Some((latency, status)) = fault {
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match status {
            0 => {
                let stream = futures_util::stream::once(async {
                    Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by fault injection"))
                });
                return (StatusCode::OK, Body::from_stream(stream)).into_response();
            }
            u16::MAX => {}
            429 => {
                let retry_after = lock(&s.world).real(Duration::from_secs(60)).as_secs().max(1).to_string();
                let body = axum::Json(json!({"message": "You've been rate limited for sending more than 512 requests in 1m0s."}));
                return (StatusCode::TOO_MANY_REQUESTS, [("Retry-After", retry_after)], body).into_response();
            }
            403 => {
                // What coderd answers a stop the token may not make (`wsbuilder.go` authorize).
                let body = axum::Json(json!({"message": "You do not have permission to stop this workspace."}));
                return (StatusCode::FORBIDDEN, body).into_response();
            }
            code => {
                return (
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    axum::Json(json!({"message": "Internal error.", "detail": "injected fault"})),
                )
                    .into_response();
            }
        }
    }
    if path == "/api/v2/buildinfo" || path == "/healthz" || path.starts_with("/control/") {
        return next.run(req).await;
    }
    let token = header(req.headers(), "Coder-Session-Token")
        .or_else(|| header(req.headers(), "Authorization").and_then(|h| h.strip_prefix("Bearer ").map(str::to_string)));
    let signed_out = "You are signed out or your session has expired. Please sign in again to continue.";
    let caller = {
        let w = lock(&s.world);
        let Some(token) = token else {
            return coder_error(ApiError {
                status: 401,
                message: "Cookie \"coder_session_token\" or query parameter must be provided.".into(),
                detail: String::new(),
            });
        };
        // A removed (revoked) key is no longer found (`httpmw/apikey.go`).
        let Some(key) = w.token(&token).cloned() else {
            return coder_error(ApiError { status: 401, message: signed_out.into(), detail: "API key is invalid.".into() });
        };
        let user = &w.users[key.user];
        if user.status != "active" {
            // `httpmw/apikey.go`: roles are looked up, then a non-active user is refused.
            return coder_error(ApiError {
                status: 401,
                message: format!("User is not active (status = {:?}). Contact an admin to reactivate your account.", user.status),
                detail: String::new(),
            });
        }
        if key.expires_at <= w.now() {
            return coder_error(ApiError {
                status: 401,
                message: signed_out.into(),
                detail: format!("API key expired at \"{}\".", ts(key.expires_at)),
            });
        }
        req.extensions_mut().insert(key.clone());
        (key.user, w.users[key.user].owner, w.real(Duration::from_secs(60)), w.config.rate_limit_per_minute)
    };
    let (ui, owner, window, limit) = caller;
    let bypass = header(req.headers(), "X-Coder-Bypass-Ratelimit").and_then(|v| parse_bool(&v)).unwrap_or(false);
    if bypass && !owner {
        return (StatusCode::PRECONDITION_REQUIRED, "\"X-Coder-Bypass-Ratelimit\" provided but user is not owner").into_response();
    }
    if !bypass {
        let mut c = lock(&s.controls);
        let q = c.ratelimit.entry((ui, path.clone())).or_default();
        let now = Instant::now();
        while q.front().is_some_and(|t| now.duration_since(*t) > window) {
            q.pop_front();
        }
        if q.len() >= limit {
            let retry_after = window.as_secs().max(1).to_string();
            let body = axum::Json(json!({"message": format!("You've been rate limited for sending more than {limit} requests in 1m0s.")}));
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("Retry-After", retry_after), ("X-RateLimit-Limit", limit.to_string()), ("X-RateLimit-Remaining", "0".to_string())],
                body,
            )
                .into_response();
        }
        q.push_back(now);
    }
    req.extensions_mut().insert(Caller(ui));
    let response = next.run(req).await;
    if !delay_reply.is_zero() {
        tokio::time::sleep(delay_reply).await;
    }
    response
}

/// Every coderd response carries Go's `Date` header, from coderd's clock (which may be off).
async fn date_header(State(s): State<CoderState>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let now = {
        let w = lock(&s.world);
        w.config.proxy_clock_offset.map_or_else(|| w.now(), |offset| chrono::Utc::now() + offset)
    };
    if let Ok(v) = axum::http::HeaderValue::from_str(&now.format("%a, %d %b %Y %H:%M:%S GMT").to_string()) {
        resp.headers_mut().insert(axum::http::header::DATE, v);
    }
    resp
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

async fn buildinfo() -> Response {
    axum::Json(json!({
        "version": "v2.34.3+4653f32", "external_url": "https://github.com/coder/coder/commit/4653f32eb4840de54e8dca04a069fb7e61664cf6",
        "dashboard_url": "http://127.0.0.1", "telemetry": false, "workspace_proxy": false, "agent_api_version": "2.6",
        "provisioner_api_version": "1.9", "upgrade_message": "", "deployment_id": "fake-deployment"
    }))
    .into_response()
}

fn caller(req_ext: &axum::http::Extensions) -> usize {
    req_ext.get::<Caller>().map_or(usize::MAX, |c| c.0)
}

fn resolve_user(w: &World, me: usize, user: &str) -> Option<usize> {
    if user == "me" {
        return Some(me);
    }
    w.users.iter().position(|u| u.username == user || u.id.to_string() == user)
}

async fn get_user(State(s): State<CoderState>, Path(user): Path<String>, req: Request) -> Response {
    let w = lock(&s.world);
    let me = caller(req.extensions());
    match resolve_user(&w, me, &user) {
        Some(i) if i == me || w.users[me].owner => axum::Json(user_json(&w, i)).into_response(),
        _ => not_found(),
    }
}

async fn get_key(State(s): State<CoderState>, Path((user, key)): Path<(String, String)>, req: Request) -> Response {
    let w = lock(&s.world);
    let me = caller(req.extensions());
    let found = resolve_user(&w, me, &user).and_then(|ui| w.tokens.iter().find(|t| t.user == ui && t.key_id == key && !t.revoked));
    match found {
        Some(t) if t.user == me || w.users[me].owner => {
            let u = &w.users[t.user];
            let scopes: Vec<&str> = if t.scopes.is_empty() { vec!["coder:all"] } else { t.scopes.iter().map(String::as_str).collect() };
            axum::Json(json!({
                "id": t.key_id, "user_id": u.id, "last_used": ts(w.now()), "expires_at": ts(t.expires_at), "created_at": ts(t.created_at),
                "updated_at": ts(t.created_at), "login_type": "token", "scope": if t.scopes.is_empty() { "all" } else { "" }, "scopes": scopes,
                "token_name": "gpu-reclaimer", "lifetime_seconds": (t.expires_at - t.created_at).num_seconds(), "allow_list": []
            }))
            .into_response()
        }
        _ => not_found(),
    }
}

/// `POST /api/v2/authcheck`: each check answered for the calling token, its role and scope
/// (`coderd/authorize.go` `checkAuthorization`).
async fn authcheck(State(s): State<CoderState>, req: Request) -> Response {
    let Some(key) = req.extensions().get::<crate::world::ApiToken>().cloned() else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let Some(body) = json_body(req).await else {
        return coder_error(ApiError { status: 400, message: "Request body must be valid JSON.".into(), detail: String::new() });
    };
    let w = lock(&s.world);
    let mut out = serde_json::Map::new();
    for (k, check) in body["checks"].as_object().into_iter().flatten() {
        let o = &check["object"];
        let allowed = w.authorize(
            &key,
            o["resource_type"].as_str().unwrap_or(""),
            check["action"].as_str().unwrap_or(""),
            o["owner_id"].as_str(),
            o["organization_id"].as_str(),
            o["any_org"].as_bool().unwrap_or(false),
        );
        out.insert(k.clone(), Value::Bool(allowed));
    }
    axum::Json(Value::Object(out)).into_response()
}

#[derive(Deserialize)]
struct ListQuery {
    q: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

async fn list_workspaces(State(s): State<CoderState>, Query(lq): Query<ListQuery>, req: Request) -> Response {
    let repeat = lock(&s.controls).repeat_in_listing;
    let w = lock(&s.world);
    let me = caller(req.extensions());
    let q = lq.q.unwrap_or_default().to_lowercase();
    let mut status = None;
    let mut owner = None;
    for term in q.split_whitespace() {
        match term.split_once(':') {
            Some(("status", v)) => {
                const VALID: [&str; 10] =
                    ["pending", "starting", "running", "stopping", "stopped", "failed", "canceling", "canceled", "deleting", "deleted"];
                if !VALID.contains(&v) {
                    return (StatusCode::BAD_REQUEST, axum::Json(json!({"message": "Invalid workspace search query.", "validations": [{"field": "status", "detail": format!("Query param \"status\" has invalid value: \"{v}\" is not a valid workspace status")}]}))).into_response();
                }
                status = Some(v.to_string());
            }
            Some(("owner", v)) => owner = Some(v.to_string()),
            Some((k, _)) => {
                return (StatusCode::BAD_REQUEST, axum::Json(json!({"message": "Invalid workspace search query.", "validations": [{"field": k, "detail": format!("Query param \"{k}\" is not a valid query param")}]}))).into_response();
            }
            None => {}
        }
    }
    let mut rows: Vec<&Workspace> = w
        .workspaces
        .iter()
        .filter(|ws| w.may_read(me, ws))
        .filter(|ws| owner.as_deref().is_none_or(|o| w.users[ws.owner].username == o || (o == "me" && ws.owner == me)))
        .filter(|ws| status.as_deref().is_none_or(|st| ws.latest().is_some_and(|b| status_of(b) == st)))
        .collect();
    // Coder's order: running first, then owner name, then workspace name.
    rows.sort_by_key(|ws| (!w.is_running(ws), w.users[ws.owner].username.to_lowercase(), ws.name.to_lowercase()));
    let count = rows.len();
    let offset = lq.offset.unwrap_or(0);
    let mut page: Vec<Value> =
        rows.into_iter().skip(offset).take(lq.limit.filter(|l| *l > 0).unwrap_or(usize::MAX)).map(|ws| workspace_json(&w, ws)).collect();
    if repeat && let Some(first) = page.first().cloned() {
        page.push(first);
    }
    axum::Json(json!({"workspaces": page, "count": count})).into_response()
}

async fn get_workspace(
    State(s): State<CoderState>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    let w = lock(&s.world);
    let me = caller(req.extensions());
    // `coderd/workspaces.go` `workspace`: `include_deleted` is a strict boolean; a deleted
    // workspace is 410 without it, in v2.34.3's words (which name the wrong parameter).
    let include_deleted = match q.get("include_deleted").map(String::as_str) {
        None => false,
        Some(v) => match parse_go_bool(v) {
            Some(b) => b,
            None => {
                let body = json!({"message": format!("Invalid boolean value {v:?} for \"include_deleted\" query param."), "validations": [{"field": "deleted", "detail": "Must be a valid boolean"}]});
                return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
            }
        },
    };
    match readable(&w, me, &id) {
        Some(ws) if w.is_deleted(ws) && !include_deleted => coder_error(ApiError {
            status: 410,
            message: format!(
                "Workspace {:?} was deleted, you can view this workspace by specifying '?deleted=true' and trying again.",
                ws.id.to_string()
            ),
            detail: String::new(),
        }),
        Some(ws) => axum::Json(workspace_json(&w, ws)).into_response(),
        None => not_found(),
    }
}

/// Coder's 404, whatever the cause (`httpapi.ResourceNotFound`).
/// A request's JSON body, read up to 1 MiB (coderd's `httpapi.Read` answers 400 for a body that
/// is not JSON).
#[allow(clippy::disallowed_methods)] // bounded: the fake reads at most 1 MiB
async fn json_body(req: Request) -> Option<Value> {
    let bytes = axum::body::to_bytes(req.into_body(), 1 << 20).await.ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn not_found() -> Response {
    coder_error(ApiError { status: 404, message: NOT_FOUND.into(), detail: String::new() })
}

/// The workspace `id` names, when `me` may read it (else Coder answers 404, whatever the cause).
fn readable<'w>(w: &'w World, me: usize, id: &str) -> Option<&'w Workspace> {
    Uuid::parse_str(id).ok().and_then(|id| w.ws_index(id)).map(|i| &w.workspaces[i]).filter(|ws| w.may_read(me, ws))
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// `GET /api/v2/workspaces/{workspace}/builds` as coderd answers it (`coderd/workspacebuilds.go`
/// `workspaceBuilds`, reference/coder/NOTES.md section 17): every build, newest first (by build
/// number), `since` keeping those created after it (an RFC 3339 time, else 400), `after_id`
/// (400 when no such build) keeping those numbered after the cursor's, then `offset` and `limit`
/// (0: all). A deleted workspace's builds still answer.
async fn list_builds(
    State(s): State<CoderState>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    let w = lock(&s.world);
    let me = caller(req.extensions());
    let Some(ws) = readable(&w, me, &id) else {
        return not_found();
    };
    // The name of the first parameter that is not a non-negative integer, if any.
    let number =
        |name: &'static str| -> Result<usize, &'static str> { q.get(name).map_or(Ok(0), |v| v.parse::<usize>().map_err(|_| name)) };
    let (limit, offset) = match (number("limit"), number("offset")) {
        (Ok(l), Ok(o)) => (l, o),
        (Err(name), _) | (_, Err(name)) => {
            let body = json!({"message": "Query parameters have invalid values.", "validations": [{"field": name, "detail": format!("Query param {name:?} must be a valid positive integer.")}]});
            return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        }
    };
    let since = match q.get("since").filter(|s| !s.is_empty()) {
        None => None,
        Some(raw) => match DateTime::parse_from_rfc3339(raw) {
            Ok(t) => Some(t.with_timezone(&Utc)),
            Err(e) => {
                return coder_error(ApiError { status: 400, message: "bad `since` format, must be RFC3339".into(), detail: e.to_string() });
            }
        },
    };
    let after = match q.get("after_id").filter(|s| !s.is_empty()) {
        None => None,
        Some(raw) => match Uuid::parse_str(raw).ok().and_then(|a| ws.builds.iter().find(|b| b.id == a)) {
            Some(b) => Some(b.number),
            None => {
                return coder_error(ApiError {
                    status: 400,
                    message: format!("Record at \"after_id\" ({raw:?}) does not exist."),
                    detail: String::new(),
                });
            }
        },
    };
    let mut builds: Vec<&Build> =
        ws.builds.iter().filter(|b| since.is_none_or(|s| b.created_at > s)).filter(|b| after.is_none_or(|n| b.number > n)).collect();
    builds.sort_by_key(|b| std::cmp::Reverse(b.number));
    let page: Vec<Value> =
        builds.into_iter().skip(offset).take(if limit == 0 { usize::MAX } else { limit }).map(|b| build_json(&w, ws, b)).collect();
    axum::Json(page).into_response()
}

async fn post_build(State(s): State<CoderState>, Path(id): Path<String>, req: Request) -> Response {
    let me = caller(req.extensions());
    let Some(body) = json_body(req).await else {
        return coder_error(ApiError { status: 400, message: "Request body must be valid JSON.".into(), detail: String::new() });
    };
    let transition = match body["transition"].as_str() {
        Some("start") => "start",
        Some("stop") => "stop",
        Some("delete") => "delete",
        other => {
            let v = other.unwrap_or("");
            return (StatusCode::BAD_REQUEST, axum::Json(json!({"message": "Validation failed.", "validations": [{"field": "transition", "detail": format!("Validation failed for tag \"oneof\" with value: \"{v}\"")}]}))).into_response();
        }
    };
    let mut w = lock(&s.world);
    let Some(ws_id) = Uuid::parse_str(&id).ok() else {
        return not_found();
    };
    match w.create_build(ws_id, transition, me, "initiator") {
        Ok(build_id) => {
            let Some((wi, bi)) = w.find_build(build_id) else { return StatusCode::INTERNAL_SERVER_ERROR.into_response() };
            let body = build_json(&w, &w.workspaces[wi], &w.workspaces[wi].builds[bi]);
            // The swagger says 200; the real handler writes 201 Created.
            (StatusCode::CREATED, axum::Json(body)).into_response()
        }
        Err(e) => coder_error(e),
    }
}

async fn get_build(State(s): State<CoderState>, Path(id): Path<String>) -> Response {
    let w = lock(&s.world);
    match Uuid::parse_str(&id).ok().and_then(|id| w.find_build(id)) {
        Some((wi, bi)) => axum::Json(build_json(&w, &w.workspaces[wi], &w.workspaces[wi].builds[bi])).into_response(),
        None => not_found(),
    }
}

/// `GET /api/v2/workspacebuilds/{id}/parameters` (`coderd/workspacebuilds.go`
/// `workspaceBuildParameters`, reference NOTES §19): `[{"name","value"}]` as the build stored
/// them; 400 for an id that is no UUID (`httpmw.ParseUUIDParam`), 404 for a build that does not
/// exist or whose workspace the caller may not read (`ExtractWorkspaceParam`, dbauthz).
async fn get_build_parameters(State(s): State<CoderState>, Path(id): Path<String>, req: Request) -> Response {
    let w = lock(&s.world);
    let Ok(build_id) = Uuid::parse_str(&id) else {
        return coder_error(ApiError { status: 400, message: format!("Invalid UUID {id:?}."), detail: "invalid UUID length".into() });
    };
    match w.find_build(build_id).filter(|(wi, _)| w.may_read(caller(req.extensions()), &w.workspaces[*wi])) {
        Some((wi, bi)) => {
            let values: Vec<Value> =
                w.workspaces[wi].builds[bi].parameters.iter().map(|(name, value)| json!({"name": name, "value": value})).collect();
            axum::Json(Value::Array(values)).into_response()
        }
        None => not_found(),
    }
}

/// `GET /api/v2/templates/{template}` (`coderd/templates.go` `template`): `codersdk.Template`. The
/// world has one template; its `activity_bump_ms` is the world's activity bump, and
/// `time_til_autostop_notify_ms` (main only, #26676) is sent only when the world sets a reminder.
async fn get_template(State(s): State<CoderState>, Path(id): Path<String>) -> Response {
    let w = lock(&s.world);
    if Uuid::parse_str(&id).ok() != Some(w.template_id) {
        return not_found();
    }
    let ms = |d: std::time::Duration| d.as_millis() as i64;
    let (org_id, org_name) = (&w.organizations[0].0, &w.organizations[0].1);
    let mut body = json!({
        "id": w.template_id, "name": "gpu-workspace", "display_name": "GPU workspace", "organization_id": org_id,
        "organization_name": org_name, "organization_display_name": org_name, "organization_icon": "", "provisioner": "terraform",
        "active_version_id": w.template_version_id, "active_user_count": 1, "build_time_stats": {}, "description": "",
        "deprecated": false, "deprecation_message": "", "icon": "", "default_ttl_ms": 0, "activity_bump_ms": ms(w.config.activity_bump),
        "autostop_requirement": {"days_of_week": [], "weeks": 1}, "autostart_requirement": {"days_of_week": []},
        "created_by_id": w.users[0].id, "created_by_name": w.users[0].username, "allow_user_autostart": true,
        "allow_user_autostop": true, "allow_user_cancel_workspace_jobs": w.config.allow_user_cancel, "failure_ttl_ms": 0,
        "time_til_dormant_ms": 0, "time_til_dormant_autodelete_ms": 0, "require_active_version": false, "max_port_share_level": "owner",
        "cors_behavior": "simple", "use_classic_parameter_flow": false, "disable_module_cache": false, "deleted": false,
        "created_at": ts(w.now()), "updated_at": ts(w.now())
    });
    if let Some(lead) = w.config.autostop_notify {
        body["time_til_autostop_notify_ms"] = json!(ms(lead));
    }
    axum::Json(body).into_response()
}

#[derive(Deserialize)]
struct DaemonsQuery {
    tags: Option<String>,
    offline: Option<String>,
}

/// `GET /api/v2/organizations/{org}/provisionerdaemons?tags=<json>&offline=`
/// (`coderd/provisionerdaemons.go`, NOTES §16): the organization's daemons whose tags contain
/// `tags`; daemons unseen for 90 s are left out unless `offline=true`. Owners and template
/// admins may read them; others get 404.
async fn provisioner_daemons(
    State(s): State<CoderState>,
    Path(org): Path<String>,
    Query(q): Query<DaemonsQuery>,
    req: Request,
) -> Response {
    let me = caller(req.extensions());
    let w = lock(&s.world);
    let Some(oi) = w.organizations.iter().position(|(id, name)| id.to_string() == org || *name == org) else {
        return not_found();
    };
    if !w.users[me].owner && !w.users[me].org_roles.iter().any(|(o, _)| *o == oi) {
        return not_found();
    }
    let filter: std::collections::BTreeMap<String, String> = match q.tags.as_deref().map(serde_json::from_str).transpose() {
        Ok(t) => t.unwrap_or_default(),
        Err(e) => return coder_error(ApiError { status: 400, message: "Invalid tags query parameter".into(), detail: e.to_string() }),
    };
    let offline = q.offline.as_deref().and_then(parse_bool).unwrap_or(false);
    let (now, within) = (w.now(), w.seen_within());
    let rows: Vec<Value> = w
        .provisioners
        .iter()
        .filter(|p| p.org == oi && p.matches(&filter))
        .filter(|p| offline || now - p.last_seen < within)
        .map(|p| {
            let recent = now - p.last_seen < within;
            json!({
                "id": p.id, "organization_id": w.organizations[p.org].0, "key_id": "00000000-0000-0000-0000-000000000001", "key_name": "built-in",
                "created_at": ts(p.created_at), "last_seen_at": ts(p.last_seen), "name": p.name, "version": "v2.34.3", "api_version": "1.9",
                "provisioners": ["terraform"], "tags": p.tags, "status": if recent { "idle" } else { "offline" },
                "current_job": null, "previous_job": null
            })
        })
        .collect();
    axum::Json(Value::Array(rows)).into_response()
}

#[derive(Deserialize)]
struct CancelQuery {
    expect_status: Option<String>,
}

/// `PATCH /api/v2/workspacebuilds/{id}/cancel[?expect_status=pending|running]`: 200 with a
/// `codersdk.Response`; 412 when the job is not in the expected state (NOTES §16).
async fn cancel_build(State(s): State<CoderState>, Path(id): Path<String>, Query(q): Query<CancelQuery>, req: Request) -> Response {
    let me = caller(req.extensions());
    let Some(build_id) = Uuid::parse_str(&id).ok() else {
        return not_found();
    };
    if let Some(v) = q.expect_status.as_deref().filter(|v| !matches!(*v, "pending" | "running")) {
        let detail = format!("expect_status must be pending or running, not {v:?}");
        return coder_error(ApiError { status: 400, message: "Invalid expect_status.".into(), detail });
    }
    match lock(&s.world).cancel_build_expecting(build_id, me, q.expect_status.as_deref()) {
        Ok(()) => axum::Json(json!({"message": "Job has been marked as canceled..."})).into_response(),
        Err(e) => coder_error(e),
    }
}

async fn put_extend(State(s): State<CoderState>, Path(id): Path<String>, req: Request) -> Response {
    let me = caller(req.extensions());
    // The workspace middleware answers before the body is read.
    let found = {
        let w = lock(&s.world);
        Uuid::parse_str(&id).ok().and_then(|id| w.ws_index(id)).is_some_and(|i| w.may_read(me, &w.workspaces[i]))
    };
    if !found {
        return not_found();
    }
    let Some(body) = json_body(req).await else {
        return coder_error(ApiError { status: 400, message: "Request body must be valid JSON.".into(), detail: String::new() });
    };
    let deadline = body["deadline"].as_str().and_then(|d| DateTime::parse_from_rfc3339(d).ok()).map(|d| d.with_timezone(&Utc));
    let (Some(ws_id), Some(deadline)) = (Uuid::parse_str(&id).ok(), deadline) else {
        return coder_error(ApiError { status: 400, message: "Validation failed.".into(), detail: "deadline".into() });
    };
    match lock(&s.world).extend(ws_id, deadline, me) {
        Ok(message) => axum::Json(json!({ "message": message })).into_response(),
        Err(e) => coder_error(e),
    }
}

async fn put_ttl(State(s): State<CoderState>, Path(id): Path<String>, axum::Json(body): axum::Json<Value>) -> Response {
    let Some(ws_id) = Uuid::parse_str(&id).ok() else {
        return not_found();
    };
    match lock(&s.world).set_ttl(ws_id, body["ttl_ms"].as_i64()) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => coder_error(e),
    }
}

#[derive(Deserialize)]
struct ControlBody {
    owner: Option<String>,
    name: Option<String>,
    load: Option<String>,
    ttl_ms: Option<i64>,
}

fn parse_load(s: &str) -> Option<Load> {
    Some(match s {
        "idle" => Load::Idle,
        "memory-only" => Load::MemoryOnly,
        "one-thread" => Load::OneThread,
        "matmul" => Load::Matmul,
        "phantom" => Load::Phantom,
        _ => return None,
    })
}

/// `POST /control/{action}[/{id}]`: create, connect, disconnect, load, start, stop.
async fn control(State(s): State<CoderState>, Path(rest): Path<String>, body: Option<axum::Json<ControlBody>>) -> Response {
    let parts: Vec<String> = rest.split('/').map(str::to_string).collect();
    let body = body.map(|b| b.0).unwrap_or(ControlBody { owner: None, name: None, load: None, ttl_ms: None });
    let mut w = lock(&s.world);
    let ws = parts.get(1).and_then(|id| Uuid::parse_str(id).ok().or_else(|| w.ws_by_name(id).map(|w| w.id)));
    let result: Result<Value, ApiError> = match (parts[0].as_str(), ws) {
        ("create", _) => w
            .create_workspace(body.owner.as_deref().unwrap_or("alice"), body.name.as_deref().unwrap_or("dev"), body.ttl_ms)
            .map(|id| json!({ "id": id })),
        ("connect", Some(id)) => {
            w.open_connection(id);
            Ok(json!({}))
        }
        ("disconnect", Some(id)) => {
            w.close_connection(id);
            Ok(json!({}))
        }
        ("load", Some(id)) => match body.load.as_deref().and_then(parse_load) {
            Some(l) => {
                w.set_load(id, l);
                Ok(json!({}))
            }
            None => Err(ApiError {
                status: 400,
                message: "load must be idle, memory-only, one-thread, matmul or phantom".into(),
                detail: String::new(),
            }),
        },
        (t @ ("start" | "stop"), Some(id)) => {
            let by = w.ws_index(id).map_or(0, |i| w.workspaces[i].owner);
            w.create_build(id, if t == "start" { "start" } else { "stop" }, by, "cli").map(|b| json!({ "build_id": b }))
        }
        _ => Err(ApiError { status: 404, message: "unknown control action or workspace".into(), detail: String::new() }),
    };
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => coder_error(e),
    }
}

async fn events(State(s): State<CoderState>) -> Response {
    let w = lock(&s.world);
    let list: Vec<Value> =
        w.events.iter().map(|e| json!({"at": ts(e.at), "workspace": e.workspace, "kind": e.kind, "detail": e.detail})).collect();
    axum::Json(
        json!({ "events": list, "users": w.users.iter().map(|u| json!({"username": u.username, "owner": u.owner})).collect::<Vec<_>>() }),
    )
    .into_response()
}

pub fn router(state: CoderState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "OK" }))
        .route("/api/v2/buildinfo", get(buildinfo))
        .route("/api/v2/users/{user}", get(get_user))
        .route("/api/v2/users/{user}/keys/{keyid}", get(get_key))
        .route("/api/v2/authcheck", post(authcheck))
        .route("/api/v2/workspaces", get(list_workspaces))
        .route("/api/v2/workspaces/{workspace}", get(get_workspace))
        .route("/api/v2/workspaces/{workspace}/builds", get(list_builds).post(post_build))
        .route("/api/v2/templates/{template}", get(get_template))
        .route("/api/v2/workspacebuilds/{workspacebuild}", get(get_build))
        .route("/api/v2/workspacebuilds/{workspacebuild}/cancel", patch(cancel_build))
        .route("/api/v2/workspacebuilds/{workspacebuild}/parameters", get(get_build_parameters))
        .route("/api/v2/workspaces/{workspace}/extend", put(put_extend))
        .route("/api/v2/workspaces/{workspace}/ttl", put(put_ttl))
        .route("/api/v2/organizations/{organization}/provisionerdaemons", get(provisioner_daemons))
        .route("/control/events", get(events))
        .route("/control/{*parts}", post(control))
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        .layer(middleware::from_fn_with_state(state.clone(), date_header))
        .with_state(state)
}
