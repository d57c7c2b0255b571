//! What really happened to each workspace, as the backtest reads it back: its builds (Coder keeps
//! them forever), the moments it was in use (a connection source), and its agent's states. From
//! these, `WorkspaceTimeline::listed_at` rebuilds the workspace as a `status:running` listing at
//! that moment would have shown it, for the replay to judge. Also the rule for coderd's agent-stat
//! gauges, which repeat their last values while nobody in the deployment is connected.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::builds::{Id, PastBuild, keep_all};
use crate::coder::types::{
    AgentLifecycle, AgentStatus, BuildParameter, BuildReason, CoderId, JobStatus, PREBUILDS_USER_ID, Transition, Workspace, WorkspaceBuild,
};

/// Where the moments of use came from, in the order the backtest prefers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionSource {
    /// `run --history-journal`: each move of `last_used_at` as a pass saw it.
    Journal,
    /// coderd's `coderd_agentstats_connection_count` in the same Prometheus, where fresh.
    CoderdMetrics,
    /// Nothing: the GPU alone is the evidence; each session counts as used at its start only.
    None,
}

impl ConnectionSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionSource::Journal => "journal",
            ConnectionSource::CoderdMetrics => "coderd_metrics",
            ConnectionSource::None => "none",
        }
    }

    /// Figures that depend on connections are upper bounds: with no connection seen, every
    /// idle GPU counts as unattended.
    pub fn is_upper_bound(self) -> bool {
        self == ConnectionSource::None
    }
}

/// One workspace's real history over the window.
#[derive(Debug, Clone)]
pub struct WorkspaceTimeline {
    /// As Coder answers it now (`include_deleted=true`): owner, name, template, organization.
    /// Without its `latest_build`: a listing at a moment shows that moment's build.
    pub record: WorkspaceRecord,
    /// Its builds, oldest first: the one current at the window's start and every later one,
    /// kept compactly (`PastBuild`).
    pub builds: Vec<PastBuild>,
    /// Who asked for them, each user once (`PastBuild::initiator`).
    pub initiators: Box<[Id]>,
    /// Moments of use in time order (by `last_used_at`): when it was seen (`seen`) and the
    /// `last_used_at` then.
    pub uses: Vec<Use>,
    /// Agent states the journal saw, in time order: (seen, build id, status).
    pub agents: Vec<(DateTime<Utc>, String, AgentStatus)>,
    /// The parameters of builds the journal saw without a connected agent (a start that may
    /// have waited for a GPU), by build id: a CPU variant's start is judged as `run` judges it.
    pub parameters: HashMap<String, Vec<BuildParameter>>,
}

/// What a listing is built from (`listing_state`): the running build's place in `builds`, and
/// the moments of use, agent states and the build's agent moments seen by then.
pub type ListingKey = (usize, usize, usize, usize);

/// A workspace's record as a timeline holds it for the whole window: every field of `Workspace`
/// but `latest_build`, which a listing at a moment takes from that moment's build (`listing`).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceRecord {
    pub id: String,
    pub name: String,
    pub owner_name: String,
    pub owner_id: CoderId,
    pub template_name: String,
    pub template_id: CoderId,
    pub organization_id: CoderId,
    pub organization_name: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: DateTime<Utc>,
    pub ttl_ms: Option<i64>,
    pub autostart_schedule: Option<String>,
    pub is_prebuild: bool,
    pub task_id: Option<String>,
}

impl From<Workspace> for WorkspaceRecord {
    fn from(w: Workspace) -> Self {
        let Workspace {
            id,
            name,
            owner_name,
            owner_id,
            template_name,
            template_id,
            organization_id,
            organization_name,
            created_at,
            last_used_at,
            latest_build: _,
            ttl_ms,
            autostart_schedule,
            is_prebuild,
            task_id,
        } = w;
        WorkspaceRecord {
            id,
            name,
            owner_name,
            owner_id,
            template_name,
            template_id,
            organization_id,
            organization_name,
            created_at,
            last_used_at,
            ttl_ms,
            autostart_schedule,
            is_prebuild,
            task_id,
        }
    }
}

