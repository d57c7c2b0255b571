//! wiremock tests of every Coder call: the request's shape (method, path, query, headers, JSON
//! body) and each outcome (success, 409, 401, 403, 404, 429 with Retry-After, a 500 burst then
//! success, a timeout). Response bodies are the captured, spec-checked fixtures.

use std::time::{Duration, Instant};

use coder_gpu_reclaimer::coder::actions::CoderActions;
use coder_gpu_reclaimer::coder::types::{AgentLifecycle, AgentStatus, BuildReason, JobStatus, Transition};
use coder_gpu_reclaimer::coder::{CoderClient, ErrorKind, SessionToken, StopOutcome};
use coder_gpu_reclaimer::retry::RetryPolicy;
use serde_json::json;
use wiremock::matchers::{body_json, header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::common::{WS_ID, fixture_json};

const TOKEN: &str = "a1b2c3d4e5-5up3rs3cr3tt0k3n";

fn quick_retry() -> RetryPolicy {
    RetryPolicy { initial: Duration::from_millis(10), max_interval: Duration::from_millis(50), max_elapsed: Duration::from_secs(5) }
}

/// The writes, through the same client.
fn actions(server: &MockServer, retry: RetryPolicy) -> CoderActions {
    CoderActions::new(client(server, retry))
}

fn client(server: &MockServer, retry: RetryPolicy) -> CoderClient {
    CoderClient::new(&crate::common::url(&server.uri()), SessionToken::new(TOKEN).unwrap(), Duration::from_millis(800), retry).unwrap()
}

fn coder_error(status: u16, message: &str, detail: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({ "message": message, "detail": detail }))
}

#[tokio::test]
async fn lists_running_workspaces_in_one_request_and_parses_real_shapes() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v2/workspaces"))
        .and(query_param("q", "status:running"))
        .and(header("Coder-Session-Token", TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(fixture_json("coder/workspaces_running.json")))
        .expect(1)
        .mount(&server)
        .await;
    let list = client(&server, RetryPolicy::none()).running_workspaces().await.unwrap();
    assert_eq!(list.len(), 2);
    let req = &server.received_requests().await.unwrap()[0];
    assert!(req.url.query_pairs().all(|(k, _)| k == "q"), "no limit/offset: limit 0 means all ({})", req.url);
    assert!(req.headers.get("X-Coder-Bypass-Ratelimit").is_none(), "no bypass before the owner check");
    let alice = list.iter().find(|w| w.name == "alice-gpu").unwrap();
    assert_eq!(alice.latest_build.transition, Transition::Start);
    assert_eq!(alice.latest_build.job.status, JobStatus::Succeeded);
    assert_eq!(alice.ttl_ms, Some(28_800_000));
    assert!(alice.latest_build.deadline.is_some());
    let agent = alice.latest_build.agents().next().unwrap();
    assert_eq!((agent.status, agent.lifecycle_state), (AgentStatus::Connected, AgentLifecycle::Ready));
    let bob = list.iter().find(|w| w.name == "bob-gpu").unwrap();
    assert_eq!(bob.ttl_ms, None, "ttl_ms is omitted when autostop is off");
    assert_eq!(bob.latest_build.deadline, None, "deadline: null means manual shutdown");
    let agent = bob.latest_build.agents().next().unwrap();
    assert_eq!((agent.status, agent.first_connected_at), (AgentStatus::Timeout, None));
}

/// The listing's list is made in the room the last listing needed: a steady pass's list is not
/// copied into a smaller one (both would be held at once); a first listing, grown by doubling,
/// is copied into one its size.
#[tokio::test]
async fn the_second_listing_is_read_into_the_room_the_first_one_needed() {
    let mut listing = fixture_json("coder/workspaces_running.json");
    let one = listing["workspaces"][0].clone();
    listing["workspaces"] = (0..300)
        .map(|i| {
            let mut ws = one.clone();
            ws["id"] = format!("00000000-0000-4000-8000-{i:012}").into();
            ws
        })
        .collect();
    listing["count"] = 300.into();
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v2/workspaces"))
        .respond_with(ResponseTemplate::new(200).set_body_json(listing))
        .expect(2)
        .mount(&server)
        .await;
    let coder = client(&server, RetryPolicy::none());
    let first = coder.running_workspaces().await.unwrap();
    assert_eq!((first.len(), first.capacity()), (300, 300), "grown by doubling to 512, then copied into its size");
    let second = coder.running_workspaces().await.unwrap();
    assert_eq!(second.len(), 300);
    assert!(second.capacity() > 300 && second.capacity() < 400, "kept in the room made up front: {}", second.capacity());
}

