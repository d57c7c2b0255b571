//! A build as a backtest's timeline keeps it for the whole window (`PastBuild`): the facts the
//! replay's rules read of every build, in 64 bytes, and the rest only for a build that a
//! listing can show running (a start whose job succeeded). A parsed `WorkspaceBuild` holds 336
//! bytes with its four ids inline (`CoderId`), plus its job's tags and its resources (640 bytes
//! a build on average at 10,000 workspaces x 7 days by heaptrack, when its ids were strings of
//! their own); a timeline holds every build of its window from the start, 11 a workspace on
//! average there. Ids are kept in 16 bytes when they are UUIDs in Coder's spelling (`Id`), a
//! build's initiator as its place among the timeline's (each user once, `keep_all`), and every
//! build is given back exactly as it was parsed (`PastBuild::build`).

use std::fmt;

use chrono::{DateTime, Utc};

use crate::coder::types::{
    BuildReason, CoderId, JobStatus, JobTags, MatchedProvisioners, ProvisionerJob, Transition, WorkspaceAgent, WorkspaceBuild,
    WorkspaceResource, WorkspaceStatus,
};

/// An id as a timeline keeps it: a UUID as Coder writes it (36 lowercase hex digits and dashes,
/// `uuid.UUID.String()`) in its 16 bytes, anything else as its text. Written back, it is the same
/// text (`Display`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Id {
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// Where the dashes of a UUID's text are.
const DASHES: [usize; 4] = [8, 13, 18, 23];
const HEX: &[u8; 16] = b"0123456789abcdef";

impl Id {
    pub fn new(text: &str) -> Self {
        uuid_bytes(text).map_or_else(|| Id::Text(text.into()), Id::Uuid)
    }

    /// The id as a listing holds it.
    pub fn coder_id(&self) -> CoderId {
        CoderId::new(self.text(&mut [0; 36]))
    }

    /// Whether this is the id `text` (the same text, byte for byte).
    pub fn is(&self, text: &str) -> bool {
        match self {
            Id::Uuid(bytes) => uuid_bytes(text).is_some_and(|b| b == *bytes),
            Id::Text(t) => &**t == text,
        }
    }

    /// The id's text, written into `buf` for a UUID (no allocation).
    pub fn text<'a>(&'a self, buf: &'a mut [u8; 36]) -> &'a str {
        match self {
            Id::Uuid(bytes) => {
                let mut digits = bytes.iter().flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
                for (i, slot) in buf.iter_mut().enumerate() {
                    *slot = if DASHES.contains(&i) { b'-' } else { digits.next().unwrap_or(b'0') };
                }
                std::str::from_utf8(buf).unwrap_or_default()
            }
            Id::Text(t) => t,
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text(&mut [0; 36]))
    }
}

/// The 16 bytes of a UUID written as Coder writes one; `None` for any other text (upper case
/// included: it would not be written back the same).
fn uuid_bytes(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != 36 || DASHES.iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let mut nibbles = text.iter().enumerate().filter(|(i, _)| !DASHES.contains(i)).map(|(_, &c)| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    });
    let mut bytes = [0u8; 16];
    for byte in &mut bytes {
        *byte = (nibbles.next()?? << 4) | nibbles.next()??;
    }
    Some(bytes)
}

/// One build of a timeline: what the replay's rules read of every build (when it was asked for
/// and done, what it did, who asked and why), and for a start whose job succeeded, the rest a
/// listing shows while it runs (`ran`).
#[derive(Debug, Clone, PartialEq)]
pub struct PastBuild {
    pub id: Id,
    pub created_at: Option<DateTime<Utc>>,
    pub transition: Transition,
    pub reason: BuildReason,
    pub job_status: JobStatus,
    pub completed_at: Option<DateTime<Utc>>,
    /// Who asked for it: its place in the timeline's initiators, from 1 (`initiator`; 0: nobody
    /// is named). A workspace's builds are asked for by a few users, each kept once.
    initiator: u32,
    ran: Option<Box<Ran>>,
}