impl WorkspaceRecord {
    /// The workspace as a listing shows it with `latest_build` as its build.
    pub fn listing(&self, latest_build: WorkspaceBuild) -> Workspace {
        Workspace {
            id: self.id.clone(),
            name: self.name.clone(),
            owner_name: self.owner_name.clone(),
            owner_id: self.owner_id.clone(),
            template_name: self.template_name.clone(),
            template_id: self.template_id.clone(),
            organization_id: self.organization_id.clone(),
            organization_name: self.organization_name.clone(),
            created_at: self.created_at,
            last_used_at: self.last_used_at,
            latest_build,
            ttl_ms: self.ttl_ms,
            autostart_schedule: self.autostart_schedule.clone(),
            is_prebuild: self.is_prebuild,
            task_id: self.task_id.clone(),
        }
    }
}

/// One moment of use: from `seen` on, `last_used_at` read `last_used_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    pub seen: DateTime<Utc>,
    pub last_used_at: DateTime<Utc>,
}

impl WorkspaceTimeline {
    pub fn new(record: Workspace, mut builds: Vec<WorkspaceBuild>) -> Self {
        builds.sort_by_key(|b| b.created_at);
        // `listed_at` shows the build of the moment: the record's own is never read, and it
        // would be held (336 bytes inline), and copied with every listing, for the whole window.
        let record = WorkspaceRecord::from(record);
        let (builds, initiators) = keep_all(builds);
        WorkspaceTimeline { record, builds, initiators, uses: Vec::new(), agents: Vec::new(), parameters: HashMap::new() }
    }

    /// How many of `builds` were created at or before `t` (the rest come after it).
    fn builds_by(&self, t: DateTime<Utc>) -> usize {
        self.builds.partition_point(|b| b.created_at.is_none_or(|c| c <= t))
    }

    /// Where in `builds` the build current at `t` is: the latest created at or before it.
    fn current_at(&self, t: DateTime<Utc>) -> Option<usize> {
        self.builds_by(t).checked_sub(1)
    }

    /// Where in `builds` the build that had it running at `t` is: a start whose job succeeded
    /// by then.
    pub fn running_index_at(&self, t: DateTime<Utc>) -> Option<usize> {
        self.current_at(t).filter(|&i| self.builds.get(i).is_some_and(|b| b.running_by(t)))
    }

    /// What a listing at `t` is built from (`None`: it was not running): its build, and how
    /// many moments of use, agent states and agent moments of that build were seen by then;
    /// and the first moment after `t` at which that may change (a build begins or the current
    /// one ends, the next use, agent state or agent moment). Passes until then read it as it is.
    pub fn listing_state(&self, t: DateTime<Utc>) -> (Option<ListingKey>, DateTime<Utc>) {
        let after = self.builds_by(t);
        let current = after.checked_sub(1).and_then(|i| self.builds.get(i).map(|b| (i, b)));
        let next_build = self.builds.get(after).and_then(|b| b.created_at);
        let ends = current.and_then(|(_, b)| b.completed_at.or(b.created_at)).filter(|&done| done > t);
        let soonest = |times: &[Option<DateTime<Utc>>]| times.iter().flatten().min().copied().unwrap_or(DateTime::<Utc>::MAX_UTC);
        let Some((b, build)) = current.filter(|(_, b)| b.running_by(t)) else {
            return (None, soonest(&[next_build, ends]));
        };
        let uses = self.uses_by(t);
        let agents = self.agents.partition_point(|(seen, _, _)| *seen <= t);
        let (mut moments, mut next_moment) = (0, None::<DateTime<Utc>>);
        for m in build.agents().flat_map(|a| [a.first_connected_at, a.last_connected_at, a.disconnected_at]).flatten() {
            if m <= t {
                moments += 1;
            } else {
                next_moment = Some(next_moment.map_or(m, |n| n.min(m)));
            }
        }
        let next_use = self.uses.get(uses).map(|u| u.last_used_at);
        let next_agent = self.agents.get(agents).map(|(seen, _, _)| *seen);
        (Some((b, uses, agents, moments)), soonest(&[next_build, next_use, next_agent, next_moment]))
    }

    /// The build that had it running at `t`.
    pub fn running_at(&self, t: DateTime<Utc>) -> Option<&PastBuild> {
        self.running_index_at(t).and_then(|i| self.builds.get(i))
    }

