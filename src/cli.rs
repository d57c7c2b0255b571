//! The command line, as clap sees it: raw flags only. `config` validates them, with the
//! environment and the config file, into `Settings` once; nothing downstream reads a raw flag.
//! The Terraform module's flags are checked against `Cli::command()`, so this is the single
//! source of truth for flag names.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::pass::policy::ReclaimWhen;

const AFTER_HELP: &str = "\
The owner token is read from the file named by --token-file / CODER_SESSION_TOKEN_FILE, else
from CODER_SESSION_TOKEN. It is never accepted as a flag value and never printed.

Settings: a flag wins over its environment variable, which wins over the --config TOML file,
which wins over the default. Durations are written like 90s, 30m, 4h.
Exit codes: 0 fine, 1 runtime failure, 2 usage or configuration error.";

#[derive(Debug, Parser)]
#[command(
    name = "coder-gpu-reclaimer",
    version,
    about = "Gives idle GPUs back: stops idle Coder workspaces with Coder stop builds.",
    long_about = "Gives idle GPUs back on Kubernetes clusters that run Coder.\n\n\
Each pass reads every running workspace from the Coder API, merges per-pod GPU readings from \
dcgm-exporter (or Prometheus), decides per workspace, and stops the idle ones with Coder stop \
builds, even when the user extended or disabled autostop. Missing data never stops anything.",
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pass every --interval and serve /metrics and the status API. Observe only unless --enforce.
    Run(RunArgs),
    /// Run one pass and print the decisions. Never stops anything.
    Plan(PlanArgs),
    /// Check the settings, Coder, the token (may it read and stop workspaces? expiry?) and the GPU sources; exit 0 only if all pass.
    Check(CheckArgs),
    /// Play the seed experiment on built-in fakes (no Coder, no GPU needed) and print a timeline.
    Demo(DemoArgs),
    /// Sum up the audit log: stops per template and owner, GPU-hours given back, would-stops.
    Report(ReportArgs),
    /// Replay the policy over past history (Prometheus and Coder's builds): what it would have stopped, given back and regretted. Never stops anything.
    Backtest(BacktestArgs),
}

#[derive(Debug, Clone, Args)]
#[command(long_about = "Replays the policy over a past window, pass by pass at --interval, with the same decisions and \
fleet rules as `run` (stop cap, breaker, contention, pools). GPU readings come from Prometheus (--prometheus-url is \
required: dcgm-exporter keeps no history); which workspaces ran when comes from Coder's build history. A simulated \
stop lasts until the workspace's next real start build; the GPU time it really held until then is given back. A stop \
is regretted when, within --regret-window, the history shows a connection, GPU compute or a start by its owner. \
Connections come from the history journal `run --history-journal` writes, else coderd's agent-stat gauges in the \
same Prometheus, else nowhere (then every figure that depends on them is an upper bound). Reads only; stops nothing.")]
pub struct BacktestArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The window: this long before --until
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = crate::duration::parse)]
    pub since: Duration,

    /// The end of the window (RFC 3339) [default: now]
    #[arg(long, value_name = "TIME")]
    pub until: Option<chrono::DateTime<chrono::Utc>>,

    /// A stop is regretted when its owner connects, its GPU computes or its owner starts it within this long after it
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = crate::duration::parse)]
    pub regret_window: Duration,

    /// Replay once per value of a duration key of the policy, e.g. idle_after=15m,30m,1h,2h
    #[arg(long, value_name = "KEY=VALUES")]
    pub sweep: Option<String>,

    /// The history journal `run --history-journal` writes [default: history_journal from --config]
    #[arg(long, value_name = "PATH")]
    pub journal: Option<PathBuf>,

    /// Where moments of use come from: the first that exists (auto), or the one named
    #[arg(long, value_name = "SOURCE", value_enum, default_value = "auto")]
    pub connections: ConnectionsArg,

    /// table for people, json (docs/backtest.md's schema), or html (one self-contained page)
    #[arg(long, value_name = "FORMAT", value_enum, default_value = "table")]
    pub output: BacktestFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConnectionsArg {
    /// The journal if there is one, else coderd's gauges if the store has them, else none
    Auto,
    /// The history journal (--journal)
    Journal,
    /// coderd_agentstats_* in the same Prometheus (coderd --prometheus-enable --prometheus-collect-agent-stats)
    Coderd,
    /// None: the GPU alone is the evidence; figures that depend on connections are upper bounds
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BacktestFormat {
    Table,
    Json,
    Html,
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// The audit log `run --audit-log` writes
    #[arg(long, value_name = "PATH")]
    pub audit_log: PathBuf,

    /// The period: this long before --until
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = crate::duration::parse)]
    pub since: Duration,

    /// The end of the period (RFC 3339) [default: now]
    #[arg(long, value_name = "TIME")]
    pub until: Option<chrono::DateTime<chrono::Utc>>,

    /// table for people, json or csv for a spreadsheet
    #[arg(long, value_name = "FORMAT", value_enum, default_value = "table")]
    pub output: ReportFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Table,
    Json,
    Csv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, Default, Args)]
