//! The floor a pass is measured against: the same requests sent by a minimal client that reads
//! each body and discards it (no parsing, no decompression, no state), with the same number in
//! flight as the service. What a pass costs above it is the service's own share.

#![allow(dead_code, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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

/// What a counting proxy saw: the bytes the upstream sent back (compressed, as on the wire) and the
/// target of every GET the service sent (replayed by the floor).
#[derive(Default)]
pub struct Seen {
    pub received: AtomicU64,
    pub requests: std::sync::Mutex<Vec<String>>,
}

/// A loopback proxy in front of an upstream (Prometheus, Coder) that counts what it sends back and records what it
/// is asked.
pub async fn counting_proxy(upstream: String, seen: Arc<Seen>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { return };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let asked = seen.clone();
                tokio::spawn(async move {
                    // Request heads, line by line: a line starting "GET " names a request.
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut line = Vec::new();
                    while let Ok(read) = client_read.read(&mut buf).await {
                        if read == 0 || server_write.write_all(&buf[..read]).await.is_err() {
                            break;
                        }
                        for &b in &buf[..read] {
                            if b != b'\n' {
                                line.push(b);
                                continue;
                            }
                            if let Some(target) = line.strip_prefix(b"GET ").and_then(|l| l.split(|&c| c == b' ').next()) {
                                asked.requests.lock().unwrap().push(String::from_utf8_lossy(target).into_owned());
                            }
                            line.clear();
                        }
                    }
                });
                // Counted as it is relayed: the service keeps its connections open.
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(read) = server_read.read(&mut buf).await {
                    if read == 0 || client_write.write_all(&buf[..read]).await.is_err() {
                        break;
                    }
                    seen.received.fetch_add(read as u64, Ordering::Relaxed);
                }
            });
        }
    });
    port
}

/// A child process killed when dropped (Prometheus, a fake Coder).
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The command that runs a measured process of `exe`: under the profiler `BENCH_PROFILER`
/// names when set (`"perf record -g -o /tmp/x.perf --"`, `"heaptrack -o /tmp/x --"`; the
/// figures then include the profiler's cost), else `exe` itself.
pub fn measured(exe: &std::path::Path) -> std::process::Command {
    match std::env::var("BENCH_PROFILER") {
        Ok(p) if !p.trim().is_empty() => {
            let mut parts = p.split_whitespace();
            let mut c = std::process::Command::new(parts.next().unwrap_or("env"));
            c.args(parts).arg(exe);
            c
        }
        _ => std::process::Command::new(exe),
    }
}

/// A program on PATH.
pub fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
}

/// Prometheus serving the TSDB in `dir/data` on a free loopback port, with this scrape interval
/// and retention; its port.
pub fn prometheus(binary: &std::path::Path, dir: &std::path::Path, scrape: &str, retention: &str) -> (Killed, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    std::fs::write(dir.join("prometheus.yml"), format!("global:\n  scrape_interval: {scrape}\n")).expect("config");
    let child = std::process::Command::new(binary)
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--storage.tsdb.retention.time={retention}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prometheus");
    (Killed(child), port)
}