/// A timeline's builds as it keeps them, oldest first as given, and the users who asked for
/// them, each once (`PastBuild::initiator`).
pub fn keep_all(builds: Vec<WorkspaceBuild>) -> (Vec<PastBuild>, Box<[Id]>) {
    let mut initiators = Vec::new();
    // Any text a peer sends may be an initiator: SipHash, not `IdHash` (`crate::ids`).
    let mut places: std::collections::HashMap<Id, u32> = std::collections::HashMap::new();
    // Into a list of their own size: collected in place, the kept builds would sit in the
    // parsed list's buffer (336 bytes a slot) for the whole window.
    let mut kept = Vec::with_capacity(builds.len());
    kept.extend(builds.into_iter().map(|mut b| {
        let place = b.initiator_id.take().map_or(0, |text| {
            let id = Id::new(&text);
            // Looked up first: a user met before costs no copy of the id.
            if let Some(&place) = places.get(&id) {
                return place;
            }
            initiators.push(id.clone());
            let place = u32::try_from(initiators.len()).unwrap_or(u32::MAX);
            places.insert(id, place);
            place
        });
        PastBuild::new(b, place)
    }));
    (kept, initiators.into_boxed_slice())
}

/// The rest of a build that a listing can show running: every other field of `WorkspaceBuild`.
#[derive(Debug, Clone, PartialEq)]
struct Ran {
    status: WorkspaceStatus,
    job_id: Id,
    error: Option<String>,
    canceled_at: Option<DateTime<Utc>>,
    tags: JobTags,
    template_version_id: Option<Id>,
    resources: Vec<WorkspaceResource>,
    deadline: Option<DateTime<Utc>>,
    max_deadline: Option<DateTime<Utc>>,
    matched_provisioners: Option<MatchedProvisioners>,
}

impl PastBuild {
    /// `b` kept, asked for by the initiator at `initiator` (`keep_all`: its `initiator_id` is
    /// read there, not here).
    fn new(b: WorkspaceBuild, initiator: u32) -> Self {
        let WorkspaceBuild {
            id,
            created_at,
            transition,
            status,
            job,
            initiator_id: _,
            template_version_id,
            reason,
            mut resources,
            deadline,
            max_deadline,
            matched_provisioners,
        } = b;
        let ProvisionerJob { id: job_id, status: job_status, completed_at, error, canceled_at, tags } = job;
        let ran = (transition == Transition::Start && job_status == JobStatus::Succeeded).then(|| {
            // Held for the whole window: no room left over from parsing (a parsed list of one
            // agent reserves four).
            resources.shrink_to_fit();
            for resource in &mut resources {
                resource.agents.shrink_to_fit();
            }
            Box::new(Ran {
                status,
                job_id: Id::new(&job_id),
                error,
                canceled_at,
                tags,
                template_version_id: template_version_id.map(|v| Id::new(&v)),
                resources,
                deadline,
                max_deadline,
                matched_provisioners,
            })
        });
        PastBuild { id: Id::new(&id), created_at, transition, reason, job_status, completed_at, initiator, ran }
    }

