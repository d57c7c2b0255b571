//! Blindness: a GPU source that answers while no running workspace maps to any of its series
//! reads like a fleet of idle CPU workspaces: nothing is judged, nothing is stopped, and nothing
//! said. `Blindness` counts such passes; from `BLIND_PASSES` in a row it is a problem (the status
//! document's `problems`, the page's banner) and a WARN line at most once an hour, naming the
//! likely cause (`likely_cause`: the namespace filter, the workspace label, pod names of no
//! running workspace, or no series at all). Pure: `now` comes in.

use chrono::{DateTime, Duration, Utc};

use crate::gpu::{GpuSeries, Ownership};

/// Passes in a row with no listed workspace mapped to a GPU series before it is a problem.
pub const BLIND_PASSES: u32 = 3;

/// A blind source is logged again after this.
pub const SAY_AGAIN: Duration = Duration::hours(1);

/// The blind passes so far, and when it was last logged.
#[derive(Debug, Default)]
pub struct Blindness {
    streak: u32,
    said_at: Option<DateTime<Utc>>,
}

/// One pass's reading: the problem while blind, and whether to log it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sight {
    pub problem: Option<String>,
    pub say: bool,
}

impl Blindness {
    /// One pass. `answered`: the source answered (no failure: a failing source is said as one);
    /// `mapped`: listed workspaces with GPU series; `without`: running workspaces of GPU
    /// templates whose agents are connected and that have none (`cause` names why, asked only
    /// when it is a problem).
    pub fn pass(&mut self, now: DateTime<Utc>, answered: bool, mapped: usize, without: usize, cause: impl FnOnce() -> String) -> Sight {
        if !answered {
            return Sight { problem: None, say: false };
        }
        if mapped > 0 || without == 0 {
            self.streak = 0;
            return Sight { problem: None, say: false };
        }
        self.streak = self.streak.saturating_add(1);
        if self.streak < BLIND_PASSES {
            return Sight { problem: None, say: false };
        }
        let say = self.said_at.is_none_or(|at| now - at >= SAY_AGAIN);
        if say {
            self.said_at = Some(now);
        }
        let problem = format!(
            "no GPU series maps to any of the {without} running GPU workspace(s) for {} passes: nothing is judged or reclaimed; {}",
            self.streak,
            cause()
        );
        Sight { problem: Some(problem), say }
    }
}

/// Why no GPU series names a running workspace, as far as the series tell: the namespace filter,
/// the workspace label, pods of no running workspace, or no series at all (`source` says which
/// source and, behind Prometheus, which jobs were read).
pub fn likely_cause(series: &[GpuSeries], ownership: &Ownership, source: &str) -> String {
    if series.is_empty() {
        return format!(
            "{source} returned no GPU series with a workspace pod: check dcgm-exporter runs with --kubernetes and that its pod labels (`exported_pod` behind Prometheus, `pod`, `pod_name` with -o) are kept"
        );
    }
    let with_pod: Vec<&GpuSeries> = series.iter().filter(|s| s.key.pod.is_some()).collect();
    let other_namespace = |want: &str| with_pod.iter().find_map(|s| s.namespace.as_deref().filter(|ns| *ns != want));
    if let Some((want, other)) = ownership.namespace.as_deref().and_then(|want| Some((want, other_namespace(want)?))) {
        return format!("GPU series name workspace pods, but in namespace {other:?}, not the namespace filter {want:?}: fix `namespace`");
    }
    if let Some(l) = ownership.workspace_id_label.as_deref().filter(|_| !with_pod.is_empty()) {
        return format!(
            "GPU series name workspace pods, but none carries a running workspace's id in the label `{l}` (workspace_id_label) or in its pod name: remove the setting, or export the pod label (dcgm-exporter --kubernetes-enable-pod-labels)"
        );
    }
    if let Some(pod) = with_pod.iter().find_map(|s| s.key.pod.as_deref()) {
        return format!(
            "GPU series name pods (e.g. {pod:?}), but of no running workspace (stale pod labels, or another Coder's workspaces)"
        );
    }
    let by = ownership.workspace_id_label.as_deref().map_or_else(
        || "a pod label (`exported_pod`, `pod_name` with -o, or `pod`) holding `coder-<workspace id>-...`".to_string(),
        |l| format!("the label `{l}` (workspace_id_label)"),
    );
    let filter = ownership.namespace.as_deref().map_or(String::new(), |ns| format!(" in namespace {ns:?} (the namespace filter)"));
    format!("no GPU series{filter} names a workspace by {by}: check dcgm-exporter's --kubernetes and the label names kept")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(minutes: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_000_000 + minutes * 60, 0).unwrap_or_default()
    }

    #[test]
    fn three_blind_passes_are_a_problem_said_once_an_hour() {
        let mut b = Blindness::default();
        let cause = || "the cause".to_string();
        // (minute, answered, mapped, without, problem?, say?)
        let table = [
            (0, true, 0, 2, false, false),
            (1, true, 0, 2, false, false),
            (2, true, 0, 2, true, true),
            (3, true, 0, 2, true, false),
            (4, false, 0, 2, false, false), // a failing source is said as one; the streak holds
            (5, true, 0, 2, true, false),
            (63, true, 0, 2, true, true),   // an hour after the last line
            (64, true, 1, 2, false, false), // one workspace maps: sight again
            (65, true, 0, 2, false, false),
            (66, true, 0, 0, false, false), // no GPU workspace runs: nothing to miss
            (67, true, 0, 2, false, false),
        ];
        for (m, answered, mapped, without, problem, say) in table {
            let s = b.pass(t(m), answered, mapped, without, cause);
            assert_eq!((s.problem.is_some(), s.say), (problem, say), "minute {m}: {s:?}");
        }
        let s = Blindness { streak: 2, said_at: None }.pass(t(0), true, 0, 3, cause);
        assert_eq!(
            s.problem.as_deref(),
            Some("no GPU series maps to any of the 3 running GPU workspace(s) for 3 passes: nothing is judged or reclaimed; the cause")
        );
    }
}
