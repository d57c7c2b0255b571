//! The fakes behave like Coder where the service depends on it (reference NOTES §2, §5, §6, §12):
//! who may stop whom, 409 on an active build, the rate limit and its owner-only bypass,
//! extend/ttl validation, and a Pending pod's agent going connecting -> timeout.

use std::time::Duration;

use mocks::{Assignment, FakeCoder, WorldConfig};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn fake(config: WorldConfig) -> FakeCoder {
    FakeCoder::start(config).await.unwrap()
}

fn fast(gpus: usize) -> WorldConfig {
    WorldConfig { gpus, scale: 600.0, ..WorldConfig::default() }
}

/// `GET` a Coder route of the fake as `token`, its JSON answer.
async fn get_json(c: &FakeCoder, path: &str, token: &str) -> Value {
    let resp = reqwest::Client::new().get(format!("{}{path}", c.url())).header("Coder-Session-Token", token).send().await.unwrap();
    resp.json().await.unwrap()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

#[tokio::test]
async fn a_member_cannot_stop_another_users_workspace_but_the_owner_can() {
    let c = fake(fast(1)).await;
    let a = c.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    settle().await;
    let http = reqwest::Client::new();
    let stop = |token: String| {
        http.post(format!("{}/api/v2/workspaces/{a}/builds", c.url()))
            .header("Coder-Session-Token", token)
            .json(&json!({"transition": "stop"}))
            .send()
    };
    let bob = stop(c.with(|w| w.token_of("bob")).unwrap()).await.unwrap();
    assert_eq!(bob.status(), StatusCode::NOT_FOUND, "stage 3 scenario 2: an ordinary user gets 404");
    assert_eq!(bob.json::<Value>().await.unwrap()["message"], "Resource not found or you do not have access to this resource");
    assert_eq!(stop(c.owner_token()).await.unwrap().status(), StatusCode::CREATED, "the owner gets 201");
    let again = stop(c.owner_token()).await.unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT, "a build is still active");
    let bad = http
        .post(format!("{}/api/v2/workspaces/{a}/builds", c.url()))
        .header("Coder-Session-Token", c.owner_token())
        .json(&json!({"transition": "pause"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert_eq!(bad.json::<Value>().await.unwrap()["validations"][0]["field"], "transition");
}

#[tokio::test]
async fn the_rate_limit_and_its_owner_only_bypass() {
    let c = fake(WorldConfig { rate_limit_per_minute: 3, scale: 1.0, ..WorldConfig::default() }).await;
    let http = reqwest::Client::new();
    let get = |token: String, bypass: bool| {
        let mut r = http.get(format!("{}/api/v2/workspaces", c.url())).header("Coder-Session-Token", token);
        if bypass {
            r = r.header("X-Coder-Bypass-Ratelimit", "true");
        }
        r.send()
    };
    let alice = c.with(|w| w.token_of("alice")).unwrap();
    for _ in 0..3 {
        assert_eq!(get(alice.clone(), false).await.unwrap().status(), StatusCode::OK);
    }
    let limited = get(alice.clone(), false).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["Retry-After"], "60");
    assert!(limited.json::<Value>().await.unwrap()["message"].as_str().unwrap().starts_with("You've been rate limited"));
    let member_bypass = get(alice, true).await.unwrap();
    assert_eq!(member_bypass.status(), StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(member_bypass.text().await.unwrap(), "\"X-Coder-Bypass-Ratelimit\" provided but user is not owner", "plain text, not JSON");
    for _ in 0..10 {
        assert_eq!(get(c.owner_token(), true).await.unwrap().status(), StatusCode::OK, "owners are not limited with the header");
    }
}

#[tokio::test]
async fn extend_and_ttl_follow_coders_rules() {
    let c = fake(WorldConfig { scale: 60.0, ..fast(1) }).await;
    let a = c.with(|w| w.create_workspace("alice", "a", Some(8 * 3_600_000))).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let http = reqwest::Client::new();
    let alice = c.with(|w| w.token_of("alice")).unwrap();
    let put = |what: &str, body: Value| {
        http.put(format!("{}/api/v2/workspaces/{a}/{what}", c.url())).header("Coder-Session-Token", &alice).json(&body).send()
    };
    let soon = (chrono::Utc::now() + chrono::Duration::seconds(5)).to_rfc3339();
    let r = put("extend", json!({"deadline": soon})).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "less than 30 minutes ahead (wall-clock, as deadlines are)");
    let twenty = (chrono::Utc::now() + chrono::Duration::minutes(20)).to_rfc3339();
    assert_eq!(put("extend", json!({"deadline": twenty})).await.unwrap().status(), StatusCode::BAD_REQUEST, "20 minutes is too soon too");
    let later = (chrono::Utc::now() + chrono::Duration::hours(4)).to_rfc3339();
    let r = put("extend", json!({"deadline": later})).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.json::<Value>().await.unwrap()["message"].as_str().unwrap().starts_with("Deadline updated to "));
    let r = put("ttl", json!({"ttl_ms": 30_000})).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.json::<Value>().await.unwrap()["validations"][0]["detail"], "time until shutdown must be at least one minute");
    assert_eq!(put("ttl", json!({"ttl_ms": 31i64 * 24 * 3_600_000})).await.unwrap().status(), StatusCode::BAD_REQUEST);
    assert_eq!(put("ttl", json!({"ttl_ms": null})).await.unwrap().status(), StatusCode::NO_CONTENT);
    let ws = get_json(&c, &format!("/api/v2/workspaces/{a}"), &alice).await;
    assert!(ws.get("ttl_ms").is_none(), "omitted once autostop is off");
    assert!(ws["latest_build"]["deadline"].is_null());
    let r = put("extend", json!({"deadline": later})).await.unwrap();
    assert_eq!(
        (r.status(), r.json::<Value>().await.unwrap()["message"].clone()),
        (StatusCode::CONFLICT, json!("Workspace shutdown is manual."))
    );
}

