//! Where GPU readings come from: the `GpuSource` trait, the two sources (dcgm-exporter scraped
//! directly, or Prometheus) and `Sources`, the configured one. What they yield (GPU identity,
//! `GpuSeries`, ownership, the parser, the signals, the windows) is the core crate's `gpu`,
//! re-exported here whole, so `gpu::GpuSeries` and `gpu::window` name the same things in both.

pub mod exporter;
pub mod prometheus;
pub mod source;

use chrono::{DateTime, Utc};
use reqwest::Url;

use crate::error::Error;

pub use reclaimer_core::gpu::*;
pub use source::{Collection, GpuSource, SourceContext, SourceFailure};

/// The configured source's settings: each source's own, from its file.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceConfig {
    Exporters(exporter::ExporterConfig),
    Prometheus(prometheus::PrometheusConfig),
}

impl SourceConfig {
    /// Exporters at these URLs (or `dns+` names), with the default limits.
    pub fn exporters_at(urls: &[String]) -> Result<Self, Error> {
        let targets = urls.iter().map(|u| exporter::ExporterTarget::parse(u)).collect::<Result<_, _>>()?;
        Ok(SourceConfig::Exporters(exporter::ExporterConfig::new(targets)))
    }

    /// Prometheus at this URL (`setting` names it in an error), with the default options and limits.
    pub fn prometheus_at(setting: &str, url: &str) -> Result<Self, Error> {
        let url = crate::http::http_url(setting, url.trim_end_matches('/'), "http://prometheus:9090")?;
        Ok(SourceConfig::Prometheus(prometheus::PrometheusConfig::new(url)))
    }

    pub fn build(&self, cx: &SourceContext) -> Result<Sources, Error> {
        Ok(match self {
            SourceConfig::Exporters(c) => Sources::Exporters(c.build(cx)?),
            SourceConfig::Prometheus(c) => Sources::Prometheus(c.build(cx)?),
        })
    }

    /// The source for the start-up log and `check`, without secrets.
    pub fn describe(&self) -> String {
        match self {
            SourceConfig::Exporters(c) => {
                format!("dcgm_exporters={}", c.targets.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
            }
            SourceConfig::Prometheus(c) => format!("prometheus_url={}", crate::http::redact(&c.url)),
        }
    }

    /// The Prometheus URL, when that is the source.
    pub fn prometheus_url(&self) -> Option<&Url> {
        match self {
            SourceConfig::Prometheus(c) => Some(&c.url),
            SourceConfig::Exporters(_) => None,
        }
    }
}

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

    /// Whether readings are taken between passes too (`sample_interval`): an exporter says only
    /// what its GPUs do at the scrape, while Prometheus already holds every scrape of the pass's
    /// window. The one place this is answered.
    pub fn samples_between_passes(&self) -> bool {
        matches!(self, Sources::Exporters(_))
    }

    /// The Prometheus source, when that is the one configured (`check` asks it which jobs carry
    /// the exporter's series).
    pub fn prometheus(&self) -> Option<&prometheus::PrometheusSource> {
        match self {
            Sources::Prometheus(p) => Some(p),
            Sources::Exporters(_) => None,
        }
    }

    /// Which series speak for which workspace, as the source reads them.
    pub fn ownership(&self) -> &Ownership {
        match self {
            Sources::Exporters(s) => s.ownership(),
            Sources::Prometheus(p) => p.ownership(),
        }
    }

    /// The workspaces whose series to hold from now on (only where `lists_first`).
    pub fn want<'a>(&self, workspaces: impl Iterator<Item = &'a str>) {
        if let Sources::Prometheus(s) = self {
            s.want(workspaces);
        }
    }
}
