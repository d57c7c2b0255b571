//! What every outgoing HTTP client shares: parsing the URLs people configure, building clients
//! that never follow a redirect and trust the configured extra CAs, reading bodies with a byte
//! limit (whole, or split as they stream in), the GPU sources' request preamble (`send`: no
//! answer in words, a redirect refused), reading small secret files with a size limit, and
//! writing URLs into logs and labels without their secrets. Below every module that talks HTTP
//! (`coder/`, `gpu/`, `audit`, the commands); it uses nothing of this crate but `error` and
//! `json_split`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::{Certificate, Url};

use crate::error::Error;
use crate::json_split::{OnElement, Splitter};

/// Parses an `http://` or `https://` URL with a host; anything else is a configuration error
/// naming `setting` and an example of what to write instead.
pub fn http_url(setting: &str, raw: &str, example: &str) -> Result<Url, Error> {
    let raw = raw.trim();
    let bad = || Error::config(format!("{setting} {:?} is not an http(s) URL: pass e.g. {example}", redact_str(raw)));
    let url = Url::parse(raw).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad());
    }
    Ok(url)
}

/// What every outgoing client shares: CAs added to the built-in roots, and the one HTTP proxy
/// (`proxy_url`). Proxies from the environment (`HTTP_PROXY`, `ALL_PROXY`, ...) are never used:
/// one set for a cluster would receive the owner token, in clear to an `http://` Coder.
#[derive(Debug, Clone, Default)]
pub struct Outbound {
    pub extra_roots: Vec<Certificate>,
    pub proxy: Option<reqwest::Url>,
}

impl Outbound {
    /// Reads a PEM bundle (`--ca-file`, `SSL_CERT_FILE`).
    pub fn from_pem_file(path: &Path) -> Result<Self, Error> {
        let pem = std::fs::read(path).map_err(|e| {
            Error::config(format!("--ca-file {}: cannot read it ({e}); fix the path or unset SSL_CERT_FILE", path.display()))
        })?;
        let extra_roots = Certificate::from_pem_bundle(&pem).map_err(|e| {
            Error::config(format!("--ca-file {}: not a PEM certificate bundle ({e}); pass the CA's PEM file", path.display()))
        })?;
        if extra_roots.is_empty() {
            return Err(Error::config(format!("--ca-file {}: holds no certificate; pass the CA's PEM file", path.display())));
        }
        Ok(Outbound { extra_roots, proxy: None })
    }
}

/// A client that never follows redirects (a 3xx is an answer, reported as an error by the
/// caller: a token must never leave the host it was configured for, and https must never turn
/// into http), with the given timeouts and trust.
#[allow(clippy::disallowed_methods)] // the one place a client is built
pub fn client(timeout: Duration, connect_timeout: Duration, outbound: &Outbound) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(connect_timeout.min(timeout))
        .user_agent(concat!("coder-gpu-reclaimer/", env!("CARGO_PKG_VERSION")));
    for cert in &outbound.extra_roots {
        builder = builder.add_root_certificate(cert.clone());
    }
    builder = match &outbound.proxy {
        Some(url) => builder.proxy(
            reqwest::Proxy::all(url.clone())
                .map_err(|e| Error::config(format!("proxy_url: not a proxy URL ({e}); write http://proxy:3128")))?,
        ),
        None => builder.no_proxy(),
    };
    builder.build().map_err(|e| Error::runtime(format!("cannot build the HTTP client: {e}")))
}

