//! `backtest`'s I/O half: fetches the history a replay needs and drives the replays as it
//! streams. GPU readings come from the Prometheus source's own queries in chunks of
//! `CHUNK_STEPS` steps (the same raw-sample rules as `run`); each workspace the readings (or the
//! journal) name is read from Coder once, when first met: its record (deleted ones too) and its
//! builds from the window's start on; moments of use come from the history journal, coderd's
//! agent-stat gauges in the same Prometheus, or nowhere (then said so). Every replay (one per
//! swept value) advances over each chunk while the chunks ahead are fetched and the next one's
//! new workspaces are read, so memory is bounded by the fleet and the chunks in flight (the one
//! replayed and those ahead, within about `POINTS_HELD` points, at least one), not by the window. The
//! report's shape and its texts are `report`.

pub mod report;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reclaimer_core::backtest::replay::{Chunk, Failed, Replay};
use reclaimer_core::backtest::timeline::{ConnectionSource, GaugeReader, GaugeStep, Use, WorkspaceTimeline};
use reclaimer_core::coder::types::{AgentStatus, WorkspaceBuild};
use reclaimer_core::history::JournalLine;
use tokio::task::{JoinHandle, JoinSet};

use crate::coder::{CoderClient, HistoryBounds};
use crate::error::Error;
use crate::gpu::prometheus::PrometheusSource;
use crate::gpu::{Collection, GpuSeries, GpuSource, SourceFailure};
use crate::pass::policy::Policy;
use report::{Report, SourceReport, VariantReport};

/// Steps fetched per chunk: 30 minutes at the default 60 s. Over 10,000 GPUs a chunk is 300,000
/// points (about 30 MB), under the source's point budget, and each query stays small.
pub const CHUNK_STEPS: u32 = 30;

/// Chunks fetched ahead of the one replayed: as many as keep the points held (the chunk
/// replayed beyond one chunk's worth, and those ahead at its series count) within about
/// `POINTS_HELD` (19 MB of 64-byte points), at least one and at most `MAX_CHUNKS_AHEAD`. The
/// first chunk holds the look-back too, so it has fewer ahead.
const POINTS_HELD: usize = 10_000 * CHUNK_STEPS as usize;
const MAX_CHUNKS_AHEAD: usize = 3;

/// Workspaces read from Coder at once when a chunk names new ones.
const CODER_READS_IN_FLIGHT: usize = 8;

/// New workspaces read from Coder in the first chunk (the fleet running at the window's start),
/// in each later chunk (those started since: ids beyond it wait for the next chunk), and in all:
/// GPU series name workspaces by their pod's name, and a store others can write could name any
/// number of made-up ids, each a Coder read. What could not be read is counted, not listed.
const FIRST_CHUNK_READS: usize = 20_000;
const CHUNK_READS: usize = 256;
const TOTAL_READS: usize = 25_000;
/// Workspaces Coder did not answer for are named in the report's gaps up to this many; the rest
/// are counted.
const UNREAD_NAMED: usize = 10;

/// Which connection source to read; `Auto` takes the first that exists, in the order of
/// `ConnectionSource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionChoice {
    Auto,
    Journal,
    CoderdMetrics,
    None,
}

/// What one backtest replays, validated.
#[derive(Debug, Clone)]
pub struct Plan {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub interval: Duration,
    pub regret_window: Duration,
    /// One policy per swept value (one, labelled `policy`, without a sweep).
    pub variants: Vec<(String, Policy)>,
    pub connections: ConnectionChoice,
    pub journal: Option<PathBuf>,
    /// coderd's scrape job (`coderd_job`); `None`: the one job that carries its gauges.
    pub coderd_job: Option<String>,
}

/// How far the fetch has come, for the progress line.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub fetched_until: DateTime<Utc>,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub workspaces: usize,
    pub series: usize,
}

/// The moments of use and agent states a journal holds, per workspace id.
#[derive(Default)]
struct JournalHistory {
    uses: HashMap<String, Vec<Use>>,
    agents: HashMap<String, Vec<(DateTime<Utc>, String, AgentStatus)>>,
    /// Each workspace's latest line.
    last_seen: HashMap<String, DateTime<Utc>>,
    first: Option<DateTime<Utc>>,
    lines: usize,
    unreadable: usize,
}

