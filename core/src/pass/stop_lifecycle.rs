//! The stop lifecycle: the states a stop build this service sent goes through, and the one
//! function that moves it on what Coder says of the build's job. Pure (no I/O, no clock): the
//! actuator asks Coder, calls `job_change`, and writes the one audit line the change names.
//!
//! ```text
//!  POST 201 ─► sent ──► running ──► succeeded (tracking ends; `stopped` until it runs again)
//!               │  ▲        │
//!               │  └ stuck ─┤ (pending past stop_timeout: reported once per idle episode)
//!               │           ├──► failed ──► (back-off) sent again ... abandoned after 5 attempts
//!               │           ├──► canceled (a person's decision, also when canceled then failed:
//!               │           │    never re-sent this episode)
//!               │           └──► reaped (coderd's job reaper) ──► sent once more when a provisioner
//!               │                matching its tags answers; reaped again ─► abandoned
//!  POST refused ─► failed
//! ```
//!
//! An idle episode ends when the workspace is active again (its decision is no longer a stop)
//! or gets a new build; the next episode starts with no history.

use chrono::{DateTime, Duration, Utc};

use crate::coder::types::{JobStatus, ProvisionerJob};
use crate::pass::audit::AuditKind;

/// Where a tracked stop stands.
#[derive(Debug, Clone, PartialEq)]
pub enum StopState {
    /// Coder created `build_id`; its job waits for a provisioner.
    Sent { build_id: String },
    /// A provisioner took the job.
    Running { build_id: String },
    /// The job stayed pending past `stop_timeout`: no provisioner takes it. Not sent again
    /// while it is pending.
    Stuck { build_id: String },
    /// The POST was refused or the build failed on its own: tried again at `retry_at`.
    /// `build_id` is our stop build that failed, if that is how it failed.
    Failed { retry_at: DateTime<Utc>, build_id: Option<String> },
    /// coderd's job reaper failed the job (pending 30 minutes, or hung 5 minutes): the
    /// workspace is `failed` in Coder while its pod still runs. `at` is when (Coder's clock).
    Reaped { build_id: String, at: DateTime<Utc> },
    /// A person canceled the stop build: not sent again in this idle episode.
    Canceled,
    /// Every attempt failed: nothing more until the workspace's next build.
    Abandoned,
}

impl StopState {
    pub fn as_str(&self) -> &'static str {
        match self {
            StopState::Sent { .. } => "sent",
            StopState::Running { .. } => "running",
            StopState::Stuck { .. } => "stuck",
            StopState::Failed { .. } => "failed",
            StopState::Reaped { .. } => "reaped",
            StopState::Canceled => "canceled",
            StopState::Abandoned => "abandoned",
        }
    }

    /// The stop build being followed (its job is not final yet).
    pub fn in_flight(&self) -> Option<&str> {
        match self {
            StopState::Sent { build_id } | StopState::Running { build_id } | StopState::Stuck { build_id } => Some(build_id),
            _ => None,
        }
    }
}

/// What a stop build's job says, when that changes the tracked stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobChange {
    Running,
    Stuck,
    Succeeded,
    Failed,
    Reaped,
    Canceled,
}

impl JobChange {
    /// The audit line this change writes.
    pub fn audit_kind(self) -> AuditKind {
        match self {
            JobChange::Running => AuditKind::StopRunning,
            JobChange::Stuck => AuditKind::StopStuck,
            JobChange::Succeeded => AuditKind::StopDone,
            JobChange::Failed => AuditKind::StopFailed,
            JobChange::Reaped => AuditKind::StopReaped,
            JobChange::Canceled => AuditKind::StopCanceled,
        }
    }
}

/// The error coderd's job reaper writes (`coderd/jobreaper/detector.go`): "Coder: Build has been
/// detected as pending for 30 minutes and has been terminated by the reaper." (or `hung`, 5).
pub fn reaped_by_coder(job: &ProvisionerJob) -> bool {
    job.status == JobStatus::Failed
        && job
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("Coder: Build has been detected as") && e.contains("terminated by the reaper"))
}

/// How the tracked stop in `state` moves on its build's `job`, pending for `pending_for`.
/// `stuck_reported`: `stop_stuck` was already written in this idle episode (once per episode,
/// not per attempt). `None`: nothing changed.
pub fn job_change(
    state: &StopState,
    job: &ProvisionerJob,
    pending_for: Duration,
    stop_timeout: Duration,
    stuck_reported: bool,
) -> Option<JobChange> {
    match (job.status, state) {
        (_, StopState::Failed { .. } | StopState::Reaped { .. } | StopState::Canceled | StopState::Abandoned) => None,
        (JobStatus::Pending, StopState::Sent { .. }) if pending_for >= stop_timeout && !stuck_reported => Some(JobChange::Stuck),
        (JobStatus::Running, StopState::Sent { .. } | StopState::Stuck { .. }) => Some(JobChange::Running),
        (JobStatus::Succeeded, _) => Some(JobChange::Succeeded),
        (JobStatus::Canceled, _) => Some(JobChange::Canceled),
        // Canceled while running, then failed (coderd reads an error before `canceled_at`): a
        // person's cancel all the same, never re-sent.
        (JobStatus::Failed, _) if job.canceled_at.is_some() => Some(JobChange::Canceled),
        (JobStatus::Failed, _) if reaped_by_coder(job) => Some(JobChange::Reaped),
        (JobStatus::Failed, _) => Some(JobChange::Failed),
        // Pending (not yet stuck, or already reported), running on, canceling, or a status this
        // version does not know: wait for the next look.
        _ => None,
    }
}

