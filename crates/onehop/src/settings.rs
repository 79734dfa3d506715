//! Resolving `serve` settings: flags > environment (both through clap) > config file > defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use onehop_log::{Durability, PartitionConfig};
use serde::Deserialize;

use onehop_engine::units::parse_bytes;
use onehop_server::HttpConfig;
use onehop_server::http::origin::AllowedOrigins;
use onehop_server::http::{BODY_BYTES_IN_FLIGHT_DEFAULT, BODY_READ_TIMEOUT_DEFAULT};

use crate::cli::ServeArgs;

pub const DEFAULT_DATA_DIR: &str = "./onehop-data";
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
pub const DEFAULT_MQTT_ADDR: &str = "127.0.0.1:1883";
pub const DEFAULT_KAFKA_ADDR: &str = "127.0.0.1:9092";
/// The Postgres listener's address when none is given: Postgres's own port, on loopback.
pub const DEFAULT_PG_ADDR: &str = "127.0.0.1:5432";
pub const DEFAULT_CONFIG_FILE: &str = "onehop.toml";
const DEFAULT_MAINTENANCE_INTERVAL_S: u64 = 30;
const DEFAULT_LOG_FILTER: &str = "info";
const DEFAULT_CONNECTIONS_MAX: usize = 20_000;
const DEFAULT_SUBSCRIPTIONS_PER_SOCKET_MAX: usize = 100;
const DEFAULT_SUBSCRIBER_QUEUE: usize = 1024;
const DEFAULT_MQTT_EMPTY_FIRST_LEVEL_STREAM: &str = "root";

/// A size in the config file: a number of bytes or a string such as "64MiB".
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self, key: &str) -> anyhow::Result<u64> {
        match self {
            Size::Bytes(bytes) => Ok(*bytes),
            Size::Text(text) => parse_bytes(text).map_err(|error| anyhow::anyhow!("{key}: {error}")),
        }
    }
}

/// `onehop.toml`: the same settings as the flags, named with `_`. Unknown keys are an error so
/// a typo is never silently ignored.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    data_dir: Option<PathBuf>,
    http_addr: Option<SocketAddr>,
    mqtt_addr: Option<SocketAddr>,
    kafka_addr: Option<String>,
    pg_addr: Option<String>,
    kafka_advertised_addr: Option<String>,
    mqtt_tls_addr: Option<SocketAddr>,
    https_addr: Option<SocketAddr>,
    kafka_tls: Option<bool>,
    kafka_tls_addr: Option<SocketAddr>,
    kafka_tls_advertised_addr: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    tls_client_auth: Option<String>,
    durability: Option<String>,
    async_fsync_interval_ms: Option<u64>,
    segment_bytes_max: Option<Size>,
    record_bytes_max: Option<Size>,
    batch_bytes_max: Option<Size>,
    maintenance_interval_s: Option<u64>,
    auto_create: Option<bool>,
    log_journal: Option<bool>,
    connections_max: Option<usize>,
    subscriptions_per_socket_max: Option<usize>,
    mqtt_subscriptions_max: Option<usize>,
    subscriber_queue: Option<usize>,
    schema: Option<PathBuf>,
    static_dir: Option<PathBuf>,
    log: Option<String>,
    mqtt_empty_first_level_stream: Option<String>,
    allowed_origins: Option<Vec<String>>,
    http_header_read_timeout_s: Option<u64>,
    http_idle_timeout_s: Option<u64>,
    http_body_read_timeout_s: Option<u64>,
    kafka_idle_timeout_s: Option<u64>,
    pg_idle_timeout_s: Option<u64>,
    idempotency_window_s: Option<u64>,
    idempotency_keys_max: Option<usize>,
    query_memory_max: Option<Size>,
    query_time_max_s: Option<u64>,
    query_stream_records_max: Option<u64>,
    checkpoint_interval_ms: Option<u64>,
    kafka_authentication_timeout_s: Option<u64>,
    http_body_bytes_in_flight_max: Option<Size>,
    shutdown_timeout_s: Option<u64>,
    admin_user: Option<String>,
    admin_password_file: Option<PathBuf>,
    insecure_listen: Option<bool>,
    jwt_keys: Option<PathBuf>,
    jwt_issuer: Option<String>,
    jwt_audience: Option<String>,
    jwt_user_claim: Option<String>,
    jwt_roles_claim: Option<String>,
    jwt_user_grants: Option<bool>,
    node_id: Option<u64>,
    cluster_addr: Option<SocketAddr>,
    cluster_advertised_addr: Option<SocketAddr>,
    peers: Option<String>,
    cluster_tls_cert: Option<PathBuf>,
    cluster_tls_key: Option<PathBuf>,
    cluster_tls_ca: Option<PathBuf>,
    cluster_snapshot_entries: Option<u64>,
    cluster_log_kept: Option<u64>,
}

