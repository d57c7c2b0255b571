//! The Coder REST client: every call this service makes to Coder, with the session token header,
//! timeouts, retries of transient failures (500/502/503/504, connection errors, timeouts),
//! bounded bodies, no redirects (the token never leaves Coder's host), a 429 that holds its URL
//! path (coderd limits per user and path) until its `Retry-After` has passed (a later pass asks
//! again; nothing sleeps inside one),
//! and errors that carry Coder's own `message` and `detail` plus what to do about them.

pub mod actions;
pub mod identity;
pub mod token;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::http::{BodyError, Outbound, StreamError, error_chain, read_limited, read_split, refused_redirect};
use crate::json_read::{read_at_start, read_whole};
use crate::json_split::OnElement;
use crate::retry::{Attempt, RetryPolicy, retry};
pub use reclaimer_core::coder::types;
pub use token::{SessionToken, TokenSource};
use types::*;

pub const TOKEN_HEADER: &str = "Coder-Session-Token";

/// The longest `Retry-After` honoured: a larger (or absurd) value waits this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// How long a 429 without `Retry-After` holds its path (httprate's window is one minute).
const DEFAULT_RATE_LIMIT_HOLD: Duration = Duration::from_secs(60);
/// Error bodies are read up to this much (Coder's are a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 << 10;
/// One workspace, build or user: a few KB each.
const MAX_OBJECT_BODY: usize = 4 << 20;

/// Called once per HTTP exchange with the route template (never a workspace id) and the status
/// code, 0 when no response came. The metrics module counts these.
pub type RequestObserver = Arc<dyn Fn(&'static str, u16) + Send + Sync>;

/// What went wrong talking to Coder, classified so callers can decide without parsing text.
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorKind {
    /// 401: the token expired or was revoked.
    Unauthorized,
    /// 403 or 404: the token's user may not do this (or cannot see the workspace).
    NoPermission,
    /// 409: a build is already active, or the workspace was deleted.
    Conflict,
    /// 429: the path is held until its `Retry-After` passed.
    RateLimited,
    /// Any other HTTP status.
    Status(u16),
    /// No response: connection refused, reset, DNS, or a timeout.
    Transport,
    /// A 2xx whose body did not match the expected shape.
    Decode,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CoderError {
    pub kind: ErrorKind,
    pub endpoint: &'static str,
    pub message: String,
}

impl fmt::Display for CoderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Coder {}: {}", self.endpoint, self.message)?;
        match self.kind {
            ErrorKind::Unauthorized => write!(f, " ({})", self.token_advice()),
            ErrorKind::NoPermission => f.write_str(" (the token's user lacks permission: use an owner's token)"),
            ErrorKind::Transport => f.write_str(" (check --coder-url and that Coder is reachable from here)"),
            _ => Ok(()),
        }
    }
}

impl CoderError {
    /// For a 401: what will fix it. A suspended (or dormant) user's tokens are refused until an
    /// admin reactivates the account (`httpmw/apikey.go`: "User is not active"); a new token of
    /// the same user does not help. Otherwise the token expired or was revoked.
    pub fn token_advice(&self) -> String {
        if self.user_inactive() {
            "the token's user is not active in Coder (suspended or dormant): an admin must reactivate the account (`coder users activate <username>`, or Users in the dashboard); a new token of that user does not help".into()
        } else {
            format!("the session token is expired or revoked: create a new one {}", token::TOKEN_ADVICE)
        }
    }

    /// A 401 because the token's user is suspended or dormant, not because of the token.
    pub fn user_inactive(&self) -> bool {
        self.kind == ErrorKind::Unauthorized && self.message.contains("User is not active")
    }
}

impl std::error::Error for CoderError {}

/// One listing of the running workspaces.
#[derive(Debug, Clone)]
pub struct Listing {
    pub workspaces: Vec<Workspace>,
    /// Coder's clock minus ours, when the response had a `Date` header.
    pub clock_offset: Option<chrono::Duration>,
}

/// The outcome of asking Coder to stop a workspace.
#[derive(Debug, Clone, PartialEq)]
pub enum StopOutcome {
    /// 201: the stop build was queued.
    Queued(Box<WorkspaceBuild>),
    /// 409: another build is active; decide again next pass.
    BuildActive(String),
}

