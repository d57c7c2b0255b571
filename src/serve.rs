//! The HTTP server of `run` (and `demo`): the status page `/`, `/metrics`, `/healthz`, `/readyz`,
//! `/api/v1/workspaces` and `/api/v1/workspaces/{id}` (add `?format=text` for one line, as the
//! workspace template's agent metadata shows it); and, with `--health-listen`, a second listener
//! for `/healthz`, `/readyz` and `/metrics` only. It reads `State`; it never acts and never shows
//! the token.
//!
//! Every workspace can reach the main port, so it defends itself: a request's headers must
//! arrive within `HEADER_TIMEOUT`, a connection lives at most `CONNECTION_TIMEOUT`, at most
//! `MAX_CONNECTIONS` are open and at most `MAX_PER_PEER` from one address (more are closed at
//! once), and with a status token the fleet-wide routes (`/`, `/api/v1/workspaces`) want
//! `Authorization: Bearer <token>`. The per-workspace route stays open: the template's agent calls
//! it, and the workspace id it needs is unguessable. Many clients together can still fill the
//! main port; the kubelet's probes and Prometheus then use the health listener, whose slots no
//! client of the main port can take (NetworkPolicy lets pods reach only the main port; the
//! kubelet's probes come from the node, which a NetworkPolicy always lets in).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request, State as AxumState};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::http::SecretFile;
use crate::pass::publish::State;

/// The status route; the workspace template's metadata script calls it (tests check the match).
pub const WORKSPACE_ROUTE: &str = "/api/v1/workspaces/{id}";
/// A client must send its request headers within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection, keep-alive included, lives at most this long.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections open at once on the main port; more are closed as they arrive.
pub const MAX_CONNECTIONS: usize = 128;
/// Connections open at once from one address on the main port: one workspace cannot take
/// every slot.
pub const MAX_PER_PEER: usize = 16;
/// The health listener's connections, in all and from one address.
pub const HEALTH_CONNECTIONS: usize = 32;
pub const HEALTH_PER_PEER: usize = 8;

#[derive(Clone)]
struct ServerState {
    state: Arc<State>,
    status_token: Option<Arc<SecretFile>>,
}

pub fn router(state: Arc<State>, status_token: Option<Arc<SecretFile>>) -> Router {
    let s = ServerState { state, status_token };
    let fleet = Router::new()
        .route("/", get(page))
        .route("/api/v1/workspaces", get(workspaces))
        .route_layer(middleware::from_fn_with_state(s.clone(), require_status_token));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(WORKSPACE_ROUTE, get(workspace))
        .merge(fleet)
        .with_state(s)
}

/// The health listener's routes: probes and metrics, nothing about workspaces.
pub fn health_router(state: Arc<State>) -> Router {
    let s = ServerState { state, status_token: None };
    Router::new().route("/metrics", get(metrics)).route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(s)
}

/// How many connections a listener keeps open, in all and from one address.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub total: usize,
    pub per_peer: usize,
}

pub const MAIN_LIMITS: ConnectionLimits = ConnectionLimits { total: MAX_CONNECTIONS, per_peer: MAX_PER_PEER };
pub const HEALTH_LIMITS: ConnectionLimits = ConnectionLimits { total: HEALTH_CONNECTIONS, per_peer: HEALTH_PER_PEER };

/// Open connections, per peer address; a slot is given back when its guard drops.
#[derive(Default)]
struct Slots {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

struct SlotGuard {
    slots: Arc<Mutex<Slots>>,
    peer: IpAddr,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.total = s.total.saturating_sub(1);
        if let Some(n) = s.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                s.per_peer.remove(&self.peer);
            }
        }
    }
}

fn take_slot(slots: &Arc<Mutex<Slots>>, peer: IpAddr, limits: ConnectionLimits) -> Option<SlotGuard> {
    let mut s = slots.lock().unwrap_or_else(|p| p.into_inner());
    let mine = s.per_peer.get(&peer).copied().unwrap_or(0);
    if s.total >= limits.total || mine >= limits.per_peer {
        return None;
    }
    s.total += 1;
    s.per_peer.insert(peer, mine + 1);
    Some(SlotGuard { slots: slots.clone(), peer })
}

/// Serves the main routes until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    status_token: Option<Arc<SecretFile>>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    serve_router(listener, router(state, status_token), MAIN_LIMITS, shutdown).await
}

/// Serves `router` on `listener` within `limits` until `shutdown` turns true.
pub async fn serve_router(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let slots = Arc::new(Mutex::new(Slots::default()));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return Ok(()),
        };
        if *shutdown.borrow() {
            return Ok(());
        }
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(event = "accept_failed", error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = take_slot(&slots, peer.ip(), limits) else {
            drop(stream); // too many open (in all, or from this address): close at once instead of queueing memory
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
            drop(slot);
        });
    }
}

async fn require_status_token(AxumState(s): AxumState<ServerState>, req: Request, next: Next) -> Response {
    let Some(want) = &s.status_token else { return next.run(req).await };
    let offered = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match offered {
        Some(t) if want.matches(t.trim()) => next.run(req).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this route needs the status token: send Authorization: Bearer <token>\n",
        )
            .into_response(),
    }
}

async fn metrics(AxumState(s): AxumState<ServerState>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.state.metrics.encode()).into_response()
}

async fn healthz(AxumState(s): AxumState<ServerState>) -> Response {
    match s.state.alive() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not alive: {why}\n")).into_response(),
    }
}

async fn readyz(AxumState(s): AxumState<ServerState>) -> Response {
    match s.state.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

async fn page(AxumState(s): AxumState<ServerState>) -> Response {
    // Rendered once per pass and shared by every reader.
    let html = s.state.status().page();
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], html).into_response()
}

async fn workspaces(AxumState(s): AxumState<ServerState>) -> Response {
    // Serialised once per pass and shared by every reader: a slow reader holds no copy of its own.
    ([(header::CONTENT_TYPE, "application/json")], s.state.status().json()).into_response()
}

#[derive(Deserialize)]
struct FormatQuery {
    format: Option<String>,
}

async fn workspace(AxumState(s): AxumState<ServerState>, Path(id): Path<String>, Query(q): Query<FormatQuery>) -> Response {
    let doc = s.state.status();
    let Some(entry) = doc.workspaces.iter().find(|w| w.id.eq_ignore_ascii_case(&id)) else {
        let msg = "no running workspace with this id in the latest pass";
        return match q.format.as_deref() {
            Some("text") => (StatusCode::NOT_FOUND, format!("{msg}\n")).into_response(),
            _ => (StatusCode::NOT_FOUND, axum::Json(serde_json::json!({ "message": msg }))).into_response(),
        };
    };
    match q.format.as_deref() {
        Some("text") => (StatusCode::OK, format!("{}\n", entry.one_line())).into_response(),
        _ => axum::Json(entry).into_response(),
    }
}
