//! The Coder client's unit tests: the listing's room, errors described, Coder's clock, `Retry-After`, path segments.

use super::*;

#[test]
fn a_listing_in_the_room_the_last_one_made_is_not_copied_into_a_smaller_list() {
    // (workspaces last time, now, whether the list is copied into one its size)
    for (last, now, copied) in [
        (10_000, 10_000, false),
        (10_000, 10_600, false),
        (10_000, 9_000, false),
        (10_000, 7_000, true),
        (10_000, 11_000, true),
        (0, 10_000, true),
        (0, 0, false),
    ] {
        let mut list: Vec<u64> = Vec::with_capacity(listing_room(last));
        for i in 0..now {
            list.push(i);
        }
        assert_eq!(too_roomy(&list), copied, "{last} then {now}: room for {}", list.capacity());
    }
}

#[test]
fn describes_coder_errors_and_plain_text() {
    let body = br#"{"message":"A workspace build is already active.","detail":"A workspace build is already active."}"#;
    assert_eq!(describe(StatusCode::CONFLICT, body), "HTTP 409: A workspace build is already active.");
    let body = br#"{"message":"You are signed out or your session has expired. Please sign in again to continue.","detail":"API key expired at 2026-11-20"}"#;
    assert!(describe(StatusCode::UNAUTHORIZED, body).ends_with("continue.: API key expired at 2026-11-20"));
    let plain = b"\"X-Coder-Bypass-Ratelimit\" provided but user is not owner\n";
    assert_eq!(describe(StatusCode::PRECONDITION_REQUIRED, plain), "HTTP 428: \"X-Coder-Bypass-Ratelimit\" provided but user is not owner");
}

#[test]
fn coders_clock_from_the_date_header() {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(reqwest::header::DATE, "Sun, 29 Nov 2026 08:00:00 GMT".parse().unwrap());
    let sent = chrono::DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().with_timezone(&chrono::Utc);
    let offset = clock_offset(&h, sent, sent + chrono::Duration::seconds(2)).unwrap();
    assert_eq!(offset, chrono::Duration::seconds(-2 * 3600 - 1), "Coder is 2 h behind (against the midpoint)");
    assert_eq!(clock_offset(&reqwest::header::HeaderMap::new(), sent, sent), None);
}

#[test]
fn retry_after_is_clamped() {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(reqwest::header::RETRY_AFTER, "18446744073709551615".parse().unwrap());
    assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
    h.insert(reqwest::header::RETRY_AFTER, "60".parse().unwrap());
    assert_eq!(retry_after(&h), Some(Duration::from_secs(60)));
    h.insert(reqwest::header::RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
    assert_eq!(retry_after(&h), None);
}

#[test]
fn encodes_path_segments() {
    assert_eq!(encode_path("a/b c"), "a%2Fb%20c");
    assert_eq!(encode_path("0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70"), "0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70");
}