#[tokio::test]
async fn unknown_enum_values_parse_instead_of_failing_the_listing() {
    let ws: coder_gpu_reclaimer::coder::types::Workspace =
        serde_json::from_value(fixture_json("coder/workspace_unknown_enums.json")).unwrap();
    assert_eq!(ws.latest_build.reason, BuildReason::FailedStop);
    assert_eq!(ws.latest_build.agents().next().unwrap().lifecycle_state, AgentLifecycle::Unknown);
    let mut v = fixture_json("coder/workspace_unknown_enums.json");
    v["latest_build"]["status"] = "hibernated".into();
    v["latest_build"]["reason"] = "task_auto_pause".into();
    let ws: coder_gpu_reclaimer::coder::types::Workspace = serde_json::from_value(v).unwrap();
    assert_eq!(ws.latest_build.reason, BuildReason::Unknown);
    assert_eq!(ws.latest_build.status.as_str(), "unknown");
}

/// A Coder that answers buildinfo and `users/me` (with the token) from fixtures, and authcheck
/// with `may_stop` for the stop check.
async fn coder_with_user(user_fixture: &str, may_stop: bool) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/v2/authcheck"))
        .and(header("Coder-Session-Token", TOKEN))
        .and(body_json(json!({"checks": {
            "read": {"object": {"resource_type": "workspace", "any_org": true}, "action": "read"},
            "stop": {"object": {"resource_type": "workspace", "any_org": true}, "action": "stop"}
        }})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"read": true, "stop": may_stop})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v2/buildinfo"))
        .respond_with(ResponseTemplate::new(200).set_body_json(fixture_json("coder/buildinfo.json")))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v2/users/me"))
        .and(header("Coder-Session-Token", TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(fixture_json(user_fixture)))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn start_up_calls_never_send_the_rate_limit_bypass() {
    // Coder answers a non-owner's bypass header with 428 on every request, and one listing a
    // minute never comes near the limit: the header is never sent.
    let server = coder_with_user("coder/user_owner.json", true).await;
    let key = fixture_json("coder/api_key.json");
    Mock::given(method("GET"))
        .and(path("/api/v2/users/me/keys/a1b2c3d4e5"))
        .respond_with(ResponseTemplate::new(200).set_body_json(key.clone()))
        .expect(1)
        .mount(&server)
        .await;
    let c = client(&server, RetryPolicy::none());
    let id = coder_gpu_reclaimer::coder::identity::connect(&c).await.unwrap();
    assert_eq!(id.permissions, coder_gpu_reclaimer::coder::identity::Permissions { read: true, stop: true });
    assert_eq!(id.coder_version, "v2.34.3+4653f32");
    assert_eq!(id.username, "admin");
    assert_eq!(
        id.token_expires_at.unwrap().to_rfc3339(),
        chrono::DateTime::parse_from_rfc3339(key["expires_at"].as_str().unwrap()).unwrap().to_rfc3339()
    );
    let reqs = server.received_requests().await.unwrap();
    assert!(reqs.len() >= 3 && reqs.iter().all(|r| r.headers.get("X-Coder-Bypass-Ratelimit").is_none()));
}

#[tokio::test]
async fn a_token_that_may_not_stop_is_refused_in_enforce_mode_only() {
    use coder_gpu_reclaimer::pass::actuator::require_permissions;
    use coder_gpu_reclaimer::pass::mode::Mode;
    // authcheck, not the role name, decides: a member, or an owner's token with a narrow --scope.
    let server = coder_with_user("coder/user_owner.json", false).await;
    let c = client(&server, RetryPolicy::none());
    let id = coder_gpu_reclaimer::coder::identity::connect(&c).await.unwrap();
    let err = require_permissions(Mode::Enforce, &id).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.message().contains("may not stop workspaces") && err.message().contains("coder tokens create"), "{err}");
    assert!(require_permissions(Mode::Observe, &id).is_ok(), "observe mode warns and goes on");
}