fn read_journal(path: &std::path::Path, until: DateTime<Utc>) -> Result<JournalHistory, Error> {
    let mut j = JournalHistory::default();
    let unreadable = crate::pass::journal::read_lines(path, |line: JournalLine| {
        if line.time > until {
            return;
        }
        j.lines += 1;
        j.first = j.first.min(Some(line.time)).or(Some(line.time));
        let seen = j.last_seen.entry(line.workspace_id.clone()).or_insert(line.time);
        *seen = (*seen).max(line.time);
        if let Some(at) = line.last_used_at {
            let uses = j.uses.entry(line.workspace_id.clone()).or_default();
            if uses.last().is_none_or(|u| u.last_used_at != at) {
                uses.push(Use { seen: line.time, last_used_at: at });
            }
        }
        if let Some(status) = line.agent.as_deref() {
            j.agents.entry(line.workspace_id).or_default().push((line.time, line.build_id, AgentStatus::from_text(status)));
        }
    })
    .map_err(|e| Error::config(format!("--journal {}: cannot read it ({e}); fix the path, or pass --connections none", path.display())))?;
    j.unreadable = unreadable;
    Ok(j)
}

/// The most bytes a username or workspace name in coderd's gauges may have (Coder's are at most
/// 32 characters): a longer one is no workspace's and is not read.
const MAX_GAUGE_NAME: usize = 128;

/// The coderd gauges one chunk of steps holds, read into a `GaugeStep` per step: from coderd's
/// scrape job only, for the workspaces the backtest knows (`known`, by owner and name), points
/// on the chunk's grid only. Memory follows the fleet and the chunk, whatever the store holds.
/// Returns the steps and how many series were not read (unknown, or names no Coder has).
async fn gauge_steps(
    prom: &PrometheusSource,
    job: &str,
    range: (i64, i64, u64),
    known: &HashMap<(String, String), Vec<usize>>,
) -> Result<(Vec<(i64, GaugeStep)>, usize), String> {
    let step = range.2;
    let mut steps: HashMap<i64, GaugeStep> = HashMap::new();
    let mut skipped = 0;
    let on_grid = |at: i64| at >= range.0 && at <= range.1 && (at - range.0) % step as i64 == 0;
    for (i, metric) in ["coderd_agentstats_connection_count", "coderd_agentstats_rx_bytes", "coderd_agentstats_tx_bytes"].iter().enumerate()
    {
        let query = format!("max by (username, workspace_name) (max_over_time({metric}{{job=\"{job}\"}}[{step}s]))");
        let mut on = |s: crate::gpu::prometheus::Series<'_>| {
            let (user, name) = (s.metric.get("username").unwrap_or(""), s.metric.get("workspace_name").unwrap_or(""));
            let key = (user.to_string(), name.to_string());
            if user.len() > MAX_GAUGE_NAME || name.len() > MAX_GAUGE_NAME || !known.contains_key(&key) {
                skipped += 1;
                return;
            }
            for (at, v) in s.values {
                let at = at as i64;
                if !on_grid(at) {
                    continue;
                }
                let entry = steps.entry(at).or_default().by_workspace.entry(key.clone()).or_insert((0.0, 0.0));
                let v = v.filter(|v| v.is_finite()).unwrap_or(0.0);
                if i == 0 { entry.0 = v } else { entry.1 += v }
            }
        };
        prom.query_each(query, range, &mut on).await.map_err(|e| format!("{metric} query: {e}"))?;
    }
    // Every step of the grid, in order; a step with no gauge at all is a step too (nobody
    // connected, or the gauges expired), and a point off the grid is not one.
    let mut all = Vec::new();
    let mut t = range.0;
    while t <= range.1 {
        all.push((t, steps.remove(&t).unwrap_or_default()));
        t += step as i64;
    }
    Ok((all, skipped / 3))
}

/// The scrape jobs whose series carry coderd's agent-stat gauges over the window (none: the
/// store has no gauges).
async fn coderd_gauge_jobs(prom: &PrometheusSource, since: DateTime<Utc>, until: DateTime<Utc>) -> Result<Vec<String>, String> {
    let span = (until - since).num_seconds().max(60);
    let step = (span / 50).max(60);
    let query = format!("count by (job) (max_over_time(coderd_agentstats_connection_count[{step}s]))");
    let mut jobs: Vec<String> = Vec::new();
    prom.query_each(query, (since.timestamp(), until.timestamp(), step as u64), &mut |s| {
        let job = s.metric.get("job").unwrap_or("");
        let plain = job.len() <= 256 && !job.chars().any(|c| c.is_control() || c == '"' || c == '\\');
        if !s.values.is_empty() && plain && !jobs.iter().any(|j| j == job) && jobs.len() < 16 {
            jobs.push(job.to_string());
        }
    })
    .await?;
    jobs.sort();
    Ok(jobs)
}

