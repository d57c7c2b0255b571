//! `demo`: the seed experiment on the built-in fakes. One GPU; session A holds it and walks
//! away (a notebook kernel keeps 19 GiB of GPU memory, nothing computes); session B starts and
//! waits. The real pass runs in enforce mode, stops A with a Coder stop build, B gets the GPU,
//! and A, started again, waits while B works. Beside them, on a second GPU, bob's overnight
//! training runs with nobody connected: it passes its Coder autostop deadline while its GPU
//! computes (`extend_while_busy` moves the deadline) and is reclaimed once its job ends and the
//! GPU idles. Then Coder's own countdown (`countdown_in_coder`, for the notebook pool's `c-*`
//! workspaces): alice's and bob's idle notebooks are not stopped by the service, their deadlines
//! move to 30 minutes away; alice comes back within it and keeps working, and bob's is stopped by
//! Coder's lifecycle executor at its deadline (the demo moves Coder's clock there). The fakes run
//! Coder's clocks 60x faster, and the policy is scaled to match (idle_after 10 s = 10 Coder
//! minutes), so it ends in about 35 s.
//! Meanwhile it serves what `run` serves on `--listen`, and `--hold` keeps serving afterwards.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mocks::{ExporterConfig, FakeCoder, FakeExporter, Load, WorldConfig};
use tokio::sync::watch;

use crate::app::{Application, Role};
use crate::cli::DemoArgs;
use crate::config::Settings;
use crate::duration::human;
use crate::error::Error;
use crate::gpu::SourceConfig;
use crate::pass::decide::Verdict;
use crate::pass::mode::Mode;
use crate::pass::policy::Rule;

const SCALE: f64 = 60.0;
const INTERVAL: Duration = Duration::from_secs(1);
const IDLE_AFTER: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(55);
/// The overnight workspace's autostop TTL: 15 s (15 Coder minutes).
const OVERNIGHT_TTL_MS: i64 = 15_000;
/// The notebooks' autostop TTL: 8 h, far beyond their countdown.
const NOTEBOOK_TTL_MS: i64 = 8 * 3600 * 1000;

fn runtime(e: impl std::fmt::Display) -> Error {
    Error::runtime(format!("demo: {e}"))
}

struct Timeline {
    started: Instant,
}

impl Timeline {
    fn line(&mut self, text: &str) {
        let t = self.started.elapsed().as_secs_f64();
        println!("t={t:>5.1}s  {text}");
    }
}

/// Where bob's overnight training is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overnight {
    Starting,
    Training,
    JobDone,
    Reclaimed,
}

/// Where the notebook pool's countdowns are.
#[derive(Debug, Default)]
struct Notebooks {
    /// alice's `c-notebook` and bob's `c-sweep`, once started.
    ids: Option<(mocks::Uuid, mocks::Uuid)>,
    said: Vec<mocks::Uuid>,
    owner_back: bool,
    averted: bool,
    clock_moved: bool,
    sweep_stopped: bool,
}

/// What stage of the story we are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    AStarting,
    AWorking,
    AWalkedAway,
    NotebooksStarting,
    BWorking,
    ABack,
}

impl Notebooks {
    /// The countdown act, after each pass: what the pass did to the notebooks, and what their
    /// owners do about it. Once `story_done`, Coder's clock is moved to c-sweep's deadline.
    fn follow(
        &mut self,
        coder: &FakeCoder,
        acted: &crate::pass::actuator::Acted,
        names: &HashMap<&str, String>,
        tl: &mut Timeline,
        story_done: bool,
    ) {
        let Some((notebook, sweep)) = self.ids else { return };
        for c in &acted.counting_down {
            let Ok(id) = c.workspace_id.parse::<mocks::Uuid>() else { continue };
            if self.said.contains(&id) {
                continue;
            }
            self.said.push(id);
            let who = names.get(c.workspace_id.as_str()).cloned().unwrap_or_default();
            tl.line(&format!(
                "  ACTION    Coder's countdown for {who}: its deadline moved to {}; Coder shows \"Stop in 30 minutes\" (PUT /api/v2/workspaces/{{id}}/extend, 200; no stop build)",
                crate::pass::mode::at(c.until)
            ));
        }
        if self.said.contains(&notebook) && !self.owner_back {
            coder.with(|w| w.open_connection(notebook));
            tl.line("alice sees \"Stop in 30 minutes\" on c-notebook in Coder's dashboard and opens it again");
            self.owner_back = true;
        }
        if acted.countdowns_averted.contains(&notebook.to_string()) {
            tl.line("c-notebook's countdown is averted: alice is back, Coder's activity bump moved the deadline, nothing is stopped");
            self.averted = true;
        }
        if story_done && self.averted && self.said.contains(&sweep) && !self.clock_moved {
            coder.with(|w| {
                let deadline = w.ws_index(sweep).and_then(|i| w.workspaces[i].latest()?.deadline);
                if let Some(d) = deadline {
                    w.config.clock_offset += d - w.now() + chrono::Duration::seconds(5);
                }
            });
            tl.line("(the demo moves Coder's clock 30 minutes ahead, past c-sweep's deadline)");
            self.clock_moved = true;
        }
        if acted.stops_done.contains(&sweep.to_string()) && !self.sweep_stopped {
            tl.line("Coder's lifecycle executor stopped c-sweep at its deadline (\"Stop by Coder\", reason autostop): its GPU is free");
            self.sweep_stopped = true;
        }
    }
}

