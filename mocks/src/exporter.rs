//! The fake dcgm-exporter: `/metrics` in the real exporter's layout (label order `gpu, UUID,
//! pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID], Hostname, DCGM_FI_DRIVER_VERSION,
//! container, namespace, pod[, pod_uid, vgpu]`; doubles with six decimals; integers bare; no
//! timestamps), with the pod labels of the workspace whose pod holds each GPU and none on free
//! GPUs. Values come from the holder's load (the seed's stage-2 table). Switches cover the
//! set-ups people run (reference dcgm `LAYOUTS.md`, `NOTES.md` §3-4 and §9-10): the counters
//! file, `-o` label names, virtual-GPU mode on an exclusive or a time-sliced GPU, MIG, DCGM 4.7
//! names, the collect interval, and what broken exporters do. `render_devices` is the whole
//! layout from plain values, so tests can render any set-up at any time without a server.

use std::fmt::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::coder::lock;
use crate::world::{Load, World};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// Pre-4.9 names: GPU_UTIL in %, FB_USED in MiB.
    Legacy,
    /// Exporter 4.9 / DCGM 4.7 names: utilization as a 0..1 ratio, memory in bytes.
    V49,
}

/// The counters file (`-f`; NOTES §1.1, LAYOUTS §7). Profiling fields follow `profiling` and
/// `sm_active` in either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counters {
    /// `etc/default-counters.csv`: utilization, memory, power, the energy counter, video engines.
    Default,
    /// A trimmed file, or a relabeling that keeps only charted fields: no energy counter and no
    /// power (NOTES §10 "Energy").
    Trimmed,
}

/// `--kubernetes-virtual-gpus` (NOTES §10, `internal/pkg/transformation/kubernetes.go`,
/// `process_metrics.go`), with the Helm chart's defaults (no hostPID, no pod informer, so no
/// process maps to a pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtualGpus {
    Off,
    /// On, on an exclusive GPU (kubelet device ids without `::`): no `vgpu` label (LAYOUTS §3).
    Exclusive,
    /// On, on a time-sliced GPU (kubelet ids `GPU-…::N`): every pod copy carries `vgpu` (LAYOUTS §4).
    TimeSliced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Normal,
    /// An empty body (as during a hot reload).
    EmptyBody,
    /// 503 on every scrape.
    Failing,
    /// Every reading is zero (a broken exporter).
    AllZero,
    /// Not an exposition at all.
    Garbage,
}

/// A profiling counter that reads 0 whatever the GPU does (exporter #662, #635; DCGM #244, #303).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stuck {
    GrEngine,
    SmActive,
}

#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// Profiling (DCP) fields present; absent on GPUs that lack them.
    pub profiling: bool,
    /// SM_ACTIVE is commented out in the default CSV; the deploy module switches it on.
    pub sm_active: bool,
    pub names: Names,
    pub counters: Counters,
    /// `-o` (`--use-old-namespace`): `uuid`, `container_name`, `pod_name`, `pod_namespace`
    /// (NOTES §3, LAYOUTS §2).
    pub old_namespace: bool,
    /// Each pool slot is a MIG instance (two per parent GPU); no GPU_UTIL for MIG.
    pub mig: bool,
    pub behaviour: Behaviour,
    pub hostname: String,
    /// Only the GPUs with these pool indexes (one exporter per node); all when empty.
    pub gpus: Vec<usize>,
    /// `-c`: how often the exporter collects (real time). Scrapes in between get the cached
    /// values of the last collection (`EntityGetLatestValues`); zero collects at every scrape.
    pub collect_interval: std::time::Duration,
    /// Virtual-GPU mode: for `GPU_UTIL` and `FB_USED`, the device-level series plus a per-pod
    /// copy reading 0 with an empty `pod_uid`; every other field once per pod with the device's
    /// value and no device-level original (NOTES §10, LAYOUTS §3-4).
    pub virtual_gpus: VirtualGpus,
    pub stuck: Option<Stuck>,
    /// A hung hostengine or exporter: the last collection is served forever (#164, DCGM #209).
    pub frozen: bool,
    /// Some values come out negative or NaN (a generic exporter bug; a parser must cope).
    pub broken_values: bool,
    /// `--kubernetes-enable-pod-uid` and what the pod informer finds (NOTES §11.1).
    pub pod_uid: PodUid,
    /// The exporter maps processes to pods (`hostPID: true` and real pod UIDs, NOTES §11.2): in
    /// virtual-GPU mode each pod's `GPU_UTIL`/`FB_USED` are its own processes'.
    pub per_process: bool,
    /// The GPU's SM count: a one-block load reads SM_ACTIVE ≈ duty / SMs (the seed's A10G: 80).
    pub sm_count: u32,
    /// Lines appended to every body as they are: what a hijacked target or a hostile exporter
    /// adds (forged series, a flood of bad lines).
    pub extra: std::sync::Arc<str>,
}