/// The most builds of one workspace whose parameters a backtest reads.
const MAX_PARAMETER_READS_PER_WORKSPACE: usize = 16;

/// The builds the journal saw without a connected agent (`connecting`, `timeout`, or lost): a
/// start that may have waited for a GPU, whose parameters say whether it is a CPU variant. The
/// latest `MAX_PARAMETER_READS_PER_WORKSPACE`.
fn builds_that_may_wait(journal: Option<&JournalHistory>, id: &str) -> Vec<String> {
    let mut builds: Vec<String> = Vec::new();
    let states = journal.and_then(|j| j.agents.get(id)).map_or(&[][..], Vec::as_slice);
    for (_, build, status) in states.iter().rev() {
        let absent = matches!(status, AgentStatus::Connecting | AgentStatus::Timeout | AgentStatus::Disconnected);
        if absent && !builds.contains(build) && builds.len() < MAX_PARAMETER_READS_PER_WORKSPACE {
            builds.push(build.clone());
        }
    }
    builds
}

/// Reads one workspace's record (deleted ones too), its builds from `start` on, and the
/// parameters of `may_wait` (builds the journal saw without a connected agent). A parameter read
/// that fails leaves that start judged as a waiter, as `run` would with no answer.
async fn read_timeline(
    coder: &CoderClient,
    id: &str,
    (start, until): (DateTime<Utc>, DateTime<Utc>),
    may_wait: Vec<String>,
) -> Result<WorkspaceTimeline, String> {
    let record = patiently(coder, || coder.workspace_including_deleted(id)).await.map_err(|e| e.to_string())?;
    let bounds = HistoryBounds { until: Some(until), ..HistoryBounds::default() };
    let builds = patiently(coder, || coder.workspace_history(id, start, bounds)).await.map_err(|e| e.to_string())?;
    if let Some((b, why)) = builds.iter().find_map(|b| impossible_times(b, until).map(|why| (b, why))) {
        let id: String = b.id.chars().take(64).collect();
        return Err(format!("its build {id:?} {why}: a record no Coder writes is not replayed"));
    }
    let mut timeline = WorkspaceTimeline::new(record, builds);
    for build in may_wait.into_iter().filter(|b| timeline.builds.iter().any(|t| t.id.is(b))) {
        if let Ok(parameters) = patiently(coder, || coder.build_parameters(&build)).await {
            timeline.parameters.insert(build, parameters);
        }
    }
    Ok(timeline)
}

/// What makes a build's times impossible (no Coder writes them), if anything: a time before
/// 2000 (Go's zero time is year 1) or more than a day after the window's end (year 9999), or a job
/// completed before its build was created.
fn impossible_times(b: &WorkspaceBuild, until: DateTime<Utc>) -> Option<String> {
    let earliest = DateTime::from_timestamp(946_684_800, 0).unwrap_or_default();
    let latest = until + chrono::Duration::days(1);
    let times = [("created", b.created_at), ("completed", b.job.completed_at)];
    if let Some((what, t)) = times.iter().find_map(|(what, t)| t.filter(|t| *t < earliest || *t > latest).map(|t| (what, t))) {
        return Some(format!("was {what} at {}", t.to_rfc3339()));
    }
    match (b.created_at, b.job.completed_at) {
        (Some(c), Some(d)) if d < c => Some(format!("was completed at {} before it was created at {}", d.to_rfc3339(), c.to_rfc3339())),
        _ => None,
    }
}

/// How often a backtest's Coder read is tried when Coder rate-limits it.
const RATE_LIMITED_TRIES: u32 = 3;

/// A Coder read, asked again once Coder's `Retry-After` has passed (at most `RATE_LIMITED_TRIES`
/// times): a backtest is a batch job, and a workspace dropped for a 429 would change its
/// figures. (`run` never waits: a later pass asks again.)
async fn patiently<T, F, Fut>(coder: &CoderClient, mut read: F) -> Result<T, crate::coder::CoderError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::coder::CoderError>>,
{
    for _ in 1..RATE_LIMITED_TRIES {
        match read().await {
            Err(e) if e.kind == crate::coder::ErrorKind::RateLimited => {
                tokio::time::sleep(coder.hold_left().max(Duration::from_millis(100))).await;
            }
            other => return other,
        }
    }
    read().await
}