/// A cluster node's settings.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node_id: u64,
    /// Where this node listens for the other nodes.
    pub address: SocketAddr,
    /// Where the other nodes reach it (`address` unless a proxy or NAT is between).
    pub advertised: SocketAddr,
    /// The members a new cluster is formed of (empty: join one that runs).
    pub peers: std::collections::BTreeMap<u64, SocketAddr>,
    /// TLS between the nodes: this node's certificate and key, and the cluster's CA.
    pub tls: Option<ClusterTlsFiles>,
    /// A snapshot every this many Raft log entries (`None`: none, the whole log is kept).
    pub snapshot_every: Option<u64>,
    /// Raft log entries kept before a snapshot.
    pub log_kept: u64,
}

/// Raft log entries between snapshots, by default.
pub const SNAPSHOT_ENTRIES_DEFAULT: u64 = 100_000;
/// Raft log entries kept before a snapshot, by default.
pub const LOG_KEPT_DEFAULT: u64 = 10_000;

/// The files of TLS between the nodes (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTlsFiles {
    /// This node's certificate chain: the CA signed it, and it names the node's cluster address
    /// (an IP address in its subject alternative names).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA every node's certificate is checked against.
    pub ca: PathBuf,
}

/// `1=127.0.0.1:7001,2=127.0.0.1:7002`: the members of a new cluster.
fn parse_peers(text: &str) -> anyhow::Result<std::collections::BTreeMap<u64, SocketAddr>> {
    let mut peers = std::collections::BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let (id, address) = item.split_once('=').with_context(|| format!("{item:?}: expected ID=ADDR"))?;
        let id: u64 = id.trim().parse().with_context(|| format!("{item:?}: the node id must be a number"))?;
        let address: SocketAddr =
            address.trim().parse().with_context(|| format!("{item:?}: the address must be IP:PORT"))?;
        if peers.insert(id, address).is_some() {
            bail!("node {id} is listed twice");
        }
    }
    Ok(peers)
}

fn cluster(args: &ServeArgs, file: &FileSettings) -> anyhow::Result<Option<ClusterSettings>> {
    let address = args.cluster_addr.or(file.cluster_addr);
    let peers = args.peers.clone().or(file.peers.clone());
    let Some(node_id) = args.node_id.or(file.node_id) else {
        if address.is_some() || peers.is_some() {
            bail!("cluster_addr and peers need node_id: this node's id in the cluster");
        }
        return Ok(None);
    };
    // A node id is also the node's Kafka broker id, an int32.
    if node_id > i32::MAX as u64 {
        bail!("node_id {node_id} is too large: node ids go up to 2147483647 (Kafka's broker ids are 32-bit)");
    }
    let address = address.context("node_id needs cluster_addr: the address the other nodes reach this one at")?;
    let advertised = args.cluster_advertised_addr.or(file.cluster_advertised_addr).unwrap_or(address);
    let peers = match peers {
        Some(text) => parse_peers(&text).context("peers")?,
        None => Default::default(),
    };
    if !peers.is_empty() {
        match peers.get(&node_id) {
            None => bail!("peers must list this node ({node_id}) among the members"),
            Some(listed) if *listed != advertised => bail!(
                "peers gives node {node_id} the address {listed}, and cluster_addr (or cluster_advertised_addr) says \
                 {advertised}"
            ),
            Some(_) => {}
        }
    }
    let tls = match (
        args.cluster_tls_cert.clone().or(file.cluster_tls_cert.clone()),
        args.cluster_tls_key.clone().or(file.cluster_tls_key.clone()),
        args.cluster_tls_ca.clone().or(file.cluster_tls_ca.clone()),
    ) {
        (None, None, None) => None,
        (Some(cert), Some(key), Some(ca)) => Some(ClusterTlsFiles { cert, key, ca }),
        _ => bail!("cluster_tls_cert, cluster_tls_key and cluster_tls_ca go together: give all three, or none"),
    };
    let snapshot_every = match args.cluster_snapshot_entries.or(file.cluster_snapshot_entries) {
        Some(0) => None,
        Some(entries) => Some(entries),
        None => Some(SNAPSHOT_ENTRIES_DEFAULT),
    };
    let log_kept = args.cluster_log_kept.or(file.cluster_log_kept).unwrap_or(LOG_KEPT_DEFAULT);
    Ok(Some(ClusterSettings { node_id, address, advertised, peers, tls, snapshot_every, log_kept }))
}