/// A secret read from a file (the status API's bearer token): never printed, compared in
/// constant time.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Reads and trims the file; an empty one is an error naming `setting`.
    pub fn from_file(setting: &str, path: &Path) -> Result<Self, Error> {
        let text = read_secret_file(path)
            .map_err(|e| Error::config(format!("{setting} {}: cannot read it ({e}); fix the path", path.display())))?;
        let value = text.trim();
        if value.is_empty() || value.chars().any(char::is_whitespace) {
            return Err(Error::config(format!("{setting} {}: must hold one token, with no spaces", path.display())));
        }
        Ok(Secret(value.to_string()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Equal, in time that does not depend on where the first difference is.
    pub fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), offered.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// A secret kept in a file that Kubernetes may swap in place (a rotated Secret): compared with
/// what a client offers, and re-read (at most once a second) when the offer does not match, so
/// a rotated token works without a restart. A file unreadable mid-rotation keeps the last one.
pub struct SecretFile {
    setting: &'static str,
    path: PathBuf,
    current: std::sync::RwLock<Secret>,
    last_read: std::sync::Mutex<std::time::Instant>,
}

impl SecretFile {
    pub fn open(setting: &'static str, path: &Path) -> Result<Self, Error> {
        let secret = Secret::from_file(setting, path)?;
        Ok(SecretFile {
            setting,
            path: path.to_path_buf(),
            current: std::sync::RwLock::new(secret),
            last_read: std::sync::Mutex::new(std::time::Instant::now()),
        })
    }

    /// Whether `offered` is the secret, the file re-read first when it is not (rate-limited).
    pub fn matches(&self, offered: &str) -> bool {
        if self.current.read().unwrap_or_else(|p| p.into_inner()).matches(offered) {
            return true;
        }
        {
            let mut last = self.last_read.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() < Duration::from_secs(1) {
                return false;
            }
            *last = std::time::Instant::now();
        }
        match Secret::from_file(self.setting, &self.path) {
            Ok(fresh) => {
                let matched = fresh.matches(offered);
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                matched
            }
            Err(_) => false,
        }
    }
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretFile({}, <redacted>)", self.path.display())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A redirect answer refused, naming the status and the target's host only, or `None` for any
/// other answer.
pub fn refused_redirect(resp: &reqwest::Response) -> Option<String> {
    let status = resp.status();
    if !status.is_redirection() {
        return None;
    }
    let target = resp
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|l| Url::parse(l).ok())
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "the same host".into());
    Some(format!(
        "HTTP {}: a redirect to {target}, not followed (configure the final URL; credentials never leave the configured host)",
        status.as_u16()
    ))
}

/// Sends a request to a GPU source: no answer reads "timed out" or "no response: …" (the error
/// chain without the URL, which may hold credentials), and a redirect is refused. The one
/// preamble of the exporter scrape and the Prometheus query.
pub async fn send(req: reqwest::RequestBuilder) -> Result<reqwest::Response, String> {
    let resp = req
        .send()
        .await
        .map_err(|e| if e.is_timeout() { "timed out".to_string() } else { format!("no response: {}", error_chain(&e.without_url())) })?;
    match refused_redirect(&resp) {
        Some(refused) => Err(refused),
        None => Ok(resp),
    }
}

/// Why a body could not be read whole.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyError {
    /// The peer sent more than the limit; reading stopped there.
    TooLarge { limit: usize },
    /// The connection broke or timed out while reading.
    Transport(String),
    /// The bodies read at the same time already hold the whole in-flight budget.
    OverBudget { budget: usize },
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge { limit } => {
                write!(f, "the body is larger than the limit of {} (raise it in the config file if this peer is real)", bytes_human(*limit))
            }
            BodyError::Transport(e) => write!(f, "reading the body failed: {e}"),
            BodyError::OverBudget { budget } => write!(
                f,
                "the bodies read at the same time already hold the in-flight budget of {} (max_in_flight_body_mib): this one is cut off",
                bytes_human(*budget)
            ),
        }
    }
}

/// "64 MiB", "512 KiB", "100 B".
pub fn bytes_human(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Hands a body to `on_chunk` chunk by chunk, stopping as soon as it passes `limit` bytes (or
/// announces more) with the `BodyError` as `E`, or at `on_chunk`'s first error.
#[allow(clippy::disallowed_methods)] // the one place a body is read, chunk by chunk, against its limit
async fn for_each_chunk<E>(
    mut resp: reqwest::Response,
    limit: usize,
    body_error: fn(BodyError) -> E,
    mut on_chunk: impl FnMut(Bytes) -> Result<(), E>,
) -> Result<(), E> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(body_error(BodyError::TooLarge { limit }));
    }
    let mut received = 0usize;
    while let Some(chunk) = resp.chunk().await.map_err(|e| body_error(BodyError::Transport(error_chain(&e.without_url()))))? {
        received += chunk.len();
        if received > limit {
            return Err(body_error(BodyError::TooLarge { limit }));
        }
        on_chunk(chunk)?;
    }
    Ok(())
}