/// The rest of `putExtendWorkspace` (NOTES §16, in coderd's order): a prebuild 409s, a deadline
/// past `max_deadline` 400s, a member who may read but not update gets dbauthz's 500.
#[tokio::test]
async fn extend_refuses_prebuilds_a_deadline_past_max_deadline_and_callers_without_update() {
    let c = fake(WorldConfig { scale: 60.0, max_deadline_after: Some(Duration::from_secs(2 * 3600)), ..fast(3) }).await;
    let a = c.with(|w| w.create_workspace("alice", "a", Some(8 * 3_600_000))).unwrap();
    let p = c.with(|w| w.create_prebuild("pre")).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ws = get_json(&c, &format!("/api/v2/workspaces/{a}"), &c.owner_token()).await;
    let (deadline, max) = (ws["latest_build"]["deadline"].as_str().unwrap(), ws["latest_build"]["max_deadline"].as_str().unwrap());
    assert!(deadline <= max, "the TTL's deadline is capped at max_deadline: {deadline} {max}");
    let http = reqwest::Client::new();
    let put = |id: uuid::Uuid, token: String, hours: i64| {
        let deadline = (chrono::Utc::now() + chrono::Duration::hours(hours)).to_rfc3339();
        http.put(format!("{}/api/v2/workspaces/{id}/extend", c.url()))
            .header("Coder-Session-Token", token)
            .json(&json!({ "deadline": deadline }))
            .send()
    };
    let message = |r: reqwest::Response| async move { (r.status(), r.json::<Value>().await.unwrap()["message"].clone()) };
    let owner = c.owner_token();
    assert_eq!(
        message(put(p, owner.clone(), 1).await.unwrap()).await,
        (StatusCode::CONFLICT, json!("Deadline extension is not supported for prebuilt workspaces"))
    );
    assert_eq!(
        message(put(a, owner.clone(), 3).await.unwrap()).await,
        (StatusCode::BAD_REQUEST, json!("Cannot extend workspace beyond max deadline."))
    );
    c.with(|w| w.grant("bob", 0, mocks::world::OrgRole::TemplateAdmin));
    let bob = c.with(|w| w.token_of("bob")).unwrap();
    assert_eq!(
        message(put(a, bob, 1).await.unwrap()).await,
        (StatusCode::INTERNAL_SERVER_ERROR, json!("Failed to extend workspace deadline."))
    );
    assert_eq!(message(put(a, owner, 1).await.unwrap()).await.0, StatusCode::OK);
}