/// `--kubernetes-enable-pod-uid` (NOTES §11.1, `kubernetes.go` `createPodInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodUid {
    /// Not set: no `pod_uid` label (virtual-GPU per-process copies write it anyway, empty).
    Off,
    /// Set, but the pod lister finds no pod (no pod read access, informer not synced): `""`.
    Empty,
    /// Set, and the pod is found: its UID.
    Real,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        ExporterConfig {
            profiling: true,
            sm_active: true,
            names: Names::Legacy,
            counters: Counters::Default,
            old_namespace: false,
            mig: false,
            behaviour: Behaviour::Normal,
            hostname: "gpu-node-1".into(),
            gpus: Vec::new(),
            collect_interval: std::time::Duration::ZERO,
            virtual_gpus: VirtualGpus::Off,
            stuck: None,
            frozen: false,
            broken_values: false,
            pod_uid: PodUid::Off,
            per_process: false,
            sm_count: 80,
            extra: std::sync::Arc::from(""),
        }
    }
}

#[derive(Clone)]
pub struct ExporterState {
    pub world: Arc<Mutex<World>>,
    pub config: Arc<Mutex<ExporterConfig>>,
    pub cache: Arc<Mutex<Collected>>,
}

/// The exporter's last collection, and each GPU's energy counter (mJ since driver load).
#[derive(Debug, Default)]
pub struct Collected {
    at: Option<std::time::Instant>,
    text: String,
    energy_mj: Vec<f64>,
    energy_at: Option<std::time::Instant>,
}

struct Field {
    legacy: &'static str,
    renamed: &'static str,
    help: &'static str,
    double: bool,
    profiling: bool,
}

const FIELDS: &[Field] = &[
    Field {
        legacy: "DCGM_FI_DEV_SM_CLOCK",
        renamed: "DCGM_FI_DEV_SM_CLOCK",
        help: "SM clock frequency (in MHz).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_DEV_GPU_TEMP",
        renamed: "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        help: "GPU temperature (in C).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_DEV_POWER_USAGE",
        renamed: "DCGM_FI_DEV_BOARD_POWER_WATTS",
        help: "Power draw (in W).",
        double: true,
        profiling: false,
    },
    // DCGM 4.7 name and unit (joules): go-dcgm 4.6.1 `dcgm_fields.h`, field 1611 (NOTES §10).
    Field {
        legacy: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        renamed: "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
        help: "Total energy consumption since boot (in mJ).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_DEV_ENC_UTIL",
        renamed: "DCGM_FI_DEV_ENC_UTIL",
        help: "Encoder utilization (in %).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_DEV_DEC_UTIL",
        renamed: "DCGM_FI_DEV_DEC_UTIL",
        help: "Decoder utilization (in %).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_DEV_GPU_UTIL",
        renamed: "DCGM_FI_DEV_GPU_UTIL_RATIO",
        help: "GPU utilization (in %).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_DEV_FB_FREE",
        renamed: "DCGM_FI_DEV_FB_FREE",
        help: "Frame buffer memory free (in MiB).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_DEV_FB_USED",
        renamed: "DCGM_FI_DEV_FB_USED_BYTES",
        help: "Frame buffer memory used (in MiB).",
        double: false,
        profiling: false,
    },
    Field {
        legacy: "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        renamed: "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        help: "Ratio of time the graphics engine is active.",
        double: true,
        profiling: true,
    },
    Field {
        legacy: "DCGM_FI_PROF_SM_ACTIVE",
        renamed: "DCGM_FI_PROF_SM_UTIL_RATIO",
        help: "The ratio of cycles an SM has at least 1 warp assigned.",
        double: true,
        profiling: true,
    },
    Field {
        legacy: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        renamed: "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
        help: "Ratio of cycles the tensor (HMMA) pipe is active.",
        double: true,
        profiling: true,
    },
    Field {
        legacy: "DCGM_FI_PROF_DRAM_ACTIVE",
        renamed: "DCGM_FI_PROF_DRAM_UTIL_RATIO",
        help: "Ratio of cycles the device memory interface is active sending or receiving data.",
        double: true,
        profiling: true,
    },
];

