//! The readings matrix: every load × every dcgm-exporter set-up × both sources. The fake exporter
//! (`mocks::exporter::render_devices`) renders 40 minutes of 15 s scrapes of each set-up in the
//! exporter's own layout; the exporter source parses them as a pass does (`merge_collection`, one
//! sample per 60 s pass), and a real Prometheus holds the same scrapes as a ServiceMonitor stores
//! them (`honorLabels` false and true) and is read by the Prometheus source with and without the
//! namespace filter; each under the default policy and under a power veto. Every cell must give the verdict and reason `expected` promises, in every
//! source; `docs/readings.md` is rendered from the cells (`UPDATE_READINGS=1` rewrites it).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use coder_gpu_reclaimer::coder::types::Workspace;
use coder_gpu_reclaimer::duration;
use coder_gpu_reclaimer::gpu::prometheus::{DEFAULT_MAX_BODY, PrometheusOptions, PrometheusSource};
use coder_gpu_reclaimer::gpu::window::Windows;
use coder_gpu_reclaimer::gpu::{Collection, GpuSeries, GpuSource, Ownership};
use coder_gpu_reclaimer::http::Outbound;
use coder_gpu_reclaimer::pass::decide::{Decision, decide};
use coder_gpu_reclaimer::pass::evaluate::merge_collection;
use coder_gpu_reclaimer::pass::policy::Policy;
use mocks::exporter::render_devices;
use mocks::{Counters, Device, ExporterConfig, Holder, Load, Names, PodUid, Stuck, VirtualGpus};

use crate::common::{installed_or_skip, running_workspace};
use crate::prometheus_world::{Stored, exporter_windows, installed, openmetrics, prometheus_with, store, without_device_series};

/// How long each cell's history is, and how often Prometheus (and the exporter source) scrape.
const HISTORY_SECS: i64 = 40 * 60;
const SCRAPE_SECS: i64 = 15;
/// The pass interval and Prometheus step.
const PASS_SECS: i64 = 60;
/// The frozen exporter serves its last collection from this long before the end.
const FROZEN_FOR_SECS: i64 = 20 * 60;

/// One exporter set-up people run (reference dcgm LAYOUTS.md, NOTES §3-4, §9-11).
struct SetUp {
    name: &'static str,
    what: &'static str,
    exporter: ExporterConfig,
    /// `-c`, seconds.
    collect_secs: i64,
    model: &'static str,
    /// A second pod time-slicing each cell's GPU, with this load.
    sharer: Option<Load>,
    /// The policy's `idle_after`, when not the default.
    idle_after: Option<Duration>,
    /// `workspace_id_label`, when set.
    workspace_id_label: Option<&'static str>,
    /// The store leaves out the series without a workload pod (a `metricRelabelings` drop, a
    /// selector on workload labels; NOTES §11.3): a set-up only behind Prometheus.
    drops_device_series: bool,
    /// How long the frozen exporter has served its last collection at the end.
    frozen_for_secs: i64,
    /// What this set-up decides differently from what `expected_without_veto` says in general.
    differs: fn(Kind) -> Option<(&'static str, &'static str)>,
}

impl SetUp {
    fn new(name: &'static str, what: &'static str, exporter: ExporterConfig, collect_secs: i64) -> Self {
        SetUp {
            name,
            what,
            exporter,
            collect_secs,
            model: "NVIDIA A10G",
            sharer: None,
            idle_after: None,
            workspace_id_label: None,
            drops_device_series: false,
            frozen_for_secs: FROZEN_FOR_SECS,
            differs: |_| None,
        }
    }
}