/// The lifecycle executor stops a workspace once its deadline passed (reason `autostop`, by its
/// owner), and the activity bump keeps a connected one's deadline ahead (NOTES §7, §16).
#[tokio::test]
async fn autostop_stops_at_the_deadline_and_a_connection_bumps_it() {
    // The executor polls every Coder minute: 1 s at 60x. The bump is 20 s of wall-clock time.
    let c = fake(WorldConfig { scale: 60.0, activity_bump: Duration::from_secs(20), ..fast(2) }).await;
    let left = c.with(|w| w.create_workspace("alice", "left", Some(3_000))).unwrap();
    let used = c.with(|w| w.create_workspace("bob", "used", Some(3_000))).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.with(|w| w.open_connection(used));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let reasons = |id: uuid::Uuid| {
        c.with(|w| {
            w.workspaces[w.ws_index(id).unwrap()]
                .builds
                .iter()
                .map(|b| (b.transition, b.reason, w.users[b.initiator].username.clone()))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(reasons(left), vec![("start", "initiator", "alice".to_string()), ("stop", "autostop", "alice".to_string())]);
    assert_eq!(reasons(used).len(), 1, "a connected workspace's deadline is bumped ahead: not stopped");
    let bumped = c.with(|w| w.workspaces[w.ws_index(used).unwrap()].latest().unwrap().deadline.unwrap());
    assert!(bumped > chrono::Utc::now() + chrono::Duration::seconds(5), "now + 20 s at the last refresh: {bumped}");
}

#[tokio::test]
async fn a_pending_pods_agent_is_connecting_then_timeout() {
    // connection_timeout 120 Coder-seconds = 0.2 s at 600x.
    let c = fake(fast(1)).await;
    c.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    settle().await;
    let b = c.with(|w| w.create_workspace("bob", "b", None)).unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let status = || {
        c.with(|w| {
            w.ws_index(b)
                .and_then(|i| w.workspaces[i].latest()?.agent.clone())
                .map(|a| (w.agent_status(&a), a.lifecycle, a.first_connected_at.is_none()))
        })
    };
    assert_eq!(status(), Some(("connecting", "created", true)), "build succeeded, pod Pending");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(), Some(("timeout", "created", true)));
    let running = c.with(|w| w.ws_index(b).map(|i| w.is_running(&w.workspaces[i]))).unwrap();
    assert!(running, "latest_build.status is running although the pod never scheduled");
}

#[tokio::test]
async fn a_freed_gpu_goes_to_the_oldest_waiter_or_at_random() {
    for (assignment, expect_oldest) in [(Assignment::OldestFirst, true), (Assignment::Random, false)] {
        let mut oldest_won = 0;
        for seed in 1..=6 {
            let c = fake(WorldConfig { assignment, seed, ..fast(1) }).await;
            let holder = c.with(|w| w.create_workspace("alice", "holder", None)).unwrap();
            settle().await;
            let first = c.with(|w| w.create_workspace("bob", "first", None)).unwrap();
            settle().await;
            c.with(|w| w.create_workspace("bob", "second", None)).unwrap();
            settle().await;
            c.with(|w| w.create_build(holder, "stop", 0, "initiator")).unwrap();
            settle().await;
            oldest_won += usize::from(c.with(|w| w.gpu_holders[0] == Some(first)));
        }
        if expect_oldest {
            assert_eq!(oldest_won, 6);
        } else {
            assert!((1..6).contains(&oldest_won), "random assignment picks either pod: oldest won {oldest_won} of 6");
        }
    }
}

/// Coder's lifecycle details (reference NOTES §15), as the fake plays them: permissions per
/// organization, the job reaper, canceled builds and suspended users.
#[tokio::test]
async fn organizations_the_reaper_cancel_and_suspension_behave_as_coderd_does() {
    let c = fake(WorldConfig { reaper_pending: Duration::from_secs(600), ..fast(2) }).await; // 1 s here
    let research = c.with(|w| {
        let org = w.add_organization("research");
        w.grant("orgadmin", org, mocks::OrgRole::TemplateAdmin);
        org
    });
    let a = c.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    let b = c.with(|w| w.create_workspace_in(research, "bob", "b")).unwrap();
    settle().await;
    let http = reqwest::Client::new();
    let org_admin = c.with(|w| w.token_of("orgadmin")).unwrap();
    let post = |path: String, token: &str, body: Value| {
        http.post(format!("{}{path}", c.url())).header("Coder-Session-Token", token.to_string()).json(&body).send()
    };
    // A template admin reads the other organization's workspaces but may not stop them.
    let listed = get_json(&c, "/api/v2/workspaces?q=status:running", &org_admin).await;
    assert_eq!(listed["count"], 2, "{listed}");
    let names: Vec<&str> = listed["workspaces"].as_array().unwrap().iter().filter_map(|w| w["organization_name"].as_str()).collect();
    assert!(names.contains(&"research") && names.contains(&"coder"), "{names:?}");
    let refused = post(format!("/api/v2/workspaces/{b}/builds"), &org_admin, json!({"transition": "stop"})).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(refused.json::<Value>().await.unwrap()["message"], "You do not have permission to stop this workspace.");
    let orgs = c.with(|w| w.organizations.iter().map(|(id, _)| id.to_string()).collect::<Vec<_>>());
    let check = |org: &str, action: &str| json!({"object": {"resource_type": "workspace", "organization_id": org}, "action": action});
    let answers: Value = post(
        "/api/v2/authcheck".into(),
        &org_admin,
        json!({"checks": {"stop-coder": check(&orgs[0], "stop"), "stop-research": check(&orgs[1], "stop"), "read-research": check(&orgs[1], "read"), "any": {"object": {"resource_type": "workspace", "any_org": true}, "action": "stop"}}}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        answers,
        json!({"stop-coder": true, "stop-research": false, "read-research": true, "any": true}),
        "any_org says yes for some org"
    );

    // No provisioner answers: the stop stays pending until the reaper fails it; the pod runs on.
    c.with(|w| w.provisioners_down = true);
    let owner = c.owner_token();
    let stop: Value =
        post(format!("/api/v2/workspaces/{a}/builds"), &owner, json!({"transition": "stop"})).await.unwrap().json().await.unwrap();
    let build = stop["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reaped = get_json(&c, &format!("/api/v2/workspacebuilds/{build}"), &owner).await;
    assert_eq!((reaped["status"].as_str(), reaped["job"]["status"].as_str()), (Some("failed"), Some("failed")), "{reaped}");
    assert_eq!(reaped["job"]["error"], "Coder: Build has been detected as pending for 10 minutes and has been terminated by the reaper.");
    assert!(c.with(|w| w.gpu_holders.contains(&Some(a))), "a reaped stop leaves the pod and its GPU");

    // On a template that does not allow user cancels (coderd's default), only a site owner may
    // cancel, a pending build included: the handler lets `expect_status=pending` through, then
    // dbauthz refuses with a 500 (reference NOTES §18). A pending stop canceled ends `canceled`
    // at once; a second cancel is a 400.
    let stop: Value =
        post(format!("/api/v2/workspaces/{b}/builds"), &owner, json!({"transition": "stop"})).await.unwrap().json().await.unwrap();
    let cancel = |who: &str, query: &str| {
        http.patch(format!("{}/api/v2/workspacebuilds/{}/cancel{query}", c.url(), stop["id"].as_str().unwrap()))
            .header("Coder-Session-Token", c.with(|w| w.token_of(who)).unwrap())
            .send()
    };
    c.with(|w| w.grant("orgadmin", research, mocks::OrgRole::Admin));
    // (who, query, status)
    for (who, query, status) in [
        ("bob", "", StatusCode::FORBIDDEN),
        ("orgadmin", "?expect_status=pending", StatusCode::INTERNAL_SERVER_ERROR),
        ("admin", "?expect_status=pending", StatusCode::OK),
        ("admin", "", StatusCode::BAD_REQUEST),
    ] {
        assert_eq!(cancel(who, query).await.unwrap().status(), status, "{who} {query}");
    }
    assert_eq!(c.with(|w| w.ws_index(b).and_then(|i| w.workspaces[i].latest().map(|l| l.job.status))), Some("canceled"));
    // A template that allows user cancels lets the workspace's owner cancel.
    c.with(|w| w.config.allow_user_cancel = true);
    let stop: Value =
        post(format!("/api/v2/workspaces/{a}/builds"), &owner, json!({"transition": "stop"})).await.unwrap().json().await.unwrap();
    let by_alice = http
        .patch(format!("{}/api/v2/workspacebuilds/{}/cancel", c.url(), stop["id"].as_str().unwrap()))
        .header("Coder-Session-Token", c.with(|w| w.token_of("alice")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(by_alice.status(), StatusCode::OK);

    // A suspended user's token: 401 "User is not active", whatever the token.
    c.with(|w| w.set_user_status("bob", "suspended"));
    let me = http.get(format!("{}/api/v2/users/me", c.url())).header("Coder-Session-Token", c.with(|w| w.token_of("bob")).unwrap());
    let resp = me.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["message"],
        "User is not active (status = \"suspended\"). Contact an admin to reactivate your account."
    );
}

/// Build history as coderd serves it (NOTES §17): newest first, `since` keeps later builds,
/// `after_id` those numbered after the cursor's, `limit`/`offset` page; a deleted workspace still
/// answers `/builds`, and `GET /workspaces/{id}` answers 410 unless `include_deleted=true`.
#[tokio::test]
async fn build_history_and_deleted_workspaces_answer_as_coderd_does() {
    let c = fake(fast(1)).await;
    let token = c.owner_token();
    let a = c.with(|w| w.create_workspace("alice", "a", None)).unwrap();
    settle().await;
    for transition in ["stop", "start", "delete"] {
        c.with(|w| w.create_build(a, transition, w.user_index("alice").unwrap(), "initiator")).unwrap();
        settle().await;
    }
    let builds = get_json(&c, &format!("/api/v2/workspaces/{a}/builds"), &token).await;
    let numbers = |v: &Value| v.as_array().unwrap().iter().map(|b| b["build_number"].as_i64().unwrap()).collect::<Vec<_>>();
    assert_eq!(numbers(&builds), [4, 3, 2, 1], "newest first: {builds}");
    assert_eq!(builds[0]["transition"], "delete");
    let page = |q: &str| {
        let (c, token) = (&c, &token);
        let path = format!("/api/v2/workspaces/{a}/builds?{q}");
        async move { get_json(c, &path, token).await }
    };
    assert_eq!(numbers(&page("limit=2").await), [4, 3]);
    assert_eq!(numbers(&page("limit=2&offset=2").await), [2, 1]);
    assert_eq!(numbers(&page("limit=0&offset=3").await), [1], "limit 0 is all");
    let second = builds[2]["created_at"].as_str().unwrap().to_string();
    assert_eq!(numbers(&page(&format!("since={second}")).await), [4, 3], "created after `since`");
    let cursor = builds[2]["id"].as_str().unwrap().to_string();
    assert_eq!(numbers(&page(&format!("after_id={cursor}")).await), [4, 3], "numbered after the cursor's");

    let http = reqwest::Client::new();
    let status_of = |path: String| {
        let (http, token, url) = (http.clone(), token.clone(), c.url());
        async move {
            let resp = http.get(format!("{url}{path}")).header("Coder-Session-Token", token).send().await.unwrap();
            (resp.status(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = status_of(format!("/api/v2/workspaces/{a}/builds?since=yesterday")).await;
    assert_eq!((status, body["message"].as_str()), (StatusCode::BAD_REQUEST, Some("bad `since` format, must be RFC3339")));
    let nobody = uuid::Uuid::new_v4();
    let (status, body) = status_of(format!("/api/v2/workspaces/{a}/builds?after_id={nobody}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["message"], format!("Record at \"after_id\" (\"{nobody}\") does not exist."));

    let (status, body) = status_of(format!("/api/v2/workspaces/{a}")).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert!(body["message"].as_str().unwrap().starts_with(&format!("Workspace \"{a}\" was deleted")), "{body}");
    let (status, body) = status_of(format!("/api/v2/workspaces/{a}?include_deleted=true")).await;
    assert_eq!((status, body["id"].as_str()), (StatusCode::OK, Some(a.to_string().as_str())), "{body}");
    assert_eq!((body["owner_name"].as_str(), body["latest_build"]["transition"].as_str()), (Some("alice"), Some("delete")));
    let (status, body) = status_of(format!("/api/v2/workspaces/{a}?include_deleted=maybe")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// While a stop is pending, coderd closes the old agent's stats connection every 15 s
/// (`checkBuildIsLatest`) and `coder ssh` refuses the workspace (reference NOTES §18): a
/// connection opened then moves neither `last_used_at` nor the deadline.
#[tokio::test]
async fn a_pending_stops_agent_reports_no_use() {
    let c = fake(fast(1)).await;
    let a = c.with(|w| w.create_workspace("alice", "a", Some(3_600_000))).unwrap();
    crate::common::service::until(&c, "A runs", Duration::from_secs(5), |w| crate::common::service::running(w, a)).await;
    c.with(|w| {
        w.stall_next_stop(a);
        w.create_build(a, "stop", 0, "initiator").unwrap();
        w.open_connection(a);
    });
    let (used, deadline) = c.with(|w| {
        let i = w.ws_index(a).unwrap();
        (w.workspaces[i].last_used_at, w.workspaces[i].builds.iter().rev().find(|b| b.transition == "start").and_then(|b| b.deadline))
    });
    let t0 = c.with(|w| w.now());
    // Three of the usage tracker's 60-s flushes, on the fake's clock.
    crate::common::service::until(&c, "three Coder minutes pass", Duration::from_secs(5), |w| {
        w.now() > t0 + chrono::Duration::from_std(w.real(Duration::from_secs(180))).unwrap_or_default()
    })
    .await;
    let (now_used, now_deadline) = c.with(|w| {
        let i = w.ws_index(a).unwrap();
        (w.workspaces[i].last_used_at, w.workspaces[i].builds.iter().rev().find(|b| b.transition == "start").and_then(|b| b.deadline))
    });
    assert_eq!((now_used, now_deadline), (used, deadline), "no use reaches coderd while the stop is pending");
}
