//! GPUs held outside Coder's running workspaces: a workspace whose pod still reports a GPU (a
//! series of the exporter's job names it) while Coder does not list it running (its latest build
//! is a stop that was canceled, failed or succeeded with the pod stuck terminating, reference
//! coder NOTES §18). Nobody can see it in Coder, and no autostop will ever stop it.
//!
//! Pure bookkeeping: each pass hands in the workspace ids GPU series named that the listing did
//! not hold (`pass`); one seen for more than two intervals is read once from Coder
//! (`GET /api/v2/workspaces/{id}`, at most `MAX_READS_PER_PASS` a pass, again after
//! `REREAD_AFTER`), an id that is no workspace is not read again for `NOT_A_WORKSPACE_FOR`, and
//! what the reads say is reported (`held`). It acts on nothing: a failed or reaped stop keeps the
//! stop lifecycle's rules, and a stop a person canceled is theirs.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::coder::types::{JobStatus, Transition, Workspace};

/// The most workspaces read a pass.
pub const MAX_READS_PER_PASS: usize = 8;
/// The most unlisted ids followed at once (GPU series name them; a store can be written to).
pub const MAX_FOLLOWED: usize = 64;
/// A workspace read is read again after this, while its GPU series go on.
pub const REREAD_AFTER: Duration = Duration::minutes(10);
/// An id Coder has no workspace for is not read again for this long.
pub const NOT_A_WORKSPACE_FOR: Duration = Duration::hours(1);

/// A workspace whose pod reports a GPU while Coder does not list it running.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldOutside {
    pub workspace_id: String,
    pub workspace: String,
    pub owner: String,
    pub template: String,
    /// Its latest build's transition and job status as Coder last answered (`stop`/`canceled`).
    pub transition: &'static str,
    pub job_status: &'static str,
    /// Since when its GPU series have been seen with it unlisted (this machine's clock).
    pub since: DateTime<Utc>,
}

impl HeldOutside {
    /// "alice/train holds a GPU outside Coder's running workspaces since <time> (latest build:
    /// stop, canceled)", as the page, the plan and `check` say it.
    pub fn words(&self) -> String {
        format!(
            "{}/{} holds a GPU outside Coder's running workspaces since {} (latest build: {}, {}): its pod still runs; start and stop it in Coder, or delete the pod",
            self.owner,
            self.workspace,
            self.since.format("%Y-%m-%d %H:%M:%S UTC"),
            self.transition,
            self.job_status
        )
    }
}

#[derive(Debug, Clone)]
struct Followed {
    first_seen: DateTime<Utc>,
    read_at: Option<DateTime<Utc>>,
    /// What the last read found, when the workspace is not running in Coder.
    held: Option<HeldOutside>,
}

/// The ids followed between passes.
#[derive(Debug, Default)]
pub struct Outside {
    followed: HashMap<String, Followed>,
    not_workspaces: HashMap<String, DateTime<Utc>>,
}

impl Outside {
    /// A pass saw GPU series naming `unlisted` (workspace ids the listing did not hold): the ids
    /// to read from Coder now, oldest first. Ids no series names any more are forgotten.
    pub fn pass(&mut self, now: DateTime<Utc>, interval: Duration, unlisted: &[String]) -> Vec<String> {
        self.not_workspaces.retain(|_, at| now - *at < NOT_A_WORKSPACE_FOR);
        self.followed.retain(|id, _| unlisted.contains(id));
        for id in unlisted {
            if self.followed.len() >= MAX_FOLLOWED || self.not_workspaces.contains_key(id) {
                continue;
            }
            self.followed.entry(id.clone()).or_insert(Followed { first_seen: now, read_at: None, held: None });
        }
        let mut due: Vec<(&String, &Followed)> = self
            .followed
            .iter()
            .filter(|(_, f)| now - f.first_seen > interval * 2 && f.read_at.is_none_or(|at| now - at >= REREAD_AFTER))
            .collect();
        due.sort_by(|a, b| (a.1.first_seen, a.0).cmp(&(b.1.first_seen, b.0)));
        due.into_iter().take(MAX_READS_PER_PASS).map(|(id, _)| id.clone()).collect()
    }