/// The listing's workspaces as they are split off, each read from its bytes with only the
/// fields the models hold (`types::read_workspace`): most where they begin in a chunk.
#[derive(Debug, Default)]
pub struct ListedWorkspaces(pub Vec<Workspace>);

impl OnElement for ListedWorkspaces {
    fn element(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.0.push(read_whole(bytes, types::read_workspace)?);
        Ok(())
    }

    fn element_at_start(&mut self, bytes: &[u8]) -> Result<Option<usize>, String> {
        let read = read_at_start(bytes, types::read_workspace)?;
        Ok(read.map(|(workspace, used)| {
            self.0.push(workspace);
            used
        }))
    }
}

/// How much of a workspace's build history `workspace_builds` keeps: builds created after
/// `until` are dropped as they come (a replay ends there), and past `max_bytes` of pages the
/// read fails (a hostile or broken Coder cannot make one workspace's history fill memory).
#[derive(Debug, Clone, Copy)]
pub struct HistoryBounds {
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    pub max_bytes: usize,
}

impl Default for HistoryBounds {
    fn default() -> Self {
        HistoryBounds { until: None, max_bytes: MAX_HISTORY_BYTES }
    }
}

/// The most page bytes one workspace's build history may take (`HistoryBounds`): a workspace
/// started and stopped three times a day for a year is about 2,200 builds, a few MB.
pub const MAX_HISTORY_BYTES: usize = 8 << 20;

/// Builds one history request asks for (`workspace_builds`), and the most read for one
/// workspace: started and stopped three times a day, a year is about 2,200 builds.
pub const BUILDS_PAGE: usize = 100;
pub const MAX_BUILDS_READ: usize = 10_000;

/// The room a listing's list is made with when the last listing held `last` workspaces: a
/// sixteenth more, so a fleet that grew a little still fits without a copy.
fn listing_room(last: usize) -> usize {
    last + last / 16 + 16
}

/// A list more than a quarter empty: what a first listing, grown by doubling, usually is, and
/// one whose fleet shrank. One in the room `listing_room` made for it, or a little less, is not.
fn too_roomy<T>(list: &Vec<T>) -> bool {
    list.capacity() > list.len() + list.len() / 4 + 64
}

/// The default largest running-workspace listing (`max_listing_mib`): about 60,000 workspaces.
pub const DEFAULT_MAX_LISTING: usize = 256 << 20;

/// How the client talks to Coder, besides where and as whom.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub outbound: Outbound,
    /// The running-workspace listing may be at most this large (about 4.2 KB per workspace).
    pub max_listing_bytes: usize,
}

impl ClientOptions {
    pub fn new(timeout: Duration, retry: RetryPolicy) -> Self {
        ClientOptions { timeout, retry, outbound: Outbound::default(), max_listing_bytes: DEFAULT_MAX_LISTING }
    }
}

#[derive(Clone)]
pub struct CoderClient {
    http: reqwest::Client,
    base: String,
    token: Arc<TokenSource>,
    retry: RetryPolicy,
    max_listing_bytes: usize,
    /// Routes Coder rate-limited, and until when (from `Retry-After`).
    /// URL paths Coder rate-limited, until when: coderd's limiter counts per user and URL path
    /// (`httprate.KeyByEndpoint`, reference NOTES §2), so one workspace's 429 holds its own path only.
    held: Arc<Mutex<HashMap<String, Instant>>>,
    observer: Option<RequestObserver>,
    /// How many workspaces the latest listing held: the next one's list is made that large (and
    /// a little more) up front (`listing_room`).
    last_listed: Arc<std::sync::atomic::AtomicUsize>,
}

impl fmt::Debug for CoderClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoderClient").field("base", &self.base).field("token", &self.token).finish_non_exhaustive()
    }
}

impl CoderClient {
    pub fn new(base_url: &Url, token: SessionToken, timeout: Duration, retry: RetryPolicy) -> Result<Self, Error> {
        Self::with_options(base_url, TokenSource::fixed(token), ClientOptions::new(timeout, retry))
    }