/// Everything `serve` runs with, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub http_addr: SocketAddr,
    pub mqtt_addr: SocketAddr,
    /// Address of the Kafka listener; `None` when it is off.
    pub kafka_addr: Option<SocketAddr>,
    /// Address of the Postgres listener, and whether it was chosen (a default address in use
    /// leaves the listener off instead of stopping the start); `None` when it is off.
    pub pg_addr: Option<(SocketAddr, bool)>,
    /// The MQTT listener over TLS, when on.
    pub mqtt_tls_addr: Option<SocketAddr>,
    /// The HTTPS listener, when on.
    pub https_addr: Option<SocketAddr>,
    /// The Kafka listener speaks TLS.
    pub kafka_tls: bool,
    /// A second Kafka listener, over TLS, and where its clients are told to connect.
    pub kafka_tls_addr: Option<SocketAddr>,
    pub kafka_tls_advertised_addr: Option<(String, u16)>,
    /// The certificate and key of the TLS listeners.
    pub tls: Option<onehop_server::tls::TlsFiles>,
    /// The host and port Kafka clients are told to connect to, when not the listener's.
    pub kafka_advertised_addr: Option<(String, u16)>,
    /// Settings given to new streams and tables unless they declare their own.
    pub stream_defaults: PartitionConfig,
    pub maintenance_interval: Duration,
    /// Create streams on their first publish.
    pub auto_create: bool,
    /// One shared journal for the log's partitions (`onehop_log::JournalOptions`).
    pub log_journal: bool,
    /// Most HTTP connections at once.
    pub connections_max: usize,
    /// Most subscriptions per WebSocket.
    pub subscriptions_per_socket_max: usize,
    /// Most topic filters per MQTT connection.
    pub mqtt_subscriptions_max: usize,
    /// Events a subscriber may have queued before it is cut off.
    pub subscriber_queue: usize,
    /// SQL applied at start.
    pub schema: Option<PathBuf>,
    /// Files served over HTTP where no route is.
    pub static_dir: Option<PathBuf>,
    pub log_filter: String,
    /// The config file that was read, if any.
    pub config_file: Option<PathBuf>,
    /// Set damaged bytes aside instead of refusing to start (flag or environment only).
    pub discard_damaged: bool,
    /// Open a damaged catalog by setting its damage aside (flag or environment only).
    pub recover_catalog: bool,
    /// The stream of MQTT topics whose first level is empty.
    pub mqtt_empty_first_level_stream: String,
    /// Origins whose pages may use the server from a browser, besides its own.
    pub allowed_origins: AllowedOrigins,
    /// Time an HTTP request head may take to arrive.
    pub http_header_read_timeout: Duration,
    /// Time an HTTP connection may wait for its next request.
    pub http_idle_timeout: Duration,
    /// Longest wait for the next piece of an HTTP request body, or for room to read it.
    pub http_body_read_timeout: Duration,
    /// Time a Kafka connection may go without a request (`connections.max.idle.ms`).
    pub kafka_idle_timeout: Duration,
    /// Time a Postgres session may wait for its client's next message.
    pub pg_idle_timeout: Duration,
    /// How long an idempotency key answers its write's retries.
    pub idempotency_window: Duration,
    /// Idempotency keys held at most.
    pub idempotency_keys_max: usize,
    /// Bytes of rows one SQL query may hold.
    pub query_memory_max: u64,
    /// How long one SQL query may run.
    pub query_time_max: Duration,
    /// Stream records one SQL query may read.
    pub query_stream_records_max: u64,
    /// How often views and transforms checkpoint while they run.
    pub checkpoint_interval: Duration,
    /// Time a Kafka connection has to log in once users exist.
    pub kafka_authentication_timeout: Duration,
    /// Bytes of HTTP request bodies in memory at once.
    pub http_body_bytes_in_flight_max: u64,
    /// Time connections have to finish after the first SIGTERM or SIGINT.
    pub shutdown_timeout: Duration,
    /// The first superuser: its name and password, created at start unless it exists.
    pub admin: Option<(String, String)>,
    /// Listen beyond loopback with no user defined.
    pub insecure_listen: bool,
    /// The file of keys JWTs are checked against, and how their claims are read.
    pub jwt: Option<JwtConfig>,
    /// Set when this is a node of a cluster.
    pub cluster: Option<ClusterSettings>,
}

/// Where JWT keys come from and how tokens are read.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub keys: PathBuf,
    pub settings: onehop_engine::access::jwt::JwtSettings,
}

impl JwtConfig {
    /// Reads the key file: at start, and on SIGHUP.
    pub fn load(&self) -> anyhow::Result<onehop_engine::access::jwt::JwtVerifier> {
        let text =
            std::fs::read_to_string(&self.keys).with_context(|| format!("reading jwt_keys {}", self.keys.display()))?;
        onehop_engine::access::jwt::JwtVerifier::from_text(&text, self.settings.clone())
            .map_err(|error| anyhow::anyhow!("jwt_keys {}: {error}", self.keys.display()))
    }
}

fn jwt(args: &ServeArgs, file: &FileSettings) -> anyhow::Result<Option<JwtConfig>> {
    let Some(keys) = args.jwt_keys.clone().or(file.jwt_keys.clone()) else {
        let stray = [&file.jwt_issuer, &file.jwt_audience, &file.jwt_user_claim, &file.jwt_roles_claim];
        if stray.iter().any(|setting| setting.is_some()) || file.jwt_user_grants.is_some() {
            bail!("jwt_issuer, jwt_audience, jwt_user_claim, jwt_roles_claim and jwt_user_grants need jwt_keys");
        }
        return Ok(None);
    };
    let defaults = onehop_engine::access::jwt::JwtSettings::default();
    let settings = onehop_engine::access::jwt::JwtSettings {
        issuer: args.jwt_issuer.clone().or(file.jwt_issuer.clone()),
        audience: args.jwt_audience.clone().or(file.jwt_audience.clone()),
        user_claim: args.jwt_user_claim.clone().or(file.jwt_user_claim.clone()).unwrap_or(defaults.user_claim),
        roles_claim: args.jwt_roles_claim.clone().or(file.jwt_roles_claim.clone()).unwrap_or(defaults.roles_claim),
        user_grants: args.jwt_user_grants || file.jwt_user_grants.unwrap_or(defaults.user_grants),
    };
    let config = JwtConfig { keys, settings };
    // A file that cannot be used stops the start here, with why.
    config.load()?;
    Ok(Some(config))
}