    /// What Coder answered for `id`: `Ok(None)` is no workspace (404, 410), `Err` no answer
    /// (asked again next pass).
    pub fn read(&mut self, now: DateTime<Utc>, id: &str, answer: Result<Option<&Workspace>, ()>) {
        match answer {
            Err(()) => {}
            Ok(None) => {
                self.followed.remove(id);
                self.not_workspaces.insert(id.to_string(), now);
            }
            Ok(Some(ws)) => {
                let Some(f) = self.followed.get_mut(id) else { return };
                f.read_at = Some(now);
                let b = &ws.latest_build;
                // Running (a listing that raced the read), or a build still in progress (a stop
                // on its way): not held outside.
                let running = b.transition == Transition::Start && b.job.status == JobStatus::Succeeded;
                f.held = (!running && !b.job.status.is_active()).then(|| HeldOutside {
                    workspace_id: ws.id.clone(),
                    workspace: ws.name.clone(),
                    owner: ws.owner_name.clone(),
                    template: ws.template_name.clone(),
                    transition: b.transition.as_str(),
                    job_status: b.job.status.as_str(),
                    since: f.first_seen,
                });
            }
        }
    }

    /// The workspaces holding a GPU outside Coder's running workspaces, by id.
    pub fn held(&self) -> Vec<HeldOutside> {
        let mut out: Vec<HeldOutside> = self.followed.values().filter_map(|f| f.held.clone()).collect();
        out.sort_by(|a, b| a.workspace_id.cmp(&b.workspace_id));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_583_200 + s, 0).unwrap_or_default()
    }

    fn ws(transition: Transition, status: JobStatus) -> Workspace {
        let json = serde_json::json!({
            "id": "w", "name": "train", "owner_name": "alice", "template_name": "gpu", "created_at": "2026-12-01T08:00:00Z",
            "last_used_at": "2026-12-01T09:00:00Z",
            "latest_build": {"id": "b", "transition": transition.as_str(), "status": "canceled",
                "job": {"id": "j", "status": status.as_str()}}
        });
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_unlisted_workspace_with_a_gpu_is_read_after_two_intervals_and_reported_once_coder_says_it_is_not_running() {
        let mut o = Outside::default();
        let interval = Duration::seconds(60);
        let ids = vec!["w".to_string()];
        // (second, ids to read)
        for (s, want) in [(0, 0), (60, 0), (120, 0), (121, 1)] {
            assert_eq!(o.pass(at(s), interval, &ids).len(), want, "second {s}");
        }
        o.read(at(121), "w", Ok(Some(&ws(Transition::Stop, JobStatus::Canceled))));
        let held = o.held();
        assert_eq!((held.len(), held[0].transition, held[0].job_status, held[0].since), (1, "stop", "canceled", at(0)));
        assert!(o.pass(at(181), interval, &ids).is_empty(), "read again only after ten minutes");
        assert_eq!(o.pass(at(121 + 600), interval, &ids), ids);
        // A stop on its way: not held (yet).
        o.read(at(721), "w", Ok(Some(&ws(Transition::Stop, JobStatus::Pending))));
        assert!(o.held().is_empty());
        // Running again in Coder (a listing race): not held.
        o.read(at(721), "w", Ok(Some(&ws(Transition::Start, JobStatus::Succeeded))));
        assert!(o.held().is_empty());
        // Its series end: forgotten.
        o.pass(at(800), interval, &[]);
        assert!(o.held().is_empty() && o.pass(at(801), interval, &ids).is_empty());
    }

    #[test]
    fn an_id_that_is_no_workspace_is_not_read_again_for_an_hour() {
        let mut o = Outside::default();
        let interval = Duration::seconds(60);
        let ids = vec!["forged".to_string()];
        o.pass(at(0), interval, &ids);
        assert_eq!(o.pass(at(121), interval, &ids), ids);
        o.read(at(121), "forged", Ok(None));
        for s in [122, 1000, 3000] {
            o.pass(at(s), interval, &ids);
        }
        assert!(o.pass(at(3500), interval, &ids).is_empty(), "not followed within the hour");
        o.pass(at(3722), interval, &ids);
        assert!(o.pass(at(3722 + 121), interval, &ids).len() == 1, "an hour later it is followed again");
    }

    #[test]
    fn at_most_a_few_reads_a_pass_and_a_bounded_number_followed() {
        let mut o = Outside::default();
        let ids: Vec<String> = (0..200).map(|i| format!("w{i:03}")).collect();
        o.pass(at(0), Duration::seconds(60), &ids);
        assert_eq!(o.pass(at(121), Duration::seconds(60), &ids).len(), MAX_READS_PER_PASS);
        assert_eq!(o.followed.len(), MAX_FOLLOWED);
    }
}