pub struct CommonArgs {
    /// Coder's URL, e.g. https://coder.example.com [required]
    #[arg(long, env = "CODER_URL", value_name = "URL", hide_env_values = true)]
    pub coder_url: Option<String>,

    /// File holding the owner session token (instead of CODER_SESSION_TOKEN)
    #[arg(long, env = "CODER_SESSION_TOKEN_FILE", value_name = "PATH", hide_env_values = true)]
    pub token_file: Option<PathBuf>,

    /// A dcgm-exporter /metrics URL; repeat for several. dns+http://svc:9400/metrics scrapes every address of a headless Service
    #[arg(long = "dcgm-exporter", env = "DCGM_EXPORTER_URLS", value_name = "URL", value_delimiter = ',', hide_env_values = true)]
    pub dcgm_exporters: Vec<String>,

    /// Read GPU history from this Prometheus instead of scraping exporters
    #[arg(long, env = "PROMETHEUS_URL", value_name = "URL", hide_env_values = true)]
    pub prometheus_url: Option<String>,

    /// TOML file with settings and the reclaim policy
    #[arg(long, env = "CODER_GPU_RECLAIMER_CONFIG", value_name = "PATH", hide_env_values = true)]
    pub config: Option<PathBuf>,

    /// Time between passes [default: 60s]
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub interval: Option<Duration>,

    /// Scrape the exporters this often between passes, so no reading is skipped [default: 15s, at most --interval]
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub sample_interval: Option<Duration>,

    /// A GPU idle this long, with no connection for as long, is reclaimed [default: 30m]
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub idle_after: Option<Duration>,

    /// Warn for this long before stopping; activity meanwhile cancels [default: 0s]
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub grace: Option<Duration>,

    /// Reclaim every idle GPU, or only while someone waits for one [default: always]
    #[arg(long, value_name = "WHEN", value_enum)]
    pub reclaim_when: Option<ReclaimWhenArg>,

    /// Timeout of each HTTP request to Coder and the GPU sources [default: 10s]
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub request_timeout: Option<Duration>,

    /// PEM file of extra CAs to trust for Coder, the exporters, Prometheus and the webhook
    #[arg(long, env = "SSL_CERT_FILE", value_name = "PATH", hide_env_values = true)]
    pub ca_file: Option<PathBuf>,

    /// The namespace of the workspace pods: GPU series of pods elsewhere never speak for a workspace
    #[arg(long, value_name = "NAME")]
    pub namespace: Option<String>,

    /// Behind Prometheus, only series with this `job` label (the exporter's scrape job) count; repeat it or separate with commas for several [default: the one job Prometheus names]
    #[arg(long, value_name = "JOB", value_delimiter = ',')]
    pub prometheus_job: Vec<String>,

    /// The HTTP proxy for every outgoing request (proxies in the environment are ignored)
    #[arg(long, value_name = "URL")]
    pub proxy_url: Option<String>,

