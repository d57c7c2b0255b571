//! The history journal's vocabulary: what `run` records so that a later backtest knows when each
//! workspace was in use. Coder keeps only the latest `last_used_at` (reference/coder NOTES §17),
//! so each moment it moved, and each change of a running workspace's build or agent, is one line
//! (`JournalLine`), not one per pass. `Tracker` finds the changes between two listings; the
//! service appends them to a file it rotates by size.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::coder::types::Workspace;

/// One change of one workspace, with its whole state after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalLine {
    /// When the pass saw it (this machine's clock).
    pub time: DateTime<Utc>,
    /// What changed: `running` (first seen running, or a new build), `used` (`last_used_at`
    /// moved), `agent` (its agent's status changed) or `gone` (no longer listed running).
    pub change: Change,
    pub workspace_id: String,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub workspace: String,
    #[serde(default)]
    pub template: String,
    /// Coder's `last_used_at` (Coder's clock), as listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub build_id: String,
    /// The first agent's status (`connected`, `connecting`, `disconnected`, `timeout`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Running,
    Used,
    Agent,
    Gone,
}

/// The last state of every workspace listed running, to tell what changed: as many entries as
/// the fleet has running workspaces.
#[derive(Debug, Default)]
pub struct Tracker {
    /// What the journal last wrote of each workspace.
    last: HashMap<String, JournalLine>,
}

impl Tracker {
    /// The lines for one listing seen at `now`: new and rebuilt workspaces, moved `last_used_at`,
    /// changed agents, and workspaces no longer listed (`gone`). The first call writes a
    /// `running` line for each listed workspace.
    pub fn changes<'w>(&mut self, now: DateTime<Utc>, workspaces: impl IntoIterator<Item = &'w Workspace>) -> Vec<JournalLine> {
        let mut out = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for ws in workspaces {
            seen.insert(ws.id.as_str());
            let agent = agent_status(ws);
            // Compared first: a line is built only for a change (most passes change nothing).
            let change = match self.last.get(&ws.id) {
                None => Change::Running,
                Some(l) if l.build_id != ws.latest_build.id => Change::Running,
                Some(l) if l.last_used_at != Some(ws.last_used_at) => Change::Used,
                Some(l) if l.agent.as_deref() != agent => Change::Agent,
                Some(_) => continue,
            };
            let line = JournalLine {
                time: now,
                change,
                workspace_id: ws.id.clone(),
                owner: ws.owner_name.clone(),
                workspace: ws.name.clone(),
                template: ws.template_name.clone(),
                last_used_at: Some(ws.last_used_at),
                build_id: ws.latest_build.id.to_string(),
                agent: agent.map(str::to_string),
            };
            self.last.insert(ws.id.clone(), line.clone());
            out.push(line);
        }
        let gone: Vec<String> = self.last.keys().filter(|id| !seen.contains(id.as_str())).cloned().collect();
        for id in gone {
            if let Some(l) = self.last.remove(&id) {
                out.push(JournalLine { time: now, change: Change::Gone, ..l });
            }
        }
        out
    }
}

fn agent_status(ws: &Workspace) -> Option<&'static str> {
    ws.latest_build.resources.iter().flat_map(|r| r.agents.iter()).next().map(|a| a.status.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspaces() -> Vec<Workspace> {
        let text = include_str!("../../tests/fixtures/coder/workspaces_running.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        serde_json::from_value(v["workspaces"].clone()).unwrap()
    }

    #[test]
    fn only_changes_are_written() {
        let t0: DateTime<Utc> = "2026-11-25T10:00:00Z".parse().unwrap();
        let mut fleet = workspaces();
        assert!(fleet.len() >= 2, "the fixture lists two workspaces or more");
        let mut tracker = Tracker::default();
        let first = tracker.changes(t0, &fleet);
        assert_eq!(first.len(), fleet.len());
        assert!(first.iter().all(|l| l.change == Change::Running));
        let t1 = t0 + chrono::Duration::minutes(1);
        assert!(tracker.changes(t1, &fleet).is_empty(), "nothing changed, nothing written");
        fleet[0].last_used_at += chrono::Duration::seconds(90);
        let moved = tracker.changes(t1, &fleet);
        assert_eq!(moved.len(), 1);
        assert_eq!((moved[0].change, moved[0].workspace_id.as_str()), (Change::Used, fleet[0].id.as_str()));
        assert_eq!(moved[0].last_used_at, Some(fleet[0].last_used_at));
        fleet[1].latest_build.id = "a-new-build".into();
        let gone_id = fleet[0].id.clone();
        let rest: Vec<&Workspace> = fleet.iter().skip(1).collect();
        let lines = tracker.changes(t1, rest);
        let kinds: Vec<(Change, &str)> = lines.iter().map(|l| (l.change, l.workspace_id.as_str())).collect();
        assert!(kinds.contains(&(Change::Running, fleet[1].id.as_str())), "a new build is a new session: {kinds:?}");
        assert!(kinds.contains(&(Change::Gone, gone_id.as_str())), "{kinds:?}");
        let text = serde_json::to_string(&lines[0]).unwrap();
        assert_eq!(serde_json::from_str::<JournalLine>(&text).unwrap(), lines[0], "read back as written");
    }
}
