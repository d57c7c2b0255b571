//! Synthetic fleets for the benchmarks, in the real layouts: dcgm-exporter expositions (the
//! default counters, label order and number formats of reference NOTES §2.1) and Coder
//! workspace listings (the captured, spec-checked fixture repeated with new ids).

#![allow(dead_code, clippy::disallowed_methods)]

use std::fmt::Write;
use std::io::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;

/// GPUs per exporter (one node).
pub const GPUS_PER_NODE: usize = 8;

/// The 25 series of the default counters file (DRIVER_VERSION is a label), plus SM_ACTIVE and
/// four more profiling fields: 30 metrics per GPU.
pub const METRICS: [(&str, bool); 30] = [
    ("DCGM_FI_DEV_SM_CLOCK", false),
    ("DCGM_FI_DEV_MEM_CLOCK", false),
    ("DCGM_FI_DEV_MEMORY_TEMP", false),
    ("DCGM_FI_DEV_GPU_TEMP", false),
    ("DCGM_FI_DEV_POWER_USAGE", true),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", false),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", false),
    ("DCGM_FI_DEV_GPU_UTIL", false),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", false),
    ("DCGM_FI_DEV_ENC_UTIL", false),
    ("DCGM_FI_DEV_DEC_UTIL", false),
    ("DCGM_FI_DEV_XID_ERRORS", false),
    ("DCGM_FI_DEV_FB_FREE", false),
    ("DCGM_FI_DEV_FB_USED", false),
    ("DCGM_FI_DEV_FB_RESERVED", false),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", false),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", false),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", false),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", false),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", false),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", true),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", true),
    ("DCGM_FI_PROF_DRAM_ACTIVE", true),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", false),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", false),
    ("DCGM_FI_PROF_SM_ACTIVE", true),
    ("DCGM_FI_PROF_SM_OCCUPANCY", true),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", true),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", true),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", true),
];

pub fn workspace_id(i: usize) -> String {
    format!("{:08x}-1f4d-4c9e-9d3b-{:012x}", 0x0b7c_0000 + (i >> 16), i)
}

/// One exporter's /metrics for GPUs `first..first+count`, GPU i held by workspace i. Every
/// tenth workspace computes (matmul); the rest idle.
pub fn exposition(first: usize, count: usize) -> String {
    let mut out = String::with_capacity(count * METRICS.len() * 360);
    for (name, double) in METRICS {
        let _ = writeln!(out, "# HELP {name} ");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for g in first..first + count {
            let busy = g % 10 == 0;
            let value: f64 = match name {
                "DCGM_FI_DEV_GPU_UTIL" => {
                    if busy {
                        100.0
                    } else {
                        0.0
                    }
                }
                "DCGM_FI_DEV_FB_USED" => {
                    if busy {
                        850.0
                    } else {
                        0.0
                    }
                }
                "DCGM_FI_DEV_POWER_USAGE" => {
                    if busy {
                        299.2
                    } else {
                        24.3
                    }
                }
                "DCGM_FI_PROF_SM_ACTIVE" => {
                    if busy {
                        0.984
                    } else {
                        0.0
                    }
                }
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => {
                    if busy {
                        1.0
                    } else {
                        0.0
                    }
                }
                _ => (g % 97) as f64,
            };
            let local = g - first;
            let _ = write!(
                out,
                "{name}{{gpu=\"{local}\",UUID=\"GPU-{:08x}-1c2b-4d5e-8f90-{:012x}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{local}\",modelName=\"NVIDIA H200\",Hostname=\"gpu-node-{}\",DCGM_FI_DRIVER_VERSION=\"570.124.06\",container=\"dev\",namespace=\"coder\",pod=\"coder-{}-7d9f8b6c5d-x2x9k\"}} ",
                g,
                g,
                0x18 + local,
                first / 8,
                workspace_id(g)
            );
            if double {
                let _ = writeln!(out, "{value:.6}");
            } else {
                let _ = writeln!(out, "{}", value as i64);
            }
        }
    }
    out
}

/// A `GET /api/v2/workspaces` body with `n` running workspaces shaped like the captured fixture.
pub fn listing(template_workspace: &serde_json::Value, n: usize) -> String {
    let template = serde_json::to_string(template_workspace).unwrap_or_default();
    let old_id = template_workspace["id"].as_str().unwrap_or_default().to_string();
    let mut out = String::with_capacity(n * (template.len() + 16) + 64);
    out.push_str("{\"workspaces\":[");
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&template.replace(&old_id, &workspace_id(i)).replace("\"alice-gpu\"", &format!("\"ws-{i}\"")));
    }
    let _ = write!(out, "],\"count\":{n}}}");
    out
}

pub struct Served {
    listing: String,
    nodes: Vec<String>,
    buildinfo: String,
    owner: String,
}

pub fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/coder/{name}", env!("CARGO_MANIFEST_DIR"))).expect("fixture")
}

/// Child mode: serve a listing and the exporters for `n` workspaces; print the port.
pub async fn serve(n: usize) {
    let list: serde_json::Value = serde_json::from_str(&fixture("workspaces_running.json")).expect("fixture json");
    let alice = list["workspaces"].as_array().and_then(|w| w.iter().find(|w| w["name"] == "alice-gpu")).cloned().expect("alice-gpu");
    let served = Arc::new(Served {
        listing: listing(&alice, n),
        nodes: (0..n.div_ceil(GPUS_PER_NODE)).map(|i| exposition(i * GPUS_PER_NODE, GPUS_PER_NODE.min(n - i * GPUS_PER_NODE))).collect(),
        buildinfo: fixture("buildinfo.json"),
        owner: fixture("user_owner.json"),
    });
    // Start-up reads buildinfo, users/me and authcheck (the key lookup 404s: expiry unknown, a
    // warning).
    let app = Router::new()
        .route("/api/v2/buildinfo", get(|State(s): State<Arc<Served>>| async move { s.buildinfo.clone() }))
        .route("/api/v2/users/me", get(|State(s): State<Arc<Served>>| async move { s.owner.clone() }))
        // Every check allowed (the owner's token): one answer per check asked, by its key (an
        // organization id for the per-organization stop checks).
        .route(
            "/api/v2/authcheck",
            axum::routing::post(|axum::Json(body): axum::Json<serde_json::Value>| async move {
                let answers: serde_json::Map<String, serde_json::Value> =
                    body["checks"].as_object().into_iter().flatten().map(|(k, _)| (k.clone(), serde_json::Value::Bool(true))).collect();
                axum::Json(answers)
            }),
        )
        .route("/api/v2/workspaces", get(|State(s): State<Arc<Served>>| async move { s.listing.clone() }))
        .route(
            "/node/{i}/metrics",
            get(|State(s): State<Arc<Served>>, Path(i): Path<usize>| async move { s.nodes.get(i).cloned().unwrap_or_default() }),
        )
        .with_state(served);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{}", listener.local_addr().expect("addr").port());
    std::io::stdout().flush().ok();
    axum::serve(listener, app).await.ok();
}

pub fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// CPU time of this process (user + system), from /proc/self/stat (clock ticks of 10 ms).
pub fn cpu_seconds() -> f64 {
    cpu_seconds_of("self")
}

/// CPU time of process `pid` ("self" for this one), user + system, from /proc/PID/stat.
pub fn cpu_seconds_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    // Fields after the command, from `state` (field 3 of proc(5)); utime and stime are fields 14
    // and 15. Counted by position: tpgid is -1 without a terminal, so parsing would shift them.
    let field = |n: usize| after.split_whitespace().nth(n - 3).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    (field(14) + field(15)) as f64 / 100.0
}