#[tokio::test]
async fn stop_sends_exactly_a_stop_transition_and_accepts_201() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format!("/api/v2/workspaces/{WS_ID}/builds")))
        .and(header("Coder-Session-Token", TOKEN))
        .and(header("Content-Type", "application/json"))
        .and(body_json(json!({"transition": "stop"})))
        .respond_with(ResponseTemplate::new(201).set_body_json(fixture_json("coder/workspace_build_stop_queued.json")))
        .expect(1)
        .mount(&server)
        .await;
    match actions(&server, RetryPolicy::none()).stop_workspace(WS_ID).await.unwrap() {
        StopOutcome::Queued(b) => {
            assert_eq!(b.transition, Transition::Stop);
            assert_eq!(b.job.status, JobStatus::Pending);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_stop_post_is_never_retried_blindly() {
    // A 503 (or a timeout) may come after Coder created the build; a second POST would queue a
    // second stop. The actuator reads the latest build instead.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({"message": "Service unavailable."})))
        .expect(1)
        .mount(&server)
        .await;
    let err = actions(&server, quick_retry()).stop_workspace(WS_ID).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Status(503));
}

#[tokio::test]
async fn a_409_is_an_outcome_not_an_error() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(409).set_body_json(fixture_json("coder/error_409_build_active.json")))
        .expect(1)
        .mount(&server)
        .await;
    let out = actions(&server, quick_retry()).stop_workspace(WS_ID).await.unwrap();
    assert_eq!(out, StopOutcome::BuildActive("HTTP 409: A workspace build is already active.".into()));
}

#[tokio::test]
async fn errors_are_classified_carry_coders_words_and_never_retry_4xx() {
    let cases = [
        (
            401,
            ResponseTemplate::new(401).set_body_json(fixture_json("coder/error_401.json")),
            ErrorKind::Unauthorized,
            "signed out or your session has expired",
        ),
        (
            403,
            coder_error(403, "You do not have permission to stop this workspace.", ""),
            ErrorKind::NoPermission,
            "You do not have permission",
        ),
        (
            404,
            coder_error(404, "Resource not found or you do not have access to this resource", ""),
            ErrorKind::NoPermission,
            "Resource not found",
        ),
    ];
    for (status, resp, kind, words) in cases {
        let server = MockServer::start().await;
        Mock::given(method("POST")).respond_with(resp).expect(1).mount(&server).await;
        let err = actions(&server, quick_retry()).stop_workspace(WS_ID).await.unwrap_err();
        assert_eq!(err.kind, kind, "{status}");
        let text = err.to_string();
        assert!(text.contains(words) && text.contains(&format!("HTTP {status}")), "{text}");
        assert!(!text.contains("5up3rs3cr3t"), "the token leaked: {text}");
    }
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(401).set_body_json(fixture_json("coder/error_401.json")))
        .mount(&server)
        .await;
    let err = client(&server, quick_retry()).me().await.unwrap_err();
    assert!(err.to_string().contains("expired or revoked: create a new one"), "{err}");
}