const FB_TOTAL_MIB: f64 = 22_731.0;

/// One GPU as the exporter sees it: its identity, and the pod holding it with that pod's load
/// (and on a time-sliced GPU in virtual-GPU mode, a second pod sharing it).
#[derive(Debug, Clone)]
pub struct Device {
    pub uuid: String,
    pub model: String,
    pub holder: Option<Holder>,
    pub sharer: Option<Holder>,
}

/// A pod's UID as the kubelet would give it (a UUID), derived from its name.
pub fn pod_uid_of(pod: &str) -> String {
    let h = pod.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", h >> 32, (h >> 16) & 0xffff, h & 0xfff, (h >> 20) & 0xfff, h & 0xffff_ffff_ffff)
}

#[derive(Debug, Clone)]
pub struct Holder {
    pub pod: String,
    pub load: Load,
}

/// Renders the exposition for the current world (`energy_mj[slot]`: each GPU's counter).
pub fn render(world: &World, cfg: &ExporterConfig, energy_mj: &[f64]) -> String {
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let devices: Vec<Device> = (0..world.gpu_holders.len())
        .map(|slot| Device {
            uuid: world.gpu_uuids.get(slot).cloned().unwrap_or_default(),
            model: world.config.gpu_model.clone(),
            holder: world.gpu_holder(slot).map(|(ws, pod)| Holder { pod: pod.name.clone(), load: ws.load }),
            sharer: None,
        })
        .collect();
    render_devices(&devices, cfg, energy_mj, millis)
}