    /// Log format [default: json for run, text otherwise]
    #[arg(long, value_name = "FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    #[command(flatten)]
    pub options: RunOptions,
}

/// The flags only `run` has.
#[derive(Debug, Clone, Default, Args)]
pub struct RunOptions {
    /// Send stop builds. Without it the service only logs and reports what it would stop.
    #[arg(long)]
    pub enforce: bool,

    /// Address for /metrics, /healthz, /readyz and /api/v1/workspaces [default: 0.0.0.0:9464]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// A second address serving only /healthz, /readyz and /metrics, for the kubelet's probes
    /// and Prometheus: no client of the main port can crowd them out [default: off; the
    /// manifest and the Terraform module use 0.0.0.0:9465]
    #[arg(long, value_name = "ADDR")]
    pub health_listen: Option<SocketAddr>,

    /// Append one JSON line to this file per change of a stop's state (stop_sending, stop_sent, ...,
    /// stop_done), would_stop, restore_ttl, resumed, deadline_extended, would_extend and
    /// autostop_averted (warnings go to the log and the webhook only)
    #[arg(long, value_name = "PATH")]
    pub audit_log: Option<PathBuf>,

    /// Journal each change of a running workspace (first seen, used, agent, stopped) to this file,
    /// one JSON line per change, for a later backtest; rotated at 64 MiB to PATH.1 [default: off]
    #[arg(long, value_name = "PATH")]
    pub history_journal: Option<PathBuf>,

    /// POST a JSON event (Slack-compatible `text`) on each warning and stop
    #[arg(long, value_name = "URL", conflicts_with = "notify_webhook_file")]
    pub notify_webhook: Option<String>,

    /// Read the webhook URL from this file (it is a secret: keep it out of the pod spec)
    #[arg(long, value_name = "PATH")]
    pub notify_webhook_file: Option<PathBuf>,

    /// Require `Authorization: Bearer <token in this file>` on the fleet-wide routes (/, /api/v1/workspaces)
    #[arg(long, value_name = "PATH")]
    pub status_token_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// table for people, json for the status document
    #[arg(long, value_name = "FORMAT", value_enum, default_value = "table")]
    pub output: OutputFormat,

    /// With exporters, sample this long before deciding (one scrape is one sample) [default: 15s]
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub sample_for: Option<Duration>,
}

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
#[command(long_about = "Plays the seed experiment on built-in fakes of Coder and dcgm-exporter, with a compressed \
clock (1 real second = 1 Coder minute): one GPU; session A holds it and walks away; session B starts \
and waits (Pending, `Insufficient nvidia.com/gpu`). The real reclaim loop runs in enforce mode, \
stops A with a Coder stop build once its GPU has been idle long enough, B gets the GPU, and A \
starts again and waits while B works. Prints a timeline and exits 0. Needs no network. While the \
story plays it serves what `run` serves (the status page, /metrics, /healthz, /readyz, the status \
API) on --listen; --hold keeps serving after the story ends, until Ctrl-C.")]
pub struct DemoArgs {
    /// Print every pass's decisions, not only changes
    #[arg(long)]
    pub verbose: bool,
    /// Where to serve the status page, /metrics, /healthz, /readyz and /api/v1/workspaces while
    /// the story plays (port 0: any free port; the URL is printed)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
    /// Keep serving, and passing, after the story ends, until Ctrl-C
    #[arg(long)]
    pub hold: bool,
}

/// `--reclaim-when`'s values, as clap lists them; the policy's `ReclaimWhen` (the core crate
/// does not depend on clap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReclaimWhenArg {
    /// Reclaim every idle GPU workspace.
    Always,
    /// Reclaim only while GPU workspaces wait for a GPU, and only as many as wait.
    Contended,
}

impl From<ReclaimWhenArg> for ReclaimWhen {
    fn from(arg: ReclaimWhenArg) -> Self {
        match arg {
            ReclaimWhenArg::Always => ReclaimWhen::Always,
            ReclaimWhenArg::Contended => ReclaimWhen::Contended,
        }
    }
}
