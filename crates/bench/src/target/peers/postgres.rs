//! A PostgreSQL 15 of the peer's own (Debian's `postgresql-15`, from `scripts/peers install
//! kafka-stack`): a fresh cluster made by `initdb` in the target's directory, started on a free
//! loopback port with logical decoding on (Debezium reads its write-ahead log) and every commit
//! fsynced, Postgres's defaults spelled out so meta.json says exactly what ran. The system's own
//! Postgres service is never used or touched.
//!
//! Postgres refuses to run as root: when the harness is root, `initdb` and `postgres` run as the
//! `postgres` user the package made, so its directory must be reachable by that user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::{PeerProcess, free_port, version_of};

/// Where Debian's package puts the server's programs.
const BIN_DIR: &str = "/usr/lib/postgresql/15/bin";
/// The database and the superuser the pipeline uses (trust authentication, loopback only).
pub const DATABASE: &str = "postgres";
pub const USER: &str = "postgres";
/// The outbox table and the publication Debezium reads it through.
pub const OUTBOX_TABLE: &str = "public.outbox";
pub const PUBLICATION: &str = "onehop_outbox";
/// The server settings given on its command line: logical decoding for Debezium, and the
/// durability of a commit (Postgres's defaults: fsync on, the commit waits for its WAL flush).
const SETTINGS: [(&str, &str); 6] = [
    ("wal_level", "logical"),
    ("fsync", "on"),
    ("synchronous_commit", "on"),
    ("max_wal_senders", "10"),
    ("max_replication_slots", "10"),
    ("listen_addresses", "127.0.0.1"),
];
/// The outbox as Debezium's outbox event router expects it (its default column names).
const SCHEMA: &str = "CREATE TABLE public.outbox (\
     id uuid PRIMARY KEY DEFAULT gen_random_uuid(), \
     aggregatetype text NOT NULL, \
     aggregateid text NOT NULL, \
     type text NOT NULL, \
     payload jsonb NOT NULL, \
     created_at timestamptz NOT NULL DEFAULT now()); \
     CREATE PUBLICATION onehop_outbox FOR TABLE public.outbox;";
/// The settings read back from the running server for meta.json.
const REPORTED: [&str; 9] = [
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "wal_level",
    "commit_delay",
    "shared_buffers",
    "max_replication_slots",
];
/// How long initdb may take (1–2 s here) and the server to answer a query (0.1 s here).
const INITDB_TIMEOUT: Duration = Duration::from_secs(60);
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct PostgresPeer {
    process: PeerProcess,
    port: u16,
    settings: serde_json::Value,
}

/// The user and group to run Postgres as: `postgres`'s when the harness is root, else none.
fn run_as() -> anyhow::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = std::ffi::CString::new(USER).expect("no NUL");
    // SAFETY: getpwnam reads a NUL-terminated name and returns a pointer into static storage
    // (or null), read at once, before any other call could overwrite it.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        bail!("Postgres will not run as root and there is no `postgres` user: run `scripts/peers install kafka-stack`");
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Ok(Some((uid, gid)))
}

/// Checks that user `uid` (group `gid`) can pass through every directory above `dir`.
fn check_reachable(dir: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    for ancestor in dir.ancestors().skip(1) {
        let metadata = std::fs::metadata(ancestor).with_context(|| format!("reading {}", ancestor.display()))?;
        let mode = metadata.mode();
        let passes = (metadata.uid() == uid && mode & 0o100 != 0)
            || (metadata.gid() == gid && mode & 0o010 != 0)
            || mode & 0o001 != 0;
        if !passes {
            bail!(
                "Postgres runs as the `postgres` user, which cannot pass through {} (mode {:o}): give --dir a directory it can reach (`chmod o+x` on it)",
                ancestor.display(),
                mode & 0o7777
            );
        }
    }
    Ok(())
}

