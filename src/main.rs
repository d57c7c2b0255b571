//! The command line only: parse, set up logging, run the subcommand, map its outcome to an exit
//! code (0 fine, 1 runtime failure, 2 usage or configuration error).

use std::process::ExitCode;

use clap::Parser;
use coder_gpu_reclaimer::cli::{Cli, Command, LogFormat};
use coder_gpu_reclaimer::commands::{self, AppError};

fn init_logging(format: LogFormat, level: tracing::Level) {
    let builder = tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr).with_target(false);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
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
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => {
                init_logging(args.common.log_format.unwrap_or(LogFormat::Json), tracing::Level::INFO);
                commands::run(args).await.map(|_| true)
            }
            Command::Plan(args) => {
                init_logging(args.common.log_format.unwrap_or(LogFormat::Text), tracing::Level::WARN);
                commands::plan(args).await.map(|out| {
                    print!("{out}");
                    true
                })
            }
            Command::Check(args) => {
                init_logging(args.common.log_format.unwrap_or(LogFormat::Text), tracing::Level::WARN);
                commands::check(args).await
            }
            Command::Demo(args) => {
                init_logging(LogFormat::Text, tracing::Level::WARN);
                coder_gpu_reclaimer::demo::run(args).await.map(|_| true)
            }
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(AppError::Config(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(AppError::Runtime(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}
