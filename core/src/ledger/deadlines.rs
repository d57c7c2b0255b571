//! Deadlines and TTLs in the ledger: extensions of Coder's autostop deadline for busy GPU work
//! (`extend_while_busy`, in the fleet rules' slots; a 4xx remembered for the build and not asked
//! again, nor does it take a slot), the autostop each extension averted (once per build, against
//! the deadline Coder reported before the first extension, its activity bumps included), the
//! limit that leaves no extension (said once per build), and TTL restores (`restore_autostop`; a
//! refusal remembered until the template version changes).

use chrono::{DateTime, Utc};

use crate::ids::{IdMap, IdSet};

use super::intent::{Acted, Call, Count, Fact, Failure, LedgerConfig, Level, Listed, Note, PassView, Plan, SaidOnce, Who};
use crate::pass::audit::{AuditEvent, AuditKind, Extension};
use crate::pass::deadline::{DeadlineAction, DeadlinePlan};
use crate::pass::decide::Verdict;

/// A build whose deadline this service moved.
#[derive(Debug, Clone)]
pub(super) struct ExtendedBuild {
    build_id: String,
    /// The deadline Coder reported for the build before this service first moved it.
    original_deadline: DateTime<Utc>,
    /// `autostop_averted` was written for the build (or cannot be known: the deadline had
    /// already passed when first moved, so it was not Coder's own).
    averted: bool,
    event: AuditEvent,
}

/// An extension planned this pass.
#[derive(Debug, Clone)]
pub(super) struct PlannedExtension {
    build_id: String,
    /// Coder's deadline as listed this pass.
    listed_deadline: DateTime<Utc>,
    coder_now: DateTime<Utc>,
    event: AuditEvent,
}

/// The audit event of a deadline extension (or would-be one) from Coder's deadline to `to`.
fn extension_event(
    kind: AuditKind,
    now: DateTime<Utc>,
    mode: &'static str,
    j: &Listed,
    plan: &DeadlinePlan,
    to: DateTime<Utc>,
) -> AuditEvent {
    let ws = &j.workspace;
    AuditEvent {
        build_id: Some(ws.latest_build.id.to_string()),
        extension: Some(Extension {
            deadline_from: plan.deadline,
            deadline_to: to,
            deadline_limit: plan.limit,
            limited_by: plan.limited_by.as_str(),
            sm_active_peak: plan.evidence.sm_active_peak,
            gr_engine_active_peak: plan.evidence.gr_engine_active_peak,
        }),
        ..AuditEvent::new(kind, now, mode, ws, j.decision)
    }
}

/// The workspaces whose deadline is due to be extended, soonest first, each with its plan and
/// the deadline to send.
fn extend_order<'a>(view: &PassView<'a>) -> impl Iterator<Item = (&'a Listed<'a>, &'a DeadlinePlan, DateTime<Utc>)> {
    let judged = view.judged;
    view.fleet.extend_order.iter().filter_map(move |&i| {
        let j = judged.get(i)?;
        let plan = j.decision.deadline.as_deref()?;
        Some((j, plan, plan.extend_to()?))
    })
}

/// What the ledger remembers of deadlines and TTLs.
#[derive(Debug)]
pub(super) struct Deadlines {
    config: LedgerConfig,
    /// Workspaces whose TTL Coder refused for good, with the template version it refused at.
    ttl_refused: IdMap<String, String>,
    /// Deadline extensions Coder refused (4xx), by workspace, with the build refused for.
    extend_refused: IdMap<String, String>,
    /// Builds whose deadline this service moved, while listed.
    extended: IdMap<String, ExtendedBuild>,
    /// Per workspace, the build for which a once-per-build line was already said.
    said_once: SaidOnce,
    /// Extensions planned this pass, by workspace.
    planned_extensions: IdMap<String, PlannedExtension>,
    /// TTL restores planned this pass: workspace -> its template version and `restore_ttl` event.
    planned_ttls: IdMap<String, (String, AuditEvent)>,
    /// What this pass did to deadlines.
    pub(super) acted: Acted,
}

impl Deadlines {
    pub(super) fn new(config: LedgerConfig) -> Self {
        Deadlines {
            config,
            ttl_refused: IdMap::default(),
            extend_refused: IdMap::default(),
            extended: IdMap::default(),
            said_once: SaidOnce::default(),
            planned_extensions: IdMap::default(),
            planned_ttls: IdMap::default(),
            acted: Acted::default(),
        }
    }

