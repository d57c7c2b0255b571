//! The floor a pass is measured against: the same requests sent by a minimal client that reads
//! each body and discards it (no parsing, no decompression, no state), with the same number in
//! flight as the service. What a pass costs above it is the service's own share.

#![allow(dead_code, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

/// A client with nothing on: no decompression, no redirects, a generous timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_gzip()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(120))
        .build()
        .expect("floor client")
}

/// GETs `url` (with `headers`, e.g. `Accept-Encoding: gzip` to receive what the service
/// receives) and discards the body as it arrives; returns the bytes received.
pub async fn discard(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> u64 {
    let mut request = client.get(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut resp = request.send().await.expect("floor request");
    let mut bytes = 0u64;
    while let Some(chunk) = resp.chunk().await.expect("floor body") {
        bytes += chunk.len() as u64;
    }
    bytes
}

/// GETs every URL, at most `in_flight` at a time, discarding the bodies; returns the bytes.
pub async fn discard_all(client: &reqwest::Client, urls: &[String], in_flight: usize, headers: &[(&str, &str)]) -> u64 {
    futures_util::stream::iter(urls.iter().map(|u| discard(client, u, headers)))
        .buffer_unordered(in_flight)
        .fold(0, |a, b| async move { a + b })
        .await
}

/// Wall and CPU seconds of `f`, measured the same way as the service's passes.
pub async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, f64, f64) {
    let cpu0 = super::synthetic::cpu_seconds();
    let t = Instant::now();
    let out = f.await;
    (out, t.elapsed().as_secs_f64(), super::synthetic::cpu_seconds() - cpu0)
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}