/// Renders the exposition of `devices` (pool slots; with MIG each slot is an instance, two per
/// parent GPU) as collected at `millis` (real time since the epoch, for bursty loads).
pub fn render_devices(devices: &[Device], cfg: &ExporterConfig, energy_mj: &[f64], millis: u128) -> String {
    let mut out = String::with_capacity(4096);
    let slots: Vec<usize> = if cfg.gpus.is_empty() { (0..devices.len()).collect() } else { cfg.gpus.clone() };
    let v49 = cfg.names == Names::V49;
    for f in FIELDS {
        if f.profiling && !cfg.profiling {
            continue; // the exporter drops unsupported DCP rows entirely: no HELP, no TYPE, no series
        }
        if f.legacy == "DCGM_FI_PROF_SM_ACTIVE" && !cfg.sm_active {
            continue;
        }
        if f.legacy == "DCGM_FI_DEV_GPU_UTIL" && cfg.mig {
            continue; // not supported for MIG instances
        }
        let energy = f.legacy == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION";
        if cfg.counters == Counters::Trimmed && (energy || f.legacy == "DCGM_FI_DEV_POWER_USAGE") {
            continue;
        }
        let name = if v49 { f.renamed } else { f.legacy };
        let _ = writeln!(out, "# HELP {name} {}", f.help);
        let _ = writeln!(out, "# TYPE {name} {}", if energy { "counter" } else { "gauge" });
        for &slot in &slots {
            let Some(device) = devices.get(slot) else { continue };
            let reading_of = |h: Option<&Holder>| {
                let load = h.map_or(Load::Idle, |h| h.load);
                let mut r = load.reading_at(millis);
                if load.is_one_block() {
                    r.sm_active *= 80.0 / f64::from(cfg.sm_count.max(1));
                }
                r
            };
            let own = reading_of(device.holder.as_ref());
            let shared = device.sharer.as_ref().filter(|_| cfg.virtual_gpus == VirtualGpus::TimeSliced);
            let r = shared.map_or(own, |s| own.together(&reading_of(Some(s))));
            let zero = cfg.behaviour == Behaviour::AllZero;
            let stuck = |which: Stuck| cfg.stuck == Some(which);
            let value_of = |r: &crate::world::Reading| match f.legacy {
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => energy_mj.get(slot).copied().unwrap_or(0.0) / if v49 { 1000.0 } else { 1.0 },
                _ if zero => 0.0,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if stuck(Stuck::GrEngine) => 0.0,
                "DCGM_FI_PROF_SM_ACTIVE" if stuck(Stuck::SmActive) => 0.0,
                "DCGM_FI_DEV_GPU_UTIL" if cfg.broken_values => f64::NAN,
                "DCGM_FI_DEV_FB_USED" if cfg.broken_values => -1.0,
                "DCGM_FI_DEV_ENC_UTIL" => r.enc_percent,
                "DCGM_FI_DEV_DEC_UTIL" => r.dec_percent,
                "DCGM_FI_DEV_SM_CLOCK" => {
                    if r.util_percent > 0.0 {
                        1710.0
                    } else {
                        210.0
                    }
                }
                "DCGM_FI_DEV_GPU_TEMP" => {
                    if r.power_watts > 100.0 {
                        61.0
                    } else {
                        33.0
                    }
                }
                "DCGM_FI_DEV_POWER_USAGE" => r.power_watts,
                "DCGM_FI_DEV_GPU_UTIL" => r.util_percent / if v49 { 100.0 } else { 1.0 },
                "DCGM_FI_DEV_FB_FREE" => FB_TOTAL_MIB - r.fb_used_mib,
                "DCGM_FI_DEV_FB_USED" => r.fb_used_mib * if v49 { 1_048_576.0 } else { 1.0 },
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => r.gr_engine_active,
                "DCGM_FI_PROF_SM_ACTIVE" => r.sm_active,
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => r.tensor_active,
                _ => r.dram_active,
            };
            let value = value_of(&r);
            let gpu = if cfg.mig { slot / 2 } else { slot };
            let uuid = if cfg.mig { devices.get(gpu * 2).map_or("", |d| d.uuid.as_str()) } else { device.uuid.as_str() };
            let uuid_label = if cfg.old_namespace { "uuid" } else { "UUID" };
            let _ = write!(
                out,
                "{name}{{gpu=\"{gpu}\",{uuid_label}=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{gpu}\",modelName=\"{}\"",
                0x4E + gpu,
                device.model
            );
            if cfg.mig {
                let _ = write!(out, ",GPU_I_PROFILE=\"3g.71gb\",GPU_I_ID=\"{}\"", slot % 2 + 1);
            }
            let _ = write!(out, ",Hostname=\"{}\",DCGM_FI_DRIVER_VERSION=\"570.124.06\"", cfg.hostname);
            let head = out.rsplit_once('\n').map_or(out.as_str(), |(_, last)| last).to_string();
            let render_value = |v: f64| {
                if !v.is_finite() {
                    "NaN".to_string()
                } else if f.double || (v49 && (f.legacy == "DCGM_FI_DEV_GPU_UTIL" || energy)) {
                    format!("{v:.6}")
                } else {
                    format!("{}", v.round() as i64)
                }
            };
            // Attributes come sorted (Go templates iterate maps in key order, NOTES §2.1).
            let pod_labels = |pod: &str| {
                if cfg.old_namespace {
                    format!(",container_name=\"dev\",pod_name=\"{pod}\",pod_namespace=\"coder\"")
                } else {
                    format!(",container=\"dev\",namespace=\"coder\",pod=\"{pod}\"")
                }
            };
            // `pod_uid` as `createPodInfo` leaves it: the UID only when the lister found the pod.
            let uid = |pod: &str, always: bool| match cfg.pod_uid {
                PodUid::Real => format!(",pod_uid=\"{}\"", pod_uid_of(pod)),
                PodUid::Empty => ",pod_uid=\"\"".to_string(),
                PodUid::Off if always => ",pod_uid=\"\"".to_string(),
                PodUid::Off => String::new(),
            };
            match &device.holder {
                Some(h) if cfg.virtual_gpus != VirtualGpus::Off => {
                    let per_process = matches!(f.legacy, "DCGM_FI_DEV_GPU_UTIL" | "DCGM_FI_DEV_FB_USED");
                    if per_process {
                        // The device-level original first (`createPerProcessMetrics`).
                        let _ = writeln!(out, "}} {}", render_value(value));
                    }
                    let pods = [Some(h), shared].into_iter().flatten();
                    for (n, pod) in pods.enumerate() {
                        let vgpu = if cfg.virtual_gpus == VirtualGpus::TimeSliced { format!(",vgpu=\"{n}\"") } else { String::new() };
                        let line_head = if n == 0 && !per_process { String::new() } else { head.clone() };
                        let v = if !per_process {
                            value
                        } else if cfg.per_process && cfg.pod_uid == PodUid::Real {
                            value_of(&reading_of(Some(pod))) // its own processes', summed per pod
                        } else {
                            0.0 // no PID mapped to the pod (`buildIdlePodValues`)
                        };
                        let _ =
                            writeln!(out, "{line_head}{}{}{vgpu}}} {}", pod_labels(&pod.pod), uid(&pod.pod, per_process), render_value(v));
                    }
                }
                Some(h) => {
                    let _ = writeln!(out, "{}{}}} {}", pod_labels(&h.pod), uid(&h.pod, false), render_value(value));
                }
                None => {
                    let _ = writeln!(out, "}} {}", render_value(value));
                }
            }
        }
    }
    out
}

