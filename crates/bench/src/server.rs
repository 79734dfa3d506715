//! Starting and stopping a `onehop serve` process for a benchmark run.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
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
        let mut command = Command::new(exe);
        command.arg("serve").args([
            "--http-addr",
            "127.0.0.1:0",
            "--mqtt-addr",
            "127.0.0.1:0",
            "--kafka-addr",
            "127.0.0.1:0",
        ]);
        // The workloads do not use the Postgres listener; the query benchmark asks for it.
        if !extra_args.contains(&"--pg-addr") {
            command.args(["--pg-addr", "off"]);
        }
        command
            .args(["--log", "warn,onehop=info"])
            .arg("--data-dir")
            .arg(data.path())
            .args(extra_args)
            .envs(env.iter().copied())
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
        let mut child = command.spawn().with_context(|| format!("starting {} serve", exe.display()))?;
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
            let line = lines.recv_timeout(Duration::from_secs(30)).context("the server did not start within 30 s")?;
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
                bail!("the server failed to start: {line}");
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || while lines.recv().is_ok() {});
        Ok(ServerProcess { child, url, mqtt, kafka, https, mqtts, pg, _data: data })
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
