//! The command line. Every flag of `serve` can also be set by an `ONEHOP_*` environment
//! variable or a key of the same name (with `_`) in `onehop.toml`; flags win over the
//! environment, which wins over the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use onehop_engine::units::parse_bytes;
use onehop_log::Durability;

#[derive(Parser, Debug)]
#[command(
    name = "onehop",
    version,
    about = "Durable tables, streams, live subscriptions and views in one process, on one log.",
    long_about = "onehop keeps every write in one durable, group-committed log and serves it to \
                  subscribers, queries and live aggregates from the same process.\n\n\
                  Start a server on the embedded default with `onehop serve`."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the server (data in ./onehop-data, HTTP on 127.0.0.1:8080 by default).
    // Boxed: its many settings would make every command as large.
    Serve(Box<ServeArgs>),
    /// Run SQL definitions (CREATE STREAM, SHOW STREAMS, DESCRIBE) on a running server.
    Sql(SqlArgs),
    /// Show a cluster's members and leader, add a node, or remove one (through any member).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Run a benchmark and print its figures.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Check a data directory read-only: every batch's checksum, every index against its
    /// segment, every segment boundary. Exits 1 when anything is damaged.
    Check(CheckArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The data directory to check (the server's --data-dir) [default: ./onehop-data].
    #[arg(long, env = "ONEHOP_DATA_DIR", value_name = "DIR", default_value = "./onehop-data")]
    pub data_dir: PathBuf,

    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SqlArgs {
    /// The statements, `;`-separated. Give either these or --file.
    #[arg(value_name = "SQL", conflicts_with = "file", required_unless_present = "file")]
    pub sql: Option<String>,

    /// Read the statements from this file.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,

    #[command(flatten)]
    pub server: ServerArgs,
}

/// Which running server a command talks to, and as whom.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The server's HTTP address.
    #[arg(long, env = "ONEHOP_URL", default_value = "http://127.0.0.1:8080", value_name = "URL")]
    pub url: String,

    /// Log in as this user, with the password in ONEHOP_PASSWORD (HTTP Basic).
    #[arg(long, env = "ONEHOP_USER", value_name = "NAME", conflicts_with = "token")]
    pub user: Option<String>,

    /// Log in with this token (from CREATE TOKEN; HTTP Bearer). Better given as ONEHOP_TOKEN,
    /// which `ps` does not show.
    #[arg(long, env = "ONEHOP_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// This node's view of the cluster: its state, the term, the leader, the members.
    Status {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Add the node ID, listening for the other nodes at ADDR (started without --peers): it
    /// copies the log, then votes. Answers once the change is committed.
    Add {
        /// The new node's --node-id.
        id: u64,
        /// The new node's cluster address (its --cluster-advertised-addr, or --cluster-addr).
        address: std::net::SocketAddr,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Remove the node ID from the members (stop it afterwards).
    Remove {
        id: u64,
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// Settings of `onehop serve`. A flag left out falls back to its environment variable, then to
/// the same key in the config file, then to the default shown.
#[derive(Args, Debug, Default, Clone)]
pub struct ServeArgs {
    /// Config file (TOML; keys as the flags with `_`, e.g. `data_dir = "/var/lib/onehop"`).
    /// Without this flag, ./onehop.toml is read when it exists.
    #[arg(long, env = "ONEHOP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory holding the log and all state [default: ./onehop-data].
    #[arg(long, env = "ONEHOP_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Address of the HTTP listener (REST, SSE, WebSocket, /healthz, /metrics). Use port 0 for
    /// any free port [default: 127.0.0.1:8080].
    #[arg(long, env = "ONEHOP_HTTP_ADDR", value_name = "ADDR")]
    pub http_addr: Option<SocketAddr>,

    /// Address of the MQTT listener (3.1.1 and 5.0 over TCP). Use port 0 for any free port
    /// [default: 127.0.0.1:1883].
    #[arg(long, env = "ONEHOP_MQTT_ADDR", value_name = "ADDR")]
    pub mqtt_addr: Option<SocketAddr>,

    /// Address of an HTTPS listener (HTTP/1.1 and HTTP/2 by ALPN) beside the HTTP one, with
    /// --tls-cert and --tls-key [default: off].
    #[arg(long, env = "ONEHOP_HTTPS_ADDR", value_name = "ADDR")]
    pub https_addr: Option<SocketAddr>,

    /// Address of the MQTT listener over TLS (8883 by convention), with --tls-cert and
    /// --tls-key [default: off].
    #[arg(long, env = "ONEHOP_MQTT_TLS_ADDR", value_name = "ADDR")]
    pub mqtt_tls_addr: Option<SocketAddr>,

    /// The TLS certificate chain (PEM, the server's certificate first), read again on SIGHUP.
    #[arg(long, env = "ONEHOP_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The TLS certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1), read again on SIGHUP.
    #[arg(long, env = "ONEHOP_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// CA certificates (PEM) that sign client certificates: TLS clients may present one, and
    /// a verified one logs in as the user its subject's common name (CN) is. Read again on
    /// SIGHUP [default: clients are not asked for a certificate].
    #[arg(long, env = "ONEHOP_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// With --tls-client-ca: `optional` (a client without a certificate may log in otherwise)
    /// or `required` (the handshake of a client without one fails) [default: optional].
    #[arg(long, env = "ONEHOP_TLS_CLIENT_AUTH", value_name = "optional|required", requires = "tls_client_ca")]
    pub tls_client_auth: Option<String>,

    /// Address of the Postgres listener (the Postgres wire protocol: psql, drivers and SQL
    /// tools run SQL), or `off`. Use port 0 for any free port. Left out, 127.0.0.1:5432 is
    /// tried and the listener stays off (with a warning) when a Postgres already has it.
    #[arg(long, env = "ONEHOP_PG_ADDR", value_name = "ADDR|off")]
    pub pg_addr: Option<String>,

    /// Address of the Kafka listener (the Kafka wire protocol: Kafka clients produce to and
    /// fetch from streams), or `off`. Use port 0 for any free port [default: 127.0.0.1:9092].
    #[arg(long, env = "ONEHOP_KAFKA_ADDR", value_name = "ADDR|off")]
    pub kafka_addr: Option<String>,

    /// The host and port Kafka clients are told to connect to (Kafka's advertised.listeners),
    /// when they reach the listener by another address: a DNS name, a container's published
    /// port, a proxy [default: the Kafka listener's address].
    #[arg(long, env = "ONEHOP_KAFKA_ADVERTISED_ADDR", value_name = "HOST:PORT")]
    pub kafka_advertised_addr: Option<String>,

    /// The Kafka listener speaks TLS (clients' `security.protocol` SSL, or SASL_SSL once users
    /// exist), with --tls-cert and --tls-key.
    #[arg(long, env = "ONEHOP_KAFKA_TLS")]
    pub kafka_tls: bool,

    /// Address of a second Kafka listener, over TLS, beside the plain one (as Kafka's
    /// `listeners=SASL_PLAINTEXT://…,SASL_SSL://…`), with --tls-cert and --tls-key
    /// [default: off].
    #[arg(long, env = "ONEHOP_KAFKA_TLS_ADDR", value_name = "ADDR")]
    pub kafka_tls_addr: Option<SocketAddr>,

    /// The host and port clients of the Kafka TLS listener are told to connect to
    /// [default: that listener's address].
    #[arg(long, env = "ONEHOP_KAFKA_TLS_ADVERTISED_ADDR", value_name = "HOST:PORT", requires = "kafka_tls_addr")]
    pub kafka_tls_advertised_addr: Option<String>,

    /// Default durability of new streams and tables: `fsync` acknowledges after fdatasync of
    /// the batch holding the write; `async` after write(2), with a background fsync
    /// [default: fsync].
    #[arg(long, env = "ONEHOP_DURABILITY", value_name = "LEVEL")]
    pub durability: Option<Durability>,

    /// How often `async` writes are fsynced in the background, in milliseconds [default: 100].
    #[arg(long, env = "ONEHOP_ASYNC_FSYNC_INTERVAL_MS", value_name = "MS")]
    pub async_fsync_interval_ms: Option<u64>,

    /// A log segment is closed and a new one begun at this size; accepts KiB/MiB/GiB suffixes
    /// [default: 64MiB].
    #[arg(long, env = "ONEHOP_SEGMENT_BYTES_MAX", value_name = "BYTES", value_parser = parse_bytes)]
    pub segment_bytes_max: Option<u64>,

    /// Largest record accepted, encoded [default: 1MiB].
    #[arg(long, env = "ONEHOP_RECORD_BYTES_MAX", value_name = "BYTES", value_parser = parse_bytes)]
    pub record_bytes_max: Option<u64>,

    /// Largest single append (all of its records) accepted [default: 16MiB].
    #[arg(long, env = "ONEHOP_BATCH_BYTES_MAX", value_name = "BYTES", value_parser = parse_bytes)]
    pub batch_bytes_max: Option<u64>,

    /// Create a stream on its first publish instead of refusing the publish [default: true].
    #[arg(long, env = "ONEHOP_AUTO_CREATE", value_name = "BOOL")]
    pub auto_create: Option<bool>,

    /// Journal every partition's batches in one shared file, so that appends to many
    /// partitions (and the consumer offsets beside them) are made durable by one fdatasync
    /// instead of one per partition file; replayed into the segments at start [default: false].
    #[arg(long, env = "ONEHOP_LOG_JOURNAL", value_name = "BOOL")]
    pub log_journal: Option<bool>,

    /// Most HTTP connections open at once (subscriptions included); more are answered 503
    /// [default: 20000].
    #[arg(long, env = "ONEHOP_CONNECTIONS_MAX", value_name = "N")]
    pub connections_max: Option<usize>,

    /// Most topic filters one MQTT connection may be subscribed to; one more is refused in its
    /// SUBACK [default: 1000].
    #[arg(long, env = "ONEHOP_MQTT_SUBSCRIPTIONS_MAX", value_name = "N")]
    pub mqtt_subscriptions_max: Option<usize>,

    /// Most subscriptions one WebSocket may hold [default: 100].
    #[arg(long, env = "ONEHOP_SUBSCRIPTIONS_PER_SOCKET_MAX", value_name = "N")]
    pub subscriptions_per_socket_max: Option<usize>,

    /// Events a subscriber may have waiting before it is cut off with a resume id
    /// [default: 1024].
    #[arg(long, env = "ONEHOP_SUBSCRIBER_QUEUE", value_name = "EVENTS")]
    pub subscriber_queue: Option<usize>,

    /// How often retention and compaction run, in seconds [default: 30].
    #[arg(long, env = "ONEHOP_MAINTENANCE_INTERVAL_S", value_name = "SECONDS")]
    pub maintenance_interval_s: Option<u64>,

    /// SQL file applied at start, before the server listens (CREATE STREAM …). Applying it again
    /// changes nothing, so it can stay in the start command.
    #[arg(long, env = "ONEHOP_SCHEMA", value_name = "FILE")]
    pub schema: Option<PathBuf>,

    /// Directory whose files the HTTP listener serves for GET and HEAD of the paths no data
    /// route takes (`/` is its index.html), to anyone: an application's pages beside its data.
    /// Dotfiles and links leading out of it are never served [default: none].
    #[arg(long, env = "ONEHOP_STATIC_DIR", value_name = "DIR")]
    pub static_dir: Option<PathBuf>,

    /// Log filter, e.g. `info` or `onehop_log=debug,info` [default: info].
    #[arg(long, env = "ONEHOP_LOG", value_name = "FILTER")]
    pub log: Option<String>,

    /// Open even when a segment holds damaged bytes that valid batches follow: set the damaged
    /// bytes aside (a copy of each file is kept beside it) and keep every valid batch. Without
    /// it such damage stops the start. For one start after reading why it stopped; not a
    /// config-file key.
    #[arg(long, env = "ONEHOP_DISCARD_DAMAGED")]
    pub discard_damaged: bool,

    /// Open even when the catalog (the definitions of streams, tables and views) is damaged:
    /// keep the definitions before the damage (a copy of the file is kept), and keep the data
    /// of every stream they no longer define as orphaned until it is defined again. For one
    /// start after reading why it stopped; not a config-file key.
    #[arg(long, env = "ONEHOP_RECOVER_CATALOG")]
    pub recover_catalog: bool,

    /// The stream that takes MQTT topics whose first level is empty (`/devices/1`), since a
    /// first level names a stream and an empty one cannot [default: root].
    #[arg(long, env = "ONEHOP_MQTT_EMPTY_FIRST_LEVEL_STREAM", value_name = "NAME")]
    pub mqtt_empty_first_level_stream: Option<String>,

    /// Origins whose web pages may use the server through a visitor's browser (CORS, and the
    /// Origin of WebSocket upgrades), comma-separated, each scheme://host[:port] as the browser
    /// shows it, e.g. https://app.example.com; `*` alone allows every origin. Requests without
    /// an Origin (curl, native clients) and the server's own pages are not affected
    /// [default: none].
    #[arg(long, env = "ONEHOP_ALLOWED_ORIGINS", value_name = "ORIGIN,…", value_delimiter = ',')]
    pub allowed_origins: Option<Vec<String>>,

    /// Seconds an HTTP client has to send a request's head, from opening the connection (or
    /// from the head's first byte, after a first request); then the connection is closed
    /// [default: 10].
    #[arg(long, env = "ONEHOP_HTTP_HEADER_READ_TIMEOUT_S", value_name = "SECONDS")]
    pub http_header_read_timeout_s: Option<u64>,

    /// Seconds an HTTP connection may wait for its next request after a response; then it is
    /// closed [default: 60].
    #[arg(long, env = "ONEHOP_HTTP_IDLE_TIMEOUT_S", value_name = "SECONDS")]
    pub http_idle_timeout_s: Option<u64>,

    /// Seconds a write's Idempotency-Key answers its retries with the first write's answer
    /// [default: 86400, a day].
    #[arg(long, env = "ONEHOP_IDEMPOTENCY_WINDOW_S", value_name = "SECONDS")]
    pub idempotency_window_s: Option<u64>,

    /// Idempotency keys held at most; past it the oldest are dropped before their window ends
    /// (each takes some 200 bytes of memory) [default: 1000000].
    #[arg(long, env = "ONEHOP_IDEMPOTENCY_KEYS_MAX", value_name = "KEYS")]
    pub idempotency_keys_max: Option<usize>,

    /// Bytes of rows one SQL query may hold at once (for its joins, groups, sort and answer);
    /// past it the query ends with `query_limit` [default: 256MiB].
    #[arg(long, env = "ONEHOP_QUERY_MEMORY_MAX", value_name = "BYTES", value_parser = parse_bytes)]
    pub query_memory_max: Option<u64>,

    /// Seconds one SQL query may run before it ends with `query_limit` [default: 30].
    #[arg(long, env = "ONEHOP_QUERY_TIME_MAX_S", value_name = "SECONDS")]
    pub query_time_max_s: Option<u64>,

    /// Stream records one SQL query may read, in all [default: 1000000].
    #[arg(long, env = "ONEHOP_QUERY_STREAM_RECORDS_MAX", value_name = "RECORDS")]
    pub query_stream_records_max: Option<u64>,

    /// How often a view or transform checkpoints where it is while it runs, in milliseconds
    /// (Kafka Streams' commit.interval.ms): a restart replays about this much [default: 1000].
    #[arg(long, env = "ONEHOP_CHECKPOINT_INTERVAL_MS", value_name = "MS")]
    pub checkpoint_interval_ms: Option<u64>,

    /// Seconds a Postgres session may wait for its client's next message before it is closed
    /// (Postgres's idle_session_timeout) [default: 3600].
    #[arg(long, env = "ONEHOP_PG_IDLE_TIMEOUT_S", value_name = "SECONDS")]
    pub pg_idle_timeout_s: Option<u64>,

    /// Seconds a Kafka connection may go without a request before it is closed (Kafka's
    /// connections.max.idle.ms) [default: 600].
    #[arg(long, env = "ONEHOP_KAFKA_IDLE_TIMEOUT_S", value_name = "SECONDS")]
    pub kafka_idle_timeout_s: Option<u64>,

    /// Seconds a Kafka connection has, from its first byte, to log in with SASL once users
    /// exist; one that has not is closed, so idle sockets cannot hold the connection slots
    /// [default: 10].
    #[arg(long, env = "ONEHOP_KAFKA_AUTHENTICATION_TIMEOUT_S", value_name = "SECONDS")]
    pub kafka_authentication_timeout_s: Option<u64>,

    /// Seconds a request body may send nothing, or wait for room in memory, before it is
    /// refused (408 body_timeout, 503 server_busy) [default: 30].
    #[arg(long, env = "ONEHOP_HTTP_BODY_READ_TIMEOUT_S", value_name = "SECONDS")]
    pub http_body_read_timeout_s: Option<u64>,

    /// Bytes of HTTP request bodies held in memory at once, all requests together; more wait
    /// for room. At least the largest body (twice --batch-bytes-max) [default: 128MiB].
    #[arg(long, env = "ONEHOP_HTTP_BODY_BYTES_IN_FLIGHT_MAX", value_name = "BYTES", value_parser = parse_bytes)]
    pub http_body_bytes_in_flight_max: Option<u64>,

    /// Seconds connections have to finish after SIGTERM or SIGINT before they are closed and
    /// the server stops; a second signal exits at once [default: 5].
    #[arg(long, env = "ONEHOP_SHUTDOWN_TIMEOUT_S", value_name = "SECONDS")]
    pub shutdown_timeout_s: Option<u64>,

    /// The first superuser (ADMIN ON ALL), created at start when no user of this name exists;
    /// its password comes from ONEHOP_ADMIN_PASSWORD or --admin-password-file, never a flag.
    /// Once a user exists, every client must log in. A user that exists keeps its password.
    #[arg(long, env = "ONEHOP_ADMIN_USER", value_name = "NAME")]
    pub admin_user: Option<String>,

    /// A file holding the first superuser's password (its first line) [default: the
    /// ONEHOP_ADMIN_PASSWORD environment variable].
    #[arg(long, env = "ONEHOP_ADMIN_PASSWORD_FILE", value_name = "FILE")]
    pub admin_password_file: Option<PathBuf>,

    /// Listen on addresses other than loopback while no user is defined, which lets anyone
    /// who can reach them read and write everything. Without it such a start is refused.
    #[arg(long, env = "ONEHOP_INSECURE_LISTEN")]
    pub insecure_listen: bool,

    /// Keys that JWTs are checked against: a JWKS file (as identity providers publish it) or
    /// PEM public keys; read again on SIGHUP. A verified JWT is accepted wherever a token is
    /// (HTTP Bearer, MQTT password, Kafka SASL OAUTHBEARER and PLAIN) [default: JWTs refused].
    #[arg(long, env = "ONEHOP_JWT_KEYS", value_name = "FILE")]
    pub jwt_keys: Option<PathBuf>,

    /// The issuer (`iss`) a JWT must name [default: any].
    #[arg(long, env = "ONEHOP_JWT_ISSUER", value_name = "ISS", requires = "jwt_keys")]
    pub jwt_issuer: Option<String>,

    /// The audience a JWT's `aud` must name [default: none; a JWT with an `aud` is refused].
    #[arg(long, env = "ONEHOP_JWT_AUDIENCE", value_name = "AUD", requires = "jwt_keys")]
    pub jwt_audience: Option<String>,

    /// The JWT claim that names the user [default: sub].
    #[arg(long, env = "ONEHOP_JWT_USER_CLAIM", value_name = "CLAIM", requires = "jwt_keys")]
    pub jwt_user_claim: Option<String>,

    /// The JWT claim that lists onehop roles, as an array or a space-separated string
    /// [default: roles].
    #[arg(long, env = "ONEHOP_JWT_ROLES_CLAIM", value_name = "CLAIM", requires = "jwt_keys")]
    pub jwt_roles_claim: Option<String>,

    /// Give a JWT the grants of the onehop user its user claim names, besides its roles'. Off:
    /// a JWT has what its roles and PUBLIC are granted, so a provider's user named like a
    /// local superuser gets nothing of it [default: off].
    #[arg(long, env = "ONEHOP_JWT_USER_GRANTS", requires = "jwt_keys")]
    pub jwt_user_grants: bool,

    /// This node's id in a cluster (a number, unique, never reused): with it, onehop runs as a
    /// node of a replicated cluster (docs/cluster.md) [default: a single node].
    #[arg(long, env = "ONEHOP_NODE_ID", value_name = "ID")]
    pub node_id: Option<u64>,

    /// The address this node's cluster listener binds, which the other nodes reach it at.
    #[arg(long, env = "ONEHOP_CLUSTER_ADDR", value_name = "ADDR")]
    pub cluster_addr: Option<SocketAddr>,

    /// The address the other nodes reach this one at, when not --cluster-addr (a proxy, a NAT)
    /// [default: --cluster-addr].
    #[arg(long, env = "ONEHOP_CLUSTER_ADVERTISED_ADDR", value_name = "ADDR", requires = "cluster_addr")]
    pub cluster_advertised_addr: Option<SocketAddr>,

    /// Every member of a new cluster, this node among them: `1=127.0.0.1:7001,2=…,3=…`. The
    /// cluster is formed by the first start of its members; later starts, and a node started
    /// without --peers (to be added with `onehop cluster add`), ignore it.
    #[arg(long, env = "ONEHOP_PEERS", value_name = "ID=ADDR,…")]
    pub peers: Option<String>,

    /// This node's certificate (PEM) for TLS between the nodes: signed by --cluster-tls-ca,
    /// naming the node's cluster address as an IP address in its subject alternative names.
    /// With it, --cluster-tls-key and --cluster-tls-ca, every connection between nodes is TLS
    /// and each node proves itself to the others [default: plain TCP].
    #[arg(long, env = "ONEHOP_CLUSTER_TLS_CERT", value_name = "FILE", requires_all = ["cluster_tls_key", "cluster_tls_ca"])]
    pub cluster_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --cluster-tls-cert.
    #[arg(long, env = "ONEHOP_CLUSTER_TLS_KEY", value_name = "FILE", requires = "cluster_tls_cert")]
    pub cluster_tls_key: Option<PathBuf>,

    /// The CA (PEM) that signs every node's certificate: a node whose certificate it did not
    /// sign is refused in the handshake.
    #[arg(long, env = "ONEHOP_CLUSTER_TLS_CA", value_name = "FILE", requires = "cluster_tls_cert")]
    pub cluster_tls_ca: Option<PathBuf>,

    /// A cluster node takes a snapshot every this many Raft log entries and purges the log
    /// before it, but for the last --cluster-log-kept entries. A node that lacks purged entries
    /// gets the leader's state as a snapshot instead. 0: no snapshots, the whole log is kept
    /// [default: 100000].
    #[arg(long, env = "ONEHOP_CLUSTER_SNAPSHOT_ENTRIES", value_name = "N")]
    pub cluster_snapshot_entries: Option<u64>,

    /// Raft log entries kept before a snapshot: a node that was away for fewer catches up from
    /// the log, with no snapshot [default: 10000].
    #[arg(long, env = "ONEHOP_CLUSTER_LOG_KEPT", value_name = "N")]
    pub cluster_log_kept: Option<u64>,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Log append latency and throughput against the disk's fdatasync floor.
    Log(BenchLogArgs),
    /// Write over HTTP → subscribers over SSE: latency from intended send to receipt.
    Notify(BenchNotifyArgs),
    /// MQTT publishers → broker → subscribers, open loop: latency from intended send to receipt.
    Mqtt(BenchMqttArgs),
    /// How fast views rebuild their state by replaying the log (records/s).
    Restore(BenchRestoreArgs),
    /// W1 (study 1): a durable write notifying every subscriber of its 5 lookup keys
    /// (1 000 keys, one SSE subscriber each; 50 events/s × 15 s, 3 s warm-up, fsync).
    W1(BenchWorkloadArgs),
    /// W2: each message to every subscriber of its tag (100 subscribers × 3 of 10 tags;
    /// 10 events/s × 15 s, 3 s warm-up, fsync).
    W2(BenchWorkloadArgs),
    /// W3: a windowed count per key (5 s tumbling, 1 s grace, 100 keys): freshness, window-close
    /// lag and point queries at 20/s (100 events/s × 30 s, 5 s warm-up, fsync).
    W3(BenchWorkloadArgs),
    /// W4: sustained MQTT QoS 1 ingestion, 256-byte payloads (1 000 events/s × 30 s, 5 s
    /// warm-up, fsync); `--sweep 1000,2500,5000,10000` is the study's ascending probe.
    W4(BenchWorkloadArgs),
    /// W1, W2, W3 and W4 one after another, each at its own published parameters.
    All(BenchWorkloadArgs),
    /// A live view: freshness, window-close lag and point-query latency (W3 with its own flags).
    View(BenchViewArgs),
    /// Kafka's ProducerPerformance against onehop's Kafka listener and against a real Kafka,
    /// in one invocation (needs `scripts/peers install kafka`).
    Kafka(BenchKafkaArgs),
    /// Study 4, the queue: Kafka clients against onehop and against Kafka, and Redis Streams
    /// consumer groups, in one invocation (needs `scripts/peers install kafka redis`).
    Queue(BenchQueueArgs),
    /// Study 5, stream processing: each scenario as onehop SQL and as a Kafka Streams 4.1 app,
    /// exactly once and at least once, fed and read through Kafka's protocol by one program, in
    /// one invocation (needs `scripts/peers install kafka-streams`).
    Streams(BenchStreamsArgs),
    /// Ad-hoc queries against Postgres 15 on the same data: a point select by primary key over
    /// the Postgres protocol and over `GET /tables`, and a three-table join with GROUP BY
    /// (needs Debian's postgresql-15: `scripts/peers install kafka-stack`).
    Query(BenchQueryArgs),
    /// A five-input joined view's freshness (write to subscriber) beside a single-source
    /// view's, at a fixed write rate; the server's CPU and RSS.
    ViewJoin(BenchViewJoinArgs),
    /// Study 2's shop: its pages (home, listing, detail) under virtual users with k6's
    /// semantics against onehop and the microservices stack, each run on a stack of its own
    /// (needs `scripts/peers install microservices`); or, with `--load`, its catalogue and
    /// pages written into the server at --url.
    Shop(BenchShopArgs),
    /// Study 3: a leader/standby ledger on a three-node cluster — transfers at a target rate,
    /// the committed transaction log applied by a standby on another node, publication latency
    /// seen on the third, and the completeness gate; `--kill ledger|node` fails over mid-run.
    Bank(BenchBankArgs),
    /// One ledger process of `bench bank` (started by it; talks over stdin and stdout).
    #[command(hide = true)]
    BankLedger(BenchBankLedgerArgs),
}

/// Flags of `onehop bench bank`.
#[derive(Args, Debug)]
pub struct BenchBankArgs {
    /// Target rates in transactions per second, one run each.
    #[arg(long, value_delimiter = ',', default_value = "5000,10000,20000,50000,100000,150000")]
    pub rates: Vec<u64>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds sent before the measured window.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// What to kill -9 halfway through the measured window: none, ledger (the ledger leader
    /// process; the standby takes over), node (the Raft leader node the ledger writes to).
    #[arg(long, default_value = "none")]
    pub kill: String,
    /// Accounts in the ledger.
    #[arg(long, default_value_t = 10_000)]
    pub accounts: u32,
    /// Every account's balance at the start.
    #[arg(long, default_value_t = 1_000)]
    pub initial_balance: u64,
    /// A transfer moves 1 to this much (one that would overdraw is recorded as rejected).
    #[arg(long, default_value_t = 500)]
    pub amount_max: u64,
    /// Transactions in one publish (one request, one Raft entry) at most.
    #[arg(long, default_value_t = 10_000)]
    pub batch_max: usize,
    /// Transactions in one record of the log (1: a record per transaction).
    #[arg(long, default_value_t = 1)]
    pub per_record: usize,
    /// Also run each rate against a single node (no replication), to show what the cluster costs.
    #[arg(long)]
    pub floor: bool,
    /// Seed of the transfers.
    #[arg(long, default_value_t = 20261127)]
    pub seed: u64,
    /// Where the nodes keep their data: put it on the disk to measure.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Where results.json, summary.md and bank-latency.svg go.
    #[arg(long, default_value = "results/bank")]
    pub out: std::path::PathBuf,
    /// End the output with one JSON line per run and per summary.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Flags of the hidden `onehop bench bank-ledger`.
#[derive(Args, Debug)]
pub struct BenchBankLedgerArgs {
    /// leader or standby.
    #[arg(long)]
    pub role: String,
    /// Every node's HTTP address (host:port).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// The node (index into --nodes) a leader publishes to and a standby follows the log on.
    #[arg(long)]
    pub node: usize,
    #[arg(long)]
    pub stream: String,
    #[arg(long)]
    pub accounts: u32,
    #[arg(long)]
    pub initial_balance: u64,
    /// The epoch of this process's records once it leads.
    #[arg(long)]
    pub epoch: u64,
    #[arg(long)]
    pub batch_max: usize,
    #[arg(long)]
    pub per_record: usize,
}

/// Flags of `onehop bench kafka`.
#[derive(Args, Debug)]
pub struct BenchKafkaArgs {
    /// Brokers of the Kafka side: 1, or 3 (replication 3, min ISR 2, as study 1).
    #[arg(long, default_value_t = 1)]
    pub kafka_brokers: u32,
    /// Records per run.
    #[arg(long, default_value_t = 500_000)]
    pub records: u64,
    /// Record sizes, in bytes.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub sizes: Vec<usize>,
    /// Records Kafka's EndToEndLatency sends one at a time against each side (0: skip it).
    #[arg(long, default_value_t = 5000)]
    pub latency_records: u64,
    /// Rounds of a consumer group's rebalance (a member joins, then leaves) against each side
    /// (0: skip it).
    #[arg(long, default_value_t = 5)]
    pub rebalance_rounds: u32,
    /// Kafka as configured by default (`off`: no fsync per write), fsyncing every write
    /// (`on`: log.flush.interval.messages=1, onehop's durability), or `both`, side by side.
    #[arg(long, default_value = "off")]
    pub kafka_fsync: onehop_bench::kafka_perf::KafkaFsync,
    /// Where the servers keep their data: put it on the disk to measure.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Where summary.md, kafka-throughput.svg and the peers' logs go.
    #[arg(long, default_value = "results/kafka")]
    pub out: std::path::PathBuf,
    /// End the output with one JSON line per target and record size.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `onehop bench query`.
#[derive(Args, Debug)]
pub struct BenchQueryArgs {
    /// Point selects per second, on each side.
    #[arg(long, default_value_t = 500)]
    pub rate: u32,
    /// Seconds of point selects measured on each side.
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// Seconds of point selects before the measured ones.
    #[arg(long, default_value_t = 3.0)]
    pub warmup: f64,
    /// Orders the join reads (with 1 000 customers and 1 000 products).
    #[arg(long, default_value_t = 100_000)]
    pub orders: u32,
    /// Runs of the join measured on each side.
    #[arg(long, default_value_t = 5)]
    pub join_runs: u32,
    /// Where the servers keep their data: put it on the disk to measure.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Where summary.md, query-latency.svg and Postgres's log go.
    #[arg(long, default_value = "results/query")]
    pub out: std::path::PathBuf,
    /// End the output with one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `onehop bench shop`.
#[derive(Args, Debug)]
pub struct BenchShopArgs {
    /// Write the shop into the running server at --url (its tables, the pages' views, then the
    /// rows) instead of measuring.
    #[arg(long)]
    pub load: bool,
    /// The stacks measured: onehop, microservices (indexed), microservices-as-published.
    #[arg(long, value_delimiter = ',', default_value = "onehop,microservices,microservices-as-published")]
    pub target: Vec<String>,
    /// The pages measured: home, listing, detail.
    #[arg(long, value_delimiter = ',', default_value = "home,listing,detail")]
    pub pages: Vec<String>,
    /// The VU levels, each a run per target and page.
    #[arg(long, value_delimiter = ',', default_value = "20,200,2000")]
    pub vus: Vec<u32>,
    /// Open-loop rates (page loads started per second, answered or not), each a run per target
    /// and page after the VU levels; `--rates none` for none.
    #[arg(long, value_delimiter = ',', default_value = "100")]
    pub rates: Vec<String>,
    /// Seconds each run lasts.
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Price and stock changes per second through each stack's write API during every run
    /// (0: none), with the pages' staleness measured.
    #[arg(long, default_value_t = 100)]
    pub writes_per_s: u32,
    /// Where the stacks keep their data.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Where summary.md, meta.json, the charts and the peers' logs go.
    #[arg(long, default_value = "results/shop")]
    pub out: std::path::PathBuf,
    /// The data set's seed (the same seed, the same shop).
    #[arg(long, default_value_t = onehop_bench::shop::DEFAULT_SEED)]
    pub seed: u64,
    /// Also write the home page's index.html into this directory, for `serve --static-dir`.
    #[arg(long, value_name = "DIR")]
    pub site: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
    /// End the output with one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `onehop bench view-join`.
#[derive(Args, Debug)]
pub struct BenchViewJoinArgs {
    /// Writes per second over the joined view's inputs.
    #[arg(long, default_value_t = 300)]
    pub rate: u32,
    /// Seconds measured.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Seconds of writes before the measured ones.
    #[arg(long, default_value_t = 3.0)]
    pub warmup: f64,
    /// Orders (with 1 000 customers, 1 000 products, 5 regions, a shipment for half the orders).
    #[arg(long, default_value_t = 5000)]
    pub orders: u32,
    /// Where the server keeps its data.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Where summary.md and view-join-latency.svg go.
    #[arg(long, default_value = "results/view-join")]
    pub out: std::path::PathBuf,
    /// End the output with one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `onehop bench queue`.
#[derive(Args, Debug)]
pub struct BenchQueueArgs {
    /// Sides to run, one after another: onehop, onehop-journal (`--log-journal true`), kafka,
    /// redis-always, redis-everysec.
    #[arg(long, value_delimiter = ',', default_value = "onehop,onehop-journal,kafka,redis-always,redis-everysec")]
    pub target: Vec<String>,
    /// Messages in all.
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// Message size, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub bytes: usize,
    /// Producers, each in a closed loop.
    #[arg(long, default_value_t = 10)]
    pub producers: u32,
    /// Consumers in one group (and partitions of the Kafka topic).
    #[arg(long, default_value_t = 10)]
    pub consumers: u32,
    /// Brokers of the Kafka side: 1, or 3 (replication 3, min ISR 2).
    #[arg(long, default_value_t = 1)]
    pub kafka_brokers: u32,
    /// Where the servers keep their data: put it on the disk to measure.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Where summary.md, queue-latency.svg and the peers' logs go.
    #[arg(long, default_value = "results/queue")]
    pub out: std::path::PathBuf,
    /// End the output with one JSON line per target.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `onehop bench streams`.
#[derive(Args, Debug)]
pub struct BenchStreamsArgs {
    /// Sides to run: onehop, onehop-cluster (three nodes, every write on a majority; a kill run
    /// kills the leader), kafka-streams.
    #[arg(long, value_delimiter = ',', default_value = "onehop,kafka-streams")]
    pub target: Vec<String>,
    /// Scenarios: a (stateless), b (word count), c (routing: four inputs, two paths, four outputs),
    /// d (joins: five inputs into one enriched record per order).
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d")]
    pub scenario: Vec<String>,
    /// Modes: eos (Kafka Streams exactly_once_v2, read_committed), alo (at_least_once).
    #[arg(long, value_delimiter = ',', default_value = "eos,alo")]
    pub mode: Vec<String>,
    /// Input rates as fractions of the study's (A 20 000/s, B 7 500/s, C 7 000/s, D 300/s), one row each: 0.25 is
    /// the standard row on a 2-core machine, 1 the stress row.
    #[arg(long, value_delimiter = ',', default_value = "0.25")]
    pub scales: Vec<f64>,
    /// Seconds of input before the measured window.
    #[arg(long, default_value_t = 20.0)]
    pub warmup: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Brokers of the Kafka Streams side: 3 (replication 3, min ISR 2, as the study), or 1.
    #[arg(long, default_value_t = 3)]
    pub kafka_brokers: u32,
    /// Kafka Streams' producer linger.ms: 0 (every output sent at once, the default here) or
    /// e.g. 100 (Kafka Streams' own default: fewer, larger produce requests for its brokers).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub ks_linger_ms: u32,
    /// Kill the processing side (onehop's server, Kafka Streams' app) with SIGKILL in the middle
    /// of each measured window and start it again on its data: outputs lost or written twice
    /// are counted (and fail the run, but for Kafka Streams at least once writing twice).
    #[arg(long)]
    pub kill: bool,
    /// Where the servers keep their data: put it on the disk to measure.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Where summary.md, meta.json, the plots and the peers' logs go.
    #[arg(long, default_value = "results/streams")]
    pub out: std::path::PathBuf,
    /// End the output with one JSON line per run.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `onehop bench w1|w2|w3|w4|all`. Left out, rate, duration and warm-up are the
/// workload's published parameters.
#[derive(Args, Debug)]
pub struct BenchWorkloadArgs {
    /// Targets to run the workload against, one after another, reported side by side:
    /// `onehop`; `onehop-auth`, `onehop-tls` and `onehop-secure` (onehop started with access
    /// on — every client logged in, a bearer token over HTTP, SSE and WebSocket, a user name and
    /// password over MQTT — with TLS on its HTTPS and MQTT listeners, or with both; the
    /// handshakes before the schedule; their ratio to `onehop` is their cost);
    /// `onehop-cluster` (W1, W2, W4: three nodes as a cluster, every write committed on a
    /// majority's fsynced Raft logs, the clients on a follower); `echo` (a
    /// loopback server in the harness that answers and delivers at once: the harness's own
    /// latency floor); and the conventional stacks, installed by
    /// `scripts/peers install`: `kafka` (W4: 3 KRaft brokers, RF 3, franz-go producer and
    /// batching consumer), `kafka-stack` (W1: Postgres 15 with an outbox table, fsync on →
    /// Debezium 3.4 embedded, pgoutput, polling every 500 ms (its default) → those brokers → a
    /// kafkajs consumer → Redis SMEMBERS per key → an HTTP POST per match; W2: those brokers,
    /// acks=all, lz4, linger 5 ms → a kafkajs consumer → Redis SMEMBERS per tag → an HTTP POST
    /// per subscriber; the study's Node.js application), `kafka-stack-poll-5ms` (W1 with
    /// Debezium polling every 5 ms, the tuned case), `kafka-streams` (W3: those brokers → a Kafka Streams 4.1 app,
    /// tumbling 5 s windows with 1 s grace, its changelog and `suppress(untilWindowCloses)`
    /// output read by a consumer, point queries through Interactive Queries over HTTP),
    /// `mosquitto` (W4: QoS 1, no persistence), `nats` and `nats-sync` (W4:
    /// JetStream file storage through its MQTT listener, fsync every 2 min or every write).
    /// A target that does not run a workload is skipped for it.
    #[arg(long, value_delimiter = ',', default_value = "onehop", value_name = "TARGET,…")]
    pub target: Vec<String>,

    /// A running onehop to measure; without it, one is started (this executable, `serve`, on a
    /// temporary data directory under --dir) and stopped afterwards.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,

    /// The MQTT listener of the server at --url (W4) [default: the URL's host, port 1883].
    #[arg(long, value_name = "HOST:PORT", requires = "url")]
    pub mqtt_address: Option<String>,

    /// Events per second, on a fixed schedule [default: the workload's].
    #[arg(long, value_name = "RATE", conflicts_with = "sweep")]
    pub rate: Option<f64>,

    /// Run at each of these rates (events per second), ascending; plots latency by rate.
    #[arg(long, value_delimiter = ',', value_name = "R1,R2,…")]
    pub sweep: Vec<f64>,

    /// Measured seconds per run [default: the workload's].
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,

    /// Unmeasured seconds before each run's measured window [default: the workload's].
    #[arg(long, value_name = "SECONDS")]
    pub warmup: Option<f64>,

    /// Runs per rate; their histograms are merged (percentiles are never averaged).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub runs: u32,

    /// Where each run's raw.csv and meta.json (under <W>/<run_id>/) and the invocation's
    /// summary.md and SVG plots go.
    #[arg(long, default_value = "results", value_name = "DIR")]
    pub out: PathBuf,

    /// Where a started server keeps its data: put it on the disk to measure.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub dir: PathBuf,

    /// Seed of every random choice (keys per event, tags per subscriber, view keys).
    #[arg(long, default_value_t = onehop_bench::workload::SEED_DEFAULT)]
    pub seed: u64,

    /// Brokers of the `kafka` target: 3 (replication 3, min ISR 2, as the study) or 1
    /// (replication 1: a quick check).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub kafka_brokers: u32,

    /// Stall the started onehop server on purpose: stop it (SIGSTOP) for this many
    /// milliseconds every --pause-every seconds of the measured window, to see it catch up.
    #[arg(long, value_name = "MS", conflicts_with = "url")]
    pub pause_ms: Option<f64>,

    /// Seconds between the starts of two pauses; the first starts this long after the warm-up.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS", requires = "pause_ms")]
    pub pause_every: f64,

    /// End the output with one JSON line per workload, target and rate.
    #[arg(long)]
    pub json: bool,

    /// Do not draw progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

/// Flags of `onehop bench view`.
#[derive(Args, Debug)]
pub struct BenchViewArgs {
    /// Events per second into the view's stream. Above 2 000/s, events due within 1 ms go as
    /// one NDJSON batch.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,

    /// Keys the events are spread over, uniformly.
    #[arg(long, default_value_t = 100)]
    pub keys: u32,

    /// Measured seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub duration: f64,

    /// Unmeasured seconds first.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub warmup: f64,

    /// A running server to measure; without it, one is started on a temporary data directory
    /// under --dir and stopped afterwards.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,

    /// Where a started server keeps its data.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub dir: PathBuf,

    /// End the output with one JSON line of the results.
    #[arg(long)]
    pub json: bool,

    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct BenchMqttArgs {
    /// A running broker (`host:port`) to measure; without it, a server is started on a
    /// temporary data directory under --dir and stopped afterwards.
    #[arg(long, value_name = "HOST:PORT")]
    pub address: Option<String>,
    /// Where a started server keeps its data: put it on the disk to measure.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Publishing connections; the rate is shared among them.
    #[arg(long, default_value_t = 1)]
    pub publishers: usize,
    /// Subscribing connections, each receiving every message.
    #[arg(long, default_value_t = 1)]
    pub subscribers: usize,
    /// Messages per second, all publishers together, on a fixed schedule.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Measured seconds (per rate with --sweep).
    #[arg(long = "duration", value_name = "SECONDS", default_value_t = 10.0)]
    pub duration: f64,
    /// Unmeasured seconds first.
    #[arg(long = "warmup", value_name = "SECONDS", default_value_t = 2.0)]
    pub warmup: f64,
    /// Payload size in bytes (at least 16: the intended send time and a sequence number).
    #[arg(long, default_value_t = 256)]
    pub payload_bytes: usize,
    /// QoS of publishes and subscriptions.
    #[arg(long, default_value_t = 1)]
    pub qos: u8,
    /// Double the rate from --rate until p99 exceeds 10 ms or a message goes missing; report
    /// the highest rate that held.
    #[arg(long)]
    pub sweep: bool,
    /// Extra clients that connect and stay idle for the whole run.
    #[arg(long, default_value_t = 0)]
    pub idle_clients: usize,
    /// End the output with one JSON line of the results.
    #[arg(long)]
    pub json: bool,
    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct BenchNotifyArgs {
    /// A running server to measure; without it, one is started on a temporary data directory
    /// under --dir and stopped afterwards.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,

    /// Where a started server keeps its data: put it on the disk to measure.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub dir: PathBuf,

    /// SSE subscribers, each on its own connection.
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,

    /// Subjects the writes rotate over; each subscriber follows one, so a write matches
    /// subscribers/subjects of them (5 % by default).
    #[arg(long, default_value_t = 20)]
    pub subjects: usize,

    /// Writes per second, on a fixed schedule.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,

    /// Measured seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub duration: f64,

    /// Unmeasured seconds first.
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub warmup: f64,

    /// Durability of the writes: fsync or async.
    #[arg(long, default_value = "fsync")]
    pub durability: Durability,

    /// How subscribers connect: sse or ws.
    #[arg(long, default_value = "sse")]
    pub protocol: onehop_bench::notify::Protocol,

    /// End the output with one JSON line of the results.
    #[arg(long)]
    pub json: bool,

    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct BenchLogArgs {
    /// Scratch files go in a temporary directory under this one: put it on the disk to measure.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub dir: PathBuf,

    /// Size of each record, encoded.
    #[arg(long, default_value_t = 256, value_name = "BYTES")]
    pub record_bytes: usize,

    /// Numbers of concurrent writers to measure, comma-separated.
    #[arg(long, default_value = "1,8,64,512", value_delimiter = ',', value_name = "N,…")]
    pub writers: Vec<usize>,

    /// Durability modes to measure, comma-separated.
    #[arg(long, default_value = "fsync,async", value_delimiter = ',', value_name = "MODE,…")]
    pub modes: Vec<Durability>,

    /// Measured seconds per configuration.
    #[arg(long, default_value_t = 3.0, value_name = "SECONDS")]
    pub duration: f64,

    /// Unmeasured seconds before each configuration.
    #[arg(long, default_value_t = 0.5, value_name = "SECONDS")]
    pub warmup: f64,

    /// Also write log.json, log.txt and SVG plots into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Also measure the floor with this many milliseconds idle before each write + fdatasync,
    /// as a write at a low rate finds the disk.
    #[arg(long, value_name = "MS")]
    pub floor_idle_ms: Option<f64>,

    /// Records written and read back for the read figures (at most 10000000; 0 skips them).
    #[arg(long, default_value_t = 200_000, value_name = "N")]
    pub read_records: usize,

    /// End the output with one JSON line of the results.
    #[arg(long)]
    pub json: bool,

    /// Do not draw progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct BenchRestoreArgs {
    /// The data goes in a temporary directory under this one: put it on the disk to measure.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub dir: PathBuf,

    /// Records written, then replayed by each view.
    #[arg(long, default_value_t = 2_000_000)]
    pub records: u64,

    /// Distinct keys among them.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,

    /// End the output with one JSON line of the results.
    #[arg(long)]
    pub json: bool,

    /// Do not draw progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