    /// Until when it was a prebuild: the creation of the first build another user initiated,
    /// when its builds begin with the prebuilds user's (`DateTime::MAX_UTC`: never claimed).
    pub fn prebuild_until(&self) -> Option<DateTime<Utc>> {
        let by_prebuilds =
            |b: &PastBuild| b.initiator(&self.initiators).is_some_and(|i| i.text(&mut [0; 36]).eq_ignore_ascii_case(PREBUILDS_USER_ID));
        if !self.builds.first().is_some_and(by_prebuilds) {
            return None;
        }
        Some(self.builds.iter().find(|b| !by_prebuilds(b)).and_then(|b| b.created_at).unwrap_or(DateTime::<Utc>::MAX_UTC))
    }

    /// The first start build created after `t` (a stop simulated at `t` lasts until it).
    pub fn next_start_after(&self, t: DateTime<Utc>) -> Option<&PastBuild> {
        let i = self.builds_by(t);
        self.builds[i..].iter().find(|b| b.transition == Transition::Start)
    }

    /// How long it really ran (held its GPU) within `[from, to)`, in seconds.
    pub fn running_seconds(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
        let mut total = 0.0;
        for (i, b) in self.builds.iter().enumerate() {
            if b.transition != Transition::Start || b.job_status != JobStatus::Succeeded {
                continue;
            }
            let Some(began) = b.completed_at.or(b.created_at) else { continue };
            // A stop that did not succeed (failed, canceled, reaped) leaves the pod and its GPU:
            // it ran on until a later build ends it, a stop that succeeded or another start.
            let ends = |n: &&PastBuild| n.transition != Transition::Stop || n.job_status == JobStatus::Succeeded;
            let ended = self.builds[i + 1..].iter().find(ends).and_then(|n| n.created_at).unwrap_or(to);
            let (a, z) = (began.max(from), ended.min(to));
            if z > a {
                total += (z - a).num_milliseconds() as f64 / 1000.0;
            }
        }
        total
    }

    /// `last_used_at` at `t`: the latest moment of use at or before it (the journal records
    /// when Coder says it was used, seen by a pass up to a minute later: a pass at `t` is
    /// judged on the use itself), else its session's start (no use seen: the GPU alone is the
    /// evidence).
    pub fn last_used_at(&self, t: DateTime<Utc>, session: &PastBuild) -> DateTime<Utc> {
        let i = self.uses_by(t);
        let start = session.created_at.unwrap_or(self.record.created_at);
        i.checked_sub(1).and_then(|i| self.uses.get(i)).map_or(start, |u| u.last_used_at.max(start))
    }

    /// How many moments of use happened at or before `t` (`uses` is in time order).
    pub fn uses_by(&self, t: DateTime<Utc>) -> usize {
        self.uses.partition_point(|u| u.last_used_at <= t)
    }

    /// Forgets the moments of use before `t` but the latest of them: what a pass after `t`
    /// reads (`last_used_at`, and regret windows that begin after `t`) stays, and a workspace
    /// connected all along costs the moments of the chunk ahead, not of the whole window.
    pub fn forget_uses_before(&mut self, t: DateTime<Utc>) {
        let before = self.uses.partition_point(|u| u.last_used_at < t);
        if before > 1 {
            self.uses.drain(..before - 1);
            give_back_room(&mut self.uses);
        }
    }

    /// Forgets the builds a pass after `t` cannot read: those before the one current at `t`.
    pub fn forget_builds_before(&mut self, t: DateTime<Utc>) {
        let current = self.builds_by(t);
        if current > 1 {
            self.builds.drain(..current - 1);
            give_back_room(&mut self.builds);
        }
    }

    /// Whether a moment of use falls in `(from, to]` (by `last_used_at`).
    pub fn used_within(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.uses.iter().map(|u| u.last_used_at).find(|&at| at > from && at <= to)
    }

