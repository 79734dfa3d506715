//! Starting and stopping a `onehop serve` process for a benchmark run.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};

/// A server this benchmark started: stopped (SIGTERM via `kill`, then SIGKILL) when dropped.
pub struct ServerProcess {
    child: Child,
    pub url: String,
    /// The MQTT listener, `host:port`.
    pub mqtt: String,
    /// The Kafka listener, `host:port`.
    pub kafka: String,
    /// The HTTPS listener, `host:port`, when `--https-addr` was given.
    pub https: Option<String>,
    /// The MQTT over TLS listener, `host:port`, when `--mqtt-tls-addr` was given.
    pub mqtts: Option<String>,
    /// The Postgres listener, `host:port`, when `--pg-addr` was given.
    pub pg: Option<String>,
    launch: Launch,
    _data: tempfile::TempDir,
}

impl ServerProcess {
    /// Starts `exe serve` on a fresh data directory under `dir`, on a free loopback port, and
    /// waits until it listens.
    pub fn start(exe: &Path, dir: &Path, extra_args: &[&str]) -> anyhow::Result<ServerProcess> {
        ServerProcess::start_with_env(exe, dir, extra_args, &[])
    }

    /// [`ServerProcess::start`], with `env` added to the server's environment (secrets that a
    /// flag would show in `ps`).
    pub fn start_with_env(
        exe: &Path,
        dir: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<ServerProcess> {
        let data = tempfile::Builder::new().prefix("onehop-bench-data-").tempdir_in(dir)?;
        let launch = Launch {
            exe: exe.to_path_buf(),
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            env: env.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect(),
        };
        let listeners = ["127.0.0.1:0"; 3];
        let (child, found) = launch.spawn(data.path(), listeners)?;
        Ok(ServerProcess {
            child,
            url: found.url,
            mqtt: found.mqtt,
            kafka: found.kafka,
            https: found.https,
            mqtts: found.mqtts,
            pg: found.pg,
            launch,
            _data: data,
        })
    }

    /// Starts the server again on its data directory and its HTTP, MQTT and Kafka ports, as an
    /// operator restarts one after a crash ([`ServerProcess::kill_9`] first); clients
    /// reconnect to the addresses they had.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let http = self.url.trim_start_matches("http://").to_string();
        let listeners = [http.as_str(), self.mqtt.as_str(), self.kafka.as_str()];
        let (child, _) = self.launch.spawn(self._data.path(), listeners)?;
        self.child = child;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server with SIGKILL, as a crash would, and reaps it.
    pub fn kill_9(&mut self) -> anyhow::Result<()> {
        self.child.kill().context("killing the server")?;
        self.child.wait().context("reaping the killed server")?;
        Ok(())
    }
}

/// How a server was started, to start it again the same way.
struct Launch {
    exe: PathBuf,
    extra_args: Vec<String>,
    env: Vec<(String, String)>,
}

/// The listeners a starting server announced.
struct Listeners {
    url: String,
    mqtt: String,
    kafka: String,
    https: Option<String>,
    mqtts: Option<String>,
    pg: Option<String>,
}

impl Launch {
    /// Starts `exe serve` on `data` with its HTTP, MQTT and Kafka listeners at `listeners` and
    /// waits until it listens.
    fn spawn(&self, data: &Path, listeners: [&str; 3]) -> anyhow::Result<(Child, Listeners)> {
        let mut command = Command::new(&self.exe);
        let [http, mqtt, kafka] = listeners;
        command.arg("serve").args(["--http-addr", http, "--mqtt-addr", mqtt, "--kafka-addr", kafka]);
        // The workloads do not use the Postgres listener; the query benchmark asks for it.
        if !self.extra_args.iter().any(|arg| arg == "--pg-addr") {
            command.args(["--pg-addr", "off"]);
        }
        command
            .args(["--log", "warn,onehop=info"])
            .arg("--data-dir")
            .arg(data)
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The target runs at the process's own priority, whichever thread starts it (harness
        // threads ask for more; see `priority`).
        let nice = crate::priority::base_nice();
        // SAFETY: between fork and exec the closure makes one async-signal-safe syscall.
        unsafe {
            command.pre_exec(move || {
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                Ok(())
            });
        }
        let mut child = command.spawn().with_context(|| format!("starting {} serve", self.exe.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let (mut mqtt, mut kafka, mut https, mut mqtts, mut pg) = (String::new(), String::new(), None, None, None);
        // The address a "listening on {scheme}://{address}" line names.
        let listening = |line: &str, scheme: &str| {
            let rest = line.split(&format!("listening on {scheme}://")).nth(1)?;
            Some(rest.split(|c: char| c.is_whitespace() || c == '"').next().unwrap_or_default().to_string())
        };
        // The plain HTTP listener is announced last.
        let url = loop {
            let line = match lines.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => line,
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("the server did not start within 30 s");
                }
            };
            if let Some(address) = listening(&line, "mqtt") {
                mqtt = address;
            }
            if let Some(address) = listening(&line, "kafka") {
                kafka = address;
            }
            if let Some(address) = listening(&line, "https") {
                https = Some(address);
            }
            if let Some(address) = listening(&line, "mqtts") {
                mqtts = Some(address);
            }
            if let Some(address) = listening(&line, "postgres") {
                pg = Some(address);
            }
            if let Some(address) = listening(&line, "http") {
                break format!("http://{address}");
            }
            if line.contains("error") {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the server failed to start: {line}");
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || while lines.recv().is_ok() {});
        Ok((child, Listeners { url, mqtt, kafka, https, mqtts, pg }))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // A clean stop first (it flushes and exits 0), then make sure.
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
