//! A redis-server of the peer's own (Debian's, from `scripts/peers install redis`) on a free
//! loopback port, with the persistence it runs recorded, and the few commands the harness sends
//! it itself (the W2 stack's subscriber sets) in RESP over one plain TCP connection.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::{PeerProcess, free_port, system_program, version_of};

/// Redis's own persistence defaults, spelled out so meta.json says exactly what ran: RDB
/// snapshots after 1 change in an hour, 100 in 5 minutes or 10 000 in a minute; no AOF. The
/// W2 stack writes its sets once, before the schedule, and only reads them during a run.
pub const SAVE: &str = "3600 1 300 100 60 10000";
pub const APPENDONLY: &str = "no";
/// How long redis-server may take to answer PING (it takes ~0.15 s here).
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Members in one SADD at most: a set's whole membership goes in one command, bounded so a
/// huge plan cannot build an unbounded request.
const MEMBERS_PER_COMMAND_MAX: usize = 10_000;

pub struct RedisPeer {
    process: PeerProcess,
    address: String,
    program: PathBuf,
}

impl RedisPeer {
    /// Starts redis-server with its data in `data` and its log in `logs`.
    pub fn start(data: &Path, logs: &Path) -> anyhow::Result<RedisPeer> {
        let program = system_program("redis-server", "redis")?;
        let port = free_port()?;
        std::fs::create_dir_all(data)?;
        let mut command = Command::new(&program);
        command
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", SAVE, "--appendonly", APPENDONLY, "--daemonize", "no", "--dir"])
            .arg(data);
        let process = PeerProcess::start("redis-server", command, logs.join("redis.log"))?;
        let mut redis = RedisPeer { process, address: format!("127.0.0.1:{port}"), program };
        let deadline = Instant::now() + START_TIMEOUT;
        while redis.command(&["PING"]).ok().as_deref() != Some("+PONG") {
            redis.process.check_running()?;
            if Instant::now() > deadline {
                bail!("redis-server did not answer PING on {} within {START_TIMEOUT:?}", redis.address);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(redis)
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Adds `members` to the set `key`; checks that Redis added every one (the key is new).
    pub fn add_to_set(&self, key: &str, members: &[String]) -> anyhow::Result<()> {
        if members.is_empty() {
            return Ok(());
        }
        if members.len() > MEMBERS_PER_COMMAND_MAX {
            bail!("{} members for {key}: at most {MEMBERS_PER_COMMAND_MAX} in one SADD", members.len());
        }
        let mut words = vec!["SADD", key];
        words.extend(members.iter().map(String::as_str));
        let answer = self.command(&words)?;
        if answer != format!(":{}", members.len()) {
            bail!("SADD {key} answered {answer:?}, expected :{}", members.len());
        }
        Ok(())
    }

    /// Sends one command and returns its one-line answer (`+OK`, `:3`, `-ERR …`).
    fn command(&self, words: &[&str]) -> anyhow::Result<String> {
        let mut stream =
            TcpStream::connect(&self.address).with_context(|| format!("connecting to {}", self.address))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut request = format!("*{}\r\n", words.len()).into_bytes();
        for word in words {
            request.extend_from_slice(format!("${}\r\n{word}\r\n", word.len()).as_bytes());
        }
        stream.write_all(&request)?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).context("reading Redis's answer")?;
        Ok(line.trim_end().to_string())
    }

    /// What meta.json records of this Redis.
    pub fn settings(&self) -> serde_json::Value {
        json!({
            "version": version_of(&self.program, &["--version"]),
            "source": "Debian's redis-server (apt)",
            "mode": "standalone, one process",
            "persistence": {
                "save": SAVE,
                "appendonly": APPENDONLY,
                "note": "Redis's defaults, given on the command line; the sets are written before the schedule and only read during it",
            },
        })
    }
}