/// The environment variable holding the first superuser's password (a flag would show it in
/// `ps`).
pub const ADMIN_PASSWORD_ENV: &str = "ONEHOP_ADMIN_PASSWORD";

/// The first superuser from the flags, the file and the environment: a name needs a password.
fn admin(args: &ServeArgs, file: &FileSettings) -> anyhow::Result<Option<(String, String)>> {
    let Some(name) = args.admin_user.clone().or(file.admin_user.clone()) else {
        return Ok(None);
    };
    let password = match args.admin_password_file.as_ref().or(file.admin_password_file.as_ref()) {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading admin_password_file {}", path.display()))?
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        None => std::env::var(ADMIN_PASSWORD_ENV).unwrap_or_default(),
    };
    if password.is_empty() {
        bail!(
            "admin_user {name:?} needs a password: set {ADMIN_PASSWORD_ENV}, or give --admin-password-file (its \
             first line)"
        );
    }
    onehop_engine::access::validate_grantee_name(&name).map_err(|error| anyhow::anyhow!("admin_user: {error}"))?;
    Ok(Some((name, password)))
}

impl Settings {
    /// Resolves settings from parsed flags/environment and the config file.
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<Settings> {
        let (file, config_file) = match &args.config {
            Some(path) => (read_file(path)?, Some(path.clone())),
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                (read_file(Path::new(DEFAULT_CONFIG_FILE))?, Some(PathBuf::from(DEFAULT_CONFIG_FILE)))
            }
            None => (FileSettings::default(), None),
        };
        Self::merge(args, file, config_file)
    }

    fn merge(args: &ServeArgs, file: FileSettings, config_file: Option<PathBuf>) -> anyhow::Result<Settings> {
        let defaults = PartitionConfig::default();
        let size = |flag: Option<u64>, from_file: &Option<Size>, key: &str, default: u64| -> anyhow::Result<u64> {
            match (flag, from_file) {
                (Some(bytes), _) => Ok(bytes),
                (None, Some(size)) => size.bytes(key),
                (None, None) => Ok(default),
            }
        };
        let durability = match (args.durability, &file.durability) {
            (Some(durability), _) => durability,
            (None, Some(text)) => text.parse::<Durability>().map_err(|error| anyhow::anyhow!("durability: {error}"))?,
            (None, None) => defaults.durability,
        };
        let segment_bytes_max =
            size(args.segment_bytes_max, &file.segment_bytes_max, "segment_bytes_max", defaults.segment_bytes_max)?;
        // Limits left at their defaults shrink to fit the ones that were set, so setting a small
        // segment size alone does not trip the batch limit.
        let batch_bytes_max = size(
            args.batch_bytes_max,
            &file.batch_bytes_max,
            "batch_bytes_max",
            (defaults.batch_bytes_max as u64).min(segment_bytes_max),
        )? as usize;
        let record_bytes_max = size(
            args.record_bytes_max,
            &file.record_bytes_max,
            "record_bytes_max",
            (defaults.record_bytes_max as u64).min(batch_bytes_max as u64),
        )? as usize;
        let stream_defaults = PartitionConfig {
            durability,
            async_fsync_interval_ms: args
                .async_fsync_interval_ms
                .or(file.async_fsync_interval_ms)
                .unwrap_or(defaults.async_fsync_interval_ms),
            segment_bytes_max,
            record_bytes_max,
            batch_bytes_max,
            queue_bytes_max: defaults.queue_bytes_max.max(batch_bytes_max),
            ..defaults
        };
        if let Err(reason) = stream_defaults.validate() {
            bail!("invalid log settings: {reason}");
        }
        let maintenance_interval_s =
            args.maintenance_interval_s.or(file.maintenance_interval_s).unwrap_or(DEFAULT_MAINTENANCE_INTERVAL_S);
        if maintenance_interval_s == 0 {
            bail!("maintenance_interval_s must be at least 1");
        }
        let count = |flag: Option<usize>, from_file: Option<usize>, key: &str, default: usize| {
            let value = flag.or(from_file).unwrap_or(default);
            if value == 0 {
                bail!("{key} must be at least 1");
            }
            Ok(value)
        };
        let allowed_origins = allowed_origins(args, &file)?;
        let admin = admin(args, &file)?;
        let jwt = jwt(args, &file)?;
        let cluster = cluster(args, &file)?;
        let log_journal = args.log_journal.or(file.log_journal).unwrap_or(false);
        if log_journal && cluster.is_some() {
            // A snapshot installed from the leader replaces the log's directory before the log
            // opens, journal and all: the journal is not yet safe there.
            bail!("log_journal is for a single node for now; start the cluster node without it");
        }
        if let Some(cluster) = &cluster
            && cluster.tls.is_none()
            && !cluster.address.ip().is_loopback()
            && !(args.insecure_listen || file.insecure_listen.unwrap_or(false))
        {
            bail!(
                "refusing to listen for other nodes on {} without TLS: anyone who can reach the cluster port could \
                 take part in the cluster. Give the nodes certificates (--cluster-tls-cert, --cluster-tls-key, \
                 --cluster-tls-ca), or keep the port on a private network and say so with --insecure-listen \
                 (docs/cluster.md)",
                cluster.address
            );
        }
        let insecure_listen = args.insecure_listen || file.insecure_listen.unwrap_or(false);
        let kafka_addr = match args.kafka_addr.clone().or(file.kafka_addr.clone()).as_deref() {
            Some("off") => None,
            Some(address) => Some(
                address
                    .parse()
                    .with_context(|| format!("kafka_addr {address:?}: an address such as 127.0.0.1:9092, or off"))?,
            ),
            None => Some(DEFAULT_KAFKA_ADDR.parse().expect("valid default address")),
        };
        let kafka_advertised_addr = args
            .kafka_advertised_addr
            .clone()
            .or(file.kafka_advertised_addr.clone())
            .map(|text| parse_host_port(&text).with_context(|| format!("kafka_advertised_addr {text:?}")))
            .transpose()?;
        let mqtt_tls_addr = args.mqtt_tls_addr.or(file.mqtt_tls_addr);
        let tls = match (args.tls_cert.clone().or(file.tls_cert.clone()), args.tls_key.clone().or(file.tls_key.clone()))
        {
            (Some(cert), Some(key)) => Some(onehop_server::tls::TlsFiles {
                cert,
                key,
                client_ca: args.tls_client_ca.clone().or(file.tls_client_ca.clone()),
                client_cert_required: match args.tls_client_auth.as_deref().or(file.tls_client_auth.as_deref()) {
                    None | Some("optional") => false,
                    Some("required") => true,
                    Some(other) => bail!("tls_client_auth {other:?}: optional or required"),
                },
            }),
            (None, None) => None,
            _ => bail!("tls_cert and tls_key go together: the certificate chain and its private key"),
        };
        let client_ca_given = args.tls_client_ca.is_some() || file.tls_client_ca.is_some();
        if tls.is_none() && client_ca_given {
            bail!("tls_client_ca needs tls_cert and tls_key, and a TLS listener");
        }
        if file.tls_client_auth.is_some() && !client_ca_given {
            bail!("tls_client_auth needs tls_client_ca: the CAs that sign client certificates");
        }
        let https_addr = args.https_addr.or(file.https_addr);
        let kafka_tls = args.kafka_tls || file.kafka_tls.unwrap_or(false);
        let kafka_tls_addr = args.kafka_tls_addr.or(file.kafka_tls_addr);
        let pg_addr = match args.pg_addr.clone().or(file.pg_addr.clone()).as_deref() {
            Some("off") => None,
            Some(address) => Some((
                address
                    .parse()
                    .with_context(|| format!("pg_addr {address:?}: an address such as 127.0.0.1:5432, or off"))?,
                true,
            )),
            None => Some((DEFAULT_PG_ADDR.parse().expect("valid default address"), false)),
        };
        let tls_listeners = [
            ("mqtt_tls_addr", mqtt_tls_addr.is_some()),
            ("https_addr", https_addr.is_some()),
            ("kafka_tls", kafka_tls),
            ("kafka_tls_addr", kafka_tls_addr.is_some()),
        ];
        if let Some((key, _)) = tls_listeners.iter().find(|(_, on)| *on && tls.is_none()) {
            bail!("{key} needs tls_cert and tls_key");
        }
        if kafka_tls && kafka_addr.is_none() {
            bail!("kafka_tls is on but the Kafka listener is off (kafka_addr = \"off\")");
        }
        if kafka_tls_addr.is_some() && kafka_addr.is_none() {
            bail!("kafka_tls_addr adds a TLS listener beside the plain Kafka one, which is off (kafka_addr = \"off\")");
        }
        if kafka_tls_addr.is_some() && kafka_tls {
            bail!(
                "kafka_tls makes the one Kafka listener TLS; kafka_tls_addr adds a TLS listener beside the plain one: \
                 give one of them"
            );
        }
        let kafka_tls_advertised_addr = args
            .kafka_tls_advertised_addr
            .clone()
            .or(file.kafka_tls_advertised_addr.clone())
            .map(|text| parse_host_port(&text).with_context(|| format!("kafka_tls_advertised_addr {text:?}")))
            .transpose()?;
        if kafka_tls_advertised_addr.is_some() && kafka_tls_addr.is_none() {
            bail!("kafka_tls_advertised_addr needs kafka_tls_addr");
        }
        // The Postgres listener offers TLS on its own port to the clients that ask for it.
        if tls.is_some() && !tls_listeners.iter().any(|(_, on)| *on) && pg_addr.is_none() {
            bail!(
                "tls_cert and tls_key are given but no TLS listener is: set https_addr, mqtt_tls_addr, kafka_tls, \
                 kafka_tls_addr or pg_addr"
            );
        }
        let mqtt_empty_first_level_stream = args
            .mqtt_empty_first_level_stream
            .clone()
            .or(file.mqtt_empty_first_level_stream)
            .unwrap_or_else(|| DEFAULT_MQTT_EMPTY_FIRST_LEVEL_STREAM.to_string());
        if let Err(error) = onehop_engine::validate_name(&mqtt_empty_first_level_stream) {
            bail!("mqtt_empty_first_level_stream: {error}");
        }
        let seconds = |flag: Option<u64>, from_file: Option<u64>, key: &str, default: Duration| match flag.or(from_file)
        {
            Some(0) => bail!("{key} must be at least 1"),
            Some(seconds) => Ok(Duration::from_secs(seconds)),
            None => Ok(default),
        };
        let http_defaults = HttpConfig::default();
        let http_header_read_timeout = seconds(
            args.http_header_read_timeout_s,
            file.http_header_read_timeout_s,
            "http_header_read_timeout_s",
            http_defaults.header_read_timeout,
        )?;
        let http_idle_timeout = seconds(
            args.http_idle_timeout_s,
            file.http_idle_timeout_s,
            "http_idle_timeout_s",
            http_defaults.idle_timeout,
        )?;
        let kafka_defaults = onehop_server::kafka::KafkaConfig::new();
        let pg_idle_timeout = seconds(
            args.pg_idle_timeout_s,
            file.pg_idle_timeout_s,
            "pg_idle_timeout_s",
            onehop_server::pg::IDLE_TIMEOUT_DEFAULT,
        )?;
        let kafka_idle_timeout = seconds(
            args.kafka_idle_timeout_s,
            file.kafka_idle_timeout_s,
            "kafka_idle_timeout_s",
            kafka_defaults.idle_timeout,
        )?;
        let engine_defaults = onehop_engine::EngineOptions::default();
        let idempotency_window = seconds(
            args.idempotency_window_s,
            file.idempotency_window_s,
            "idempotency_window_s",
            engine_defaults.idempotency_window,
        )?;
        let idempotency_keys_max = count(
            args.idempotency_keys_max,
            file.idempotency_keys_max,
            "idempotency_keys_max",
            engine_defaults.idempotency_keys_max,
        )?;
        let query_memory_max = size(
            args.query_memory_max,
            &file.query_memory_max,
            "query_memory_max",
            engine_defaults.query_memory_bytes_max,
        )?;
        let query_time_max =
            seconds(args.query_time_max_s, file.query_time_max_s, "query_time_max_s", engine_defaults.query_time_max)?;
        let query_stream_records_max = args
            .query_stream_records_max
            .or(file.query_stream_records_max)
            .unwrap_or(engine_defaults.query_stream_records_max);
        if query_memory_max == 0 || query_stream_records_max == 0 {
            bail!("query_memory_max and query_stream_records_max must be at least 1");
        }
        let checkpoint_interval = match args.checkpoint_interval_ms.or(file.checkpoint_interval_ms) {
            Some(0) => bail!("checkpoint_interval_ms must be at least 1"),
            Some(ms) => Duration::from_millis(ms),
            None => engine_defaults.checkpoint_interval,
        };
        let kafka_authentication_timeout = seconds(
            args.kafka_authentication_timeout_s,
            file.kafka_authentication_timeout_s,
            "kafka_authentication_timeout_s",
            kafka_defaults.authentication_timeout,
        )?;
        let shutdown_timeout = seconds(
            args.shutdown_timeout_s,
            file.shutdown_timeout_s,
            "shutdown_timeout_s",
            http_defaults.shutdown_timeout,
        )?;
        let http_body_read_timeout = seconds(
            args.http_body_read_timeout_s,
            file.http_body_read_timeout_s,
            "http_body_read_timeout_s",
            BODY_READ_TIMEOUT_DEFAULT,
        )?;
        // The largest body HTTP takes: one append's worth, with room for its JSON escaping.
        let body_bytes_max = 2 * batch_bytes_max as u64;
        let http_body_bytes_in_flight_max = size(
            args.http_body_bytes_in_flight_max,
            &file.http_body_bytes_in_flight_max,
            "http_body_bytes_in_flight_max",
            BODY_BYTES_IN_FLIGHT_DEFAULT.max(body_bytes_max),
        )?;
        if http_body_bytes_in_flight_max < body_bytes_max {
            bail!(
                "http_body_bytes_in_flight_max ({http_body_bytes_in_flight_max} bytes) is below the largest request \
                 body ({body_bytes_max} bytes, twice batch_bytes_max), which could then never be read"
            );
        }
        Ok(Settings {
            connections_max: count(
                args.connections_max,
                file.connections_max,
                "connections_max",
                DEFAULT_CONNECTIONS_MAX,
            )?,
            subscriptions_per_socket_max: count(
                args.subscriptions_per_socket_max,
                file.subscriptions_per_socket_max,
                "subscriptions_per_socket_max",
                DEFAULT_SUBSCRIPTIONS_PER_SOCKET_MAX,
            )?,
            mqtt_subscriptions_max: count(
                args.mqtt_subscriptions_max,
                file.mqtt_subscriptions_max,
                "mqtt_subscriptions_max",
                onehop_server::mqtt::SUBSCRIPTIONS_MAX_DEFAULT,
            )?,
            subscriber_queue: count(
                args.subscriber_queue,
                file.subscriber_queue,
                "subscriber_queue",
                DEFAULT_SUBSCRIBER_QUEUE,
            )?,
            data_dir: args.data_dir.clone().or(file.data_dir).unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            http_addr: args
                .http_addr
                .or(file.http_addr)
                .unwrap_or_else(|| DEFAULT_HTTP_ADDR.parse().expect("valid default address")),
            mqtt_addr: args
                .mqtt_addr
                .or(file.mqtt_addr)
                .unwrap_or_else(|| DEFAULT_MQTT_ADDR.parse().expect("valid default address")),
            kafka_addr,
            pg_addr,
            kafka_advertised_addr,
            mqtt_tls_addr,
            https_addr,
            kafka_tls,
            kafka_tls_addr,
            kafka_tls_advertised_addr,
            tls,
            stream_defaults,
            maintenance_interval: Duration::from_secs(maintenance_interval_s),
            auto_create: args.auto_create.or(file.auto_create).unwrap_or(true),
            log_journal,
            schema: args.schema.clone().or(file.schema),
            static_dir: args.static_dir.clone().or(file.static_dir),
            log_filter: args.log.clone().or(file.log).unwrap_or_else(|| DEFAULT_LOG_FILTER.to_string()),
            config_file,
            discard_damaged: args.discard_damaged,
            recover_catalog: args.recover_catalog,
            mqtt_empty_first_level_stream,
            allowed_origins,
            http_header_read_timeout,
            http_idle_timeout,
            kafka_idle_timeout,
            pg_idle_timeout,
            idempotency_window,
            idempotency_keys_max,
            query_memory_max,
            query_time_max,
            query_stream_records_max,
            checkpoint_interval,
            kafka_authentication_timeout,
            http_body_read_timeout,
            http_body_bytes_in_flight_max,
            shutdown_timeout,
            admin,
            insecure_listen,
            jwt,
            cluster,
        })
    }
}