    /// A pass begins: what is remembered of workspaces no longer listed is forgotten.
    pub(super) fn begin(&mut self, view: &PassView) {
        self.acted = Acted::default();
        self.planned_extensions.clear();
        self.planned_ttls.clear();
        if self.said_once.is_empty() && self.extend_refused.is_empty() && self.extended.is_empty() && self.ttl_refused.is_empty() {
            return;
        }
        let listed: IdSet<&str> = view.judged.iter().map(|j| j.workspace.id.as_str()).collect();
        self.said_once.retain(|id, _| listed.contains(id));
        self.extend_refused.retain(|id, _| listed.contains(id.as_str()));
        self.extended.retain(|id, _| listed.contains(id.as_str()));
        self.ttl_refused.retain(|id, _| listed.contains(id.as_str()));
    }

    /// Observe mode: would-be TTL restores (every pass while they apply) and each would-be
    /// extension, once per build.
    pub(super) fn would_act(&mut self, view: &PassView, plan: &mut Plan) {
        for j in view.judged {
            if let Some(ttl) = j.decision.restore_ttl_ms {
                let mut note = Note::new(Level::Info, "would_restore_ttl", "would set the autostop TTL back").fact(Fact::TtlMs, ttl);
                note.who = Some(Who::of_workspace(j.workspace));
                plan.notes.push(note);
            }
        }
        self.would_extend(view, plan);
    }

    /// A busy workspace whose limit leaves no extension, said once per build: Coder's autostop
    /// stops it at its deadline.
    pub(super) fn say_limits_once(&mut self, view: &PassView, plan: &mut Plan) {
        for j in view.judged {
            let Some(p) = j.decision.deadline.as_ref().filter(|p| p.action == DeadlineAction::LimitReached) else { continue };
            if self.said_once.first_time("extend_limit_reached", &j.workspace.id, &j.workspace.latest_build.id) {
                let limited_by = p.limited_by.as_str();
                let text = format!(
                    "its GPU computes, but {limited_by} leaves no extension of 30 minutes or more: Coder's autostop stops it at its deadline"
                );
                let mut note = Note::new(Level::Info, "extend_limit_reached", text)
                    .fact(Fact::Deadline, p.deadline)
                    .fact(Fact::Limit, p.limit)
                    .fact(Fact::LimitedBy, limited_by);
                note.who = Some(Who::of_workspace(j.workspace));
                plan.notes.push(note);
            }
        }
    }

    /// Observe mode: each would-be extension, once per build.
    fn would_extend(&mut self, view: &PassView, plan: &mut Plan) {
        for (j, p, to) in extend_order(view) {
            let ws = &j.workspace;
            if self.said_once.first_time("would_extend", &ws.id, &ws.latest_build.id) {
                let event = extension_event(AuditKind::WouldExtend, view.now, self.config.mode, j, p, to);
                let text = "its GPU computes with nobody connected: would move Coder's autostop deadline (observe mode: Coder stops it at its deadline)";
                plan.notes.push(Note::new(Level::Info, "would_extend", text).fact(Fact::From, p.deadline).fact(Fact::To, to).audit(event));
                self.acted.would_extend.push(ws.id.clone());
            }
        }
    }

    /// TTLs to set back (`restore_autostop`), but not on a workspace being reclaimed, nor one
    /// whose TTL Coder refused at its template version.
    pub(super) fn ttls_to_restore(&mut self, view: &PassView, plan: &mut Plan) {
        for j in view.judged {
            let (ws, d) = (&j.workspace, &j.decision);
            let Some(ttl_ms) = d.restore_ttl_ms else { continue };
            if d.verdict == Verdict::Reclaim {
                continue;
            }
            let version = ws.latest_build.template_version_id.as_deref().unwrap_or_default().to_string();
            if self.ttl_refused.get(&ws.id) == Some(&version) {
                continue;
            }
            let event = AuditEvent::new(AuditKind::RestoreTtl, view.now, self.config.mode, ws, d);
            plan.calls.push(Call::RestoreTtl { workspace_id: ws.id.clone(), ttl_ms, event: Box::new(event.clone()) });
            self.planned_ttls.insert(ws.id.clone(), (version, event));
        }
    }

