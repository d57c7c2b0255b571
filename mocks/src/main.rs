//! `fake-coder`: runs the fake Coder and one fake dcgm-exporter on loopback, prints their URLs
//! and the owner token's location, and serves until ctrl-c. Drive it with `/control/...`.

use std::process::ExitCode;

use mocks::{ExporterConfig, FakeCoder, FakeExporter, WorldConfig};

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut config = WorldConfig::default();
    let mut addr = "127.0.0.1:0".to_string();
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--gpus", Some(n)) => config.gpus = n.parse().unwrap_or(1),
            ("--scale", Some(s)) => config.scale = s.parse().unwrap_or(1.0),
            ("--listen", Some(l)) => addr = l,
            _ => {
                eprintln!("usage: fake-coder [--gpus N] [--scale COD3R_SECONDS_PER_SECOND] [--listen ADDR]");
                return ExitCode::from(2);
            }
        }
    }
    let coder = match FakeCoder::start_on(&addr, config).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return ExitCode::from(1);
        }
    };
    let exporter = match FakeExporter::start(coder.world.clone(), ExporterConfig::default()).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot start the fake exporter: {e}");
            return ExitCode::from(1);
        }
    };
    let token_file = std::env::temp_dir().join("fake-coder-owner-token");
    if let Err(e) = std::fs::write(&token_file, coder.owner_token()) {
        eprintln!("error: cannot write {}: {e}", token_file.display());
        return ExitCode::from(1);
    }
    println!("fake Coder:         {}", coder.url());
    println!("fake dcgm-exporter: {}", exporter.url());
    println!("owner token file:   {}", token_file.display());
    println!(
        "create a workspace: curl -XPOST {}/control/create -H 'Content-Type: application/json' -d '{{\"owner\":\"alice\",\"name\":\"a\"}}'",
        coder.url()
    );
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