    pub fn with_options(base_url: &Url, token: TokenSource, options: ClientOptions) -> Result<Self, Error> {
        let http = crate::http::client(options.timeout, Duration::from_secs(5), &options.outbound)?;
        Ok(CoderClient {
            http,
            base: base_url.as_str().trim_end_matches('/').to_string(),
            token: Arc::new(token),
            retry: options.retry,
            max_listing_bytes: options.max_listing_bytes,
            held: Arc::new(Mutex::new(HashMap::new())),
            observer: None,
            last_listed: Arc::default(),
        })
    }

    /// The token requests carry now.
    pub fn token(&self) -> SessionToken {
        self.token.current()
    }

    /// Re-reads the token file; true when a new token took effect (logged as `token_reloaded`).
    pub fn reload_token(&self) -> bool {
        match self.token.reload() {
            Ok(true) => {
                tracing::info!(
                    event = "token_reloaded",
                    key_id = self.token.current().key_id().unwrap_or("?"),
                    "the token file changed; using the new token"
                );
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(event = "token_file_unreadable", error = %e, "cannot re-read the token file; keeping the current token");
                false
            }
        }
    }

    /// Runs `call`; after a 401, re-reads the token file and, if it holds a new token, once more.
    async fn with_fresh_token<T, Fut: Future<Output = Result<T, CoderError>>>(&self, call: impl Fn() -> Fut) -> Result<T, CoderError> {
        match call().await {
            Err(e) if e.kind == ErrorKind::Unauthorized && self.reload_token() => call().await,
            other => other,
        }
    }

    /// The same client making one attempt per call: what the actuator writes and reads with,
    /// so a pass never waits on one workspace's retries (the ledger backs off across passes).
    pub fn without_retries(&self) -> Self {
        CoderClient { retry: RetryPolicy::none(), ..self.clone() }
    }