/// `HOST:PORT`, the host a name, an IPv4 address or a bracketed IPv6 one.
fn parse_host_port(text: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = text.rsplit_once(':').context("expected HOST:PORT, such as kafka.example.com:9092")?;
    let port: u16 = port.parse().ok().filter(|port| *port > 0).context("the port must be a number from 1 to 65535")?;
    let bare = host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')).unwrap_or(host);
    let valid = !bare.is_empty()
        && (bare.parse::<std::net::IpAddr>().is_ok()
            || bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
    if !valid {
        bail!("{host:?} is not a host name or an address");
    }
    Ok((bare.to_string(), port))
}

/// The allow-list from the flag or environment, else the file; none when neither sets it.
fn allowed_origins(args: &ServeArgs, file: &FileSettings) -> anyhow::Result<AllowedOrigins> {
    match args.allowed_origins.as_ref().or(file.allowed_origins.as_ref()) {
        Some(entries) => AllowedOrigins::parse(entries.iter().map(String::as_str))
            .map_err(|error| anyhow::anyhow!("allowed_origins: {error}")),
        None => Ok(AllowedOrigins::default()),
    }
}

fn read_file(path: &Path) -> anyhow::Result<FileSettings> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> FileSettings {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn an_advertised_kafka_address_is_a_host_or_address_and_a_port() {
        assert_eq!(parse_host_port("kafka.example.com:9092").unwrap(), ("kafka.example.com".into(), 9092));
        assert_eq!(parse_host_port("10.0.0.5:19092").unwrap(), ("10.0.0.5".into(), 19092));
        assert_eq!(parse_host_port("[::1]:9092").unwrap(), ("::1".into(), 9092));
        for bad in ["kafka", "kafka:0", "kafka:x", ":9092", "a b:9092", "kafka:70000"] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_listen_on_loopback_only() {
        let settings = Settings::merge(&ServeArgs::default(), FileSettings::default(), None).unwrap();
        assert_eq!(settings.data_dir, PathBuf::from("./onehop-data"));
        assert!(settings.http_addr.ip().is_loopback());
        assert_eq!(settings.http_addr.port(), 8080);
        assert_eq!(settings.stream_defaults, PartitionConfig::default());
        assert!(settings.auto_create);
    }

    #[test]
    fn flags_win_over_file_and_file_over_defaults() {
        let from_file = file(
            "data_dir = \"/from/file\"\nhttp_addr = \"127.0.0.1:9000\"\nsegment_bytes_max = \"8MiB\"\n\
             durability = \"async\"\nmaintenance_interval_s = 5\nauto_create = false\n",
        );
        let args = ServeArgs { data_dir: Some("/from/flag".into()), ..ServeArgs::default() };
        let settings = Settings::merge(&args, from_file, None).unwrap();
        assert_eq!(settings.data_dir, PathBuf::from("/from/flag"));
        assert_eq!(settings.http_addr.port(), 9000);
        assert_eq!(settings.stream_defaults.segment_bytes_max, 8 << 20);
        assert_eq!(settings.stream_defaults.durability, Durability::Async);
        assert_eq!(settings.maintenance_interval, Duration::from_secs(5));
        assert!(!settings.auto_create);
    }

    #[test]
    fn the_shared_journal_is_a_setting_and_refused_with_a_cluster() {
        let on = Settings::merge(&ServeArgs::default(), file("log_journal = true\n"), None).unwrap();
        assert!(on.log_journal);
        assert!(!Settings::merge(&ServeArgs::default(), file(""), None).unwrap().log_journal);
        let clustered = file("log_journal = true\nnode_id = 1\ncluster_addr = \"127.0.0.1:7001\"\n");
        let refused = Settings::merge(&ServeArgs::default(), clustered, None).unwrap_err().to_string();
        assert!(refused.contains("log_journal is for a single node"), "{refused}");
    }

    #[test]
    fn bad_files_and_values_are_refused_with_the_key_named() {
        assert!(
            toml::from_str::<FileSettings>("data_directory = \"x\"").unwrap_err().to_string().contains("unknown field")
        );
        let error = Settings::merge(&ServeArgs::default(), file("durability = \"later\""), None).unwrap_err();
        assert!(error.to_string().contains("durability"), "{error}");
        let error =
            Settings::merge(&ServeArgs::default(), file("segment_bytes_max = \"12 furlongs\""), None).unwrap_err();
        assert!(error.to_string().contains("segment_bytes_max"), "{error}");
        let args = ServeArgs { record_bytes_max: Some(64 << 20), ..ServeArgs::default() };
        let error = Settings::merge(&args, FileSettings::default(), None).unwrap_err();
        assert!(error.to_string().contains("record_bytes_max"), "{error}");
    }

    #[test]
    fn the_empty_first_level_stream_must_be_a_stream_name() {
        let settings = Settings::merge(&ServeArgs::default(), FileSettings::default(), None).unwrap();
        assert_eq!(settings.mqtt_empty_first_level_stream, "root");
        let from_file = file("mqtt_empty_first_level_stream = \"slash\"");
        let settings = Settings::merge(&ServeArgs::default(), from_file, None).unwrap();
        assert_eq!(settings.mqtt_empty_first_level_stream, "slash");
        for bad in ["", "no spaces", "__reserved"] {
            let args = ServeArgs { mqtt_empty_first_level_stream: Some(bad.into()), ..ServeArgs::default() };
            let error = Settings::merge(&args, FileSettings::default(), None).unwrap_err();
            assert!(error.to_string().contains("mqtt_empty_first_level_stream"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn allowed_origins_come_from_the_flag_or_the_file_and_are_checked() {
        let none = Settings::merge(&ServeArgs::default(), FileSettings::default(), None).unwrap();
        assert!(none.allowed_origins.is_none());
        let from_file = file("allowed_origins = [\"https://App.Example.com:443\", \"http://127.0.0.1:5173\"]");
        let settings = Settings::merge(&ServeArgs::default(), from_file, None).unwrap();
        assert_eq!(settings.allowed_origins.to_string(), "https://app.example.com,http://127.0.0.1:5173");
        // The flag wins, even when it empties the list.
        let args = ServeArgs { allowed_origins: Some(vec![String::new()]), ..ServeArgs::default() };
        let settings = Settings::merge(&args, file("allowed_origins = [\"*\"]"), None).unwrap();
        assert!(settings.allowed_origins.is_none());
        let error = Settings::merge(&ServeArgs::default(), file("allowed_origins = [\"https://a.example/\"]"), None)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("allowed_origins: ") && error.contains("write https://a.example"), "{error}");
    }

    #[test]
    fn http_timeouts_and_body_memory_are_settings_with_checked_values() {
        let settings = Settings::merge(&ServeArgs::default(), FileSettings::default(), None).unwrap();
        assert_eq!(settings.http_header_read_timeout, Duration::from_secs(10));
        assert_eq!(settings.http_idle_timeout, Duration::from_secs(60));
        assert_eq!(settings.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(settings.http_body_read_timeout, Duration::from_secs(30));
        assert_eq!(settings.http_body_bytes_in_flight_max, 128 << 20);
        let from_file =
            file("http_idle_timeout_s = 5\nhttp_body_bytes_in_flight_max = \"64MiB\"\nshutdown_timeout_s = 2\n");
        let args = ServeArgs { http_idle_timeout_s: Some(7), ..ServeArgs::default() };
        let settings = Settings::merge(&args, from_file, None).unwrap();
        assert_eq!(settings.http_idle_timeout, Duration::from_secs(7));
        assert_eq!(settings.http_body_bytes_in_flight_max, 64 << 20);
        assert_eq!(settings.shutdown_timeout, Duration::from_secs(2));
        // A larger batch limit raises the default, so that its bodies can still be read.
        let args =
            ServeArgs { segment_bytes_max: Some(512 << 20), batch_bytes_max: Some(128 << 20), ..ServeArgs::default() };
        assert_eq!(
            Settings::merge(&args, FileSettings::default(), None).unwrap().http_body_bytes_in_flight_max,
            256 << 20
        );
        let error = Settings::merge(&ServeArgs::default(), file("http_header_read_timeout_s = 0"), None).unwrap_err();
        assert!(error.to_string().contains("http_header_read_timeout_s"), "{error}");
        let error =
            Settings::merge(&ServeArgs::default(), file("http_body_bytes_in_flight_max = \"8MiB\""), None).unwrap_err();
        assert!(error.to_string().contains("http_body_bytes_in_flight_max"), "{error}");
    }
}