/// Reads a whole body, chunk by chunk, stopping as soon as it passes `limit` bytes.
pub async fn read_limited(resp: reqwest::Response, limit: usize) -> Result<Bytes, BodyError> {
    let mut buf = BytesMut::new();
    for_each_chunk(
        resp,
        limit,
        |e| e,
        |chunk| {
            buf.extend_from_slice(&chunk);
            Ok(())
        },
    )
    .await?;
    Ok(buf.freeze())
}

/// Bytes that bodies read at the same time may receive together (exporter scrapes run `slots` at
/// a time), so the per-body limits compose under the container's memory limit. Half the budget
/// is every slot's own share: a body's first `total / (2 * slots)` bytes are its own, and only
/// what it receives beyond that comes from the common half, as it arrives, given back when its
/// read ends. A few stalled bodies at the body limit can take the common half, never a healthy
/// body's share.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: std::sync::Arc<tokio::sync::Semaphore>,
    total: usize,
    share: usize,
}

impl BodyBudget {
    pub fn new(total: usize, slots: usize) -> Self {
        let share = total / (2 * slots.max(1));
        let common = (total - share * slots.max(1)).min(tokio::sync::Semaphore::MAX_PERMITS);
        BodyBudget { bytes: std::sync::Arc::new(tokio::sync::Semaphore::new(common)), total, share }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// What every body holds of its own, beyond the common part.
    pub fn share(&self) -> usize {
        self.share
    }
}

/// Hands a body to `on_chunk` as it arrives, at most `limit` bytes, charging each byte
/// received to `budget` until it returns: when the bodies in flight have received the whole
/// budget, this one stops with `BodyError::OverBudget` (never waits: a wait could deadlock
/// bodies that each hold part of it). The receiver keeps what it makes of the bytes, never the
/// body (an exporter's scrape is folded into series as it streams in), so what it holds is
/// bounded by what was charged.
pub async fn stream_within(
    resp: reqwest::Response,
    limit: usize,
    budget: &BodyBudget,
    mut on_chunk: impl FnMut(&[u8]),
) -> Result<(), BodyError> {
    let mut charge = Charge { budget, limit, upto: 0, share: None };
    let mut read = 0usize;
    for_each_chunk(
        resp,
        limit,
        |e| e,
        |chunk| {
            read += chunk.len();
            charge.upto(read)?;
            on_chunk(&chunk);
            Ok(())
        },
    )
    .await
}

/// What one body has taken from a `BodyBudget`: its first `share` bytes are its own; only what
/// it holds beyond them comes from the common part.
struct Charge<'a> {
    budget: &'a BodyBudget,
    /// The body's own limit.
    limit: usize,
    /// Bytes charged so far (own share first).
    upto: usize,
    share: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Charge<'_> {
    /// Charges the body up to `bytes` in all (nothing when that much is charged already).
    fn upto(&mut self, bytes: usize) -> Result<(), BodyError> {
        let beyond = bytes.saturating_sub(self.budget.share.max(self.upto));
        self.upto = self.upto.max(bytes);
        if beyond == 0 {
            return Ok(());
        }
        let n = u32::try_from(beyond).map_err(|_| BodyError::TooLarge { limit: self.limit })?;
        let more = self.budget.bytes.clone().try_acquire_many_owned(n).map_err(|_| BodyError::OverBudget { budget: self.budget.total })?;
        match &mut self.share {
            Some(s) => s.merge(more),
            None => self.share = Some(more),
        }
        Ok(())
    }
}

/// Why a body could not be read as it streamed in.
#[derive(Debug)]
pub enum StreamError {
    /// Over the limit, or the connection broke: what was parsed so far is discarded.
    Body(BodyError),
    /// The parser refused the bytes: why.
    Parse(String),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Body(e) => e.fmt(f),
            StreamError::Parse(e) => f.write_str(e),
        }
    }
}