    /// A start build by the owner created in `(from, to]`.
    pub fn owner_started_within(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.builds
            .iter()
            // Autostart builds carry the owner as initiator too (NOTES §18): only `reason` tells
            // a scheduled start from the owner coming back.
            .filter(|b| b.transition == Transition::Start && b.reason != BuildReason::Autostart)
            .filter(|b| b.initiator(&self.initiators).is_some_and(|i| i.is(&self.record.owner_id)))
            .filter_map(|b| b.created_at)
            .find(|&at| at > from && at <= to)
    }

    /// The workspace as a `status:running` listing at `t` would have shown it, when it ran:
    /// its record with that build as the latest, `last_used_at` by the connection source, and
    /// each agent's state (the journal's, else the build's own connection times).
    pub fn listed_at(&self, t: DateTime<Utc>) -> Option<Workspace> {
        let build = self.running_at(t)?;
        let mut ws = self.record.listing(build.build(&self.initiators)?);
        // A claim keeps the workspace's id and changes its owner in place; the builds before it
        // keep the prebuilds user as initiator (NOTES §18): until the claimer's first build it
        // was a prebuild, whoever owns it now.
        if self.prebuild_until().is_some_and(|claimed| t < claimed) {
            ws.owner_id = PREBUILDS_USER_ID.into();
            ws.owner_name = "prebuilds".into();
            ws.is_prebuild = true;
        }
        ws.last_used_at = self.last_used_at(t, build);
        ws.latest_build.status = crate::coder::types::WorkspaceStatus::Running;
        // The journal records the first agent's status only.
        let seen = self.agents.partition_point(|(seen, _, _)| *seen <= t);
        let journal = self.agents[..seen].iter().rev().find(|(_, id, _)| build.id.is(id)).map(|(_, _, s)| *s);
        for (i, agent) in ws.latest_build.resources.iter_mut().flat_map(|r| r.agents.iter_mut()).enumerate() {
            agent_at(agent, t, journal.filter(|_| i == 0));
        }
        Some(ws)
    }
}

/// An agent as it was at `t`: the journal's status when it saw one for this build, else from
/// the build's record: connected from `first_connected_at` on, disconnected from a later
/// `disconnected_at`, connecting before it ever connected.
fn agent_at(agent: &mut crate::coder::types::WorkspaceAgent, t: DateTime<Utc>, journal: Option<AgentStatus>) {
    let connected = agent.first_connected_at.filter(|c| *c <= t);
    let lost = agent.disconnected_at.filter(|d| *d <= t && connected.is_some_and(|c| *d >= c));
    agent.status = match (journal, connected, lost) {
        (Some(s), _, _) => s,
        (None, None, _) => AgentStatus::Connecting,
        (None, Some(_), Some(_)) => AgentStatus::Disconnected,
        (None, Some(_), None) => AgentStatus::Connected,
    };
    if agent.status == AgentStatus::Connecting || agent.status == AgentStatus::Timeout {
        agent.first_connected_at = None;
        agent.last_connected_at = None;
        agent.disconnected_at = None;
        agent.lifecycle_state = AgentLifecycle::Starting;
    } else {
        agent.first_connected_at = connected.or(agent.first_connected_at);
        agent.last_connected_at = agent.last_connected_at.filter(|l| *l <= t).or(connected);
        agent.disconnected_at = lost;
        agent.lifecycle_state = AgentLifecycle::Ready;
    }
}

/// coderd's agent-stat gauges (`coderd_agentstats_connection_count`, rx/tx bytes) at one step
/// of the deployment: per (owner, workspace name), the connection count and the bytes since the
/// last tick. coderd commits new values only when some agent in the deployment reported
/// connection stats since its last tick (`prometheusmetrics.go`: `if len(stats) > 0`), so while
/// nobody anywhere is connected the last values persist (reference coder NOTES §17): a step
/// whose every gauge equals the previous step's is a repeat and no evidence of anything, and a
/// workspace whose values equal its previous ones was not committed afresh; only agents with a
/// connection appear (idle is absent, not 0).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GaugeStep {
    pub by_workspace: HashMap<(String, String), (f64, f64)>,
}

/// Reads a run of gauge steps into moments of use per (owner, workspace name): a workspace with a
/// connection count above zero was in use at a step where its values differ from the step
/// before (a fresh commit of its own).
#[derive(Debug, Default)]
pub struct GaugeReader {
    previous: Option<GaugeStep>,
    /// Steps read, and how many were repeats (no evidence).
    pub steps: usize,
    pub repeats: usize,
}