    pub(super) fn ttl_answered(&mut self, id: &str, answer: Result<(), Failure>, notes: &mut Vec<Note>) {
        let Some((version, event)) = self.planned_ttls.remove(id) else { return };
        match answer {
            Ok(()) => {
                notes.push(Note::new(Level::Info, "restore_ttl", "set the autostop TTL back").audit(event).count(Count::TtlRestored));
            }
            // 400: the template forbids a user autostop TTL; 403/404: the token may not update it.
            Err(f) if matches!(f.status, Some(400 | 403 | 404)) => {
                let text = "Coder refuses this workspace's autostop TTL (the template forbids a user TTL, or the token may not update it): not asked again until its template version changes; set the TTL in the template instead";
                notes.push(Note::new(Level::Warn, "restore_ttl_refused", text).about(&event).error(f.text));
                self.ttl_refused.insert(id.to_string(), version);
            }
            Err(f) => {
                let text = "could not set the autostop TTL back; trying again next pass";
                notes.push(Note::new(Level::Warn, "restore_ttl_failed", text).about(&event).error(f.text));
            }
        }
    }

    /// Builds whose deadline Coder reported before the first extension has passed while they
    /// still run because this service moved it: one `autostop_averted` per build.
    pub(super) fn count_averted(&mut self, view: &PassView, plan: &mut Plan) {
        let coder_now = view.coder_now();
        for j in view.judged {
            let ws = &j.workspace;
            let Some(e) = self.extended.get_mut(&ws.id) else { continue };
            if e.averted || e.build_id != ws.latest_build.id || coder_now < e.original_deadline {
                continue;
            }
            e.averted = true;
            let event = AuditEvent { event: AuditKind::AutostopAverted, time: view.now, ..e.event.clone() };
            let text = "the workspace runs past the autostop deadline Coder had set, because its GPU computes";
            let note = Note::new(Level::Info, "autostop_averted", text).fact(Fact::OriginalDeadline, e.original_deadline);
            plan.notes.push(note.audit(event).count(Count::AutostopAverted));
            self.acted.autostops_averted.push(ws.id.clone());
        }
    }

    /// The extensions the fleet rules found due, in their slots; one Coder refused for this
    /// build, or whose deadline a countdown moves this pass (`moving`), is skipped without a slot.
    pub(super) fn extensions_to_send(&mut self, view: &PassView, plan: &mut Plan, moving: &IdSet<String>) {
        let mut slots = view.fleet.extension_slots;
        for (j, p, to) in extend_order(view) {
            let ws = &j.workspace;
            // A countdown's deadline is put back this pass: the extension waits for the next.
            if self.extend_refused.get(&ws.id).is_some_and(|b| *b == ws.latest_build.id) || moving.contains(&ws.id) {
                continue;
            }
            if slots == 0 {
                break;
            }
            slots -= 1;
            let event = extension_event(AuditKind::DeadlineExtended, view.now, self.config.mode, j, p, to);
            plan.calls.push(Call::Extend { workspace_id: ws.id.clone(), to, event: Box::new(event.clone()) });
            let planned = PlannedExtension {
                build_id: ws.latest_build.id.to_string(),
                listed_deadline: p.deadline,
                coder_now: view.coder_now(),
                event,
            };
            self.planned_extensions.insert(ws.id.clone(), planned);
        }
    }

    pub(super) fn extend_answered(&mut self, id: &str, answer: Result<(), Failure>, notes: &mut Vec<Note>) {
        let Some(p) = self.planned_extensions.remove(id) else { return };
        match answer {
            Ok(()) => {
                let (from, to) =
                    p.event.extension.as_ref().map_or((p.listed_deadline, p.listed_deadline), |x| (x.deadline_from, x.deadline_to));
                let text = "its GPU computes with nobody connected: Coder's autostop deadline moved";
                let note = Note::new(Level::Info, "deadline_extended", text).fact(Fact::From, from).fact(Fact::To, to);
                notes.push(note.audit(p.event.clone()).count(Count::DeadlineExtended));
                if self.extended.get(id).is_none_or(|e| e.build_id != p.build_id) {
                    // The deadline Coder reported before this first move, bumps included. Already
                    // past then: one this service set before a restart, not Coder's own.
                    let averted = p.coder_now >= p.listed_deadline;
                    let e = ExtendedBuild { build_id: p.build_id, original_deadline: p.listed_deadline, averted, event: p.event };
                    self.extended.insert(id.to_string(), e);
                }
                self.acted.extended.push(id.to_string());
            }
            Err(f) if f.is_refusal() => {
                let text = "Coder refuses to move this workspace's deadline: not asked again for this build";
                notes.push(Note::new(Level::Warn, "extend_refused", text).about(&p.event).error(f.text).count(Count::ExtensionRefused));
                self.extend_refused.insert(id.to_string(), p.build_id);
            }
            Err(f) => {
                let text = "could not move the deadline; trying again next pass";
                notes.push(Note::new(Level::Warn, "extend_failed", text).about(&p.event).error(f.text).count(Count::ExtensionFailed));
            }
        }
    }
}