/// The history and the replays over it, fetched and replayed chunk by chunk.
pub async fn run(
    coder: &CoderClient,
    prom: &Arc<PrometheusSource>,
    plan: Plan,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Report, Error> {
    let step = prom.step();
    let step_secs = step.as_secs().max(1) as i64;
    let align = |t: DateTime<Utc>| DateTime::from_timestamp(t.timestamp().div_euclid(step_secs) * step_secs, 0).unwrap_or(t);
    let (since, until) = (align(plan.since), align(plan.until));
    let lookback = plan.variants.iter().map(|(_, p)| p.longest_lookback()).max().unwrap_or_default();
    let history_from = since - crate::duration::chrono(lookback);

    let mut notes = Vec::new();
    let mut gaps = Vec::new();
    let mut journal = None;
    let wants_journal = matches!(plan.connections, ConnectionChoice::Auto | ConnectionChoice::Journal);
    match (&plan.journal, wants_journal) {
        (Some(path), true) if path.exists() || plan.connections == ConnectionChoice::Journal => {
            journal = Some(read_journal(path, until)?);
        }
        (None, true) if plan.connections == ConnectionChoice::Journal => {
            return Err(Error::config(
                "--connections journal needs the journal: pass --journal PATH (the file `run --history-journal` writes)",
            ));
        }
        _ => {}
    }
    let connections = match (plan.connections, &journal) {
        (ConnectionChoice::Journal, _) | (ConnectionChoice::Auto, Some(_)) => ConnectionSource::Journal,
        (ConnectionChoice::CoderdMetrics, _) => ConnectionSource::CoderdMetrics,
        (ConnectionChoice::None, _) => ConnectionSource::None,
        (ConnectionChoice::Auto, None) => ConnectionSource::CoderdMetrics,
    };
    // coderd's gauges from coderd's scrape job only: the one named, else the one that carries them.
    let mut gauge_job = plan.coderd_job.clone();
    let connections = match (connections, &gauge_job) {
        (ConnectionSource::CoderdMetrics, None) => match coderd_gauge_jobs(prom, since, until).await {
            Ok(jobs) if jobs.len() == 1 => {
                gauge_job = jobs.into_iter().next();
                ConnectionSource::CoderdMetrics
            }
            Ok(jobs) if jobs.is_empty() => ConnectionSource::None,
            Ok(jobs) => {
                gaps.push(format!(
                    "coderd's gauges are in several scrape jobs ({}): none is read as coderd's; set coderd_job in the config file to the job that scrapes coderd",
                    jobs.join(", ")
                ));
                ConnectionSource::None
            }
            Err(e) => {
                gaps.push(format!("coderd's gauges could not be looked for ({e}): no connection source"));
                ConnectionSource::None
            }
        },
        (c, _) => c,
    };
    let mut connection_report = SourceReport { name: connections.as_str().into(), detail: String::new(), gaps: Vec::new() };
    match (&journal, connections) {
        (Some(j), ConnectionSource::Journal) => {
            connection_report.detail = format!(
                "{} lines from {}{}",
                j.lines,
                plan.journal.as_ref().map_or(String::new(), |p| p.display().to_string()),
                if j.unreadable > 0 { format!(", {} unreadable lines skipped", j.unreadable) } else { String::new() }
            );
            match j.first {
                None => connection_report.gaps.push("the journal holds no line up to --until: no connection was seen".into()),
                Some(first) if first > since => {
                    connection_report.gaps.push(format!("the journal begins at {}: before it no connection was seen", first.to_rfc3339()))
                }
                Some(_) => {}
            }
        }
        (_, ConnectionSource::CoderdMetrics) => {
            connection_report.detail = format!(
                "coderd_agentstats_connection_count, rx and tx bytes of job {:?} (fresh values per workspace only)",
                gauge_job.as_deref().unwrap_or_default()
            );
        }
        _ => {
            connection_report.detail = "none: the GPU alone is the evidence".into();
            notes.push("no connection source: every figure that depends on connections (stops, GPU-hours given back) is an upper bound, and a connection after a stop cannot make it regretted".into());
        }
    }
    if plan.variants.iter().any(|(_, p)| p.reclaim_when == crate::pass::policy::ReclaimWhen::Contended)
        && connections != ConnectionSource::Journal
    {
        notes.push("reclaim_when = contended: a workspace waiting for a GPU has no GPU series and is seen only in the journal; without it nobody waits, and a contended policy stops nothing".into());
    }

    let mut fleet = Fleet::default();
    let mut replays: Vec<Replay> =
        plan.variants.iter().map(|(label, policy)| Replay::new(label.clone(), policy.clone(), plan.interval, plan.regret_window)).collect();
    let mut gauges = GaugeReader::default();
    let mut gauges_skipped = 0usize;
    let mut gpu_gaps = Vec::new();
    let mut gpu_hours_reported = 0.0;
    let mut chunks = 0usize;
    let mut last_pass: Option<DateTime<Utc>> = None;
    let chunk_span = chrono::Duration::seconds(step_secs * i64::from(CHUNK_STEPS));
    // The journal's workspaces seen within the history (not those gone long before it).
    let journal_ids: Vec<String> = journal
        .as_ref()
        .map(|j| j.last_seen.iter().filter(|(_, at)| **at >= history_from).map(|(id, _)| id.clone()).collect())
        .unwrap_or_default();
    let mut pending_ids: Vec<String> = journal_ids;
    let mut chunk_end = since;
    // A chunk's stage: its GPU series, and the workspaces they name that were not read yet, read
    // from Coder. The chunks ahead of the one replayed are fetched meanwhile (Prometheus
    // evaluates them and their answers are parsed on the runtime's other threads), and the next
    // one's new workspaces are read from Coder.
    let reader = Reader { coder, history: (history_from, until), journal: journal.as_ref() };
    let mut collection = prom.collect(chunk_end).await;
    // The fleet running at the window's start (up to 20,000 reads) goes into the timelines as
    // each read completes: collected first, the reads and the timelines held two copies of it.
    let ids = fleet.asked.take_new(&collection.series, &mut pending_ids, FIRST_CHUNK_READS);
    fleet.timelines.reserve_exact(ids.len());
    reader.read_each(ids, |read| fleet.add(read, journal.as_ref(), &mut gaps)).await;
    let mut fresh = Vec::new();
    let mut ahead: VecDeque<(DateTime<Utc>, Fetch)> = VecDeque::new();
    let mut asked_until = chunk_end;
    loop {
        chunks += 1;
        // The timelines are held for the whole run: grown by an eighth at least, not doubled
        // (a doubled list of 10,000 held 16,384 slots of 680 bytes).
        let timelines = &mut fleet.timelines;
        if timelines.capacity() - timelines.len() < fresh.len() {
            timelines.reserve_exact(fresh.len().max(timelines.len() / 8));
        }
        for done in fresh.drain(..) {
            fleet.add(done, journal.as_ref(), &mut gaps);
        }
        let series: Vec<GpuSeries> = collection.series;
        // A failed fetch keeps the slices before the failure: their passes are judged on them.
        let fetched_to = series.iter().filter_map(|s| s.points.last()).map(|p| p.at).max();
        let failed = !collection.failures.is_empty();
        if failed {
            let why = collection.failures.iter().map(|f| f.error.as_str()).collect::<Vec<_>>().join("; ");
            let from = fetched_to.or(last_pass).map_or(history_from, |t| t + chrono::Duration::seconds(step_secs));
            gpu_gaps.push(format!("{} to {}: {why}", from.to_rfc3339(), chunk_end.to_rfc3339()));
        }
        for s in series.iter().filter(|s| s.workspace_id.is_some()) {
            gpu_hours_reported += s.points.iter().filter(|p| p.at > since && p.at <= until).count() as f64 * step_secs as f64 / 3600.0;
        }
        // A small fleet's chunk takes Prometheus about 80 ms whatever its size (each answer is
        // evaluated and encoded by one thread), far longer than its replay: several ahead keep
        // Prometheus busy. Two ahead also keep it busy while the last answers of a chunk are
        // evaluated: at 10,000 workspaces (4,400 GPUs) they replay 7 days at about 1.45x the
        // floor against 1.8x with one. The chunks ahead are asked for here, once the chunk
        // before is replayed and freed, never when one arrives: asked for then, a chunk more
        // was held while the replay lagged (4 in all; 129.8 MiB there, against 128).
        let depth = chunks_ahead(&series);
        while ahead.len() < depth && asked_until < until {
            let (from, to) = (asked_until + chrono::Duration::seconds(step_secs), (asked_until + chunk_span).min(until));
            let prom = prom.clone();
            ahead.push_back((to, Fetch(tokio::spawn(async move { prom.collect_between(from.timestamp(), to.timestamp()).await }))));
            asked_until = to;
        }
        let Fleet { timelines, by_name, asked } = &mut fleet;
        let next = async {
            let (end, mut fetch) = ahead.pop_front()?;
            let collection = (&mut fetch.0).await.unwrap_or_else(|e| Collection {
                failures: vec![SourceFailure::new(prom.shown().to_string(), String::new(), format!("the fetch failed: {e}"))],
                ..Collection::default()
            });
            let ids = asked.take_new(&collection.series, &mut pending_ids, CHUNK_READS);
            Some((end, collection, reader.read(ids).await))
        };
        let this = async {
            // The passes of this chunk: every step after the last pass, up to its end.
            let first = last_pass.map_or(since, |t| t + crate::duration::chrono(plan.interval));
            // The gauges from the look-back on: a use just before the window counts in its first passes.
            let gauges_from = last_pass.map_or(history_from, |_| first);
            let range = (gauges_from.timestamp(), chunk_end.timestamp(), step_secs as u64);
            let reading = gauge_job.as_deref().filter(|_| connections == ConnectionSource::CoderdMetrics && first <= chunk_end);
            if let Some(job) = reading {
                match gauge_steps(prom, job, range, by_name).await {
                    Ok((steps, skipped)) => {
                        gauges_skipped = gauges_skipped.max(skipped);
                        for (at, step) in steps {
                            let Some(at) = DateTime::from_timestamp(at, 0) else { continue };
                            for key in gauges.read(step) {
                                for &t in by_name.get(&key).map_or(&[][..], Vec::as_slice) {
                                    if timelines[t].running_at(at).is_some() {
                                        timelines[t].uses.push(Use { seen: at, last_used_at: at });
                                    }
                                }
                            }
                        }
                    }
                    Err(e) => connection_report.gaps.push(format!("{} to {}: {e}", first.to_rfc3339(), chunk_end.to_rfc3339())),
                }
            }
            let shown = prom.shown().to_string();
            let mut chunk = Chunk::new(&series, timelines, failed.then_some(Failed { source: shown.as_str(), after: fetched_to }));
            // New workspaces, moments of use and forgotten builds since the last pass.
            for replay in &mut replays {
                replay.history_changed();
            }
            let mut t = first;
            while t <= chunk_end {
                chunk.advance(last_pass, t);
                for replay in &mut replays {
                    replay.pass(t, last_pass, timelines, &chunk, step, until);
                }
                last_pass = Some(t);
                t += crate::duration::chrono(plan.interval);
            }
            // Moments of use and builds a later pass cannot read again: memory follows the chunk and
            // the builds ahead, not the window behind.
            if let Some(t) = last_pass {
                let keep_from = t - crate::duration::chrono(plan.regret_window);
                for timeline in timelines.iter_mut() {
                    timeline.forget_uses_before(keep_from);
                    timeline.forget_builds_before(keep_from);
                }
            }
            progress(Progress { fetched_until: chunk_end, since, until, workspaces: timelines.len(), series: series.len() });
            // Replayed: its points go now, not when the next chunk is in (the chunks ahead
            // are being fetched meanwhile).
            drop(chunk);
            drop(series);
        };
        let (next, ()) = tokio::join!(next, this);
        let Some((end, next, read)) = next else { break };
        collection = next;
        fresh = read;
        chunk_end = end;
    }
    if fleet.asked.unreadable.len() > UNREAD_NAMED {
        gaps.push(format!("and {} more workspaces Coder did not answer for", fleet.asked.unreadable.len() - UNREAD_NAMED));
    }
    if !pending_ids.is_empty() {
        gaps.push(format!(
            "{} workspace ids the GPU series name were not read from Coder: more new ids than {CHUNK_READS} a chunk, or {TOTAL_READS} in all (made-up pod names in a store others can write?)",
            pending_ids.len()
        ));
    }
    if fleet.timelines.is_empty() && !fleet.asked.unreadable.is_empty() {
        return Err(Error::runtime(format!(
            "Coder answered for none of the {} workspaces the history names ({}): check --coder-url and that the token is an owner's",
            fleet.asked.unreadable.len(),
            gaps.first().map_or("", String::as_str)
        )));
    }
    if gauges_skipped > 0 {
        connection_report.detail.push_str(&format!(
            "; up to {gauges_skipped} gauge series a chunk named no workspace the history holds (or a name longer than {MAX_GAUGE_NAME} bytes) and were not read"
        ));
    }
    if connections == ConnectionSource::CoderdMetrics && gauges.repeats > 0 {
        connection_report.detail.push_str(&format!(
            "; {} of {} steps repeated the last values (nobody in the deployment connected) and were read as no connection",
            gauges.repeats, gauges.steps
        ));
    }
    let variants = replays.into_iter().map(VariantReport::from_replay).collect();
    Ok(Report {
        schema_version: report::SCHEMA_VERSION,
        since,
        until,
        interval: plan.interval,
        regret_window: plan.regret_window,
        passes: last_pass.map_or(0, |l| ((l - since).num_seconds() / plan.interval.as_secs().max(1) as i64 + 1) as u64),
        workspaces: fleet.timelines.len(),
        gpu_hours_reported,
        upper_bound: connections.is_upper_bound(),
        gpu_source: SourceReport {
            name: "prometheus".into(),
            detail: format!("{} ({} chunks of {} steps of {}s)", prom.shown(), chunks, CHUNK_STEPS, step_secs),
            gaps: gpu_gaps.into_iter().chain(gaps).collect(),
        },
        connections: connection_report,
        notes,
        variants,
    })
}

/// How many chunks to fetch ahead of this one (`POINTS_HELD`).
fn chunks_ahead(series: &[GpuSeries]) -> usize {
    let per_chunk = series.len().max(1) * CHUNK_STEPS as usize;
    let beyond = series.iter().map(|s| s.points.len()).sum::<usize>().saturating_sub(per_chunk);
    (POINTS_HELD.saturating_sub(beyond) / per_chunk).clamp(1, MAX_CHUNKS_AHEAD)
}

/// The workspaces read from Coder so far: their timelines, by id and by (owner, name) (how
/// coderd's gauges name them), and the ids Coder did not answer for (not asked again).
#[derive(Default)]
struct Fleet {
    timelines: Vec<WorkspaceTimeline>,
    by_name: HashMap<(String, String), Vec<usize>>,
    asked: Asked,
}

/// What was asked of Coder: the workspaces read (their timeline's index), those it did not
/// answer for (not asked again), and how many reads in all (`TOTAL_READS`).
#[derive(Default)]
struct Asked {
    index: HashMap<String, usize>,
    unreadable: HashSet<String>,
    reads: usize,
}

impl Asked {
    fn knows(&self, id: &str) -> bool {
        self.index.contains_key(id) || self.unreadable.contains(id)
    }

    /// The workspaces `series` name that were never asked for, added to those waiting; the
    /// ones to read now, within `budget` (and what is left of `TOTAL_READS`); the rest wait.
    fn take_new(&mut self, series: &[GpuSeries], waiting: &mut Vec<String>, budget: usize) -> Vec<String> {
        waiting.extend(series.iter().filter_map(|s| s.workspace_id.as_deref()).filter(|id| !self.knows(id)).map(str::to_string));
        waiting.sort();
        waiting.dedup();
        waiting.retain(|id| !self.knows(id));
        let budget = budget.min(TOTAL_READS.saturating_sub(self.reads));
        let later = waiting.split_off(budget.min(waiting.len()));
        let now = std::mem::replace(waiting, later);
        self.reads += now.len();
        now
    }
}

/// A chunk fetched ahead: stopped when dropped unawaited (a backtest that ends early leaves no
/// queries running behind it).
struct Fetch(JoinHandle<Collection>);

impl Drop for Fetch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One workspace's read from Coder: its id and its timeline, or why Coder did not answer.
type Read = Result<(String, Result<WorkspaceTimeline, String>), tokio::task::JoinError>;

/// Reads new workspaces from Coder, `CODER_READS_IN_FLIGHT` at a time.
#[derive(Clone, Copy)]
struct Reader<'a> {
    coder: &'a CoderClient,
    history: (DateTime<Utc>, DateTime<Utc>),
    journal: Option<&'a JournalHistory>,
}