pub async fn run(args: DemoArgs) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::bind(args.listen).await.map_err(|e| {
        Error::config(format!(
            "--listen {}: cannot bind ({e}); choose a free address, e.g. --listen 127.0.0.1:0 (any free port)",
            args.listen
        ))
    })?;
    let bound = listener.local_addr().map_err(runtime)?;
    let world = WorldConfig {
        gpus: 4,
        scale: SCALE,
        build_queue: Duration::from_secs(5),
        build_run: Duration::from_secs(60),
        agent_connect: Duration::from_secs(30),
        ..WorldConfig::default()
    };
    let coder = FakeCoder::start(world).await.map_err(runtime)?;
    // GPUs 2 and 3 are the notebook pool's: a taint keeps other sessions' pods off them.
    coder.with(|w| w.cordoned[2..].fill(true));
    let exporter = FakeExporter::start(coder.world.clone(), ExporterConfig::default()).await.map_err(runtime)?;
    println!("coder-gpu-reclaimer demo: the seed experiment on built-in fakes (no network, no GPU).");
    println!("Fake Coder at {}, fake dcgm-exporter at {}; four GPUs (two in the notebook pool).", coder.url(), exporter.url());
    println!("Coder's clocks run 60x faster here: 1 s below is 1 Coder minute (usage refresh, batching, builds).");
    println!(
        "Policy: idle_after {} (= 10 Coder minutes), a pass every {}, extend_while_busy, countdown_in_coder 30m for c-* workspaces, enforce mode.\n",
        human(chrono::Duration::seconds(10)),
        human(chrono::Duration::seconds(1))
    );

    let gpu = SourceConfig::exporters_at(&[exporter.url()]).map_err(runtime)?;
    let mut settings = Settings::local(&coder.url(), &coder.owner_token(), gpu, INTERVAL).map_err(runtime)?;
    settings.request_timeout = Duration::from_secs(5);
    settings.mode = Mode::Enforce;
    settings.policy.thresholds.idle_after = IDLE_AFTER;
    settings.policy.thresholds.extend_while_busy = true;
    settings.policy.rules.push(Rule {
        workspace: Some("c-*".into()),
        countdown_in_coder: Some(Duration::from_secs(30 * 60)),
        ..Rule::default()
    });
    let mut app = Application::build(&settings, Role::Run).await.map_err(runtime)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = tokio::spawn(crate::serve::serve(listener, app.state.clone(), None, stop_rx.clone()));
    println!("Status page: http://{bound}/   (also /metrics, /healthz, /readyz, /api/v1/workspaces)\n");

    let mut tl = Timeline { started: Instant::now() };
    let a = coder.with(|w| w.create_workspace("alice", "a-train", None)).map_err(|e| runtime(e.message))?;
    tl.line("alice starts workspace a-train (GPU template)");
    let overnight = coder.with(|w| w.create_workspace("bob", "overnight", Some(OVERNIGHT_TTL_MS))).map_err(|e| runtime(e.message))?;
    tl.line("bob starts workspace overnight for a training run; its autostop TTL is 15 Coder minutes");
    let mut night = Overnight::Starting;
    let mut b = None;
    let mut stage = Stage::AStarting;
    let mut seen_events = 0;
    let mut last: HashMap<String, (Verdict, &'static str)> = HashMap::new();
    let mut b_waited = false;
    let mut a_waited_again = 0;
    let mut stopped_a = false;
    let mut notebooks = Notebooks::default();

    while tl.started.elapsed() < DEADLINE {
        // The story: what people do, driven by what happened.
        let (a_ready, b_ready, night_ready) = coder.with(|w| {
            let ready = |id| {
                w.ws_index(id)
                    .and_then(|i| w.workspaces[i].latest().and_then(|b| b.agent.clone()))
                    .is_some_and(|ag| ag.first_connected_at.is_some())
            };
            (ready(a), b.is_some_and(ready), ready(overnight))
        });
        if night == Overnight::Starting && night_ready {
            coder.with(|w| {
                w.set_load(overnight, Load::Matmul);
                if let Some(i) = w.ws_index(overnight) {
                    w.workspaces[i].last_used_at = w.now() - chrono::Duration::hours(1);
                }
                // Its GPU is in the training pool: a taint keeps the other sessions' pods off it
                // (the fake cordons it), so the seed story keeps its one GPU.
                if let Some(g) = w.gpu_holders.iter().position(|h| *h == Some(overnight)) {
                    w.cordoned[g] = true;
                }
            });
            tl.line(
                "bob's training job runs (matmul) and bob goes home: nobody is connected to overnight (its GPU is in the training pool)",
            );
            night = Overnight::Training;
        }
        match stage {
            Stage::AStarting if a_ready => {
                coder.with(|w| {
                    w.open_connection(a);
                    w.set_load(a, Load::Matmul);
                    w.write_file(a, "/home/coder/model.ckpt");
                    w.write_file(a, "/tmp/scratch.bin");
                });
                tl.line(
                    "alice connects and trains on the GPU (matmul: 100% util, SM_ACTIVE 0.984); writes ~/model.ckpt and /tmp/scratch.bin",
                );
                let id = coder.with(|w| w.create_workspace("bob", "b-notebook", None)).map_err(|e| runtime(e.message))?;
                b = Some(id);
                tl.line("bob starts workspace b-notebook: its pod is Pending (Insufficient nvidia.com/gpu)");
                stage = Stage::AWorking;
            }
            Stage::AWorking if b_waited => {
                coder.with(|w| {
                    w.set_load(a, Load::MemoryOnly);
                    w.close_connection(a);
                });
                tl.line("alice closes her laptop; her kernel keeps 19,376 MiB of GPU memory, nothing computes");
                stage = Stage::AWalkedAway;
            }
            Stage::AWalkedAway if b_ready => {
                let b = b.ok_or_else(|| runtime("b missing"))?;
                coder.with(|w| {
                    w.open_connection(b);
                    w.set_load(b, Load::Matmul);
                });
                tl.line("bob's agent connected: bob works on the GPU (matmul)");
                let files = coder.with(|w| w.ws_index(a).map(|i| (w.workspaces[i].home_files.clone(), w.workspaces[i].tmp_files.clone())));
                if let Some((home, tmp)) = files {
                    tl.line(&format!("a-train is stopped: home files kept {home:?}, /tmp files {tmp:?} (lost, as in the seed)"));
                }
                let notebook =
                    coder.with(|w| w.create_workspace("alice", "c-notebook", Some(NOTEBOOK_TTL_MS))).map_err(|e| runtime(e.message))?;
                let sweep = coder.with(|w| w.create_workspace("bob", "c-sweep", Some(NOTEBOOK_TTL_MS))).map_err(|e| runtime(e.message))?;
                coder.with(|w| w.cordoned[2..].fill(false));
                notebooks.ids = Some((notebook, sweep));
                tl.line("alice and bob also start c-notebook and c-sweep in the notebook pool (autostop 8 h) and leave them idle");
                stage = Stage::NotebooksStarting;
            }
            Stage::NotebooksStarting
                if notebooks
                    .ids
                    .is_some_and(|(c, d)| coder.with(|w| w.gpu_holders.contains(&Some(c)) && w.gpu_holders.contains(&Some(d)))) =>
            {
                coder.with(|w| w.cordoned[2..].fill(true));
                coder.with(|w| w.create_build(a, "start", 1, "dashboard")).map_err(|e| runtime(e.message))?;
                tl.line("alice comes back and starts a-train again");
                stage = Stage::BWorking;
            }
            _ => {}
        }

        let pass = app.pass(&stop_rx).await.map_err(runtime)?;
        let names: HashMap<&str, String> =
            pass.eval.workspaces().map(|w| (w.id.as_str(), format!("{} ({})", w.name, w.owner_name))).collect();
        let events: Vec<String> = coder.with(|w| {
            w.events[seen_events..]
                .iter()
                .filter(|e| matches!(e.kind, "build_succeeded" | "gpu_assigned" | "gpu_released" | "build_failed"))
                .map(|e| format!("  coder     {:<22} {} {}", e.workspace, e.kind, e.detail))
                .collect::<Vec<_>>()
        });
        seen_events = coder.with(|w| w.events.len());
        for e in events {
            tl.line(&e);
        }
        for d in pass.eval.decisions() {
            let key = (d.verdict, d.reason.as_str());
            let changed = last.get(&d.workspace_id) != Some(&key);
            if changed || args.verbose {
                let who = names.get(d.workspace_id.as_str()).cloned().unwrap_or_default();
                tl.line(&format!("  decision  {who:<22} {:<8} {:<20} {}", d.verdict.as_str(), d.reason.as_str(), d.message));
                last.insert(d.workspace_id.clone(), key);
            }
            if Some(d.workspace_id.as_str()) == b.map(|b| b.to_string()).as_deref() && d.verdict == Verdict::Waiting {
                b_waited = true;
            }
            if d.workspace_id == a.to_string() && d.verdict == Verdict::Waiting && stage == Stage::BWorking {
                a_waited_again += 1;
            }
        }
        for j in pass.eval.judged().filter(|j| pass.acted.extended.contains(&j.workspace.id)) {
            let to = j.decision.deadline.as_ref().and_then(|p| p.extend_to()).map(crate::pass::mode::at).unwrap_or_default();
            let who = names.get(j.workspace.id.as_str()).cloned().unwrap_or_default();
            tl.line(&format!(
                "  ACTION    Coder's autostop deadline of {who} moved to {to}: its GPU computes, nobody connected (PUT /api/v2/workspaces/{{id}}/extend, 200)"
            ));
        }
        if night == Overnight::Training && pass.acted.autostops_averted.contains(&overnight.to_string()) {
            tl.line("overnight is past the deadline Coder had set and still training: autostop averted");
            coder.with(|w| w.set_load(overnight, Load::Idle));
            tl.line("bob's training job finishes: overnight's GPU idles");
            night = Overnight::JobDone;
        }
        if pass.acted.stops_done.contains(&overnight.to_string()) {
            night = Overnight::Reclaimed;
        }
        for id in &pass.acted.stops_sent {
            stopped_a |= *id == a.to_string();
            let who = names.get(id.as_str()).cloned().unwrap_or_default();
            tl.line(&format!("  ACTION    stop build sent for {who} (POST /api/v2/workspaces/{{id}}/builds, 201)"));
        }
        notebooks.follow(&coder, &pass.acted, &names, &mut tl, stage == Stage::ABack && night == Overnight::Reclaimed);
        if stage == Stage::BWorking && a_waited_again >= 3 {
            stage = Stage::ABack;
            tl.line("a-train, started again, waits while bob works on b-notebook");
        }
        if stage == Stage::ABack && night == Overnight::Reclaimed && notebooks.averted && notebooks.sweep_stopped {
            break;
        }
        tokio::time::sleep(INTERVAL).await;
    }
    if stage != Stage::ABack || !stopped_a || night != Overnight::Reclaimed || !notebooks.averted || !notebooks.sweep_stopped {
        return Err(runtime(format!(
            "the story did not finish within {}s (stage {stage:?}, overnight {night:?}, notebooks {notebooks:?}); run with --verbose to see every pass",
            DEADLINE.as_secs()
        )));
    }
    let stops_by_admin = coder.with(|w| w.stop_builds_by(a, "admin"));
    let autostops =
        coder.with(|w| w.ws_index(overnight).map_or(0, |i| w.workspaces[i].builds.iter().filter(|b| b.reason == "autostop").count()));
    println!(
        "\nDone: {stops_by_admin} stop build sent for a-train; its GPU went to b-notebook, and a-train, started again, waited while bob worked."
    );
    println!(
        "overnight ran past its Coder autostop deadline while training ({autostops} autostop builds) and was reclaimed once its GPU idled."
    );
    println!(
        "c-notebook got Coder's countdown and alice came back within it; c-sweep was stopped by Coder at its deadline ({} stop builds by the reclaimer).",
        notebooks.ids.map_or(0, |(c, d)| coder.with(|w| w.stop_builds_by(c, "admin") + w.stop_builds_by(d, "admin")))
    );
    if args.hold {
        println!("Serving http://{bound}/ until Ctrl-C.");
        crate::commands::spawn_signal_handler(stop_tx.clone());
        let mut stopping = stop_rx.clone();
        while !*stopping.borrow() {
            app.pass(&stop_rx).await.map_err(runtime)?;
            tokio::select! {
                _ = tokio::time::sleep(INTERVAL) => {}
                _ = stopping.changed() => {}
            }
        }
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    Ok(())
}
