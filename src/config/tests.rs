//! The settings' tests: flags, environment and file resolved into `Settings` and `Policy`, and
//! the refusals that name the fix.

use super::*;
use crate::gpu::exporter::ExporterTarget;

fn args() -> CommonArgs {
    CommonArgs {
        coder_url: Some("https://coder.example.com/".into()),
        dcgm_exporters: vec!["http://10.0.0.7:9400/metrics".into()],
        ..CommonArgs::default()
    }
}

fn token() -> Option<String> {
    Some("abc123-secret".into())
}

fn resolve(a: &CommonArgs, token: Option<String>) -> Result<Settings, Error> {
    Settings::resolve(a, None, token, LogFormat::Text)
}

#[test]
fn defaults_apply_when_nothing_is_set() {
    let s = resolve(&args(), token()).unwrap();
    assert_eq!(s.coder_url.as_str(), "https://coder.example.com/");
    assert_eq!(s.interval, Duration::from_secs(60));
    assert_eq!(s.policy.thresholds.idle_after, Duration::from_secs(1800));
    assert_eq!(s.policy.max_sample_gap, Duration::from_secs(180));
    assert_eq!(s.request_timeout, Duration::from_secs(10));
}

/// Writes `contents` to a fresh file under the temp dir; the file is removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, contents: &str) -> Self {
        let path = std::env::temp_dir().join(format!("cgr-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
}

#[test]
fn file_beats_default_and_flag_beats_file() {
    let file = TempFile::new("policy.toml", "idle_after = \"45m\"\ngrace = \"5m\"\ncoder_url = \"https://file.example.com\"\n");
    let path = file.0.clone();
    let mut a = args();
    a.config = Some(path.clone());
    a.coder_url = None;
    let s = resolve(&a, token()).unwrap();
    assert_eq!(s.policy.thresholds.idle_after, Duration::from_secs(45 * 60));
    assert_eq!(s.policy.thresholds.grace, Duration::from_secs(300));
    assert_eq!(s.coder_url.as_str(), "https://file.example.com/");
    a.idle_after = Some(Duration::from_secs(600));
    a.coder_url = Some("https://flag.example.com".into());
    let s = resolve(&a, token()).unwrap();
    assert_eq!(s.policy.thresholds.idle_after, Duration::from_secs(600));
    assert_eq!(s.coder_url.as_str(), "https://flag.example.com/");
}

#[test]
fn an_explicit_token_file_wins_over_the_environment() {
    let file = TempFile::new("token", "fileid0001-fromfile\n");
    let a = CommonArgs { token_file: Some(file.0.clone()), ..args() };
    assert_eq!(resolve(&a, token()).unwrap().token.key_id(), Some("fileid0001"));
    assert_eq!(resolve(&args(), token()).unwrap().token.key_id(), Some("abc123"));
}

#[test]
fn bad_input_names_the_setting_and_the_fix() {
    let cases: Vec<(CommonArgs, Option<String>, &str)> = vec![
        (CommonArgs { coder_url: None, ..args() }, token(), "CODER_URL is not set: pass --coder-url https://coder.example.com"),
        (
            CommonArgs { coder_url: Some("coder.example.com".into()), ..args() },
            token(),
            "--coder-url \"coder.example.com\" is not an http(s) URL",
        ),
        (
            CommonArgs { coder_url: Some("dns+http://coder.coder.svc:80".into()), ..args() },
            token(),
            "--coder-url \"dns+http://coder.coder.svc:80\" is not an http(s) URL",
        ),
        (
            CommonArgs { dcgm_exporters: vec!["dns+ftp://x:1/metrics".into()], ..args() },
            token(),
            "--dcgm-exporter \"ftp://x:1/metrics\" is not an http(s) URL",
        ),
        (CommonArgs { idle_after: Some(crate::duration::MAX), grace: Some(Duration::from_secs(u64::MAX)), ..args() }, token(), "grace"),
        (args(), None, "no session token: set CODER_SESSION_TOKEN"),
        (CommonArgs { dcgm_exporters: vec![], ..args() }, token(), "no GPU source: pass --dcgm-exporter"),
        (CommonArgs { prometheus_url: Some("http://p:9090".into()), ..args() }, token(), "choose one GPU source"),
        (CommonArgs { interval: Some(Duration::from_millis(10)), ..args() }, token(), "--interval must be at least 1s"),
        (CommonArgs { idle_after: Some(Duration::ZERO), ..args() }, token(), "idle_after must be more than 0s"),
        (args(), Some("a b".into()), "CODER_SESSION_TOKEN: the session token contains whitespace"),
        (
            CommonArgs { token_file: Some("/nonexistent/token".into()), ..args() },
            None,
            "--token-file: cannot read the token file /nonexistent/token",
        ),
        (
            CommonArgs { coder_url: Some("http://coder:80".into()), proxy_url: Some("http://proxy:3128".into()), ..args() },
            token(),
            "the owner token would cross the proxy in clear",
        ),
        (
            CommonArgs { prometheus_job: vec!["a\"b".into()], ..args() },
            token(),
            "prometheus_job \"a\\\"b\": name the exporter's scrape job",
        ),
    ];
    for (a, tok, want) in cases {
        let got = resolve(&a, tok).unwrap_err().message().to_string();
        assert!(got.contains(want), "got {got:?}, want it to contain {want:?}");
        assert!(!got.contains("secret"), "an error must not echo the token: {got}");
    }
}

#[test]
fn run_settings_resolve_once_from_flags_and_file() {
    let file = TempFile::new(
        "run.toml",
        "log_format = \"text\"\nlisten = \"127.0.0.1:9999\"\nnotify_webhook = \"https://hooks.example.com/x\"\naudit_log = \"/tmp/a.jsonl\"\n",
    );
    let a = CommonArgs { config: Some(file.0.clone()), ..args() };
    let s = Settings::resolve(&a, Some(&RunOptions { enforce: true, ..RunOptions::default() }), token(), LogFormat::Json).unwrap();
    assert_eq!(s.log_format, LogFormat::Text, "the file's log_format wins over the command's default");
    assert_eq!(s.listen.to_string(), "127.0.0.1:9999");
    assert_eq!(s.notify_webhook.as_ref().map(Url::as_str), Some("https://hooks.example.com/x"));
    assert_eq!(s.audit_log.as_deref(), Some(Path::new("/tmp/a.jsonl")));
    assert_eq!(s.mode.as_str(), Mode::Enforce.as_str());
    let flags = RunOptions { listen: Some("127.0.0.1:1".parse().unwrap()), ..RunOptions::default() };
    let s = Settings::resolve(&a, Some(&flags), token(), LogFormat::Json).unwrap();
    assert_eq!(s.listen.port(), 1, "a flag beats the file");
    assert_eq!(s.mode.as_str(), Mode::Observe.as_str(), "a flag beats the file");
    let s = Settings::resolve(&args(), None, token(), LogFormat::Json).unwrap();
    assert_eq!((s.log_format, s.listen), (LogFormat::Json, DEFAULT_LISTEN));
    assert!(matches!(
        ExporterTarget::parse("dns+http://dcgm.gpu:9400/metrics").unwrap(),
        ExporterTarget::Dns(u) if u.as_str() == "http://dcgm.gpu:9400/metrics"
    ));
}

#[test]
fn file_errors_name_the_key_and_line() {
    let e = FileConfig::parse("idle_after = \"30m\"\nidle_aftr = \"1h\"\n").unwrap_err().to_string();
    assert!(e.starts_with("line 2 (idle_aftr = \"1h\"):") && e.contains("unknown field"), "{e}");
    let e = FileConfig::parse("\n\ngrace = \"soon\"\n").unwrap_err().to_string();
    assert!(e.starts_with("line 3 (grace = \"soon\"):") && e.contains("\"soon\" is not a duration"), "{e}");
    let e = FileConfig::parse("[[rule]]\ntemplate = \"gpu-*\"\nexmpt = true\n").unwrap_err().to_string();
    assert!(e.starts_with("line 3 (exmpt = true):"), "{e}");
    let f = FileConfig::parse("max_idle_fraction = 1.5\n").unwrap();
    let e = build_policy(&args(), &f, Duration::from_secs(60)).unwrap_err().to_string();
    assert!(e.contains("max_idle_fraction = 1.5 is out of range"), "{e}");
}

#[test]
fn extension_keys_are_checked_against_coders_rules() {
    let policy = |text: &str| build_policy(&args(), &FileConfig::parse(text).unwrap(), Duration::from_secs(60));
    for (text, want) in [
        (
            "extend_by = \"32m\"\n",
            "extend_by must be at least 30m plus three intervals: Coder refuses a deadline less than 30 minutes ahead",
        ),
        ("[[rule]]\ntemplate = \"ml-*\"\nextend_by = \"10m\"\n", "rule 1: extend_by must be at least 30m"),
        ("extend_limit = \"0s\"\n", "extend_by and extend_limit must be more than 0s"),
        ("countdown_in_coder = \"29m\"\n", "countdown_in_coder must be between 30m and 7d: Coder refuses a deadline less than 30 minutes"),
        ("countdown_in_coder = \"8d\"\n", "countdown_in_coder must be between 30m and 7d"),
        ("[[rule]]\ntemplate = \"ml-*\"\ncountdown_in_coder = \"5m\"\n", "rule 1: countdown_in_coder must be between 30m"),
    ] {
        let e = policy(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
    let p = policy("extend_while_busy = true\nextend_by = \"33m\"\nmax_extensions_per_pass = 7\n").unwrap();
    assert!(p.thresholds.extend_while_busy);
    assert_eq!((p.thresholds.extend_by, p.max_extensions_per_pass), (Duration::from_secs(33 * 60), 7));
    assert_eq!(p.extend_when_within, Duration::from_secs(32 * 60), "30 minutes plus two 60 s intervals");
    // Off unless set; a rule's own wins for its workspaces, others keep the top level's.
    assert_eq!(policy("").unwrap().thresholds.countdown_in_coder, None);
    let p = policy("countdown_in_coder = \"45m\"\n[[rule]]\ntemplate = \"ml-*\"\ncountdown_in_coder = \"2h\"\n").unwrap();
    assert_eq!(p.thresholds.countdown_in_coder, Some(Duration::from_secs(45 * 60)));
    assert_eq!(p.rules[0].countdown_in_coder, Some(Duration::from_secs(2 * 3600)));
}

#[test]
fn pools_are_named_and_listed_once_the_default_first() {
    let policy = |text: &str| build_policy(&args(), &FileConfig::parse(text).unwrap(), Duration::from_secs(60));
    assert_eq!(policy("").unwrap().pools, ["default"]);
    let e = policy("[[rule]]\ntemplate = \"x\"\npool = \"h100 sxm\"\n").unwrap_err().to_string();
    assert!(e.contains("pool \"h100 sxm\": a short name"), "{e}");
    let p =
        policy("pool = \"a10g\"\n[[rule]]\ntemplate = \"big-*\"\npool = \"h100\"\n[[rule]]\ntemplate = \"x\"\npool = \"a10g\"\n").unwrap();
    assert_eq!(p.pools, ["a10g", "h100"], "the default first, then each rule's once");
}

#[test]
fn a_long_interval_starts_with_an_extend_by_that_outlasts_it() {
    // (interval, extend_by when not set): an hour, or 30 minutes plus four intervals; stop_timeout
    // is at least the interval. A pass every 15 minutes failed at start on both before (issue 42).
    for (minutes, want) in [(1, 60), (10, 70), (15, 90), (30, 150)] {
        let interval = Duration::from_secs(minutes * 60);
        let p = build_policy(&args(), &FileConfig::default(), interval).unwrap_or_else(|e| panic!("{minutes}m: {e}"));
        assert_eq!(p.thresholds.extend_by, Duration::from_secs(want * 60), "{minutes}m");
    }
    // The whole settings, as `run --interval 15m` resolves them.
    let a = CommonArgs { interval: Some(Duration::from_secs(15 * 60)), ..args() };
    let s = resolve(&a, token()).unwrap_or_else(|e| panic!("--interval 15m: {e}"));
    assert_eq!((s.policy.stop_timeout, s.policy.thresholds.extend_by), (Duration::from_secs(900), Duration::from_secs(90 * 60)));
    let short = FileConfig::parse("extend_by = \"1h\"\n").unwrap();
    let e = build_policy(&args(), &short, Duration::from_secs(15 * 60)).unwrap_err().to_string();
    assert!(e.contains("extend_by must be at least 30m plus three intervals"), "{e}");
}

/// `bind_allowance` and `gpu_parameters` (issue 47): read from the file, defaults otherwise, and
/// refusals that name the fix.
#[test]
fn start_keys_parse_and_refuse_what_cannot_be_meant() {
    let interval = Duration::from_secs(60);
    let policy = |text: &str| FileConfig::parse(text).and_then(|f| build_policy(&args(), &f, interval));
    let p = policy("").unwrap();
    assert_eq!((p.bind_allowance, p.gpu_parameters.len()), (Duration::from_secs(30), 5));
    let p = policy("bind_allowance = \"45s\"\ngpu_parameters = [\"accelerator\", \"GPU_Count\"]\n").unwrap();
    assert_eq!(p.bind_allowance, Duration::from_secs(45));
    assert_eq!(p.gpu_parameters, vec!["accelerator".to_string(), "GPU_Count".to_string()]);
    assert!(policy("gpu_parameters = []\n").unwrap().gpu_parameters.is_empty());
    for (text, fix) in [
        ("bind_allowance = \"2h\"\n", "at most 1h"),
        ("gpu_parameters = [\"gpu count\"]\n", "a build parameter's name"),
        ("gpu_parameters = [\"\"]\n", "a build parameter's name"),
    ] {
        let e = policy(text).unwrap_err().to_string();
        assert!(e.contains(fix), "{text}: {e}");
    }
}

/// `prometheus_job`: unset, the job is discovered; one string, a TOML list, or the flag repeated
/// or comma-separated name the jobs read (each exactly); a bad name is refused with the fix.
#[test]
fn prometheus_job_is_discovered_named_or_listed() {
    use crate::gpu::prometheus::jobs::JobChoice;
    let jobs_of = |a: &CommonArgs, text: &str| -> Result<JobChoice, Error> {
        let file = TempFile::new(&format!("jobs-{}.toml", text.len()), text);
        let mut a = a.clone();
        a.config = Some(file.0.clone());
        a.dcgm_exporters = Vec::new();
        a.prometheus_url = Some("http://prometheus:9090".into());
        let s = resolve(&a, token())?;
        match s.gpu {
            SourceConfig::Prometheus(p) => Ok(p.options.jobs),
            SourceConfig::Exporters(_) => panic!("behind Prometheus"),
        }
    };
    let named = |jobs: &[&str]| JobChoice::Named(jobs.iter().map(|j| j.to_string()).collect());
    assert_eq!(jobs_of(&args(), "").unwrap(), JobChoice::Discover);
    assert_eq!(jobs_of(&args(), "prometheus_job = \"gpu-metrics\"\n").unwrap(), named(&["gpu-metrics"]));
    assert_eq!(jobs_of(&args(), "prometheus_job = [\"a\", \"b\", \"a\"]\n").unwrap(), named(&["a", "b"]));
    let flag = CommonArgs { prometheus_job: vec!["x".into(), "y".into()], ..args() };
    assert_eq!(jobs_of(&flag, "prometheus_job = \"ignored\"\n").unwrap(), named(&["x", "y"]), "the flag beats the file");
    for text in [
        "prometheus_job = []\n",
        "prometheus_job = [\"\"]\n",
        "prometheus_job = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]\n",
    ] {
        let e = jobs_of(&args(), text).unwrap_err().to_string();
        assert!(e.contains("prometheus_job"), "{text}: {e}");
    }
}