fn set_ups() -> Vec<SetUp> {
    let base = ExporterConfig { sm_active: false, ..ExporterConfig::default() };
    let with = |f: &dyn Fn(&mut ExporterConfig)| {
        let mut c = base.clone();
        f(&mut c);
        c
    };
    let s = SetUp::new;
    let vgpu = with(&|c| c.virtual_gpus = VirtualGpus::Exclusive);
    vec![
        s("default", "`default-counters.csv` (no SM_ACTIVE), `--kubernetes`, `-c 30000`", base.clone(), 30),
        s("dcp-sm", "the DCP counters with `DCGM_FI_PROF_SM_ACTIVE` switched on", with(&|c| c.sm_active = true), 30),
        s("trimmed", "a trimmed counters file: no energy counter, no power", with(&|c| c.counters = Counters::Trimmed), 30),
        s(
            "dcgm-4.7",
            "DCGM 4.7 names (exporter 4.9): utilization as a ratio, memory in bytes, energy in J",
            with(&|c| c.names = Names::V49),
            30,
        ),
        s("old-names", "`-o`: `uuid`, `pod_name`, `pod_namespace`, `container_name`", with(&|c| c.old_namespace = true), 30),
        s(
            "vgpu-exclusive",
            "`--kubernetes-virtual-gpus` on an exclusive GPU (chart defaults: per-pod `GPU_UTIL`/`FB_USED` 0)",
            with(&|c| c.virtual_gpus = VirtualGpus::Exclusive),
            30,
        ),
        s(
            "vgpu-time-sliced",
            "virtual-GPU mode on a time-sliced GPU (`vgpu` label)",
            with(&|c| c.virtual_gpus = VirtualGpus::TimeSliced),
            30,
        ),
        s("mig", "a MIG instance (Flex mode): no `GPU_UTIL`, the whole GPU's power", with(&|c| c.mig = true), 30),
        s("collect-1s", "`-c 1000`", base.clone(), 1),
        s("collect-5m", "`-c 300000` (`exporter_collect_interval = \"5m\"`)", base.clone(), 300),
        s(
            "default-pod-uid-no-rbac",
            "`--kubernetes-enable-pod-uid` without pod read access: the pod's own series carry `pod_uid=\"\"`, no device-level series",
            with(&|c| c.pod_uid = PodUid::Empty),
            30,
        ),
        SetUp {
            drops_device_series: true,
            // Only the pod's copies are stored: its utilization and memory read 0, its profiling
            // and video fields are the device's. What computes cannot be judged; the rest can.
            differs: |k| match k {
                Kind::MemoryHeld => Some(("reclaim", "idle")),
                Kind::OneThread | Kind::LightKernel | Kind::Matmul | Kind::Bursty => Some(("unknown", "no-device-series")),
                Kind::StuckGr => Some(("keep", "gpu-active")),
                _ => None,
            },
            ..s(
                "vgpu-no-device-series",
                "behind Prometheus only: `vgpu-exclusive` stored without the series that carry no workload pod (a relabeling or selector dropped the device-level `GPU_UTIL`/`FB_USED`)",
                vgpu.clone(),
                30,
            )
        },
        SetUp {
            workspace_id_label: Some("label_com_coder_workspace_id"),
            ..s(
                "vgpu-pod-labels",
                "`vgpu-exclusive` with `workspace_id_label` set: virtual-GPU copies carry no pod labels, so the pod name maps",
                vgpu.clone(),
                30,
            )
        },
        SetUp {
            sharer: Some(Load::Matmul),
            // Judged by its own processes (their sums account for the device's readings): the
            // device-wide compute fields and power are nobody's own. A sharer that holds memory
            // keeps the device's DRAM activity: its copies cannot be told from the other
            // sharer's kernels, so beside a matmul it is kept; one that holds none is idle.
            differs: |k| match k {
                Kind::MemoryHeld | Kind::Bursty | Kind::StuckGr => Some(("keep", "gpu-active")),
                _ => None,
            },
            ..s(
                "time-sliced-per-process",
                "virtual-GPU mode on a time-sliced GPU with `hostPID` and real pod UIDs: each sharer's `GPU_UTIL`/`FB_USED` are its own processes'; the other sharer runs a matmul",
                with(&|c| {
                    c.virtual_gpus = VirtualGpus::TimeSliced;
                    c.pod_uid = PodUid::Real;
                    c.per_process = true;
                }),
                30,
            )
        },
        SetUp {
            model: "NVIDIA B300",
            ..s(
                "b300",
                "`dcp-sm` on a 160-SM GPU: a one-block kernel reads SM = duty / 160, printed with six decimals",
                with(&|c| {
                    c.sm_active = true;
                    c.sm_count = 160;
                }),
                30,
            )
        },
        SetUp {
            idle_after: Some(Duration::from_secs(300)),
            frozen_for_secs: 8 * 60,
            ..s(
                "collect-5m-idle-5m",
                "`collect-5m` with `idle_after = \"5m\"`, shorter than two collections; the frozen exporter froze 8 minutes ago, before frozen detection (two collections) could tell",
                base.clone(),
                300,
            )
        },
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Idle,
    MemoryHeld,
    OneThread,
    LightKernel,
    Matmul,
    Bursty,
    Transcode,
    CopyOnly,
    StuckGr,
    Frozen,
}

struct LoadCase {
    kind: Kind,
    name: &'static str,
    what: &'static str,
}

fn loads() -> Vec<LoadCase> {
    let l = |kind, name, what| LoadCase { kind, name, what };
    vec![
        l(Kind::Idle, "idle", "nothing running: 0%, 0 MiB, 24.3 W"),
        l(Kind::MemoryHeld, "memory held", "a process holds 19,376 MiB and waits"),
        l(Kind::OneThread, "one-thread kernel", "100%, GR 1.0, SM 0.012 (one SM of 80)"),
        l(Kind::LightKernel, "light periodic kernel", "one block a tenth of the time: 10%, GR 0.1, SM 0.00125"),
        l(Kind::Matmul, "matmul", "100%, GR 1.0, SM 0.984, tensor 0.41, DRAM 0.53, 299 W"),
        l(Kind::Bursty, "bursty notebook", "a matmul one minute in ten, memory held between; the last burst began 9 minutes ago"),
        l(Kind::Transcode, "encode/decode only", "NVENC 61%, NVDEC 35%, no kernel"),
        l(Kind::CopyOnly, "copy-only", "DRAM 0.62, SM 0, no kernel (memcpy, peer-to-peer)"),
        l(Kind::StuckGr, "stuck GR, busy utilization", "a matmul whose GR_ENGINE_ACTIVE reads 0 (exporter #662)"),
        l(Kind::Frozen, "frozen exporter", "the last idle collection served for 20 minutes (exporter #164)"),
    ]
}

/// The power veto of the matrix's second policy: an A10G drawing this much is kept.
const VETO_WATTS: f64 = 80.0;

/// What the docs promise for a load in a set-up (README "Readings as real exporters produce
/// them", docs/policy.md): the set-up decides only which signals exist. With the power veto a
/// GPU drawing `VETO_WATTS` is kept, unless its data is doubtful, the set-up has no power, or it
/// is a MIG instance (which reports the whole GPU's power).
fn expected(load: Kind, s: &SetUp, veto: bool) -> (&'static str, &'static str) {
    let watts = cell_exporter(load, s).1.reading_at(0).power_watts;
    // A sharer judged by its own processes has no power reading of its own.
    let own_power = s.exporter.counters != Counters::Trimmed && !s.exporter.mig && !s.exporter.per_process;
    let vetoed = veto && watts >= VETO_WATTS && own_power && s.model == "NVIDIA A10G";
    match expected_without_veto(load, s) {
        ("unknown", reason) => ("unknown", reason),
        _ if vetoed => ("keep", "gpu-active"),
        plain => plain,
    }
}

fn expected_without_veto(load: Kind, s: &SetUp) -> (&'static str, &'static str) {
    if let Some(differs) = (s.differs)(load) {
        return differs;
    }
    let sm = s.exporter.sm_active && s.exporter.profiling;
    let energy = s.exporter.counters != Counters::Trimmed;
    match load {
        Kind::Idle => ("reclaim", "idle"),
        Kind::MemoryHeld => ("reclaim", "memory-held-idle"),
        // SM_ACTIVE tells a one-thread or light kernel from work; without it GR_ENGINE_ACTIVE
        // reads them busy (the README's SM_ACTIVE note).
        Kind::OneThread | Kind::LightKernel if sm => ("reclaim", "phantom-utilization"),
        Kind::OneThread | Kind::LightKernel => ("keep", "gpu-active"),
        Kind::Matmul | Kind::Transcode | Kind::CopyOnly => ("keep", "gpu-active"),
        Kind::Bursty => ("keep", "not-idle-long-enough"),
        // GR at 0 under busy utilization is the stuck pattern; on MIG (no utilization) the busy
        // tensor pipes contradict it.
        Kind::StuckGr => ("unknown", "metrics-disagree"),
        Kind::Frozen if energy => ("unknown", "frozen-data"),
        // Without an energy counter a hung exporter's idle readings are an idle GPU's.
        Kind::Frozen => ("reclaim", "idle"),
    }
}

/// The exporter config and load of one cell.
fn cell_exporter(load: Kind, s: &SetUp) -> (ExporterConfig, Load) {
    let mut cfg = s.exporter.clone();
    let load = match load {
        Kind::Idle | Kind::Frozen => Load::Idle,
        Kind::MemoryHeld => Load::MemoryOnly,
        Kind::OneThread => Load::OneThread,
        Kind::LightKernel => Load::LightKernel,
        Kind::Matmul => Load::Matmul,
        Kind::Bursty => Load::Bursty { period: Duration::from_secs(600), busy: Duration::from_secs(60) },
        Kind::Transcode => Load::Encode,
        Kind::CopyOnly => Load::CopyOnly,
        Kind::StuckGr => {
            cfg.stuck = Some(Stuck::GrEngine);
            Load::Matmul
        }
    };
    (cfg, load)
}

/// A cell's workspace id (`variant` 0: the exporter source and `honorLabels: false`; 1: true).
fn ws_id(cell: usize, variant: usize) -> String {
    format!("{cell:08x}-1f4d-4c9e-9d3b-{variant:012x}")
}

/// Every scrape of one cell's GPU: (time, exposition). The exporter collects every `-c` (aligned
/// to the epoch) and serves its latest collection; the energy counter rises by the power drawn
/// between collections; a frozen exporter serves the collection before the freeze forever.
fn scrapes(end: i64, load: Kind, s: &SetUp, cell: usize, variant: usize) -> Vec<(i64, String)> {
    let (cfg, workload) = cell_exporter(load, s);
    let device = Device {
        uuid: format!("GPU-{cell:08x}-7d4f-4e8a-9c1b-{variant:012x}"),
        model: s.model.into(),
        holder: Some(Holder { pod: format!("coder-{}-6d9f8b7c5-x2x9k", ws_id(cell, variant)), load: workload }),
        sharer: s.sharer.map(|load| Holder { pod: format!("coder-{}-7c4d9a8b6-k3m8p", ws_id(cell, variant + 2)), load }),
    };
    let power_at = |millis: u128| {
        let own = workload.reading_at(millis);
        s.sharer.map_or(own, |load| own.together(&load.reading_at(millis))).power_watts
    };
    let c = s.collect_secs;
    let freeze = (load == Kind::Frozen).then_some((end - s.frozen_for_secs).div_euclid(c) * c);
    let mut energy_mj = 1.0e10;
    let mut collected: Option<(i64, String)> = None;
    let mut out = Vec::new();
    for at in (end - HISTORY_SECS..=end).step_by(SCRAPE_SECS as usize) {
        let due = at.div_euclid(c) * c;
        let due = freeze.map_or(due, |f| due.min(f));
        if collected.as_ref().is_none_or(|(t, _)| *t < due) {
            let since = collected.as_ref().map_or(0, |(t, _)| due - t);
            energy_mj += power_at(due as u128 * 1000) * since as f64 * 1000.0;
            let text = render_devices(std::slice::from_ref(&device), &cfg, &[energy_mj], due as u128 * 1000);
            collected = Some((due, if s.drops_device_series { without_device_series(&text) } else { text }));
        }
        if let Some((_, text)) = &collected {
            out.push((at, text.clone()));
        }
    }
    out
}

/// The policies a set-up is judged by: the defaults for 60 s passes, told the exporter's `-c`;
/// then the same with a power veto (`active_power_watts`) for the A10G.
fn policies(s: &SetUp) -> [Policy; 2] {
    let mut plain = Policy {
        exporter_collect_interval: Duration::from_secs(s.collect_secs as u64),
        ..Policy::defaults(Duration::from_secs(PASS_SECS as u64))
    };
    if let Some(idle_after) = s.idle_after {
        plain.thresholds.idle_after = idle_after;
    }
    let veto = Policy { active_power_watts: vec![("NVIDIA A10G".into(), VETO_WATTS)], ..plain.clone() };
    [plain, veto]
}

/// Which of `policies` a table shows.
const POLICY_NAMES: [&str; 2] = ["the default policy", "a power veto, `active_power_watts = { \"NVIDIA A10G\" = 80.0 }`"];

/// Decides each workspace of one set-up from its windows.
fn decide_all(now: DateTime<Utc>, windows: &Windows, workspaces: &[Workspace], p: &Policy) -> Vec<Decision> {
    workspaces.iter().map(|ws| decide(now, ws, windows.get(&ws.id), p, None)).collect()
}

fn windows_for(p: &Policy) -> Windows {
    Windows::new(duration::chrono(p.longest_lookback()), Duration::from_secs(PASS_SECS as u64))
}

/// One cell's outcome, per source.
struct Cell {
    policy: usize,
    load: usize,
    set_up: usize,
    want: (&'static str, &'static str),
    got: Vec<(String, (String, String, String))>,
}

fn outcome(d: &Decision) -> (String, String, String) {
    (d.verdict.as_str().to_string(), d.reason.as_str().to_string(), d.message.clone())
}

#[tokio::test]
async fn every_load_in_every_set_up_reads_as_the_docs_promise_from_both_sources() {
    let started = std::time::Instant::now();
    let (set_ups, loads) = (set_ups(), loads());
    // The end falls on a pass (a Prometheus step), 9 minutes after a notebook burst began
    // (bursts start on the 10-minute mark), 4 minutes after a 5-minute exporter's last
    // collection (its energy counter still for longer than frozen_after), and in the past:
    // Prometheus serves what promtool wrote only up to now.
    let end = Utc::now().timestamp().div_euclid(600) * 600 - 60;
    let now = DateTime::from_timestamp(end, 0).unwrap();
    let last_used = now - chrono::Duration::minutes(60);
    let coder = Ownership { namespace: Some("coder".into()), workspace_id_label: None };
    let ownerships = [("", Ownership::default()), (", namespace filter", coder.clone())];
    let (n_setups, n_loads) = (set_ups.len(), loads.len());
    let at = |pi: usize, si: usize, li: usize| (pi * n_setups + si) * n_loads + li;
    let mut cells: Vec<Cell> = (0..POLICY_NAMES.len() * n_setups * n_loads)
        .map(|i| {
            let (pi, si, li) = (i / (n_setups * n_loads), i / n_loads % n_setups, i % n_loads);
            Cell { policy: pi, load: li, set_up: si, want: expected(loads[li].kind, &set_ups[si], pi == 1), got: Vec::new() }
        })
        .collect();
    let pass = Duration::from_secs(PASS_SECS as u64);
    let mut stored = Stored::new();
    for (si, s) in set_ups.iter().enumerate() {
        let ps = policies(s);
        let index = |li: usize| si * n_loads + li;
        let histories: Vec<Vec<(i64, String)>> = loads.iter().enumerate().map(|(li, l)| scrapes(end, l.kind, s, index(li), 0)).collect();
        let workspaces: Vec<Workspace> = (0..n_loads).map(|li| running_workspace(&ws_id(index(li), 0), last_used)).collect();
        // The exporter source scrapes every cell's exporter each time.
        let texts: Vec<(i64, Vec<String>)> =
            (0..histories[0].len()).map(|i| (histories[0][i].0, histories.iter().map(|h| h[i].1.clone()).collect())).collect();
        // A store's relabeling is no exporter set-up: the exporter serves the whole layout.
        for (label, own) in ownerships.iter().filter(|_| !s.drops_device_series) {
            let own = Ownership { workspace_id_label: s.workspace_id_label.map(str::to_string), ..own.clone() };
            let windows = exporter_windows(now, &texts, &workspaces, &ps[0], pass, &own);
            for (pi, p) in ps.iter().enumerate() {
                for (li, d) in decide_all(now, &windows, &workspaces, p).iter().enumerate() {
                    cells[at(pi, si, li)].got.push((format!("exporter{label}"), outcome(d)));
                }
            }
        }
        for (li, l) in loads.iter().enumerate() {
            // `honorLabels: false` stores the exporter source's GPU; `true` a twin of its own.
            for (history, honor) in [(histories[li].clone(), false), (scrapes(end, l.kind, s, index(li), 1), true)] {
                store(&mut stored, history.iter().map(|(at, text)| (*at, text.as_str())), honor);
            }
        }
    }
    let exporter_secs = started.elapsed().as_secs_f64();

    if installed_or_skip(installed(), "prometheus").is_some() {
        let prom = prometheus_with(&openmetrics(&stored)).await;
        let url = crate::common::url(&prom.url);
        let labels: std::collections::BTreeSet<Option<&str>> = set_ups.iter().map(|s| s.workspace_id_label).collect();
        for ((label, own), workspace_id_label) in ownerships.iter().flat_map(|o| labels.iter().map(move |l| (o, *l))) {
            // The fetch depends only on the look-back, the same for every set-up's policies, and
            // asks for the power draw as it does under a power veto (the default policy reads none).
            let lookback = policies(&set_ups[0])[0].longest_lookback();
            let power = PrometheusOptions { power: true, ..PrometheusOptions::default() };
            let timeout = Duration::from_secs(30);
            let own = Ownership { workspace_id_label: workspace_id_label.map(str::to_string), ..own.clone() };
            let source =
                PrometheusSource::with_options(&url, own, lookback, pass, timeout, &Outbound::default(), DEFAULT_MAX_BODY, power).unwrap();
            let collection = source.collect(now).await;
            assert!(collection.failures.is_empty(), "{:?}", collection.failures);
            for (si, s) in set_ups.iter().enumerate().filter(|(_, s)| s.workspace_id_label == workspace_id_label) {
                let ps = policies(s);
                for (variant, honor) in [(0, "false"), (1, "true")] {
                    let workspaces: Vec<Workspace> =
                        (0..n_loads).map(|li| running_workspace(&ws_id(si * n_loads + li, variant), last_used)).collect();
                    let ids: HashSet<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
                    let series: Vec<GpuSeries> =
                        collection.series.iter().filter(|g| g.workspace_id.as_deref().is_some_and(|w| ids.contains(w))).cloned().collect();
                    let mut windows = windows_for(&ps[0]);
                    merge_collection(
                        &mut windows,
                        &mut Collection { series, step: collection.step, ..Collection::default() },
                        &workspaces,
                        chrono::Duration::zero(),
                    );
                    for (pi, p) in ps.iter().enumerate() {
                        for (li, d) in decide_all(now, &windows, &workspaces, p).iter().enumerate() {
                            cells[at(pi, si, li)].got.push((format!("Prometheus honorLabels {honor}{label}"), outcome(d)));
                        }
                    }
                }
            }
        }
    }

    let mut wrong = Vec::new();
    for c in &cells {
        for (source, (v, r, m)) in &c.got {
            if (v.as_str(), r.as_str()) != c.want {
                wrong.push(format!(
                    "{} in {} under {} via {source}: {v} {r} ({m}), want {} {}",
                    loads[c.load].name, set_ups[c.set_up].name, POLICY_NAMES[c.policy], c.want.0, c.want.1
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} readings differ from the docs:\n{}",
        wrong.len(),
        cells.iter().map(|c| c.got.len()).sum::<usize>(),
        wrong.join("\n")
    );
    let sources = cells[0].got.len();
    eprintln!(
        "readings matrix: {} loads x {} set-ups x {} policies x {sources} source variants in {:.1} s ({exporter_secs:.1} s of it rendering and the exporter source)",
        loads.len(),
        set_ups.len(),
        POLICY_NAMES.len(),
        started.elapsed().as_secs_f64()
    );
    check_readings_doc(&render_doc(&set_ups, &loads, &cells));
}

/// `docs/readings.md`: the matrix as a platform engineer reads it.
fn render_doc(set_ups: &[SetUp], loads: &[LoadCase], cells: &[Cell]) -> String {
    let mut out = String::new();
    out.push_str(
        "# What the service reads in your exporter set-up\n\n\
         Generated by `tests/readings.rs` (`UPDATE_READINGS=1 cargo test --test integration readings` rewrites it); the test fails\n\
         when this file and the service disagree. Each cell is the verdict and reason for one workspace that has run\n\
         the load for 40 minutes, nobody connected for an hour, under the default policy (`idle_after` 30m,\n\
         60 s passes) told the exporter's collect interval, and under the same with a power veto. The same verdict comes from every source: the\n\
         exporter scraped directly, with and without the namespace filter, and Prometheus holding the same\n\
         scrapes as a ServiceMonitor stores them (`honorLabels` false and true), with and without the filter.\n\n\
         `keep` and `unknown` never stop anything; `reclaim` stops the workspace.\n\n",
    );
    for (pi, policy) in POLICY_NAMES.iter().enumerate() {
        let _ = write!(out, "## Under {policy}\n\n| load |");
        for s in set_ups {
            let _ = write!(out, " {} |", s.name);
        }
        out.push_str("\n|---|");
        out.push_str(&"---|".repeat(set_ups.len()));
        out.push('\n');
        for (li, l) in loads.iter().enumerate() {
            let _ = write!(out, "| {} |", l.name);
            for si in 0..set_ups.len() {
                let c = &cells[(pi * set_ups.len() + si) * loads.len() + li];
                let _ = write!(out, " {} `{}` |", c.want.0, c.want.1);
            }
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str("## Set-ups\n\n");
    for s in set_ups {
        let _ = writeln!(out, "- **{}**: {}.", s.name, s.what);
    }
    out.push_str("\n## Loads\n\nReadings of an A10G (80 SMs) from the seed's stage-2 table and reference dcgm NOTES §9-10.\n\n");
    for l in loads {
        let _ = writeln!(out, "- **{}**: {}.", l.name, l.what);
    }
    out.push_str(
        "\n## What the set-up decides\n\n\
         - Without `DCGM_FI_PROF_SM_ACTIVE` a one-thread or light kernel reads busy through GR_ENGINE_ACTIVE \
         and is kept; with it, it is `phantom-utilization`.\n\
         - Without an energy counter (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, or `DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL` \
         under DCGM 4.7 names) frozen data cannot be told from an idle GPU: frozen detection is off, the GPU is \
         judged on its readings, and `check` says so.\n\
         - On MIG there is no `GPU_UTIL`: a stuck GR_ENGINE_ACTIVE is told by the busy tensor pipes, and busy \
         device memory alone (copy-only work) keeps an instance.\n\
         - Set `exporter_collect_interval` to the exporter's `-c`: frozen data needs two collections without the \
         counter rising.\n\
         - A power veto needs the power field (not in a trimmed counters file), and never applies to a MIG instance: \
         every instance reports the whole GPU's power.\n\
         - An empty `pod_uid` marks a virtual-GPU placeholder only beside a device-level series; without one it is the \
         default layout's own series (`--kubernetes-enable-pod-uid` without pod read access), read as it is.\n\
         - Behind Prometheus the empty `pod_uid` is dropped at ingestion, so virtual-GPU copies need the device-level \
         series in the store: without it a sharer, or an exclusive GPU reading 0 % and 0 MiB while its profiling fields \
         compute, is `unknown` `no-device-series`. An exclusive GPU without profiling fields cannot be told from an \
         idle one there (0 % and 0 MiB whatever runs): keep the series without a workload pod (the relabeling, \
         `prometheus_selector`); `check` fails when the store holds none.\n\
         - With `hostPID` and real pod UIDs on every sharer, and their own utilization and memory adding up to the \
         device-level readings, a time-sliced sharer is judged by its own processes: another sharer's work no longer \
         keeps an idle one. The device-wide compute fields and power are nobody's own and are not read for it; video \
         engines are (no per-process field says whose: a sharer encoding keeps every sharer), and so is DRAM for a \
         sharer that holds memory (its copies cannot be told from another sharer's kernels: kept). Where the sums do \
         not add up (a process not mapped to its pod, per-process utilization not supported, a graphics process), \
         every sharer reads the device's, as without per-process data.\n\
         - `workspace_id_label` falls back to the workspace id in the pod name: virtual-GPU copies carry no pod labels.\n\
         - SM_ACTIVE contradicts GR_ENGINE_ACTIVE only below half of one SM's share on 160 SMs (the most any GPU has): \
         a one-block kernel on a B300 is the phantom it is, not a stuck counter.\n\
         - A reclaim needs the energy counter to have risen within `idle_after`: with `idle_after` shorter than two \
         collections a frozen exporter is `frozen-data` before frozen detection could tell, and with `idle_after` at \
         or under `-c` a GPU may read `frozen-data` for a pass just before each collection (set `idle_after` longer).\n",
    );
    out
}

fn check_readings_doc(rendered: &str) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/readings.md");
    if std::env::var("UPDATE_READINGS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "docs/readings.md is not what the matrix says: run UPDATE_READINGS=1 cargo test --test integration readings"
    );
}
