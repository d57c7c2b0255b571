//! A fake Prometheus HTTP API (`/api/v1/query_range` only) for hostile and load tests whose
//! answers no real store could be made to hold quickly: each query is answered by the test's own
//! function, in Prometheus's JSON shape (`{"status":"success","data":{"resultType":"matrix",
//! "result":[{"metric":{...},"values":[[<unix seconds>,"<value>"],...]}]}}`, Prometheus 2.x
//! `web/api/v1`), so a test can send 20,000 series, points off the step grid, or any body the
//! limits admit. Real stores answer the same queries in `prometheus_world`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

/// One `query_range`: the PromQL, and the range asked for (unix seconds, step in seconds).
#[derive(Debug, Clone)]
pub struct RangeQuery {
    pub query: String,
    pub start: i64,
    pub end: i64,
    pub step: i64,
}

/// Answers a query with the `result` array's elements, each a JSON object as text.
pub type Answer = Arc<dyn Fn(&RangeQuery) -> Vec<String> + Send + Sync>;

/// Which queries the store cannot answer now; Prometheus says so as `respondError` in
/// `web/api/v1/api.go` does: `errorUnavailable` is HTTP 503 with
/// `{"status":"error","errorType":"unavailable","error":...}`.
pub type Unavailable = Arc<dyn Fn(&RangeQuery) -> bool + Send + Sync>;

pub struct FakePrometheus {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl FakePrometheus {
    pub async fn start(answer: Answer) -> std::io::Result<Self> {
        Self::start_with(answer, Arc::new(|_: &RangeQuery| false)).await
    }

    /// A store that answers 503 to the queries `unavailable` names (a storage node down, a
    /// query queue full) and `answer`s the rest.
    pub async fn start_with(answer: Answer, unavailable: Unavailable) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = Router::new().route("/api/v1/query_range", get(query_range)).with_state((answer, unavailable));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(FakePrometheus { addr, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Prometheus writes a step as `60s` or a float of seconds.
fn seconds(text: &str) -> i64 {
    text.trim_end_matches('s').parse::<f64>().map_or(0, |s| s as i64)
}

async fn query_range(
    State((answer, unavailable)): State<(Answer, Unavailable)>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let get = |k: &str| params.get(k).cloned().unwrap_or_default();
    let q =
        RangeQuery { query: get("query"), start: seconds(&get("start")), end: seconds(&get("end")), step: seconds(&get("step")).max(1) };
    if unavailable(&q) {
        let body = r#"{"status":"error","errorType":"unavailable","error":"the store is unavailable (fake)"}"#;
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, [("Content-Type", "application/json")], body).into_response();
    }
    let result = answer(&q).join(",");
    let body = format!(r#"{{"status":"success","data":{{"resultType":"matrix","result":[{result}]}}}}"#);
    ([("Content-Type", "application/json")], body).into_response()
}
