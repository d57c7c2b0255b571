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
        }
    }
}

#[derive(Clone)]
pub struct ExporterState {
    pub world: Arc<Mutex<World>>,
    pub config: Arc<Mutex<ExporterConfig>>,
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

/// Renders the exposition for the current world.
pub fn render(world: &World, cfg: &ExporterConfig) -> String {
    let mut out = String::with_capacity(4096);
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
        let _ = writeln!(out, "# TYPE {name} gauge");
        for &slot in &slots {
            let holder = world.gpu_holder(slot);
            let load = holder.map_or(Load::Idle, |(ws, _)| ws.load);
            let r = load.reading();
            let zero = cfg.behaviour == Behaviour::AllZero;
            let value = match f.legacy {
                _ if zero => 0.0,
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
            if let Some((_, pod)) = holder {
                let _ = write!(out, ",container=\"dev\",namespace=\"coder\",pod=\"{}\"", pod.name);
            }
            let rendered = if f.double || (cfg.names == Names::V49 && f.legacy == "DCGM_FI_DEV_GPU_UTIL") {
                format!("{value:.6}")
            } else {
                format!("{}", value.round() as i64)
            };
            let _ = writeln!(out, "}} {rendered}");
        }
    }
    out
}

async fn metrics(State(s): State<ExporterState>) -> Response {
    let cfg = lock(&s.config).clone();
    match cfg.behaviour {
        Behaviour::EmptyBody => (StatusCode::OK, String::new()).into_response(),
        Behaviour::Failing => (StatusCode::SERVICE_UNAVAILABLE, "unavailable\n").into_response(),
        Behaviour::Garbage => (StatusCode::OK, "<html><body>502 Bad Gateway</body></html>\n").into_response(),
        Behaviour::Normal | Behaviour::AllZero => {
            let text = render(&lock(&s.world), &cfg);
            ([("X-Content-Type-Options", "nosniff")], text).into_response()
        }
    }
}

pub fn router(state: ExporterState) -> Router {
    Router::new().route("/metrics", get(metrics)).route("/health", get(|| async { "OK" })).with_state(state)
}