/// A command for a Postgres program, run as `user` when given.
fn command(program: &str, user: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(Path::new(BIN_DIR).join(program));
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

impl PostgresPeer {
    /// Makes a cluster in `data` (created here, inside the target's own directory `parent`)
    /// and starts it, its log in `logs`; then makes the outbox table and its publication.
    pub fn start(parent: &Path, logs: &Path) -> anyhow::Result<PostgresPeer> {
        PostgresPeer::start_with(parent, logs, Some(SCHEMA))
    }

    /// [`PostgresPeer::start`] without the outbox: a cluster with only its own databases.
    pub fn start_plain(parent: &Path, logs: &Path) -> anyhow::Result<PostgresPeer> {
        PostgresPeer::start_with(parent, logs, None)
    }

    fn start_with(parent: &Path, logs: &Path, schema: Option<&str>) -> anyhow::Result<PostgresPeer> {
        let initdb = Path::new(BIN_DIR).join("initdb");
        if !initdb.is_file() {
            bail!("{} is not installed: run `scripts/peers install kafka-stack` first", initdb.display());
        }
        let user = run_as()?;
        let data: PathBuf = parent.join("postgres");
        std::fs::create_dir_all(&data)?;
        if let Some((uid, gid)) = user {
            // The target's directory (ours, 0700 as tempfile makes it) lets the postgres user
            // through, and the cluster's directory is its own.
            let mode = std::fs::metadata(parent)?.mode() | 0o001;
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(mode))?;
            std::os::unix::fs::chown(&data, Some(uid), Some(gid)).context("giving the postgres user its directory")?;
            check_reachable(&data, uid, gid)?;
        }
        let mut make = command("initdb", user);
        make.args(["--auth=trust", "--encoding=UTF8", "--no-instructions", "--username", USER, "-D"]).arg(&data);
        PeerProcess::start("initdb", make, logs.join("postgres-initdb.log"))?.wait_success(INITDB_TIMEOUT)?;

        let port = free_port()?;
        let mut server = command("postgres", user);
        server.arg("-D").arg(&data).args(["-c", &format!("port={port}"), "-c", "unix_socket_directories="]);
        for (name, value) in SETTINGS {
            server.args(["-c", &format!("{name}={value}")]);
        }
        let process = PeerProcess::start("postgres", server, logs.join("postgres.log"))?;
        let mut postgres = PostgresPeer { process, port, settings: serde_json::Value::Null };
        let deadline = Instant::now() + START_TIMEOUT;
        while postgres.query("SELECT 1").is_err() {
            postgres.process.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "postgres did not answer on 127.0.0.1:{port} within {START_TIMEOUT:?}; its log is in {}",
                    logs.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(schema) = schema {
            postgres.query(schema).context("making the outbox table and its publication")?;
        }
        let reported: Vec<String> = REPORTED.iter().map(|name| format!("'{name}'")).collect();
        let rows = postgres.query(&format!(
            "SELECT name || '=' || current_setting(name) FROM pg_settings WHERE name IN ({}) ORDER BY name",
            reported.join(",")
        ))?;
        let server_settings: serde_json::Map<String, serde_json::Value> = rows
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(name, value)| (name.to_string(), value.into()))
            .collect();
        postgres.settings = json!({
            "version": version_of(&Path::new(BIN_DIR).join("postgres"), &["--version"]),
            "source": "Debian's postgresql-15 (apt); a cluster of the run's own (initdb), not the system's service",
            "authentication": "trust, 127.0.0.1 only",
            "command_line": SETTINGS.iter().map(|(name, value)| format!("{name}={value}")).collect::<Vec<_>>(),
            "server": server_settings,
            "outbox": schema,
        });
        Ok(postgres)
    }

    /// `host:port`, as the glue and the relay are given it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// What meta.json records of this Postgres.
    pub fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }

    /// Runs `sql` through psql and returns its unaligned output.
    pub fn query(&self, sql: &str) -> anyhow::Result<String> {
        self.query_in(DATABASE, sql)
    }

    /// Runs a script of statements (of any length) in `database` through psql's stdin.
    pub fn script_in(&self, database: &str, sql: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let mut child = Command::new(Path::new(BIN_DIR).join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER, "-d", database])
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"])
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running psql")?;
        child.stdin.take().expect("stdin is piped").write_all(sql.as_bytes()).context("writing to psql")?;
        let output = child.wait_with_output().context("waiting for psql")?;
        if !output.status.success() {
            bail!("psql failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(())
    }

    /// [`PostgresPeer::query`] in database `database`.
    pub fn query_in(&self, database: &str, sql: &str) -> anyhow::Result<String> {
        let output = Command::new(Path::new(BIN_DIR).join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER, "-d", database])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "5")
            .output()
            .context("running psql")?;
        if !output.status.success() {
            bail!("psql failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}