/// A collection: advance each GPU's energy counter by its power since the last one, render.
fn collect(world: &World, cfg: &ExporterConfig, c: &mut Collected) {
    let now = std::time::Instant::now();
    let slots = world.gpu_holders.len();
    c.energy_mj.resize(slots, 1.0e9);
    let dt = c.energy_at.map_or(0.0, |t| now.duration_since(t).as_secs_f64()) * world.config.scale;
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    for (slot, e) in c.energy_mj.iter_mut().enumerate() {
        let watts = world.gpu_holder(slot).map_or(Load::Idle, |(ws, _)| ws.load).reading_at(millis).power_watts;
        *e += watts * dt * 1000.0;
    }
    c.energy_at = Some(now);
    c.text = render(world, cfg, &c.energy_mj);
    c.at = Some(now);
}

async fn metrics(State(s): State<ExporterState>) -> Response {
    let cfg = lock(&s.config).clone();
    match cfg.behaviour {
        Behaviour::EmptyBody => (StatusCode::OK, String::new()).into_response(),
        Behaviour::Failing => (StatusCode::SERVICE_UNAVAILABLE, "unavailable\n").into_response(),
        Behaviour::Garbage => (StatusCode::OK, "<html><body>502 Bad Gateway</body></html>\n").into_response(),
        Behaviour::Normal | Behaviour::AllZero => {
            let text = {
                let mut cache = lock(&s.cache);
                let due = cache.at.is_none_or(|t| t.elapsed() >= cfg.collect_interval);
                if due && !(cfg.frozen && cache.at.is_some()) {
                    collect(&lock(&s.world), &cfg, &mut cache);
                }
                cache.text.clone()
            };
            let text = if cfg.extra.is_empty() { text } else { format!("{text}{}", cfg.extra) };
            ([("X-Content-Type-Options", "nosniff")], text).into_response()
        }
    }
}

pub fn router(state: ExporterState) -> Router {
    Router::new().route("/metrics", get(metrics)).route("/health", get(|| async { "OK" })).with_state(state)
}
