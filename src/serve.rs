//! The HTTP server of `run`: `/metrics`, `/healthz`, `/readyz`, `/api/v1/workspaces` and
//! `/api/v1/workspaces/{id}` (add `?format=text` for one line, as the workspace template's agent
//! metadata shows it). It reads `State`; it never acts and never shows the token.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::report::State;

/// The status route; the workspace template's metadata script calls it (tests check the match).
pub const WORKSPACE_ROUTE: &str = "/api/v1/workspaces/{id}";

pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/workspaces", get(workspaces))
        .route(WORKSPACE_ROUTE, get(workspace))
        .with_state(state)
}

/// Serves until `shutdown` turns true.
pub async fn serve(listener: TcpListener, state: Arc<State>, mut shutdown: watch::Receiver<bool>) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
}

async fn metrics(AxumState(state): AxumState<Arc<State>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.encode()).into_response()
}

async fn readyz(AxumState(state): AxumState<Arc<State>>) -> Response {
    match state.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

async fn workspaces(AxumState(state): AxumState<Arc<State>>) -> Response {
    // Serialized from the shared document: no copy of 10,000 entries per request.
    axum::Json(state.status().as_ref()).into_response()
}

#[derive(Deserialize)]
struct FormatQuery {
    format: Option<String>,
}

async fn workspace(AxumState(state): AxumState<Arc<State>>, Path(id): Path<String>, Query(q): Query<FormatQuery>) -> Response {
    let doc = state.status();
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