    pub fn with_observer(mut self, observer: RequestObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// `GET /api/v2/buildinfo` (no auth needed; the token is sent anyway).
    pub async fn buildinfo(&self) -> Result<BuildInfo, CoderError> {
        self.call(Method::GET, "GET /api/v2/buildinfo", "/api/v2/buildinfo".into(), None::<&()>).await
    }

    /// `GET /api/v2/users/me`.
    pub async fn me(&self) -> Result<User, CoderError> {
        self.call(Method::GET, "GET /api/v2/users/{user}", "/api/v2/users/me".into(), None::<&()>).await
    }

    /// `GET /api/v2/users/me/keys/{keyid}`: the token's expiry.
    pub async fn api_key(&self, key_id: &str) -> Result<ApiKey, CoderError> {
        let path = format!("/api/v2/users/me/keys/{}", encode_path(key_id));
        self.call(Method::GET, "GET /api/v2/users/{user}/keys/{keyid}", path, None::<&()>).await
    }

    /// `GET /api/v2/workspaces?q=status:running`: every running workspace in one request
    /// (no `limit` means all; offset paging is unstable while states change).
    ///
    /// The body is parsed as it streams in (10,000 workspaces are about 42 MB of JSON), so only
    /// the fields this service reads are ever held in memory.
    pub async fn running_workspaces(&self) -> Result<Vec<Workspace>, CoderError> {
        self.listing().await.map(|l| l.workspaces)
    }

    /// The running workspaces, with Coder's clock as its `Date` header showed it.
    pub async fn listing(&self) -> Result<Listing, CoderError> {
        const ENDPOINT: &str = "GET /api/v2/workspaces";
        let url = format!("{}/api/v2/workspaces?q=status%3Arunning", self.base);
        self.check_hold(ENDPOINT, "/api/v2/workspaces")?;
        let (resp, clock_offset) = self.with_fresh_token(|| retry(self.retry, || self.list_once(ENDPOINT, &url))).await?;
        Ok(Listing { workspaces: resp.workspaces, clock_offset })
    }

    async fn list_once(&self, endpoint: &'static str, url: &str) -> Attempt<(WorkspacesResponse, Option<chrono::Duration>), CoderError> {
        let sent = chrono::Utc::now();
        let resp = match self.request(Method::GET, url).send().await {
            Ok(r) => r,
            Err(e) => return self.transport_failure(endpoint, &e),
        };
        let clock_offset = clock_offset(resp.headers(), sent, chrono::Utc::now());
        let status = resp.status();
        self.count_request(endpoint, status.as_u16());
        if !status.is_success() {
            return self.status_failure(endpoint, resp).await;
        }
        // Each workspace is parsed as soon as its bytes are in: the listing is never held whole.
        let last = self.last_listed.load(std::sync::atomic::Ordering::Relaxed);
        let mut workspaces = ListedWorkspaces(Vec::with_capacity(listing_room(last)));
        let parsed = read_split(resp, self.max_listing_bytes, &["workspaces"], &mut workspaces)
            .await
            .and_then(|rest| serde_json::from_slice::<WorkspacesResponse>(&rest).map_err(|e| StreamError::Parse(e.to_string())));
        match parsed {
            Ok(list) => {
                // Grown by doubling (a first listing, or a fleet that grew past the room made):
                // up to twice the room it needs, held for the whole pass, so it is copied into
                // one its size. A list in the room made for it stays as it is: the copy holds
                // both lists at once (6.7 MB more at 10,000 workspaces, while they are read).
                if too_roomy(&workspaces.0) {
                    workspaces.0.shrink_to_fit();
                }
                self.last_listed.store(workspaces.0.len(), std::sync::atomic::Ordering::Relaxed);
                Attempt::Done(Ok((WorkspacesResponse { workspaces: workspaces.0, ..list }, clock_offset)))
            }
            Err(StreamError::Body(BodyError::TooLarge { .. })) => Attempt::Done(Err(self.too_large(endpoint))),
            Err(StreamError::Body(e)) => body_failure(endpoint, e),
            Err(StreamError::Parse(e)) => Attempt::Done(Err(unexpected_body(endpoint, e))),
        }
    }

    /// `POST /api/v2/authcheck`: what the token may do (its user's roles and its scope) to
    /// workspaces in some organization (`any_org`): enough to know whether it may act at all.
    pub async fn authcheck(&self, actions: &[&str], resource_type: &str) -> Result<HashMap<String, bool>, CoderError> {
        let checks = actions
            .iter()
            .map(|a| {
                let object = AuthorizationObject { resource_type: resource_type.to_string(), any_org: Some(true), organization_id: None };
                (a.to_string(), AuthorizationCheck { object, action: a.to_string() })
            })
            .collect();
        self.ask_authcheck(AuthorizationRequest { checks }).await
    }

    /// `POST /api/v2/authcheck`, one question per organization: may the token stop workspaces
    /// there? Permissions are per organization (`rbac/roles.go`): an organization admin may stop
    /// its own organization's workspaces, a template admin only reads them. Keyed by organization id.
    pub async fn may_stop_in(&self, organization_ids: &[&str]) -> Result<HashMap<String, bool>, CoderError> {
        let checks = organization_ids
            .iter()
            .map(|org| {
                let object =
                    AuthorizationObject { resource_type: "workspace".into(), any_org: None, organization_id: Some(org.to_string()) };
                (org.to_string(), AuthorizationCheck { object, action: "stop".into() })
            })
            .collect();
        self.ask_authcheck(AuthorizationRequest { checks }).await
    }

    async fn ask_authcheck(&self, body: AuthorizationRequest) -> Result<HashMap<String, bool>, CoderError> {
        self.call(Method::POST, "POST /api/v2/authcheck", "/api/v2/authcheck".into(), Some(&body)).await
    }

    /// `GET /api/v2/workspaces/{id}`: one workspace, its latest build included.
    pub async fn workspace(&self, workspace_id: &str) -> Result<Workspace, CoderError> {
        let path = format!("/api/v2/workspaces/{}", encode_path(workspace_id));
        self.call(Method::GET, "GET /api/v2/workspaces/{workspace}", path, None::<&()>).await
    }

    /// `GET /api/v2/workspaces/{id}?include_deleted=true`: one workspace, also when it was
    /// deleted since (its owner, name and template for a history that outlived it; without the
    /// parameter coderd answers 410, reference NOTES §17).
    pub async fn workspace_including_deleted(&self, workspace_id: &str) -> Result<Workspace, CoderError> {
        let path = format!("/api/v2/workspaces/{}?include_deleted=true", encode_path(workspace_id));
        self.call(Method::GET, "GET /api/v2/workspaces/{workspace}", path, None::<&()>).await
    }

    /// `GET /api/v2/workspaces/{id}/builds?since=..&limit=..&offset=..`: every build created after
    /// `since` (sent to the microsecond, as coderd stores times), newest first, page by page
    /// (`BUILDS_PAGE`), at most `MAX_BUILDS_READ` (a build met twice across pages, when one was
    /// created meanwhile, is kept once), within `bounds`. Answers for a deleted workspace too.
    pub async fn workspace_builds(
        &self,
        workspace_id: &str,
        since: chrono::DateTime<chrono::Utc>,
        bounds: HistoryBounds,
    ) -> Result<Vec<WorkspaceBuild>, CoderError> {
        self.builds_since(workspace_id, since, bounds).await.map(|(builds, _)| builds)
    }

    /// `workspace_builds`, with how many builds Coder answered (those past `bounds.until` too).
    async fn builds_since(
        &self,
        workspace_id: &str,
        since: chrono::DateTime<chrono::Utc>,
        bounds: HistoryBounds,
    ) -> Result<(Vec<WorkspaceBuild>, usize), CoderError> {
        const ENDPOINT: &str = "GET /api/v2/workspaces/{workspace}/builds";
        let since = since.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut builds: Vec<WorkspaceBuild> = Vec::new();
        let mut ids: std::collections::HashSet<String> = std::collections::HashSet::new();
        let (mut received, mut bytes) = (0usize, 0usize);
        loop {
            let path = format!(
                "/api/v2/workspaces/{}/builds?since={}&limit={BUILDS_PAGE}&offset={received}",
                encode_path(workspace_id),
                encode_path(&since),
            );
            let (page, size): (Vec<WorkspaceBuild>, usize) = self.get_sized(ENDPOINT, path).await?;
            bytes += size;
            if bytes > bounds.max_bytes {
                let message = format!(
                    "its build history is larger than {} from the window's start: not read (a Coder that answers this is not one to replay)",
                    crate::http::bytes_human(bounds.max_bytes)
                );
                return Err(CoderError { kind: ErrorKind::Decode, endpoint: ENDPOINT, message });
            }
            let full = page.len() == BUILDS_PAGE;
            received += page.len();
            let mut new = 0;
            for b in page {
                if ids.insert(b.id.to_string()) {
                    new += 1;
                    // Past the window's end a build changes nothing a replay reads.
                    if bounds.until.is_none_or(|u| b.created_at.is_none_or(|c| c <= u)) {
                        builds.push(b);
                    }
                }
            }
            if !full || new == 0 || received >= MAX_BUILDS_READ {
                builds.truncate(MAX_BUILDS_READ);
                return Ok((builds, received));
            }
        }
    }

    /// The builds that make up a workspace's history from `start` on: every build created after
    /// it (`workspace_builds`) and the one current at `start`, read as the next older ones in
    /// coderd's newest-first order (`limit=2&offset=<after>`, two in case one build was created
    /// between the calls). Oldest first.
    pub async fn workspace_history(
        &self,
        workspace_id: &str,
        start: chrono::DateTime<chrono::Utc>,
        bounds: HistoryBounds,
    ) -> Result<Vec<WorkspaceBuild>, CoderError> {
        let (mut builds, received) = self.builds_since(workspace_id, start, bounds).await?;
        if received < MAX_BUILDS_READ {
            // Past every build after `start` in coderd's newest-first order (those dropped past
            // the window's end too): the one current at `start` and its predecessor.
            let after = received;
            let path = format!("/api/v2/workspaces/{}/builds?limit=2&offset={after}", encode_path(workspace_id));
            let older: Vec<WorkspaceBuild> = self.call(Method::GET, "GET /api/v2/workspaces/{workspace}/builds", path, None::<&()>).await?;
            if let Some(current) = older.into_iter().find(|b| b.created_at.is_some_and(|c| c <= start)) {
                if builds.iter().all(|b| b.id != current.id) {
                    builds.push(current);
                }
            }
        }
        builds.sort_by_key(|b| b.created_at);
        Ok(builds)
    }

    /// `GET /api/v2/templates/{id}`: the template's schedule (`activity_bump_ms`, and on Coder
    /// versions with the autostop reminder, `time_til_autostop_notify_ms`; reference NOTES §18).
    pub async fn template_schedule(&self, template_id: &str) -> Result<TemplateSchedule, CoderError> {
        let path = format!("/api/v2/templates/{}", encode_path(template_id));
        self.call(Method::GET, "GET /api/v2/templates/{template}", path, None::<&()>).await
    }

    /// `GET /api/v2/workspacebuilds/{id}/parameters`: the values the build was made with (a new
    /// build copies the previous build's; reference NOTES §19). Readable with read on the
    /// workspace; 404 for a build that does not exist or cannot be read.
    pub async fn build_parameters(&self, build_id: &str) -> Result<Vec<BuildParameter>, CoderError> {
        let path = format!("/api/v2/workspacebuilds/{}/parameters", encode_path(build_id));
        self.call(Method::GET, "GET /api/v2/workspacebuilds/{workspacebuild}/parameters", path, None::<&()>).await
    }

    /// `GET /api/v2/workspacebuilds/{id}`: follow a build until its job is final.
    pub async fn workspace_build(&self, build_id: &str) -> Result<WorkspaceBuild, CoderError> {
        let path = format!("/api/v2/workspacebuilds/{}", encode_path(build_id));
        self.call(Method::GET, "GET /api/v2/workspacebuilds/{workspacebuild}", path, None::<&()>).await
    }

    /// `GET /api/v2/organizations/{org}/provisionerdaemons?tags=<json>`: the organization's
    /// provisioner daemons whose tags contain `tags`, seen within 90 s (coderd omits older ones
    /// without `offline=true`; reference NOTES §16). Needs read on the organization's provisioner
    /// jobs (owners, template admins), else 404.
    pub async fn provisioner_daemons(&self, organization_id: &str, tags: &JobTags) -> Result<Vec<ProvisionerDaemon>, CoderError> {
        let tags = serde_json::to_string(tags).unwrap_or_else(|_| "{}".into());
        let path = format!("/api/v2/organizations/{}/provisionerdaemons?tags={}", encode_path(organization_id), encode_path(&tags));
        self.call(Method::GET, "GET /api/v2/organizations/{organization}/provisionerdaemons", path, None::<&()>).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        endpoint: &'static str,
        path_and_query: String,
        body: Option<&impl Serialize>,
    ) -> Result<T, CoderError> {
        self.call_with(self.retry, method, endpoint, path_and_query, body).await
    }

    async fn call_with<T: DeserializeOwned>(
        &self,
        policy: RetryPolicy,
        method: Method,
        endpoint: &'static str,
        path_and_query: String,
        body: Option<&impl Serialize>,
    ) -> Result<T, CoderError> {
        self.check_hold(endpoint, path_and_query.split('?').next().unwrap_or_default())?;
        let url = format!("{}{}", self.base, path_and_query);
        let body = match body.map(serde_json::to_vec).transpose() {
            Ok(b) => b,
            Err(e) => return Err(CoderError { kind: ErrorKind::Decode, endpoint, message: format!("cannot encode the request: {e}") }),
        };
        self.with_fresh_token(|| retry(policy, || self.try_once(method.clone(), endpoint, &url, body.as_deref()))).await
    }

    /// A request with the token (in its header only: never in a URL).
    fn request(&self, method: Method, url: &str) -> reqwest::RequestBuilder {
        self.http.request(method, url).header(TOKEN_HEADER, self.token.current().expose()).header("Accept", "application/json")
    }

    /// Fails at once while Coder's `Retry-After` for this path has not passed.
    fn check_hold(&self, endpoint: &'static str, path: &str) -> Result<(), CoderError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match held.get(path) {
            Some(until) if *until > Instant::now() => {
                let left = until.saturating_duration_since(Instant::now()).as_secs() + 1;
                let message = format!("rate limited by Coder; asking again in {left}s (its Retry-After)");
                Err(CoderError { kind: ErrorKind::RateLimited, endpoint, message })
            }
            Some(_) => {
                held.remove(path);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// How long until every path Coder rate-limited may be asked again (zero: none is held).
    /// `backtest` waits this long and asks again; a pass never waits.
    pub fn hold_left(&self) -> Duration {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        held.values().map(|until| until.saturating_duration_since(now)).max().unwrap_or_default()
    }

    fn too_large(&self, endpoint: &'static str) -> CoderError {
        let limit = crate::http::bytes_human(self.max_listing_bytes);
        let message = format!(
            "the workspace listing is larger than max_listing_mib ({limit}); raise it in the config file if the fleet is that large"
        );
        CoderError { kind: ErrorKind::Decode, endpoint, message }
    }

    fn transport_failure<T>(&self, endpoint: &'static str, e: &reqwest::Error) -> Attempt<T, CoderError> {
        self.count_request(endpoint, 0);
        let what = if e.is_timeout() { "timed out" } else { "no response" };
        // reqwest's error text names the URL, which never holds the token (header only).
        let error = CoderError { kind: ErrorKind::Transport, endpoint, message: format!("{what}: {}", error_chain(e)) };
        Attempt::Retry { error, after: None }
    }

    /// A non-2xx answer: 5xx are retried, a 429 holds the route until its `Retry-After`, a
    /// redirect is refused (and names only the target's host), others are final.
    async fn status_failure<T>(&self, endpoint: &'static str, resp: reqwest::Response) -> Attempt<T, CoderError> {
        let status = resp.status();
        let path = resp.url().path().to_string();
        if let Some(message) = refused_redirect(&resp) {
            return Attempt::Done(Err(CoderError { kind: ErrorKind::Status(status.as_u16()), endpoint, message }));
        }
        let after = retry_after(resp.headers());
        let body = read_limited(resp, MAX_ERROR_BODY).await.unwrap_or_default();
        let error = CoderError { kind: error_kind(status), endpoint, message: describe(status, &body) };
        match status.as_u16() {
            429 => {
                let hold = after.unwrap_or(DEFAULT_RATE_LIMIT_HOLD);
                let now = Instant::now();
                let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                // Expired holds go: the map holds only paths Coder limits now.
                held.retain(|_, until| *until > now);
                held.insert(path, now + hold);
                drop(held);
                tracing::warn!(
                    event = "rate_limited",
                    endpoint,
                    retry_after_seconds = hold.as_secs(),
                    "Coder rate-limited this path; the next pass after its Retry-After asks again"
                );
                Attempt::Done(Err(error))
            }
            500 | 502 | 503 | 504 => Attempt::Retry { error, after },
            _ => Attempt::Done(Err(error)),
        }
    }

    async fn try_once<T: DeserializeOwned>(
        &self,
        method: Method,
        endpoint: &'static str,
        url: &str,
        body: Option<&[u8]>,
    ) -> Attempt<T, CoderError> {
        match self.try_once_sized(method, endpoint, url, body).await {
            Attempt::Done(r) => Attempt::Done(r.map(|(t, _)| t)),
            Attempt::Retry { error, after } => Attempt::Retry { error, after },
        }
    }

    /// A `GET` of `path`, with the size of the body it was read from (for a byte budget).
    async fn get_sized<T: DeserializeOwned>(&self, endpoint: &'static str, path: String) -> Result<(T, usize), CoderError> {
        self.check_hold(endpoint, path.split('?').next().unwrap_or_default())?;
        let url = format!("{}{}", self.base, path);
        self.with_fresh_token(|| retry(self.retry, || self.try_once_sized(Method::GET, endpoint, &url, None))).await
    }

    async fn try_once_sized<T: DeserializeOwned>(
        &self,
        method: Method,
        endpoint: &'static str,
        url: &str,
        body: Option<&[u8]>,
    ) -> Attempt<(T, usize), CoderError> {
        let mut req = self.request(method, url);
        if let Some(body) = body {
            req = req.header("Content-Type", "application/json").body(body.to_vec());
        }
        let resp = match req.send().await {
            Ok(resp) => resp,
            Err(e) => return self.transport_failure(endpoint, &e),
        };
        let status = resp.status();
        self.count_request(endpoint, status.as_u16());
        if !status.is_success() {
            return self.status_failure(endpoint, resp).await;
        }
        let bytes = match read_limited(resp, MAX_OBJECT_BODY).await {
            Ok(b) => b,
            Err(e) => return body_failure(endpoint, e),
        };
        let size = bytes.len();
        let bytes: &[u8] = if status == StatusCode::NO_CONTENT || bytes.is_empty() { b"null" } else { &bytes };
        Attempt::Done(serde_json::from_slice(bytes).map(|t| (t, size)).map_err(|e| unexpected_body(endpoint, e)))
    }

    fn count_request(&self, endpoint: &'static str, status: u16) {
        if let Some(observer) = &self.observer {
            observer(endpoint, status);
        }
    }
}

/// The connection broke while the body was read (worth another try), or it was too large
/// (final).
fn body_failure<T>(endpoint: &'static str, e: BodyError) -> Attempt<T, CoderError> {
    match e {
        BodyError::Transport(_) => {
            Attempt::Retry { error: CoderError { kind: ErrorKind::Transport, endpoint, message: e.to_string() }, after: None }
        }
        BodyError::TooLarge { .. } | BodyError::OverBudget { .. } => {
            Attempt::Done(Err(CoderError { kind: ErrorKind::Decode, endpoint, message: e.to_string() }))
        }
    }
}

/// A 2xx whose body is not what Coder sends: final.
fn unexpected_body(endpoint: &'static str, e: impl fmt::Display) -> CoderError {
    let message = format!("unexpected response body ({e}); is --coder-url a Coder deployment of v2.x?");
    CoderError { kind: ErrorKind::Decode, endpoint, message }
}

fn error_kind(status: StatusCode) -> ErrorKind {
    match status.as_u16() {
        401 => ErrorKind::Unauthorized,
        403 | 404 => ErrorKind::NoPermission,
        409 => ErrorKind::Conflict,
        429 => ErrorKind::RateLimited,
        other => ErrorKind::Status(other),
    }
}

/// "HTTP 409: A workspace build is already active. (detail)" from a `codersdk.Response` body, or
/// the first line of a plain-text body (the 428 from the rate-limit bypass is plain text).
fn describe(status: StatusCode, body: &[u8]) -> String {
    let parsed: Option<CoderResponse> = serde_json::from_slice(body).ok();
    let text = match parsed {
        Some(r) if !r.message.is_empty() => {
            let mut s = r.message;
            if !r.detail.is_empty() && r.detail != s {
                s.push_str(": ");
                s.push_str(&r.detail);
            }
            for v in r.validations {
                s.push_str(&format!(" [{}: {}]", v.field, v.detail));
            }
            s
        }
        _ => String::from_utf8_lossy(body).lines().next().unwrap_or("").chars().take(200).collect(),
    };
    format!("HTTP {}: {}", status.as_u16(), if text.is_empty() { "(empty body)" } else { &text })
}

/// Coder's clock minus ours, from the response's `Date` header against the midpoint of the
/// request (the header has 1 s resolution; the estimate is good to about a second plus half
/// the round trip).
fn clock_offset(
    headers: &reqwest::header::HeaderMap,
    sent: chrono::DateTime<chrono::Utc>,
    received: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::Duration> {
    let date = headers.get(reqwest::header::DATE)?.to_str().ok()?;
    let coder = chrono::DateTime::parse_from_rfc2822(date).ok()?.with_timezone(&chrono::Utc);
    let midpoint = sent + (received - sent) / 2;
    Some(coder - midpoint)
}

/// `Retry-After` in seconds, clamped to `MAX_RETRY_AFTER` (a huge value must not overflow a
/// deadline). The HTTP-date form is not used by Coder and is ignored.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

/// Percent-encodes a path segment (ids are UUIDs, but never trust input to be one).
fn encode_path(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
