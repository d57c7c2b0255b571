//! The command line as a person meets it: `--help`, settings precedence (flag > env > file >
//! default) seen through `check`, exit code 2 with one clear line for each bad setting, and the
//! token never printed.

use std::process::Command;

use crate::common::binary;

const SECRET: &str = "k3y1d00001-v3ryS3cr3tTok3nValue";

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(binary());
    cmd.args(args);
    for var in [
        "CODER_URL",
        "CODER_SESSION_TOKEN",
        "CODER_SESSION_TOKEN_FILE",
        "DCGM_EXPORTER_URLS",
        "PROMETHEUS_URL",
        "CODER_GPU_RECLAIMER_CONFIG",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `--help` lists the five subcommands, and no help shows the token or an env value.
#[test]
fn help_lists_the_five_commands_and_never_shows_the_token() {
    let (code, out, _) = run(&["--help"], &[("CODER_SESSION_TOKEN", SECRET)]);
    assert_eq!(code, 0);
    for cmd in ["run", "plan", "check", "report", "demo"] {
        assert!(out.lines().any(|l| l.trim_start().starts_with(cmd)), "{cmd} missing from\n{out}");
    }
    for sub in ["run", "plan", "check", "report", "demo"] {
        let (code, out, _) = run(&[sub, "--help"], &[("CODER_SESSION_TOKEN", SECRET), ("CODER_URL", "https://coder.internal.example.com")]);
        assert_eq!(code, 0);
        assert!(!out.contains(SECRET) && !out.contains("coder.internal.example.com"), "env values are never echoed in help:\n{out}");
    }
    let (_, out, _) = run(&["run", "--help"], &[]);
    assert!(out.contains("--enforce") && out.contains("[default: 60s]") && out.contains("[env: CODER_URL]"), "{out}");
}

#[test]
fn bad_settings_exit_2_with_one_line_that_names_the_fix() {
    let dir = std::env::temp_dir().join(format!("cgr-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad_toml = dir.join("bad.toml");
    std::fs::write(&bad_toml, "interval = \"60s\"\nidel_after = \"30m\"\n").unwrap();
    let good = ["--coder-url", "http://127.0.0.1:9", "--dcgm-exporter", "http://127.0.0.1:9/metrics"];
    let token = [("CODER_SESSION_TOKEN", SECRET)];
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (vec!["plan"], token.to_vec(), "error: CODER_URL is not set: pass --coder-url https://coder.example.com"),
        (vec!["plan", "--coder-url", "http://127.0.0.1:9"], token.to_vec(), "error: no GPU source: pass --dcgm-exporter"),
        ([&["plan"][..], &good[..]].concat(), vec![], "error: no session token: set CODER_SESSION_TOKEN"),
        ([&["plan", "--interval", "soon"][..], &good[..]].concat(), token.to_vec(), "invalid value 'soon' for '--interval <DURATION>'"),
        (
            [&["plan", "--config", bad_toml.to_str().unwrap()][..], &good[..]].concat(),
            token.to_vec(),
            "line 2 (idel_after = \"30m\"): unknown field `idel_after`",
        ),
        (
            [&["run", "--audit-log", "/nonexistent-dir/audit.jsonl"][..], &good[..]].concat(),
            token.to_vec(),
            "error: --audit-log /nonexistent-dir/audit.jsonl: cannot open it for appending",
        ),
        ([&["plan", "--prometheus-url", "http://p:9090"][..], &good[..]].concat(), token.to_vec(), "choose one GPU source"),
        (vec!["plan", "--enforce"], token.to_vec(), "unexpected argument '--enforce'"),
        (
            vec!["plan", "--coder-url", "dns+http://coder.coder.svc:80", "--dcgm-exporter", "http://127.0.0.1:9/metrics"],
            token.to_vec(),
            "error: --coder-url \"dns+http://coder.coder.svc:80\" is not an http(s) URL: pass e.g. https://coder.example.com",
        ),
        ([&["run", "--notify-webhook", "hooks.example.com/x"][..], &good[..]].concat(), token.to_vec(), "error: --notify-webhook"),
        ([&["plan", "--idle-after", "400000y"][..], &good[..]].concat(), token.to_vec(), "longer than a year"),
    ];
    for (args, env, want) in cases {
        let (code, out, err) = run(&args, &env);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err:?}");
        assert!(!err.contains("v3ryS3cr3t") && !out.contains("v3ryS3cr3t"));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn precedence_flag_over_env_over_file_over_default() {
    let fake = mocks::FakeCoder::start(mocks::WorldConfig::default()).await.unwrap();
    let ex = mocks::FakeExporter::start(fake.world.clone(), mocks::ExporterConfig::default()).await.unwrap();
    let token = fake.owner_token();
    let dir = std::env::temp_dir().join(format!("cgr-prec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(
        &file,
        format!("coder_url = \"http://127.0.0.1:1\"\ndcgm_exporters = [\"{}\"]\nidle_after = \"45m\"\ninterval = \"2m\"\n", ex.url()),
    )
    .unwrap();
    let settings = |args: Vec<String>, env: Vec<(String, String)>| {
        let token = token.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                env.push(("CODER_SESSION_TOKEN", &token));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let (_, out, err) = run(&args, &env);
                assert!(!out.contains(&token) && !err.contains(&token), "the token is never printed");
                out.lines()
                    .find(|l| l.contains("settings:"))
                    .map(str::to_string)
                    .unwrap_or_else(|| panic!("no settings line:\n{out}\n{err}"))
            })
            .await
            .unwrap()
        }
    };
    let cfg = file.to_str().unwrap().to_string();
    let from_file = settings(vec!["check".into(), "--config".into(), cfg.clone()], vec![]).await;
    assert!(
        from_file.contains("coder_url=http://127.0.0.1:1 ") && from_file.contains("idle_after=45m") && from_file.contains("interval=2m"),
        "{from_file}"
    );
    assert!(from_file.contains("grace=0s") && from_file.contains("reclaim_when=always"), "defaults fill the rest: {from_file}");
    let from_env =
        settings(vec!["check".into()], vec![("CODER_GPU_RECLAIMER_CONFIG".into(), cfg.clone()), ("CODER_URL".into(), fake.url())]).await;
    assert!(
        from_env.contains(&format!("coder_url={} ", fake.url())) && from_env.contains("idle_after=45m"),
        "env beats the file: {from_env}"
    );
    let from_flag = settings(
        vec!["check".into(), "--coder-url".into(), "http://127.0.0.1:2".into(), "--idle-after".into(), "10m".into()],
        vec![("CODER_GPU_RECLAIMER_CONFIG".into(), cfg), ("CODER_URL".into(), fake.url())],
    )
    .await;
    assert!(
        from_flag.contains("coder_url=http://127.0.0.1:2 ") && from_flag.contains("idle_after=10m") && from_flag.contains("interval=2m"),
        "flags beat env and file: {from_flag}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn the_config_files_log_format_sets_up_logging() {
    let fake = mocks::FakeCoder::start(mocks::WorldConfig::default()).await.unwrap();
    let ex = mocks::FakeExporter::start(fake.world.clone(), mocks::ExporterConfig::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("cgr-logfmt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("settings.toml");
    std::fs::write(&file, "log_format = \"text\"\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let mut child = Command::new(binary())
        .args(["run", "--config", file.to_str().unwrap(), "--coder-url", &fake.url(), "--dcgm-exporter", &ex.url()])
        .env("CODER_SESSION_TOKEN", fake.owner_token())
        .env_remove("CODER_URL")
        .env_remove("CODER_GPU_RECLAIMER_CONFIG")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr).lines().map_while(Result::ok).find(|l| l.contains("coder-gpu-reclaimer starting"))
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = first.expect("a start-up line");
    assert!(!line.trim_start().starts_with('{'), "run's default is JSON, the file says text: {line}");
    assert!(line.contains("INFO") && line.contains("event=\"starting\""), "{line}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn report_sums_up_the_audit_log() {
    let log = crate::common::fixture_path("audit/week.jsonl");
    let log = log.to_str().unwrap();
    let (code, out, err) = run(&["report", "--audit-log", log, "--until", "2026-11-29T09:01:00Z", "--output", "json"], &[]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = r["rows"].as_array().unwrap();
    let row = |owner: &str| rows.iter().find(|x| x["owner"] == owner).unwrap().clone();
    assert_eq!((row("alice")["stops"].as_u64(), row("alice")["gpu_hours_given_back"].as_f64()), (Some(1), Some(4.0)));
    assert_eq!((row("bob")["stops"].as_u64(), row("bob")["gpu_hours_given_back"].as_f64()), (Some(1), Some(96.0)));
    assert_eq!((row("carol")["would_stops"].as_u64(), row("carol")["stops"].as_u64()), (Some(1), Some(0)));
    assert!(rows.iter().all(|x| x["owner"] != "dave"), "outside the period");
    assert_eq!(
        (r["total"]["stops"].as_u64(), r["total"]["would_stops"].as_u64(), r["total"]["gpu_hours_given_back"].as_f64()),
        (Some(2), Some(1), Some(100.0))
    );
    assert_eq!(r["unreadable_lines"], 1);
    let (code, csv, _) = run(&["report", "--audit-log", log, "--until", "2026-11-29T09:01:00Z", "--output", "csv"], &[]);
    assert_eq!(code, 0);
    assert!(
        csv.starts_with(
            "template,owner,stops,would_stops,gpu_hours_given_back,deadline_extensions,would_extend,autostops_averted,countdowns_averted\n"
        ) && csv.contains("gpu-h100,bob,1,0,96.00,0,0,0,0\n"),
        "{csv}"
    );
    assert!(csv.trim_end().ends_with("(all),(all),2,1,100.00,0,0,0,0"), "{csv}");
    let (code, table, _) = run(&["report", "--audit-log", log, "--until", "2026-11-29T09:01:00Z"], &[]);
    assert_eq!(code, 0);
    assert!(table.contains("GPU reclaim report, 2026-11-22 09:01 UTC to 2026-11-29 09:01 UTC") && table.contains("100.00"), "{table}");
    let (code, _, err) = run(&["report", "--audit-log", "/nonexistent/audit.jsonl"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(!table.contains("GIVEN BACK") && r.get("currency").is_none(), "no prices, no money");
}

/// With `gpu_hour_price` set, the audit lines carry the price of each stop, and `report` shows
/// the money given back beside the GPU-hours, in every format.
#[test]
fn report_prices_what_was_given_back() {
    let log = crate::common::fixture_path("audit/priced-week.jsonl");
    let log = log.to_str().unwrap();
    let until = ["--until", "2026-11-29T09:01:00Z"];
    let (code, out, err) = run(&[&["report", "--audit-log", log, "--output", "json"][..], &until].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = r["rows"].as_array().unwrap();
    let cost = |owner: &str| rows.iter().find(|x| x["owner"] == owner).and_then(|x| x["cost_given_back"].as_f64());
    assert_eq!((cost("alice"), cost("bob"), cost("carol")), (Some(3.0), Some(240.0), None), "4 h x 0.75, 96 h x 2.50");
    assert_eq!((r["total"]["cost_given_back"].as_f64(), r["currency"].as_str()), (Some(243.0), Some("USD")));
    let (_, csv, _) = run(&[&["report", "--audit-log", log, "--output", "csv"][..], &until].concat(), &[]);
    assert!(
        csv.starts_with(
            "template,owner,stops,would_stops,gpu_hours_given_back,cost_given_back,currency,deadline_extensions,would_extend,autostops_averted,countdowns_averted\n"
        ),
        "{csv}"
    );
    assert!(csv.contains("gpu-h100,bob,1,0,96.00,240.00,USD,0,0,0,0\n") && csv.contains("gpu-a10g,carol,0,1,0.00,,USD,0,0,0,0\n"), "{csv}");
    assert!(csv.trim_end().ends_with("(all),(all),2,1,100.00,243.00,USD,0,0,0,0"), "{csv}");
    let (_, table, _) = run(&[&["report", "--audit-log", log][..], &until].concat(), &[]);
    assert!(table.contains("USD GIVEN BACK") && table.contains("243.00"), "{table}");
}
