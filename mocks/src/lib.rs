//! Stateful fakes of Coder's REST API (v2.34.3 shapes and status codes) and NVIDIA dcgm-exporter,
//! sharing one `World`. Used by the end-to-end tests and by `coder-gpu-reclaimer demo`. They
//! listen on loopback, on port 0 unless told otherwise.

pub mod coder;
pub mod exporter;
pub mod prometheus;
pub mod world;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use coder::Fault;
pub use exporter::{Behaviour, Counters, Device, ExporterConfig, Holder, Names, PodUid, Stuck, VirtualGpus, pod_uid_of};
pub use uuid::Uuid;
pub use world::{Assignment, Load, OrgRole, World, WorldConfig};

/// A running fake Coder and its world. Dropping it stops the server and the ticker.
pub struct FakeCoder {
    pub addr: SocketAddr,
    pub world: Arc<Mutex<World>>,
    pub controls: Arc<Mutex<coder::Controls>>,
    tasks: Vec<JoinHandle<()>>,
}

impl FakeCoder {
    pub async fn start(config: WorldConfig) -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0", config).await
    }

    pub async fn start_on(addr: &str, config: WorldConfig) -> std::io::Result<Self> {
        let world = Arc::new(Mutex::new(World::new(config)));
        let controls = Arc::new(Mutex::new(coder::Controls::default()));
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let router = coder::router(coder::CoderState { world: world.clone(), controls: controls.clone() });
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        let ticking = world.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                coder::lock(&ticking).tick();
            }
        });
        Ok(FakeCoder { addr, world, controls, tasks: vec![server, ticker] })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Runs `f` on the world (under its lock).
    pub fn with<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        f(&mut coder::lock(&self.world))
    }

    pub fn owner_token(&self) -> String {
        self.with(|w| w.users[0].token.clone())
    }

    /// Sets (or replaces) the faults for requests whose path starts with `prefix`.
    pub fn set_fault(&self, prefix: &str, fault: Fault) {
        let mut c = coder::lock(&self.controls);
        c.faults.retain(|(p, _)| p != prefix);
        c.faults.push((prefix.to_string(), fault));
    }

    /// The listing repeats its first entry (as offset paging can while states change).
    pub fn repeat_in_listing(&self, on: bool) {
        coder::lock(&self.controls).repeat_in_listing = on;
    }

    /// Every request seen so far, as (method, path and query).
    pub fn requests(&self) -> Vec<(String, String)> {
        coder::lock(&self.controls).requests.clone()
    }
}

impl Drop for FakeCoder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A running fake dcgm-exporter reading the same world.
pub struct FakeExporter {
    pub addr: SocketAddr,
    pub config: Arc<Mutex<ExporterConfig>>,
    task: Option<JoinHandle<()>>,
}

impl FakeExporter {
    pub async fn start(world: Arc<Mutex<World>>, config: ExporterConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let config = Arc::new(Mutex::new(config));
        let router = exporter::router(exporter::ExporterState { world, config: config.clone(), cache: Default::default() });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(FakeExporter { addr, config, task: Some(task) })
    }

    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    pub fn set(&self, f: impl FnOnce(&mut ExporterConfig)) {
        f(&mut coder::lock(&self.config));
    }

    /// The exporter dies: its port stops answering.
    pub fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Drop for FakeExporter {
    fn drop(&mut self) {
        self.kill();
    }
}