#[tokio::test]
async fn a_429_holds_the_route_until_retry_after_then_asks_again() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .set_body_json(json!({"message": "You've been rate limited for sending more than 512 requests in 1m0s."})),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(fixture_json("coder/workspaces_running.json")))
        .mount(&server)
        .await;
    let c = client(&server, quick_retry());
    let started = Instant::now();
    let first = c.running_workspaces().await.unwrap_err();
    assert_eq!(first.kind, ErrorKind::RateLimited);
    assert!(started.elapsed() < Duration::from_millis(900), "no sleeping inside the call ({:?})", started.elapsed());
    let held = c.running_workspaces().await.unwrap_err();
    assert!(held.message.contains("rate limited by Coder; asking again in"), "{held}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1, "no request while the route is held");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(c.running_workspaces().await.unwrap().len(), 2, "asked again after Retry-After");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

/// coderd's limiter counts per user and URL path (`httprate.KeyByEndpoint`, reference NOTES §2):
/// one workspace's 429 holds that workspace's path, not the route of every workspace.
#[tokio::test]
async fn a_429_holds_its_own_path_only() {
    let server = MockServer::start().await;
    let a = "a0000000-0000-4000-8000-000000000001";
    let b = "b0000000-0000-4000-8000-000000000002";
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspacebuilds/{a}/parameters")))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "60").set_body_json(json!({"message": "rate limited"})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspacebuilds/{b}/parameters")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([{"name": "gpu_count", "value": "1"}])))
        .mount(&server)
        .await;
    let c = client(&server, quick_retry());
    assert_eq!(c.build_parameters(a).await.unwrap_err().kind, ErrorKind::RateLimited);
    assert_eq!(c.build_parameters(b).await.unwrap().len(), 1, "another path is not held");
    assert_eq!(c.build_parameters(a).await.unwrap_err().kind, ErrorKind::RateLimited, "its own is");
    assert_eq!(server.received_requests().await.unwrap().len(), 2, "no request on the held path");
    let left = c.hold_left();
    assert!(left > Duration::from_secs(58) && left <= Duration::from_secs(60), "{left:?}");
}

#[tokio::test]
async fn a_5xx_burst_is_retried_until_success() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({"message": "Internal error fetching workspaces."})))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(503).set_body_string("upstream connect error"))
        .up_to_n_times(1)
        .with_priority(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(fixture_json("coder/workspaces_running.json")))
        .with_priority(3)
        .mount(&server)
        .await;
    assert_eq!(client(&server, quick_retry()).running_workspaces().await.unwrap().len(), 2);
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}

#[tokio::test]
async fn a_timeout_gives_up_within_the_retry_budget() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(5))).mount(&server).await;
    let budget =
        RetryPolicy { initial: Duration::from_millis(10), max_interval: Duration::from_millis(20), max_elapsed: Duration::from_secs(2) };
    let started = Instant::now();
    let err = client(&server, budget).running_workspaces().await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transport);
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(4), "bounded: {:?}", started.elapsed());
}

#[tokio::test]
async fn follows_a_build_and_sets_a_ttl() {
    let server = MockServer::start().await;
    let build = fixture_json("coder/workspace_build_stop_succeeded.json");
    let id = build["id"].as_str().unwrap().to_string();
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspacebuilds/{id}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(build))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path(format!("/api/v2/workspaces/{WS_ID}/ttl")))
        .and(body_json(json!({"ttl_ms": 28_800_000})))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(body_json(json!({"ttl_ms": 1})))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({"message": "Error updating workspace time until shutdown.", "validations": [{"field": "ttl_ms", "detail": "time until shutdown must be at least one minute"}]})))
        .mount(&server)
        .await;
    let c = actions(&server, RetryPolicy::none());
    let b = c.workspace_build(&id).await.unwrap();
    assert_eq!((b.transition, b.job.status), (Transition::Stop, JobStatus::Succeeded));
    c.set_ttl(WS_ID, Some(28_800_000)).await.unwrap();
    let err = c.set_ttl(WS_ID, Some(1)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Status(400));
    assert!(err.to_string().contains("[ttl_ms: time until shutdown must be at least one minute]"), "{err}");
}

#[test]
fn the_client_debug_output_hides_the_token() {
    let c = CoderClient::new(
        &crate::common::url("https://coder.example.com"),
        SessionToken::new(TOKEN).unwrap(),
        Duration::from_secs(1),
        RetryPolicy::none(),
    )
    .unwrap();
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("5up3rs3cr3t") && dbg.contains("redacted"), "{dbg}");
}