impl Reader<'_> {
    async fn read(&self, ids: Vec<String>) -> Vec<Read> {
        let mut done = Vec::with_capacity(ids.len());
        self.read_each(ids, |read| done.push(read)).await;
        done
    }

    /// `read`, each read handed to `each` as it completes (in that order).
    async fn read_each(&self, ids: Vec<String>, mut each: impl FnMut(Read)) {
        let mut reads = JoinSet::new();
        for id in ids {
            let coder = self.coder.clone();
            let history = self.history;
            let may_wait = builds_that_may_wait(self.journal, &id);
            reads.spawn(async move {
                let t = read_timeline(&coder, &id, history, may_wait).await;
                (id, t)
            });
            if reads.len() >= CODER_READS_IN_FLIGHT {
                if let Some(read) = reads.join_next().await {
                    each(read);
                }
            }
        }
        while let Some(read) = reads.join_next().await {
            each(read);
        }
    }
}

impl Fleet {
    /// One workspace's read, with its moments of use and agent states from the journal.
    fn add(&mut self, done: Read, journal: Option<&JournalHistory>, gaps: &mut Vec<String>) {
        match done {
            Ok((id, Ok(mut timeline))) => {
                if let Some(j) = journal {
                    timeline.uses = j.uses.get(&id).cloned().unwrap_or_default();
                    timeline.uses.sort_by_key(|u| (u.last_used_at, u.seen));
                    timeline.agents = j.agents.get(&id).cloned().unwrap_or_default();
                }
                let key = (timeline.record.owner_name.clone(), timeline.record.name.clone());
                self.by_name.entry(key).or_default().push(self.timelines.len());
                self.asked.index.insert(id, self.timelines.len());
                self.timelines.push(timeline);
            }
            Ok((id, Err(e))) => {
                if self.asked.unreadable.len() < UNREAD_NAMED {
                    gaps.push(format!("workspace {id}: Coder did not answer for it ({e}): its GPU series are not replayed"));
                }
                self.asked.unreadable.insert(id);
            }
            Err(e) => gaps.push(format!("a Coder read failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::token::SessionToken;
    use crate::retry::RetryPolicy;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    /// Chunks ahead by the points held: three for a small fleet up to 3,333 GPUs, two up to
    /// 5,000 (10,000 workspaces' 4,400 GPUs, the bench), one above, and fewer while a first
    /// chunk that holds a long look-back is replayed.
    #[test]
    fn chunks_ahead_keep_the_points_held_within_the_budget() {
        let chunk = |series: usize, points: usize| {
            let mut s = GpuSeries::from_labels(|k| (k == "UUID").then_some("GPU-1"), &Arc::from("p"), &Default::default()).unwrap();
            s.points = vec![crate::gpu::Point::new(Utc::now()); points];
            vec![s; series]
        };
        let rows = [
            (4_400, 30, 2),
            (4_400, 65, 1),
            (1_000, 30, 3),
            (3_300, 30, 3),
            (3_400, 30, 2),
            (5_000, 30, 2),
            (5_100, 30, 1),
            (20_000, 30, 1),
            (2_000, 150, 1),
            (0, 0, 3),
        ];
        for (series, points, want) in rows {
            assert_eq!(chunks_ahead(&chunk(series, points)), want, "{series} series of {points} points");
        }
    }

    /// One workspace's `/builds` answers 429 once (coderd limits per user and path): the
    /// backtest waits for its `Retry-After` and reads it, instead of dropping the workspace.
    #[tokio::test]
    async fn a_rate_limited_read_is_asked_again_after_retry_after() {
        let server = MockServer::start().await;
        let id = "a0000000-0000-4000-8000-000000000001";
        let listed: serde_json::Value = serde_json::from_str(include_str!("../../tests/fixtures/coder/workspaces_running.json")).unwrap();
        let record = listed["workspaces"][0].clone();
        Mock::given(method("GET"))
            .and(path(format!("/api/v2/workspaces/{id}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(record))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("/api/v2/workspaces/{id}/builds")))
            .respond_with(
                ResponseTemplate::new(429).insert_header("Retry-After", "1").set_body_json(serde_json::json!({"message": "rate limited"})),
            )
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("/api/v2/workspaces/{id}/builds")))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!([])))
            .mount(&server)
            .await;
        let retry = RetryPolicy {
            initial: Duration::from_millis(10),
            max_interval: Duration::from_millis(50),
            max_elapsed: Duration::from_secs(2),
        };
        let url = reqwest::Url::parse(&server.uri()).unwrap();
        let coder = CoderClient::new(&url, SessionToken::new("t0k3n-for-the-test").unwrap(), Duration::from_secs(2), retry).unwrap();
        let started = std::time::Instant::now();
        let timeline = read_timeline(&coder, id, (Utc::now(), Utc::now()), Vec::new()).await;
        assert!(timeline.is_ok(), "{:?}", timeline.err());
        assert!(started.elapsed() >= Duration::from_millis(900), "waited for Retry-After: {:?}", started.elapsed());
    }
}