/// One element of a split body at most, or the rest of it: a Coder workspace is about 4 KB, a
/// Prometheus series at most 11,000 points (its own limit per query), about 400 KB.
pub const MAX_PIECE: usize = 4 << 20;

/// Reads a JSON body as it arrives, handing each element of the array at `path` (object keys
/// from the root) to `on_element` (where it begins in a chunk when the receiver can read it there,
/// else as one slice once split off), and returns the rest of the document with that array left
/// empty. So the body is never held whole (10,000 workspaces are 42 MB of JSON), yet each piece
/// is parsed from memory. Reading stops, and the result is `TooLarge`, as soon as
/// the body passes `limit` bytes; it stops too at the first error of `on_element`.
pub async fn read_split(
    resp: reqwest::Response,
    limit: usize,
    path: &'static [&'static str],
    on_element: &mut (dyn OnElement + Send),
) -> Result<Vec<u8>, StreamError> {
    let mut splitter = Splitter::new(path, MAX_PIECE);
    for_each_chunk(resp, limit, StreamError::Body, |chunk| splitter.feed(&chunk, on_element).map_err(StreamError::Parse)).await?;
    splitter.finish().map_err(StreamError::Parse)
}

/// The largest secret file read (a token, a webhook URL): real ones are under 200 bytes.
pub const MAX_SECRET_FILE: u64 = 64 << 10;

/// Reads a small file (a token, a URL) whole, refusing one larger than `MAX_SECRET_FILE`
/// without reading it: a wrong path to a large file must not fill memory.
pub fn read_secret_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_SECRET_FILE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_SECRET_FILE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "larger than 64 KiB: not a token; check the path"));
    }
    Ok(text)
}