/// Whether provisioners answer again after a reap at `reaped_at`: a build of a workspace in the
/// same organization has completed since (Coder's clock on both sides). `completed` is every
/// listed workspace's organization and its latest build's completion time.
pub fn provisioners_answer<'a>(
    organization: &str,
    reaped_at: DateTime<Utc>,
    mut completed: impl Iterator<Item = (&'a str, Option<DateTime<Utc>>)>,
) -> bool {
    completed.any(|(org, done)| org == organization && done.is_some_and(|t| t > reaped_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(status: JobStatus, error: Option<&str>) -> ProvisionerJob {
        ProvisionerJob {
            id: "j".into(),
            status,
            completed_at: None,
            error: error.map(str::to_string),
            canceled_at: None,
            tags: Default::default(),
        }
    }

    const REAPED: &str = "Coder: Build has been detected as pending for 30 minutes and has been terminated by the reaper.";
    const HUNG: &str = "Coder: Build has been detected as hung for 5 minutes and has been terminated by the reaper.";

    #[test]
    fn every_job_status_moves_a_stop_as_documented() {
        let sent = StopState::Sent { build_id: "b".into() };
        let running = StopState::Running { build_id: "b".into() };
        let stuck = StopState::Stuck { build_id: "b".into() };
        let timeout = Duration::minutes(10);
        let (young, old) = (Duration::minutes(1), Duration::minutes(11));
        use JobStatus::*;
        // (state, job status, job error, pending for, stuck reported, change)
        type Case<'a> = (&'a StopState, JobStatus, Option<&'a str>, Duration, bool, Option<JobChange>);
        let cases: [Case; 16] = [
            (&sent, Pending, None, young, false, None),
            (&sent, Pending, None, old, false, Some(JobChange::Stuck)),
            // Once per idle episode: a stop sent again after a reap is not reported stuck twice.
            (&sent, Pending, None, old, true, None),
            (&stuck, Pending, None, old, true, None),
            (&sent, Running, None, young, false, Some(JobChange::Running)),
            (&stuck, Running, None, old, true, Some(JobChange::Running)),
            (&running, Running, None, old, false, None),
            (&running, Canceling, None, old, false, None),
            (&running, Succeeded, None, old, false, Some(JobChange::Succeeded)),
            (&stuck, Succeeded, None, old, true, Some(JobChange::Succeeded)),
            (&running, Failed, Some("terraform apply: context deadline exceeded"), old, false, Some(JobChange::Failed)),
            (&stuck, Failed, Some(REAPED), old, true, Some(JobChange::Reaped)),
            (&running, Failed, Some(HUNG), old, false, Some(JobChange::Reaped)),
            (&sent, Canceled, None, young, false, Some(JobChange::Canceled)),
            (&StopState::Canceled, Succeeded, None, old, false, None),
            (&sent, JobStatus::Unknown, None, old, true, None),
        ];
        for (state, status, error, pending_for, reported, want) in cases {
            let got = job_change(state, &job(status, error), pending_for, timeout, reported);
            assert_eq!(got, want, "{} + job {} ({error:?}), pending {pending_for}, reported {reported}", state.as_str(), status.as_str());
        }
    }

    #[test]
    fn a_stop_canceled_while_running_is_canceled_whatever_its_error_says() {
        let canceled_at = DateTime::<Utc>::from_timestamp(1_764_583_200, 0);
        let timed_out = ProvisionerJob { canceled_at, ..job(JobStatus::Failed, Some("Cancel timed out")) };
        let running = StopState::Running { build_id: "b".into() };
        let change = job_change(&running, &timed_out, Duration::zero(), Duration::minutes(10), false);
        assert_eq!(change, Some(JobChange::Canceled), "not `failed`: it is not sent again after a back-off");
        let canceling = ProvisionerJob { canceled_at, ..job(JobStatus::Canceling, None) };
        assert_eq!(job_change(&running, &canceling, Duration::zero(), Duration::minutes(10), false), None, "wait for the end");
        let reaped = ProvisionerJob { canceled_at, ..job(JobStatus::Failed, Some(REAPED)) };
        assert_eq!(job_change(&running, &reaped, Duration::zero(), Duration::minutes(10), false), Some(JobChange::Canceled));
    }

    #[test]
    fn only_the_reapers_own_message_is_a_reap() {
        assert!(reaped_by_coder(&job(JobStatus::Failed, Some(REAPED))));
        assert!(reaped_by_coder(&job(JobStatus::Failed, Some(HUNG))));
        assert!(!reaped_by_coder(&job(JobStatus::Failed, Some("a provisioner said: terminated by the reaper"))));
        assert!(!reaped_by_coder(&job(JobStatus::Failed, None)));
        assert!(!reaped_by_coder(&job(JobStatus::Canceled, Some(REAPED))));
    }

    #[test]
    fn provisioners_answer_again_when_a_build_in_the_organization_completed_after_the_reap() {
        let reaped = DateTime::<Utc>::from_timestamp(1_764_583_200, 0).unwrap_or_default();
        let later = Some(reaped + Duration::seconds(5));
        let earlier = Some(reaped - Duration::seconds(5));
        assert!(provisioners_answer("a", reaped, [("b", later), ("a", later)].into_iter()));
        assert!(!provisioners_answer("a", reaped, [("b", later), ("a", earlier), ("a", None)].into_iter()));
        assert!(!provisioners_answer("a", reaped, std::iter::empty()));
    }
}
