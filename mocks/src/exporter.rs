//! The fake dcgm-exporter: `/metrics` in the real exporter's layout (label order `gpu, UUID,
//! pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID], Hostname, DCGM_FI_DRIVER_VERSION,
//! container, namespace, pod`; doubles with six decimals; integers bare; no timestamps), with the
//! pod labels of the workspace whose pod holds each GPU and none on free GPUs. Values come from
//! the holder's load (the seed's stage-2 table). Switches cover what real exporters do.

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
    /// Each pool slot is a MIG instance (two per parent GPU); no GPU_UTIL for MIG.
    pub mig: bool,
    pub behaviour: Behaviour,
    pub hostname: String,
    /// Only the GPUs with these pool indexes (one exporter per node); all when empty.
    pub gpus: Vec<usize>,
    /// `-c`: how often the exporter collects (real time). Scrapes in between get the cached
    /// values of the last collection (`EntityGetLatestValues`); zero collects at every scrape.
    pub collect_interval: std::time::Duration,
    /// `--kubernetes-virtual-gpus` without hostPID (the Helm chart's default): each pod series
    /// carries `vgpu` and `pod_uid`, its GPU_UTIL and FB_USED are 0 (no process could be mapped
    /// to the pod), its profiling fields are the device's; the device-level series (no pod
    /// labels) carries the real values (`internal/pkg/transformation/kubernetes.go`).
    pub virtual_gpus: bool,
    pub stuck: Option<Stuck>,
    /// A hung hostengine or exporter: the last collection is served forever (#164, DCGM #209).
    pub frozen: bool,
    /// Some values come out negative or NaN (a generic exporter bug; a parser must cope).
    pub broken_values: bool,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        ExporterConfig {
            profiling: true,
            sm_active: true,
            names: Names::Legacy,
            mig: false,
            behaviour: Behaviour::Normal,
            hostname: "gpu-node-1".into(),
            gpus: Vec::new(),
            collect_interval: std::time::Duration::ZERO,
            virtual_gpus: false,
            stuck: None,
            frozen: false,
            broken_values: false,
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
    Field {
        legacy: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        renamed: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
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

/// Renders the exposition for the current world (`energy_mj[slot]`: each GPU's counter).
pub fn render(world: &World, cfg: &ExporterConfig, energy_mj: &[f64]) -> String {
    let mut out = String::with_capacity(4096);
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let slots: Vec<usize> = if cfg.gpus.is_empty() { (0..world.gpu_holders.len()).collect() } else { cfg.gpus.clone() };
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
        let name = if cfg.names == Names::V49 { f.renamed } else { f.legacy };
        let _ = writeln!(out, "# HELP {name} {}", f.help);
        let _ = writeln!(out, "# TYPE {name} {}", if f.legacy.contains("ENERGY") { "counter" } else { "gauge" });
        for &slot in &slots {
            let holder = world.gpu_holder(slot);
            let load = holder.map_or(Load::Idle, |(ws, _)| ws.load);
            let r = load.reading_at(millis);
            let zero = cfg.behaviour == Behaviour::AllZero;
            let stuck = |which: Stuck| cfg.stuck == Some(which);
            let value = match f.legacy {
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => energy_mj.get(slot).copied().unwrap_or(0.0),
                _ if zero => 0.0,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if stuck(Stuck::GrEngine) => 0.0,
                "DCGM_FI_PROF_SM_ACTIVE" if stuck(Stuck::SmActive) => 0.0,
                "DCGM_FI_DEV_GPU_UTIL" if cfg.broken_values => f64::NAN,
                "DCGM_FI_DEV_FB_USED" if cfg.broken_values => -1.0,
                "DCGM_FI_DEV_ENC_UTIL" => r.enc_percent,
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
                "DCGM_FI_DEV_GPU_UTIL" => {
                    if cfg.names == Names::V49 {
                        r.util_percent / 100.0
                    } else {
                        r.util_percent
                    }
                }
                "DCGM_FI_DEV_FB_FREE" => FB_TOTAL_MIB - r.fb_used_mib,
                "DCGM_FI_DEV_FB_USED" => {
                    if cfg.names == Names::V49 {
                        r.fb_used_mib * 1_048_576.0
                    } else {
                        r.fb_used_mib
                    }
                }
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => r.gr_engine_active,
                "DCGM_FI_PROF_SM_ACTIVE" => r.sm_active,
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => {
                    if load == Load::Matmul {
                        0.412
                    } else {
                        0.0
                    }
                }
                _ => {
                    if load == Load::Matmul {
                        0.533
                    } else {
                        0.0
                    }
                }
            };
            let (gpu, parent) = if cfg.mig { (slot / 2, slot / 2) } else { (slot, slot) };
            let uuid = world.gpu_uuids.get(parent * if cfg.mig { 2 } else { 1 }).cloned().unwrap_or_default();
            let _ = write!(
                out,
                "{name}{{gpu=\"{gpu}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{gpu}\",modelName=\"{}\"",
                0x4E + gpu,
                world.config.gpu_model
            );
            if cfg.mig {
                let _ = write!(out, ",GPU_I_PROFILE=\"3g.71gb\",GPU_I_ID=\"{}\"", slot % 2 + 1);
            }
            let _ = write!(out, ",Hostname=\"{}\",DCGM_FI_DRIVER_VERSION=\"570.124.06\"", cfg.hostname);
            let head = out.rsplit_once('\n').map_or(out.as_str(), |(_, last)| last).to_string();
            let render_value = |v: f64| {
                if !v.is_finite() {
                    "NaN".to_string()
                } else if f.double || (cfg.names == Names::V49 && f.legacy == "DCGM_FI_DEV_GPU_UTIL") {
                    format!("{v:.6}")
                } else {
                    format!("{}", v.round() as i64)
                }
            };
            match holder {
                Some((ws, pod)) if cfg.virtual_gpus => {
                    // The device-level series (no pod labels, real values), then the pod's.
                    let _ = writeln!(out, "}} {}", render_value(value));
                    let per_process = matches!(f.legacy, "DCGM_FI_DEV_GPU_UTIL" | "DCGM_FI_DEV_FB_USED");
                    let pod_value = if per_process { 0.0 } else { value };
                    let _ = writeln!(
                        out,
                        "{head},container=\"dev\",namespace=\"coder\",pod=\"{}\",pod_uid=\"{}\",vgpu=\"0\"}} {}",
                        pod.name,
                        ws.id,
                        render_value(pod_value)
                    );
                }
                Some((_, pod)) => {
                    let _ = writeln!(out, ",container=\"dev\",namespace=\"coder\",pod=\"{}\"}} {}", pod.name, render_value(value));
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
            ([("X-Content-Type-Options", "nosniff")], text).into_response()
        }
    }
}

pub fn router(state: ExporterState) -> Router {
    Router::new().route("/metrics", get(metrics)).route("/health", get(|| async { "OK" })).with_state(state)
}