/// The file's permission bits when users other than its owner and group may read it (a secret
/// should be mode 0600 or 0640; a Kubernetes Secret volume's `defaultMode` sets it).
pub fn readable_by_others(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o004 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// An error and its sources, joined: reqwest's own text stops at the outermost layer.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// A URL as logs and labels may show it: no user, password, query or fragment.
pub fn redact(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// A webhook URL as logs may show it: its path is the secret (Slack's is), so only the host.
pub fn redact_webhook(url: &Url) -> String {
    format!("{}://{}/…", url.scheme(), host_port(url))
}

/// `host:port`, for metric labels.
pub fn host_port(url: &Url) -> String {
    match (url.host_str(), url.port_or_known_default()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => String::new(),
    }
}

/// `redact` for text that may or may not parse as a URL (user input in error messages).
pub fn redact_str(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(u) if u.has_host() => redact(&u),
        _ => match raw.split_once('@') {
            Some((_, rest)) if raw.contains("://") => format!("{}://{rest}", raw.split("://").next().unwrap_or("")),
            _ => raw.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(bytes: usize) -> reqwest::Response {
        reqwest::Response::from(axum::http::Response::new(vec![b'x'; bytes]))
    }

    /// Issue 31: two stalled exporters just under the body limit held the whole budget, and
    /// healthy scrapes failed. Now each scrape's first share is its own. (A charge is what a
    /// body in flight has received; `stream_within` holds one until its read ends.)
    #[test]
    fn stalled_bodies_at_the_limit_never_take_a_healthy_scrapes_share() {
        let budget = BodyBudget::new(32 << 20, 32);
        assert_eq!(budget.share(), 512 << 10);
        let charge = || Charge { budget: &budget, limit: 16 << 20, upto: 0, share: None };
        let mut stalled = charge();
        assert!(stalled.upto(15 << 20).is_ok());
        let mut second = charge();
        assert!(matches!(second.upto(15 << 20), Err(BodyError::OverBudget { .. })), "the common half is taken");
        let mut healthy: Vec<Charge> = (0..31).map(|_| charge()).collect();
        assert!(healthy.iter_mut().all(|c| c.upto(400 << 10).is_ok()), "every other slot still reads a real body");
        drop((stalled, second, healthy));
        assert!(charge().upto(15 << 20).is_ok(), "given back when dropped");
    }

    /// A body is handed over chunk by chunk, in order, and charged as it arrives: while one body
    /// of three 512 KiB chunks is read (its own 512 KiB and the common MiB), another cannot pass
    /// its own share; once it is read, the budget is whole again.
    #[tokio::test]
    async fn a_body_is_handed_over_as_it_arrives_and_charged_until_its_read_ends() {
        let chunks = || futures_util::stream::iter((0..3u8).map(|i| Ok::<_, std::io::Error>(Bytes::from(vec![b'a' + i; 512 << 10]))));
        let app = axum::Router::new().route("/", axum::routing::get(move || async move { axum::body::Body::from_stream(chunks()) }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        // A share of 512 KiB a body, and 1 MiB in common.
        let budget = BodyBudget::new(2 << 20, 2);
        let http = client(Duration::from_secs(5), Duration::from_secs(5), &Outbound::default()).unwrap();
        let resp = send(http.get(&url)).await.unwrap();
        assert_eq!(resp.content_length(), None, "sent chunked");
        let (mut received, mut over_while_read) = (Vec::new(), None);
        stream_within(resp, 16 << 20, &budget, |chunk| {
            received.extend_from_slice(chunk);
            if received.len() == 3 * (512 << 10) {
                let mut other = Charge { budget: &budget, limit: 16 << 20, upto: 0, share: None };
                over_while_read = Some(other.upto((512 << 10) + 1));
            }
        })
        .await
        .unwrap();
        assert_eq!(received.len(), 3 * (512 << 10));
        assert!(received[..512 << 10].iter().all(|b| *b == b'a') && received[1024 << 10..].iter().all(|b| *b == b'c'), "in order");
        assert!(matches!(over_while_read, Some(Err(BodyError::OverBudget { .. }))), "the chunks took the common MiB");
        let mut after = Charge { budget: &budget, limit: 16 << 20, upto: 0, share: None };
        assert!(after.upto(3 * (512 << 10)).is_ok(), "given back when the read ended");
    }

    /// A body over the budget stops where it passes it, not after it is read.
    #[tokio::test]
    async fn a_body_past_the_budget_stops_there() {
        let budget = BodyBudget::new(2 << 20, 2);
        let mut seen = 0;
        let r = stream_within(body(4 << 20), 16 << 20, &budget, |chunk| seen += chunk.len()).await;
        assert!(matches!(r, Err(BodyError::OverBudget { .. })), "{r:?}");
        assert!(seen <= 3 * (512 << 10), "read {seen} bytes past a budget of 1.5 MiB for it");
    }

    #[test]
    fn only_http_urls_with_a_host() {
        assert!(http_url("--x", "https://coder.example.com", "e").is_ok());
        for bad in ["coder.example.com", "dns+http://coder:80", "ftp://x", "http://", "unix:///run/x.sock"] {
            let e = http_url("--x", bad, "https://e").unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.message().starts_with("--x "), "{e}");
        }
        let e = http_url("--x", "ftp://user:s3cret@host/x", "e").unwrap_err();
        assert!(!e.message().contains("s3cret"), "{e}");
    }

    #[test]
    fn secrets_never_reach_logs_or_labels() {
        let u = Url::parse("https://user:s3cret@prom.example.com:9443/api?token=abc#frag").unwrap();
        assert_eq!(redact(&u), "https://prom.example.com:9443/api");
        assert_eq!(host_port(&u), "prom.example.com:9443");
        let hook = Url::parse("https://hooks.slack.com/services/T000/B000/XXXXSECRET").unwrap();
        assert_eq!(redact_webhook(&hook), "https://hooks.slack.com:443/…");
        assert_eq!(host_port(&Url::parse("http://10.0.0.7/metrics").unwrap()), "10.0.0.7:80");
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!([bytes_human(64 << 20), bytes_human(512 << 10), bytes_human(100)], ["64 MiB", "512 KiB", "100 B"]);
    }
}
