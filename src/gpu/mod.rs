//! Where GPU readings come from: the `GpuSource` trait, the two sources (dcgm-exporter scraped
//! directly, or Prometheus) and `Sources`, the configured one. What they yield (GPU identity,
//! `GpuSeries`, ownership, the parser, the signals, the windows) is the core crate's `gpu`,
//! re-exported here whole, so `gpu::GpuSeries` and `gpu::window` name the same things in both.

pub mod exporter;
pub mod prometheus;
pub mod source;

use std::collections::HashSet;

use chrono::{DateTime, Utc};

pub use reclaimer_core::gpu::*;
pub use source::{Collection, GpuSource, SourceFailure};

/// The configured source.
// One per process: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Sources {
    Exporters(exporter::ExporterSource),
    Prometheus(prometheus::PrometheusSource),
}

impl GpuSource for Sources {
    async fn collect(&self, now: DateTime<Utc>) -> Collection {
        match self {
            Sources::Exporters(s) => s.collect(now).await,
            Sources::Prometheus(s) => s.collect(now).await,
        }
    }
}

impl Sources {
    /// Whether a pass lists the workspaces before it reads this source, to hold only their
    /// series (`want`): Prometheus answers for the whole store, however many series others put
    /// there. An exporter's body is bounded by its own limits, so it is read beside the listing.
    pub fn lists_first(&self) -> bool {
        matches!(self, Sources::Prometheus(_))
    }

    /// The workspaces whose series to hold from now on (only where `lists_first`).
    pub fn want(&self, workspaces: HashSet<String>) {
        if let Sources::Prometheus(s) = self {
            s.want(workspaces);
        }
    }
}