/// `PUT .../extend`: the deadline in RFC 3339 with the token header; 200 is done, Coder's 400 and
/// 409 (reference NOTES §16) are final, with Coder's message.
#[tokio::test]
async fn extends_a_deadline_and_reads_coders_refusals() {
    let server = MockServer::start().await;
    let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&chrono::Utc);
    Mock::given(method("PUT"))
        .and(path(format!("/api/v2/workspaces/{WS_ID}/extend")))
        .and(header("Coder-Session-Token", TOKEN))
        .and(body_json(json!({"deadline": "2026-12-01T22:00:00Z"})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"message": "Deadline updated to 2026-12-01T22:00:00Z."})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(body_json(json!({"deadline": "2026-12-09T22:00:00Z"})))
        .respond_with(coder_error(400, "Cannot extend workspace beyond max deadline.", ""))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(body_json(json!({"deadline": "2026-12-02T22:00:00Z"})))
        .respond_with(coder_error(409, "Workspace shutdown is manual.", ""))
        .expect(1)
        .mount(&server)
        .await;
    let c = actions(&server, quick_retry());
    c.extend_deadline(WS_ID, at("2026-12-01T22:00:00Z")).await.unwrap();
    let err = c.extend_deadline(WS_ID, at("2026-12-09T22:00:00Z")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Status(400));
    assert!(err.to_string().contains("Cannot extend workspace beyond max deadline."), "{err}");
    let err = c.extend_deadline(WS_ID, at("2026-12-02T22:00:00Z")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Conflict);
    assert!(err.to_string().contains("Workspace shutdown is manual."), "{err}");
}

/// Asking which provisioners answer for a job's tags: the query parameter the spec names (`tags`
/// as JSON). The service never cancels a build (reference NOTES §18): no PATCH is sent.
#[tokio::test]
async fn lists_provisioners_by_tags() {
    let server = MockServer::start().await;
    Mock::given(method("PATCH")).respond_with(ResponseTemplate::new(500)).expect(0).mount(&server).await;
    let org = "42638e23-9859-4dec-8568-7bc6436fa29d";
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/organizations/{org}/provisionerdaemons")))
        .and(query_param("tags", r#"{"gpu":"true","owner":"","scope":"organization"}"#))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([{
            "id": "5c1a0e1e-6a4f-4f7e-9c1d-2b3a4c5d6e7f", "name": "gpu-provisioner", "last_seen_at": "2026-12-01T20:59:30Z",
            "status": "idle", "tags": {"gpu": "true", "owner": "", "scope": "organization"}, "organization_id": org,
            "provisioners": ["terraform"], "version": "v2.34.3", "api_version": "1.9", "created_at": "2026-11-01T00:00:00Z"
        }])))
        .mount(&server)
        .await;
    let c = actions(&server, RetryPolicy::none());
    let tags = coder_gpu_reclaimer::coder::types::JobTags::from_pairs([("gpu", "true"), ("owner", ""), ("scope", "organization")]);
    let daemons = c.provisioner_daemons(org, &tags).await.unwrap();
    assert_eq!((daemons.len(), daemons[0].tags.get("gpu").map(String::as_str)), (1, Some("true")));
}

/// Build history: `since` in RFC 3339 (to the microsecond, `Z`), pages of `BUILDS_PAGE` by `offset`
/// until a short page, and a build seen on two pages (one was created meanwhile) kept once.
#[tokio::test]
async fn build_history_is_read_page_by_page_and_each_build_once() {
    use coder_gpu_reclaimer::coder::BUILDS_PAGE;
    let server = MockServer::start().await;
    let build = |n: usize| {
        let mut b = fixture_json("coder/workspace_build_stop_queued.json");
        b["id"] = json!(format!("11111111-0000-4000-8000-{n:012}"));
        b
    };
    let history = format!("/api/v2/workspaces/{WS_ID}/builds");
    let first: Vec<_> = (0..BUILDS_PAGE).map(build).collect();
    // The second page starts with the first page's last build: a new one pushed it along.
    let second: Vec<_> = (BUILDS_PAGE - 1..BUILDS_PAGE + 3).map(build).collect();
    for (offset, page) in [("0", first), ("100", second)] {
        Mock::given(method("GET"))
            .and(path(history.as_str()))
            .and(query_param("since", "2026-11-25T10:00:00.250000Z"))
            .and(query_param("limit", "100"))
            .and(query_param("offset", offset))
            .respond_with(ResponseTemplate::new(200).set_body_json(page))
            .expect(1)
            .mount(&server)
            .await;
    }
    let since = chrono::DateTime::parse_from_rfc3339("2026-11-25T10:00:00.250+00:00").unwrap().with_timezone(&chrono::Utc);
    let builds = client(&server, RetryPolicy::none()).workspace_builds(WS_ID, since, Default::default()).await.unwrap();
    assert_eq!(builds.len(), BUILDS_PAGE + 3);
    assert_eq!(builds.last().unwrap().id, format!("11111111-0000-4000-8000-{:012}", BUILDS_PAGE + 2));
    let mut ids: Vec<&str> = builds.iter().map(|b| b.id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), builds.len(), "each build once");
}