impl GaugeReader {
    /// The workspaces in use at this step: a connection count above zero in a fresh commit of
    /// that workspace's gauges. Freshness is per workspace, not per step: a step may hold one
    /// person's first commit beside the repeated values of people who left (NOTES §18), and
    /// a real commit changes that workspace's values (its rx/tx bytes since the last tick).
    pub fn read(&mut self, step: GaugeStep) -> Vec<(String, String)> {
        self.steps += 1;
        let previous = self.previous.as_ref();
        if previous.is_some_and(|p| *p == step) && !step.by_workspace.is_empty() {
            self.repeats += 1;
        }
        let mut used: Vec<(String, String)> = step
            .by_workspace
            .iter()
            .filter(|(_, (connections, _))| *connections > 0.0)
            .filter(|(key, values)| previous.and_then(|p| p.by_workspace.get(*key)) != Some(*values))
            .map(|(k, _)| k.clone())
            .collect();
        used.sort();
        self.previous = Some(step);
        used
    }
}

/// A list that was drained holds its old room until it grows again: past half empty, it is
/// moved into one of its own size. The builds read up front (11 a workspace over 7 days at
/// 10,000 workspaces) are forgotten as the replay passes them, and their room goes with them.
fn give_back_room<T>(list: &mut Vec<T>) {
    if list.len() * 2 < list.capacity() {
        list.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(m: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + m * 60, 0).unwrap()
    }

    fn build(id: &str, transition: &str, m: i64, connected: Option<i64>) -> WorkspaceBuild {
        let agents = connected.map_or(serde_json::json!([]), |c| {
            serde_json::json!([{"agents": [{"id": "a", "status": "disconnected", "first_connected_at": at(c), "last_connected_at": at(c)}]}])
        });
        serde_json::from_value(serde_json::json!({
            "id": id, "created_at": at(m), "transition": transition, "status": "stopped",
            "job": {"id": "j", "status": "succeeded", "completed_at": at(m)}, "resources": agents,
            "initiator_id": "owner"
        }))
        .unwrap()
    }

    fn timeline(builds: Vec<WorkspaceBuild>) -> WorkspaceTimeline {
        let record: Workspace = serde_json::from_value(serde_json::json!({
            "id": "w", "name": "n", "owner_name": "alice", "owner_id": "owner", "created_at": at(-100),
            "last_used_at": at(-100), "latest_build": builds[0].clone()
        }))
        .unwrap();
        WorkspaceTimeline::new(record, builds)
    }

    #[test]
    fn a_record_keeps_every_field_of_the_workspace_but_its_build() {
        let ws: Workspace = serde_json::from_value(serde_json::json!({
            "id": "w", "name": "n", "owner_name": "alice", "owner_id": "owner", "template_name": "gpu", "template_id": "t",
            "organization_id": "o", "organization_name": "org", "created_at": at(-100), "last_used_at": at(-50),
            "latest_build": build("b1", "start", 0, Some(2)), "ttl_ms": 3_600_000, "autostart_schedule": "CRON_TZ=UTC 0 9 * * 1-5",
            "is_prebuild": true, "task_id": "task"
        }))
        .unwrap();
        let record = WorkspaceRecord::from(ws.clone());
        assert_eq!(record.listing(ws.latest_build.clone()), ws);
        assert_ne!(record.listing(build("b2", "stop", 60, None)), ws, "the listing's build is the one given");
    }

    #[test]
    fn a_listing_at_a_moment_shows_the_build_and_agent_of_that_moment() {
        let t = timeline(vec![build("b1", "start", 0, Some(2)), build("b2", "stop", 60, None), build("b3", "start", 120, None)]);
        assert!(t.listed_at(at(-1)).is_none(), "before its first build");
        let starting = t.listed_at(at(1)).unwrap();
        assert_eq!(starting.latest_build.agents().next().unwrap().status, AgentStatus::Connecting, "before first_connected_at");
        let up = t.listed_at(at(30)).unwrap();
        assert_eq!(up.latest_build.id, "b1");
        assert_eq!(up.latest_build.agents().next().unwrap().status, AgentStatus::Connected, "the API's status now is not then");
        assert!(t.listed_at(at(90)).is_none(), "stopped");
        assert_eq!(t.listed_at(at(130)).unwrap().latest_build.id, "b3");
        assert_eq!(t.next_start_after(at(0)).map(|b| b.id.to_string()).as_deref(), Some("b3"));
        assert_eq!(t.running_seconds(at(30), at(150)), 60.0 * 60.0, "30 min of b1 and 30 of b3");
        assert_eq!(t.owner_started_within(at(100), at(130)), Some(at(120)));
        assert_eq!(t.owner_started_within(at(120), at(130)), None, "after, not at");
        let mut t = t;
        t.forget_builds_before(at(90));
        assert_eq!(t.builds.iter().map(|b| b.id.to_string()).collect::<Vec<_>>(), ["b2", "b3"], "the one current at 90 and later");
        assert_eq!(t.running_seconds(at(30), at(150)), 30.0 * 60.0, "b1 forgotten");
        assert_eq!(t.listed_at(at(130)).unwrap().latest_build.id, "b3");
    }

    /// A listing's state holds until the moment `listing_state` names, and that moment is
    /// never later than a change: checked minute by minute against the state read afresh.
    #[test]
    fn a_listing_state_holds_until_the_next_moment_that_can_change_it() {
        let mut b3 = build("b3", "start", 120, Some(125));
        b3.job.completed_at = Some(at(123));
        let mut t = timeline(vec![build("b1", "start", 0, Some(2)), build("b2", "stop", 60, None), b3]);
        t.uses = vec![Use { seen: at(11), last_used_at: at(10) }, Use { seen: at(31), last_used_at: at(30) }];
        t.agents = vec![(at(40), "b1".into(), AgentStatus::Connected), (at(130), "b3".into(), AgentStatus::Connected)];
        let read = |m: i64| t.listing_state(at(m)).0;
        let mut changes = 0;
        for m in -5..200 {
            let (key, until) = t.listing_state(at(m));
            assert!(until > at(m), "minute {m}");
            let stable_to = (m..200).take_while(|&n| at(n) < until).last().unwrap_or(m);
            for n in m..=stable_to {
                assert_eq!(read(n), key, "minute {n}, within the state read at {m} (until {until})");
            }
            changes += usize::from(read(m + 1) != key);
        }
        assert!(changes >= 8, "the table moves: builds, uses, agents and moments ({changes} changes)");
        assert_eq!(t.listing_state(at(60)), (None, at(120)), "stopped: until the next build");
        assert_eq!(t.listing_state(at(121)), (None, at(123)), "starting: until its job is done");
        assert_eq!(t.listing_state(at(190)).1, DateTime::<Utc>::MAX_UTC, "nothing after: for good");
    }

    #[test]
    fn last_used_at_is_the_latest_use_by_then_else_the_session_start() {
        let mut t = timeline(vec![build("b1", "start", 0, Some(1))]);
        let session = t.builds[0].clone();
        assert_eq!(t.last_used_at(at(10), &session), at(0), "no use: the session's start");
        t.uses = vec![Use { seen: at(6), last_used_at: at(5) }, Use { seen: at(21), last_used_at: at(20) }];
        assert_eq!(t.last_used_at(at(5), &session), at(5), "judged on the use itself, not when a pass saw it");
        assert_eq!(t.last_used_at(at(19), &session), at(5));
        assert_eq!(t.used_within(at(5), at(20)), Some(at(20)));
        assert_eq!(t.used_within(at(20), at(50)), None);
        t.uses.push(Use { seen: at(31), last_used_at: at(30) });
        t.forget_uses_before(at(25));
        assert_eq!(t.uses.len(), 2, "the latest before 25 stays, for last_used_at");
        assert_eq!(t.last_used_at(at(26), &session), at(20));
        assert_eq!(t.used_within(at(25), at(40)), Some(at(30)));
    }

    #[test]
    fn repeated_gauges_are_no_evidence_and_idle_agents_are_absent() {
        let step = |pairs: &[(&str, f64, f64)]| GaugeStep {
            by_workspace: pairs.iter().map(|(w, c, b)| (("alice".to_string(), w.to_string()), (*c, *b))).collect(),
        };
        let mut r = GaugeReader::default();
        assert_eq!(r.read(step(&[("a", 1.0, 100.0), ("b", 0.0, 5.0)])), vec![("alice".to_string(), "a".to_string())]);
        assert_eq!(r.read(step(&[("a", 1.0, 180.0)])), vec![("alice".to_string(), "a".to_string())], "fresh: bytes moved");
        assert!(r.read(step(&[("a", 1.0, 180.0)])).is_empty(), "the same values again: nobody in the deployment connected");
        assert!(r.read(step(&[])).is_empty(), "no gauge: nobody connected");
        assert_eq!((r.steps, r.repeats), (4, 1));
    }

    /// Three people left at 23:36; their last values repeat in every later commit. Another
    /// person's first commit makes a step unlike the one before: the three are not in use.
    #[test]
    fn freshness_is_per_workspace_in_a_step_that_mixes_a_repeated_set_and_a_fresh_commit() {
        let step = |pairs: &[(&str, f64, f64)]| GaugeStep {
            by_workspace: pairs.iter().map(|(w, c, b)| (("u".to_string(), w.to_string()), (*c, *b))).collect(),
        };
        let left = [("a", 1.0, 300.0), ("b", 2.0, 40.0), ("c", 1.0, 12.0)];
        let mut r = GaugeReader::default();
        assert_eq!(r.read(step(&left)).len(), 3, "23:36: their last commit");
        assert!(r.read(step(&left)).is_empty(), "23:37: repeated");
        let mut mixed = left.to_vec();
        mixed.push(("d", 1.0, 90.0));
        assert_eq!(r.read(step(&mixed)), [("u".to_string(), "d".to_string())], "01:05: only d's commit is fresh");
        mixed[3] = ("d", 1.0, 95.0);
        mixed[0] = ("a", 1.0, 310.0);
        let used = r.read(step(&mixed));
        assert_eq!(used, [("u".to_string(), "a".to_string()), ("u".to_string(), "d".to_string())], "a came back");
    }

    #[test]
    fn a_claimed_prebuild_was_a_prebuild_until_its_claim() {
        let mut b1 = build("b1", "start", 0, Some(1));
        b1.initiator_id = Some(PREBUILDS_USER_ID.into());
        let mut b2 = build("b2", "start", 120, Some(121));
        b2.initiator_id = Some("owner".into());
        let t = timeline(vec![b1.clone(), b2]);
        assert_eq!(t.prebuild_until(), Some(at(120)));
        let before = t.listed_at(at(60)).unwrap();
        assert!(before.is_prebuild() && before.owner_name == "prebuilds", "judged as run judged it then: a prebuild");
        let after = t.listed_at(at(130)).unwrap();
        assert!(!after.is_prebuild() && after.owner_name == "alice", "the claimer's from the claim on");
        assert_eq!(timeline(vec![build("b1", "start", 0, None)]).prebuild_until(), None, "never a prebuild");
        assert_eq!(timeline(vec![b1]).prebuild_until(), Some(DateTime::<Utc>::MAX_UTC), "not claimed yet");
    }

    #[test]
    fn a_failed_stop_leaves_the_gpu_held_until_a_stop_succeeds() {
        let mut failed = build("s1", "stop", 60, None);
        failed.job.status = JobStatus::Failed;
        let t = timeline(vec![build("b1", "start", 0, Some(1)), failed, build("s2", "stop", 100, None)]);
        assert_eq!(t.running_seconds(at(30), at(200)), 70.0 * 60.0, "from 30 to the stop that succeeded at 100");
        assert!(t.listed_at(at(80)).is_none(), "not listed running meanwhile, as Coder lists it");
    }

    #[test]
    fn an_autostart_is_not_the_owner_coming_back() {
        let mut auto = build("b2", "start", 120, None);
        auto.reason = BuildReason::Autostart;
        let t = timeline(vec![build("b1", "stop", 0, None), auto, build("b3", "start", 150, None)]);
        assert_eq!(t.owner_started_within(at(100), at(140)), None, "the schedule, not the owner");
        assert_eq!(t.owner_started_within(at(100), at(160)), Some(at(150)));
    }
}