    /// Who asked for it, of the timeline's `initiators` (`keep_all`).
    pub fn initiator<'a>(&self, initiators: &'a [Id]) -> Option<&'a Id> {
        initiators.get(usize::try_from(self.initiator).ok()?.checked_sub(1)?)
    }

    /// Whether it had the workspace running at `t`: a start whose job succeeded by then.
    pub fn running_by(&self, t: DateTime<Utc>) -> bool {
        self.ran.is_some() && self.completed_at.or(self.created_at).is_some_and(|done| done <= t)
    }

    /// Its agents (none unless it is a start that succeeded).
    pub fn agents(&self) -> impl Iterator<Item = &WorkspaceAgent> {
        self.ran.iter().flat_map(|r| r.resources.iter().flat_map(|r| r.agents.iter()))
    }

    /// The build as it was parsed, for one a listing can show running (`None` for any other);
    /// `initiators`: its timeline's.
    pub fn build(&self, initiators: &[Id]) -> Option<WorkspaceBuild> {
        let r = self.ran.as_deref()?;
        Some(WorkspaceBuild {
            id: self.id.coder_id(),
            created_at: self.created_at,
            transition: self.transition,
            status: r.status,
            job: ProvisionerJob {
                id: r.job_id.coder_id(),
                status: self.job_status,
                completed_at: self.completed_at,
                error: r.error.clone(),
                canceled_at: r.canceled_at,
                tags: r.tags.clone(),
            },
            initiator_id: self.initiator(initiators).map(Id::coder_id),
            template_version_id: r.template_version_id.as_ref().map(Id::coder_id),
            reason: self.reason,
            resources: r.resources.clone(),
            deadline: r.deadline,
            max_deadline: r.max_deadline,
            matched_provisioners: r.matched_provisioners,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_kept_in_16_bytes_and_written_back_the_same() {
        let uuid = "c42fdf75-3097-471c-8c33-fb52454d81c0";
        let id = Id::new(uuid);
        assert!(matches!(id, Id::Uuid(_)));
        assert_eq!(id.to_string(), uuid);
        assert!(id.is(uuid));
        assert!(!id.is("c42fdf75-3097-471c-8c33-fb52454d81c1"));
        assert!(!id.is("C42FDF75-3097-471C-8C33-FB52454D81C0"), "another text");
        for text in [
            "C42FDF75-3097-471C-8C33-FB52454D81C0",
            "b1",
            "",
            "c42fdf75x3097-471c-8c33-fb52454d81c0",
            "c42fdf75-3097-471c-8c33-fb52454d81cg",
        ] {
            let id = Id::new(text);
            assert!(matches!(id, Id::Text(_)), "{text}");
            assert_eq!(id.to_string(), text);
            assert!(id.is(text));
        }
    }

    fn parsed(transition: &str, job_status: &str) -> WorkspaceBuild {
        serde_json::from_value(serde_json::json!({
            "id": "8f1e3a52-1c4b-4f0e-9a57-3c2d1b0a9e8f", "created_at": "2026-12-01T10:00:00.123456Z", "transition": transition,
            "status": "running", "reason": "autostart", "initiator_id": "Not-A-UUID",
            "template_version_id": "0b6f3a61-5e39-4c8f-8f0d-1f2e3d4c5b6a",
            "job": {"id": "2d4c6b8a-0e1f-4a3b-9c5d-7e6f8a9b0c1d", "status": job_status, "completed_at": "2026-12-01T10:00:42Z",
                    "error": "a message", "tags": {"scope": "organization", "owner": ""}},
            "resources": [{"agents": []}, {"agents": [{"id": "a1", "status": "connected", "first_connected_at": "2026-12-01T10:01:00Z"}]}],
            "deadline": "2026-12-01T18:00:00Z", "max_deadline": null, "matched_provisioners": {"count": 1, "available": 1}
        }))
        .unwrap()
    }

    #[test]
    fn a_start_that_succeeded_is_given_back_exactly_as_parsed() {
        let b = parsed("start", "succeeded");
        let (kept, initiators) = keep_all(vec![b.clone()]);
        let kept = &kept[0];
        assert_eq!(kept.build(&initiators), Some(b));
        assert_eq!(kept.agents().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["a1"]);
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        assert!(
            kept.running_by(at("2026-12-01T10:00:42Z")) && !kept.running_by(at("2026-12-01T10:00:41Z")),
            "running once its job is done"
        );
    }

    #[test]
    fn other_builds_keep_the_facts_the_rules_read_and_never_run() {
        for (transition, status) in [("stop", "succeeded"), ("start", "failed"), ("start", "canceled"), ("delete", "succeeded")] {
            let b = parsed(transition, status);
            let (kept, initiators) = keep_all(vec![b.clone()]);
            let kept = &kept[0];
            assert_eq!(kept.build(&initiators), None, "{transition} {status}");
            assert!(!kept.running_by(DateTime::<Utc>::MAX_UTC));
            assert_eq!(kept.agents().count(), 0);
            assert_eq!((kept.id.coder_id(), kept.created_at, kept.transition), (b.id, b.created_at, b.transition));
            assert_eq!((kept.reason, kept.job_status, kept.completed_at), (b.reason, b.job.status, b.job.completed_at));
            assert_eq!(kept.initiator(&initiators).map(Id::coder_id), b.initiator_id);
        }
    }

    #[test]
    fn a_timeline_keeps_each_initiator_once_and_every_build_its_own() {
        let by = |initiator: Option<&str>| {
            let mut b = parsed("stop", "succeeded");
            b.initiator_id = initiator.map(CoderId::new);
            b
        };
        let owner = "4cd23375-8c04-4f43-aa35-baf2a1bdd06d";
        let asked = [Some(owner), Some(crate::coder::types::PREBUILDS_USER_ID), None, Some(owner), Some("Not-A-UUID"), Some(owner)];
        let (kept, initiators) = keep_all(asked.iter().map(|i| by(*i)).collect());
        assert_eq!(initiators.len(), 3, "the owner, the prebuilds user and one other, once each");
        let given_back: Vec<Option<String>> = kept.iter().map(|b| b.initiator(&initiators).map(Id::to_string)).collect();
        assert_eq!(given_back, asked.map(|i| i.map(str::to_string)));
    }

    #[test]
    fn a_kept_build_is_a_fraction_of_a_parsed_one() {
        assert_eq!(std::mem::size_of::<PastBuild>(), 64);
        assert!(std::mem::size_of::<PastBuild>() * 2 < std::mem::size_of::<WorkspaceBuild>(), "{}", std::mem::size_of::<WorkspaceBuild>());
    }
}