/// A workspace deleted since its history: asked with `include_deleted=true` (else coderd says 410).
#[tokio::test]
async fn a_deleted_workspace_is_read_with_include_deleted() {
    let server = MockServer::start().await;
    let mut ws = fixture_json("coder/workspaces_running.json")["workspaces"][0].clone();
    ws["id"] = json!(WS_ID);
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspaces/{WS_ID}")))
        .and(query_param("include_deleted", "true"))
        .respond_with(ResponseTemplate::new(200).set_body_json(ws))
        .expect(1)
        .mount(&server)
        .await;
    let got = client(&server, RetryPolicy::none()).workspace_including_deleted(WS_ID).await.unwrap();
    assert_eq!(got.id, WS_ID);
}

/// The actuator's client (`without_retries`) makes one attempt per call, whatever the client it
/// comes from retries: a `PUT /extend` Coder answers 500 (a token without `update`, reference
/// NOTES §16) is asked once this pass, and again only in a later one (the ledger's back-off), so
/// one workspace never holds a pass up. The listing's client still retries.
#[tokio::test]
async fn the_actuators_client_makes_one_attempt_per_call() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path(format!("/api/v2/workspaces/{WS_ID}/extend")))
        .respond_with(coder_error(500, "Failed to extend workspace deadline.", ""))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspaces/{WS_ID}")))
        .respond_with(coder_error(503, "unavailable", ""))
        .mount(&server)
        .await;
    let gets = || async { server.received_requests().await.unwrap().iter().filter(|r| r.method.as_str() == "GET").count() };
    let retrying = client(&server, RetryPolicy { max_elapsed: Duration::from_millis(300), ..quick_retry() });
    let once = CoderActions::new(retrying.without_retries());
    let deadline = chrono::DateTime::parse_from_rfc3339("2026-12-09T22:00:00Z").unwrap().with_timezone(&chrono::Utc);
    let err = once.extend_deadline(WS_ID, deadline).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Status(500), "{err}");
    assert!(once.workspace(WS_ID).await.is_err());
    assert_eq!(gets().await, 1, "one attempt");
    // The client it came from retries the same read within its budget.
    assert!(retrying.workspace(WS_ID).await.is_err());
    assert!(gets().await > 2, "the listing's client retries");
}

/// `GET /api/v2/workspacebuilds/{id}/parameters` (reference NOTES §19): one request, the values
/// as Coder stores them; a 404 is final.
#[tokio::test]
async fn reads_a_builds_parameters() {
    let server = MockServer::start().await;
    let build = "6f1d5a8e-2b7c-4e3f-9a0d-1c2b3e4f5a6b";
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspacebuilds/{build}/parameters")))
        .and(header("Coder-Session-Token", TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(fixture_json("coder/build_parameters.json")))
        .expect(1)
        .mount(&server)
        .await;
    let params = client(&server, RetryPolicy::none()).build_parameters(build).await.unwrap();
    let pairs: Vec<(&str, &str)> = params.iter().map(|p| (p.name.as_str(), p.value.as_str())).collect();
    assert_eq!(pairs, vec![("cpu", "4"), ("memory", "8"), ("home_disk_size", "10"), ("gpu_count", "0")]);
    let missing = "0d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a";
    Mock::given(method("GET"))
        .and(path(format!("/api/v2/workspacebuilds/{missing}/parameters")))
        .respond_with(coder_error(404, "Resource not found or you do not have access to this resource", ""))
        .expect(1)
        .mount(&server)
        .await;
    let e = client(&server, quick_retry()).build_parameters(missing).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoPermission, "Coder's 404 is also what a token that may not read says: {e}");
    assert_eq!(server.received_requests().await.unwrap().len(), 2, "a 404 is not retried");
}
