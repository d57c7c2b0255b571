//! The binary: parse the flags, call the subcommand (`commands/`, one file each) on a two-thread
//! runtime, and map the outcome to an exit code (0 fine, 1 runtime failure or a failed `check`, 2 usage or configuration
//! error: `Error::exit_code`). `run`, `plan`, `check` and `backtest` resolve their flags into `Settings` once
//! and log in the settings' format (`run` at info, the others at warn); `report` and `demo`
//! resolve none (the demo builds its own) and log text at warn.

use std::process::ExitCode;

use clap::Parser;
use coder_gpu_reclaimer::cli::{Cli, Command, LogFormat};
use coder_gpu_reclaimer::commands;
use coder_gpu_reclaimer::config::Settings;
use coder_gpu_reclaimer::error::Error;

fn init_logging(format: LogFormat, level: tracing::Level) {
    coder_gpu_reclaimer::logging::init(format == LogFormat::Json, level);
}

fn token_env() -> Option<String> {
    std::env::var("CODER_SESSION_TOKEN").ok()
}

/// Resolves the subcommand's settings, sets up logging from them and calls it.
async fn run_command(command: Command) -> Result<bool, Error> {
    match command {
        Command::Run(args) => {
            let settings = Settings::resolve(&args.common, Some(&args.options), token_env(), LogFormat::Json)?;
            init_logging(settings.log_format, tracing::Level::INFO);
            commands::run::run(settings).await.map(|_| true)
        }
        Command::Plan(args) => {
            let settings = Settings::resolve(&args.common, None, token_env(), LogFormat::Text)?;
            init_logging(settings.log_format, tracing::Level::WARN);
            let mut out = std::io::BufWriter::new(std::io::stdout());
            commands::plan::run(settings, args.output, args.sample_for, &mut out).await.map(|_| true)
        }
        Command::Check(args) => {
            let settings = Settings::resolve(&args.common, None, token_env(), LogFormat::Text);
            init_logging(settings.as_ref().map_or(LogFormat::Text, |s| s.log_format), tracing::Level::WARN);
            Ok(commands::check::run(settings).await)
        }
        Command::Report(args) => {
            init_logging(LogFormat::Text, tracing::Level::WARN);
            commands::report::run(&args, chrono::Utc::now(), &mut std::io::stdout().lock()).map(|_| true)
        }
        Command::Backtest(args) => {
            let settings = Settings::resolve(&args.common, None, token_env(), LogFormat::Text)?;
            init_logging(settings.log_format, tracing::Level::WARN);
            let mut out = std::io::BufWriter::new(std::io::stdout());
            commands::backtest::run(settings, &args, chrono::Utc::now(), &mut out).await.map(|_| true)
        }
        Command::Demo(args) => {
            init_logging(LogFormat::Text, tracing::Level::WARN);
            commands::demo::run(args).await.map(|_| true)
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run_command(cli.command)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
