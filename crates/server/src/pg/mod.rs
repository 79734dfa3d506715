//! The Postgres wire protocol (3.0): psql, drivers and SQL tools reach onehop's SQL with the
//! same users, grants and limits as `POST /sql`.
//!
//! - `codec`: the messages, decoded and encoded (our own: the protocol is small and stable,
//!   and a codec of our own is one we fuzz and whose limits we set; docs/postgres.md argues it).
//! - `types`: onehop's JSON values as Postgres types and back.
//! - this module: the listener and one connection: the startup (TLS on the server's
//!   certificate when the client asks and the server has one; SCRAM-SHA-256 with onehop's users
//!   once users exist), the simple query protocol, the extended one (Parse, Bind, Describe,
//!   Execute, Sync, named and unnamed statements and portals, text and binary formats), the
//!   settings drivers set and show, and transactions of queries.
//!
//! A statement runs as `POST /sql` runs it ([`onehop_sql::execute_as`]); what is not SQL of
//! onehop's (`SET`, `SHOW` of a setting, `BEGIN`/`COMMIT`/`ROLLBACK`) is answered here.

pub mod codec;
pub mod copy;
pub mod subscribe;
pub mod types;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onehop_engine::access::credential::ScramHash;
use onehop_engine::access::scram::ScramExchange;
use onehop_engine::hub::Delivery;
use onehop_engine::{ColumnType, Engine, EngineError, ErrorKind, ObjectKind, Principal, Privilege};
use onehop_sql::query::Cancel;
use onehop_sql::{Output, SqlError, Statement};
use serde_json::Value;
use sqlparser::ast;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use codec::{Field, Frontend, MESSAGE_BYTES_MAX, Out, PROTOCOL_3, Startup};

/// A name in a statement as onehop holds it: `name`, or `public.name` (onehop's objects are in
/// the schema `public`).
pub(crate) fn local_name(name: &ast::ObjectName) -> Result<String, PgError> {
    match name.0.as_slice() {
        [part] => part.as_ident(),
        [schema, part] if schema.as_ident().is_some_and(|schema| schema.value == "public") => part.as_ident(),
        _ => None,
    }
    .map(|ident| ident.value.clone())
    .ok_or_else(|| PgError::new("3F000", format!("{name} is not a name onehop holds")))
}

/// What an object a statement names is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Relation {
    Table,
    View,
    Stream,
}

/// What `name` is, or `42P01` as Postgres answers for a relation it does not have.
pub(crate) fn relation(engine: &Engine, name: &str) -> Result<Relation, PgError> {
    if engine.has_table(name) {
        Ok(Relation::Table)
    } else if engine.view(name).is_ok() {
        Ok(Relation::View)
    } else if engine.stream(name).is_ok() {
        Ok(Relation::Stream)
    } else {
        Err(PgError::new("42P01", format!("relation \"{name}\" does not exist")))
    }
}

/// Postgres connections open now.
pub const CONNECTIONS: &str = "pg_connections";
/// Postgres connections refused because connections_max were open.
pub const CONNECTIONS_REFUSED: &str = "pg_connections_refused_total";
/// Time a connection has from its first byte to a finished login.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The version reported to clients, which read features from it.
const SERVER_VERSION: &str = "15.0 (onehop)";

/// How the listener runs.
#[derive(Clone)]
pub struct PgConfig {
    pub connections_max: usize,
    /// TLS for clients that ask (`sslmode=require`); `None`: they are told no.
    pub tls: Option<crate::tls::Tls>,
    /// How long a session waits for its client's next message before it closes.
    pub idle_timeout: Duration,
}

/// The default of [`PgConfig::idle_timeout`]: an hour, so an abandoned session does not hold
/// its socket (and a place under connections_max) for ever.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(3600);

/// Accepts Postgres connections on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<Engine>,
    config: PgConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let processes = Arc::new(AtomicI32::new(1));
    let running = Running::default();
    crate::accept::accept_connections(
        listener,
        config.connections_max,
        "postgres",
        CONNECTIONS_REFUSED,
        shutdown,
        move |stream, peer, permit| {
            let (engine, config, processes, running) =
                (engine.clone(), config.clone(), processes.clone(), running.clone());
            tokio::spawn(async move {
                metrics::gauge!(CONNECTIONS).increment(1.0);
                let process = processes.fetch_add(1, Ordering::Relaxed);
                connection(stream, peer, &engine, &config, Session::key(process, &running)).await;
                metrics::gauge!(CONNECTIONS).decrement(1.0);
                drop(permit);
            });
        },
    )
    .await;
}

/// The sessions by process id: their secret key and the way to cancel their query, for cancel
/// requests (which come on a connection of their own).
#[derive(Clone, Default)]
struct Running(Arc<Mutex<HashMap<i32, (i32, Cancel)>>>);

/// A session's entry in [`Running`], removed when the session ends.
struct Key {
    process: i32,
    secret: i32,
    cancel: Cancel,
    running: Running,
}

impl Drop for Key {
    fn drop(&mut self) {
        self.running.0.lock().expect("running sessions lock").remove(&self.process);
    }
}

impl Running {
    /// Cancels the query of `process` if `secret` is its key.
    fn cancel(&self, process: i32, secret: i32) {
        if let Some((key, cancel)) = self.0.lock().expect("running sessions lock").get(&process)
            && *key == secret
        {
            cancel.cancel();
        }
    }
}

/// Reads the 4-byte length and the body of a message whose length counts itself.
async fn read_body<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Result<Vec<u8>, String>> {
    let length = stream.read_u32().await? as usize;
    if length < 4 {
        return Ok(Err(format!("a message length of {length}")));
    }
    if length - 4 > MESSAGE_BYTES_MAX {
        return Ok(Err(format!("a message of {} bytes is longer than the {MESSAGE_BYTES_MAX} allowed", length - 4)));
    }
    let mut body = vec![0; length - 4];
    stream.read_exact(&mut body).await?;
    Ok(Ok(body))
}

/// Writes an error and nothing more: the connection is to be closed.
async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, code: &str, message: &str) {
    let mut out = Out::default();
    out.error(false, code, message, None, None);
    let _ = stream.write_all(&out.buffer).await;
    let _ = stream.flush().await;
}

async fn connection(
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
    engine: &Arc<Engine>,
    config: &PgConfig,
    key: Key,
) {
    // An SSL or GSS request first, then the startup message (on TLS, if it was agreed).
    let mut asked = 0;
    loop {
        asked += 1;
        let body = match tokio::time::timeout(STARTUP_TIMEOUT, read_body(&mut stream)).await {
            Ok(Ok(Ok(body))) => body,
            Ok(Ok(Err(reason))) => return refuse(&mut stream, "08P01", &reason).await,
            Ok(Err(_)) | Err(_) => return,
        };
        match codec::decode_startup(&body) {
            Ok(Startup::Ssl) if asked == 1 => match &config.tls {
                Some(tls) => {
                    if stream.write_all(b"S").await.is_err() {
                        return;
                    }
                    let accepted =
                        crate::tls::accept(tls.acceptor(), stream, crate::tls::HANDSHAKE_TIMEOUT, "postgres", peer)
                            .await;
                    if let Some((mut stream, _)) = accepted {
                        let body = match tokio::time::timeout(STARTUP_TIMEOUT, read_body(&mut stream)).await {
                            Ok(Ok(Ok(body))) => body,
                            Ok(Ok(Err(reason))) => return refuse(&mut stream, "08P01", &reason).await,
                            Ok(Err(_)) | Err(_) => return,
                        };
                        // libpq 17 sends its cancel requests over TLS too.
                        if let Ok(Startup::Cancel { process, secret }) = codec::decode_startup(&body) {
                            return key.running.cancel(process, secret);
                        }
                        return start(stream, peer, engine, key, config.idle_timeout, &body).await;
                    }
                    return;
                }
                None => {
                    if stream.write_all(b"N").await.is_err() {
                        return;
                    }
                }
            },
            Ok(Startup::Gss) if asked == 1 => {
                if stream.write_all(b"N").await.is_err() {
                    return;
                }
            }
            // A cancel request gets no answer, as Postgres gives none.
            Ok(Startup::Cancel { process, secret }) => return key.running.cancel(process, secret),
            Ok(Startup::Start { .. }) => return start(stream, peer, engine, key, config.idle_timeout, &body).await,
            Ok(_) => return refuse(&mut stream, "08P01", "a second SSL or GSS request").await,
            Err(reason) => return refuse(&mut stream, "08P01", &reason).await,
        }
    }
}

/// The startup message `body`: the login, then the session.
async fn start<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    engine: &Arc<Engine>,
    key: Key,
    idle_timeout: Duration,
    body: &[u8],
) {
    let parameters = match codec::decode_startup(body) {
        Ok(Startup::Start { version: PROTOCOL_3, parameters }) => parameters,
        Ok(Startup::Start { version, .. }) => {
            let message =
                format!("protocol {}.{} is not supported: onehop speaks 3.0", version >> 16, version & 0xffff);
            return refuse(&mut stream, "0A000", &message).await;
        }
        Ok(_) => return refuse(&mut stream, "08P01", "a startup message was expected").await,
        Err(reason) => return refuse(&mut stream, "08P01", &reason).await,
    };
    let parameter = |name: &str| parameters.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    let user = parameter("user").unwrap_or_default();
    let login = tokio::time::timeout(STARTUP_TIMEOUT, log_in(&mut stream, engine, &user, peer.ip())).await;
    let principal = match login {
        Ok(Ok(Some(principal))) => principal,
        Ok(Ok(None)) | Err(_) => return,
        Ok(Err(refusal)) => {
            crate::access::login_failed("postgres", Some(&user), &refusal);
            tracing::debug!(%peer, user, "a Postgres login was refused");
            return refuse(&mut stream, "28P01", &refusal).await;
        }
    };
    key.running.0.lock().expect("running sessions lock").insert(key.process, (key.secret, key.cancel.clone()));
    let mut session = Session::new(engine.clone(), principal, key.cancel.clone(), idle_timeout);
    session.settings.insert("application_name".into(), parameter("application_name").unwrap_or_default());
    if let Some(client_encoding) = parameter("client_encoding")
        && !client_encoding.eq_ignore_ascii_case("utf8")
        && !client_encoding.eq_ignore_ascii_case("utf-8")
        && !client_encoding.eq_ignore_ascii_case("unicode")
    {
        let message = format!("client_encoding {client_encoding} is not supported: onehop speaks UTF8");
        return refuse(&mut stream, "22021", &message).await;
    }
    let mut out = Out::default();
    out.authentication_ok();
    for (name, value) in [
        ("server_version", SERVER_VERSION),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("TimeZone", "UTC"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("is_superuser", if session.superuser() { "on" } else { "off" }),
        ("session_authorization", &user),
    ] {
        out.parameter_status(name, value);
    }
    out.parameter_status("application_name", session.settings["application_name"].as_str());
    out.backend_key(key.process, key.secret);
    out.ready(b'I');
    if stream.write_all(&out.buffer).await.is_err() {
        return;
    }
    session.run(&mut stream).await;
    drop(key);
}

/// The login: SCRAM-SHA-256 against the user's credential once users exist, none before.
/// `Ok(None)`: the client went away.
async fn log_in<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    engine: &Engine,
    user: &str,
    source: std::net::IpAddr,
) -> Result<Option<Principal>, String> {
    let access = engine.access();
    if !access.enabled() || (access.anonymous_welcome() && user.is_empty()) {
        return Ok(Some(access.anonymous()));
    }
    let mut out = Out::default();
    out.authentication_sasl(&["SCRAM-SHA-256"]);
    if stream.write_all(&out.buffer).await.is_err() {
        return Ok(None);
    }
    let Some(body) = read_password(stream).await? else { return Ok(None) };
    let (mechanism, client_first) = codec::decode_sasl_initial(&body)?;
    if mechanism != "SCRAM-SHA-256" {
        return Err(format!("the SASL mechanism {mechanism} is not offered: use SCRAM-SHA-256"));
    }
    let failed = |_: EngineError| format!("password authentication failed for user \"{user}\"");
    let (exchange, server_first) =
        ScramExchange::start_as(access, ScramHash::Sha256, &client_first, Some(user)).map_err(failed)?;
    let mut out = Out::default();
    out.authentication(11, &server_first);
    if stream.write_all(&out.buffer).await.is_err() {
        return Ok(None);
    }
    let Some(client_final) = read_password(stream).await? else { return Ok(None) };
    // The proof is the guess: slowed and counted as a password login over HTTP is.
    if let Err(EngineError::LoginThrottled { retry_after_ms }) = access.admit_login(user, Some(source)).await {
        return Err(format!("too many failed logins: try again in {} s", retry_after_ms.div_ceil(1000)));
    }
    let finished = exchange.finish(access, &client_final);
    access.login_checked(user, Some(source), finished.is_ok());
    let (principal, server_final) = finished.map_err(failed)?;
    let mut out = Out::default();
    out.authentication(12, &server_final);
    if stream.write_all(&out.buffer).await.is_err() {
        return Ok(None);
    }
    Ok(Some(principal))
}

/// A password message's body; `None` when the client went away.
async fn read_password<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Option<Vec<u8>>, String> {
    let Ok(tag) = stream.read_u8().await else { return Ok(None) };
    if tag != b'p' {
        return Err(format!("a password message was expected, not {:?}", tag as char));
    }
    match read_body(stream).await {
        Ok(Ok(body)) => Ok(Some(body)),
        Ok(Err(reason)) => Err(reason),
        Err(_) => Ok(None),
    }
}

/// An error as the client reads it: SQLSTATE, message, hint.
#[derive(Debug)]
pub struct PgError {
    pub code: &'static str,
    pub message: String,
    pub hint: Option<String>,
}

impl PgError {
    fn new(code: &'static str, message: impl Into<String>) -> PgError {
        PgError { code, message: message.into(), hint: None }
    }
}

impl From<SqlError> for PgError {
    fn from(error: SqlError) -> PgError {
        let hint = error.hint();
        let code = match &error {
            SqlError::Syntax(_) => "42601",
            SqlError::Unsupported { .. } | SqlError::UnsupportedQuery { .. } => "0A000",
            SqlError::InvalidQuery(message) if message.contains("is not a table, view or stream") => "42P01",
            SqlError::InvalidQuery(message) if message.contains("column") => "42703",
            SqlError::InvalidQuery(_) => "42000",
            SqlError::InvalidOption(_) => "22023",
            SqlError::QueryLimit { limit: "time", .. } | SqlError::Canceled => "57014",
            SqlError::QueryLimit { .. } => "54000",
            SqlError::UniqueViolation(_) => "23505",
            SqlError::SerializationFailure(_) => "40001",
            SqlError::ActiveTransaction(_) => "25001",
            SqlError::Transaction(_) => "0A000",
            SqlError::Engine(engine) => match engine.kind() {
                ErrorKind::Forbidden => "42501",
                ErrorKind::Unauthenticated => "28000",
                ErrorKind::NotFound => "42704",
                ErrorKind::Conflict => "42710",
                // A row changed by another writer since the statement read it.
                ErrorKind::PreconditionFailed => "40001",
                ErrorKind::Invalid | ErrorKind::OutOfRange | ErrorKind::Unprocessable => "22023",
                ErrorKind::TooLarge | ErrorKind::LimitExceeded => "54000",
                ErrorKind::ShuttingDown => "57P01",
                ErrorKind::Unavailable => "57P03",
                ErrorKind::StorageFailed => "58030",
                ErrorKind::Internal => "XX000",
            },
        };
        PgError { code, message: error.to_string(), hint }
    }
}

/// What one statement answered.
enum Outcome {
    /// A result set; `verb` names the write whose RETURNING rows these are.
    Rows {
        columns: Vec<String>,
        rows: Vec<Vec<Value>>,
        verb: Option<String>,
    },
    Command {
        tag: String,
        notice: Option<String>,
    },
    /// A COPY TO STDOUT's rows, sent as copy data.
    CopyOut {
        columns: Vec<String>,
        rows: Vec<Vec<Value>>,
        format: copy::Format,
    },
    /// A COPY FROM STDIN, checked and ready for the client's data.
    CopyIn(Box<CopyIn>),
    /// A SUBSCRIBE, open: its snapshot, then what it follows.
    Subscribe(Box<subscribe::Following>),
}

impl Outcome {
    /// A statement's output; a command's tag is its first two words (`CREATE STREAM`).
    fn of(output: Output) -> Outcome {
        let tag = |statement: &str| statement.split_whitespace().take(2).collect::<Vec<_>>().join(" ").to_uppercase();
        match output {
            Output::Rows { columns, rows, verb, .. } => Outcome::Rows { columns, rows, verb },
            Output::Created { statement, .. } | Output::Altered { statement, .. } | Output::Dropped { statement } => {
                Outcome::Command { tag: tag(&statement), notice: None }
            }
            Output::Unchanged { statement, note, .. } => Outcome::Command { tag: tag(&statement), notice: Some(note) },
            Output::Changed { verb, rows, .. } => Outcome::Command { tag: rows_tag(Some(&verb), rows), notice: None },
        }
    }
}

/// A COPY FROM STDIN: where its rows go and, once it began, its data so far.
struct CopyIn {
    target: String,
    columns: Vec<String>,
    /// The declared types of `columns` (none: not declared).
    types: Vec<Option<ColumnType>>,
    format: copy::Format,
    data: Vec<u8>,
    /// More data came than query_memory_max allows: it is dropped, and the COPY fails at its end.
    too_big: bool,
    /// It came by the simple query protocol: ReadyForQuery follows its end.
    simple: bool,
}

/// Rows per INSERT a COPY FROM STDIN writes (all of them in one transaction).
const COPY_ROWS_PER_INSERT: usize = 1000;

/// A portal: a bound statement's answer, sent as Execute asks.
struct Portal {
    outcome: Option<Outcome>,
    types: Vec<u32>,
    /// Per column: binary.
    binary: Vec<bool>,
    rows: VecDeque<Vec<Value>>,
    sent: usize,
}

/// A prepared statement.
struct Prepared {
    types: Vec<u32>,
    /// The statement, parsed once (none for an empty query string).
    piece: Option<Piece>,
    /// The types of its untyped parameters, from the columns they meet (inferred when parsed,
    /// as Postgres fixes a prepared statement's parameter types).
    inferred: Vec<Option<onehop_engine::ColumnType>>,
}

/// Where the session is: outside a transaction, in one (with its writes, kept until COMMIT,
/// and its savepoints, innermost last), or in one an error ended (until ROLLBACK).
enum Transaction {
    Idle,
    Open { writes: onehop_sql::Transaction, savepoints: Vec<(String, onehop_sql::Transaction)> },
    Failed { savepoints: Vec<(String, onehop_sql::Transaction)> },
}

impl Transaction {
    fn open() -> Transaction {
        Transaction::Open { writes: onehop_sql::Transaction::new(), savepoints: Vec::new() }
    }

    fn is_idle(&self) -> bool {
        matches!(self, Transaction::Idle)
    }
}

struct Session {
    engine: Arc<Engine>,
    principal: Principal,
    settings: HashMap<String, String>,
    statements: HashMap<String, Prepared>,
    portals: HashMap<String, Portal>,
    transaction: Transaction,
    out: Out,
    /// After an error in the extended protocol: messages are skipped until Sync.
    skipping: bool,
    /// Set by a cancel request for this session's process and key.
    cancel: Cancel,
    idle_timeout: Duration,
    /// The COPY FROM STDIN whose data is coming in.
    copy_in: Option<Box<CopyIn>>,
    /// The SUBSCRIBE to follow once its start is sent.
    following: Option<Box<subscribe::Following>>,
    /// A simple query's answer to send as it is made.
    streaming: Option<Answer>,
}

/// A query's answer as it is made (see [`onehop_sql::stream_as`]).
type Answer = tokio::sync::mpsc::Receiver<Result<onehop_sql::query::stream::Streamed, SqlError>>;

impl Session {
    /// A session's key for cancel requests: its process id and a random secret.
    fn key(process: i32, running: &Running) -> Key {
        Key { process, secret: rand::random::<i32>(), cancel: Cancel::default(), running: running.clone() }
    }

    fn new(engine: Arc<Engine>, principal: Principal, cancel: Cancel, idle_timeout: Duration) -> Session {
        Session {
            cancel,
            idle_timeout,
            engine,
            principal,
            settings: HashMap::new(),
            statements: HashMap::new(),
            portals: HashMap::new(),
            transaction: Transaction::Idle,
            out: Out::default(),
            skipping: false,
            copy_in: None,
            following: None,
            streaming: None,
        }
    }

    /// Whether the session may do everything (no users defined, or a superuser).
    fn superuser(&self) -> bool {
        match self.engine.access().permissions(&self.principal) {
            Ok(None) => true,
            Ok(Some(permissions)) => permissions.is_superuser(),
            Err(_) => false,
        }
    }

    fn status(&self) -> u8 {
        match self.transaction {
            Transaction::Idle => b'I',
            Transaction::Open { .. } => b'T',
            Transaction::Failed { .. } => b'E',
        }
    }

    async fn run<S: AsyncRead + AsyncWrite + Unpin>(&mut self, stream: &mut S) {
        loop {
            let tag = match tokio::time::timeout(self.idle_timeout, stream.read_u8()).await {
                Ok(Ok(tag)) => tag,
                Ok(Err(_)) => return,
                Err(_) => {
                    let mut out = Out::default();
                    let message = format!(
                        "terminating connection due to idle-session timeout ({} s, pg_idle_timeout_s)",
                        self.idle_timeout.as_secs()
                    );
                    out.error(false, "57P05", &message, None, None);
                    let _ = stream.write_all(&out.buffer).await;
                    return;
                }
            };
            let body = match read_body(stream).await {
                Ok(Ok(body)) => body,
                Ok(Err(reason)) => return refuse(stream, "54000", &reason).await,
                Err(_) => return,
            };
            let message = match codec::decode(tag, &body) {
                Ok(message) => message,
                Err(reason) => return refuse(stream, "08P01", &reason).await,
            };
            let flush = matches!(
                message,
                Frontend::Sync | Frontend::Flush | Frontend::Query(_) | Frontend::CopyDone | Frontend::CopyFail(_)
            );
            if self.copy_in.is_some() {
                match message {
                    Frontend::CopyData(data) => self.copy_data(&data),
                    Frontend::CopyDone => self.copy_done(None).await,
                    Frontend::CopyFail(reason) => self.copy_done(Some(reason)).await,
                    // Postgres ignores these while COPY data comes in.
                    Frontend::Flush | Frontend::Sync => {}
                    Frontend::Terminate => return,
                    _ => {
                        self.copy_in = None;
                        return refuse(stream, "08P01", "unexpected message type during COPY from stdin").await;
                    }
                }
            } else {
                match message {
                    Frontend::Terminate => return,
                    Frontend::Query(sql) => self.simple(&sql).await,
                    Frontend::Sync => {
                        self.skipping = false;
                        if self.transaction.is_idle() {
                            self.portals.clear();
                        }
                        let status = self.status();
                        self.out.ready(status);
                    }
                    Frontend::Flush => {}
                    Frontend::Password(_) => {
                        return refuse(stream, "08P01", "a password message after the login").await;
                    }
                    // Copy messages outside a COPY are ignored, as Postgres ignores them.
                    Frontend::CopyData(_) | Frontend::CopyDone | Frontend::CopyFail(_) => {}
                    Frontend::Other(tag) => {
                        let message = format!("message type {:?} is not part of the protocol", tag as char);
                        return refuse(stream, "08P01", &message).await;
                    }
                    extended if self.skipping => drop(extended),
                    extended => {
                        if let Err(error) = self.extended(extended).await {
                            self.fail(&error);
                            self.skipping = true;
                        }
                    }
                }
            }
            // A COPY FROM STDIN that began waits for the client's data: its response goes now.
            let copying = self.copy_in.is_some();
            if ((flush || copying) && !self.out.buffer.is_empty()) || self.out.buffer.len() > 64 * 1024 {
                if stream.write_all(&self.out.buffer).await.is_err() {
                    return;
                }
                self.out.buffer.clear();
            }
            if let Some(following) = self.following.take()
                && !self.follow(stream, *following).await
            {
                return;
            }
            if let Some(answer) = self.streaming.take()
                && !self.drain(stream, answer).await
            {
                return;
            }
        }
    }

    /// Sends a SUBSCRIBE's changes as they come, until the client cancels it (then an error,
    /// as a canceled query ends) or goes (then `false`: the connection is done).
    async fn follow<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        mut following: subscribe::Following,
    ) -> bool {
        let mut synced = false;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let ended = loop {
            if !self.out.buffer.is_empty() {
                if stream.write_all(&self.out.buffer).await.is_err() {
                    return false;
                }
                self.out.buffer.clear();
            }
            tokio::select! {
                delivery = following.cursor.next() => match delivery {
                    Ok(Delivery::Event(event, change)) => {
                        let row = following.shape.event_row(&event, change);
                        self.subscribed_row(&following, &row);
                    }
                    Ok(Delivery::Overflow { .. }) => {
                        break PgError::new("53000", "the subscription fell too far behind and was ended: SUBSCRIBE again");
                    }
                    Err(error) => break PgError::from(SqlError::from(error)),
                },
                tag = stream.read_u8() => {
                    let Ok(tag) = tag else { return false };
                    let Ok(Ok(body)) = read_body(stream).await else { return false };
                    match codec::decode(tag, &body) {
                        Ok(Frontend::Sync) => synced = true,
                        Ok(Frontend::Flush) => {}
                        Ok(Frontend::Terminate) | Err(_) => return false,
                        Ok(_) => {
                            let error = "a message came while SUBSCRIBE was running: cancel it first (a cancel request)";
                            refuse(stream, "08P01", error).await;
                            return false;
                        }
                    }
                }
                _ = tick.tick() => {
                    if self.cancel.is_canceled() {
                        break PgError::new("57014", "canceling statement due to user request");
                    }
                }
            }
        };
        self.fail(&ended);
        if following.simple || synced {
            let status = self.status();
            self.out.ready(status);
        } else {
            self.skipping = true;
        }
        let written = stream.write_all(&self.out.buffer).await.is_ok();
        self.out.buffer.clear();
        written
    }

    /// Sends a simple query's answer as it is made: the row description once the first rows
    /// are known (their types are those rows'), each batch as it comes, then the tag, or the
    /// error that ended it; then ReadyForQuery. `false`: the client went.
    async fn drain<S: AsyncRead + AsyncWrite + Unpin>(&mut self, stream: &mut S, mut answer: Answer) -> bool {
        use onehop_sql::query::stream::Streamed;
        let mut columns = Vec::new();
        let mut types: Option<Vec<u32>> = None;
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            if !self.out.buffer.is_empty() {
                if stream.write_all(&self.out.buffer).await.is_err() {
                    return false;
                }
                self.out.buffer.clear();
            }
            let next = tokio::select! {
                next = answer.recv() => next,
                _ = tick.tick() => {
                    if self.cancel.is_canceled() {
                        // Dropping the answer stops the query at its next batch.
                        self.fail(&PgError::new("57014", "canceling statement due to user request"));
                        break;
                    }
                    continue;
                }
            };
            match next {
                Some(Ok(Streamed::Columns(named))) => columns = named,
                Some(Ok(Streamed::Rows(rows))) => {
                    let types = types.get_or_insert_with(|| {
                        let types: Vec<u32> = (0..columns.len())
                            .map(|index| types::column_type(rows.iter().filter_map(|row| row.get(index))))
                            .collect();
                        self.describe_rows(&columns, &types, &vec![false; types.len()]);
                        types
                    });
                    let (types, binary) = (types.clone(), vec![false; types.len()]);
                    for row in &rows {
                        self.data_row(row, &types, &binary);
                    }
                    sent += rows.len() as u64;
                }
                Some(Err(error)) => {
                    self.fail(&PgError::from(error));
                    break;
                }
                None => {
                    if types.is_none() {
                        let text = vec![types::TEXT; columns.len()];
                        self.describe_rows(&columns, &text, &vec![false; columns.len()]);
                    }
                    self.out.command_complete(&rows_tag(None, sent));
                    break;
                }
            }
        }
        let status = self.status();
        self.out.ready(status);
        let written = stream.write_all(&self.out.buffer).await.is_ok();
        self.out.buffer.clear();
        written
    }

    /// One row of a SUBSCRIBE, as a data row or a line of copy data.
    fn subscribed_row(&mut self, following: &subscribe::Following, row: &[Value]) {
        match &following.copy {
            Some(format) => self.copy_line(row, &following.shape.types, format),
            None => {
                let binary =
                    if following.binary.is_empty() { vec![false; row.len()] } else { following.binary.clone() };
                self.data_row(row, &following.shape.types, &binary);
            }
        }
    }

    /// A row as one line of copy data, its values in text.
    fn copy_line(&mut self, row: &[Value], types: &[u32], format: &copy::Format) {
        let texts: Vec<Option<String>> = row
            .iter()
            .zip(types)
            .map(|(value, oid)| {
                types::encode(value, *oid, false).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            })
            .collect();
        let fields: Vec<Option<&str>> = texts.iter().map(Option::as_deref).collect();
        self.out.copy_data(&copy::encode_line(&fields, format));
    }

    fn fail(&mut self, error: &PgError) {
        self.out.error(false, error.code, &error.message, None, error.hint.as_deref());
        if let Transaction::Open { savepoints, .. } = &mut self.transaction {
            // The writes are dropped: an error ends the transaction (a savepoint can take it
            // back to an earlier state).
            self.transaction = Transaction::Failed { savepoints: std::mem::take(savepoints) };
        }
    }

    /// The simple query protocol: every statement of `sql` in turn, each answered whole.
    async fn simple(&mut self, sql: &str) {
        if sql.trim().trim_matches(';').trim().is_empty() {
            self.out.empty_query();
        } else {
            match self.statements_of(sql) {
                Err(error) => self.fail(&error),
                // One query outside a transaction: its rows go out as they are found.
                Ok(statements)
                    if self.transaction.is_idle()
                        && matches!(statements.as_slice(), [Piece::Onehop(statement)] if matches!(**statement, Statement::Query { .. })) =>
                {
                    let Some(Piece::Onehop(statement)) = statements.into_iter().next() else { unreachable!("matched") };
                    self.cancel.reset();
                    match onehop_sql::stream_as(&self.engine, &self.principal, &statement, Some(&self.cancel)) {
                        Ok(answer) => {
                            // ReadyForQuery follows its end.
                            self.streaming = Some(answer);
                            return;
                        }
                        Err(error) => self.fail(&PgError::from(error)),
                    }
                }
                Ok(statements) => {
                    for statement in statements {
                        match self.execute(statement, &[]).await {
                            Ok(outcome) => {
                                let types = outcome_types(&outcome);
                                let binary = vec![false; types.len()];
                                self.send(outcome, &types, &binary, true);
                                if self.copy_in.is_some() || self.following.is_some() {
                                    // ReadyForQuery follows the COPY's data, or the SUBSCRIBE's end.
                                    return;
                                }
                            }
                            Err(error) => {
                                self.fail(&error);
                                break;
                            }
                        }
                    }
                }
            }
        }
        let status = self.status();
        self.out.ready(status);
    }

    /// `sql` split into what this module answers and onehop's statements.
    fn statements_of(&self, sql: &str) -> Result<Vec<Piece>, PgError> {
        if let Some(plan) = subscribe::parse(sql) {
            return Ok(vec![Piece::Subscribe(Box::new(plan?))]);
        }
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let Ok(parsed) = sqlparser::parser::Parser::parse_sql(&dialect, sql) else {
            // onehop's own statements (CREATE STREAM, …) are not Postgres's.
            return Ok(onehop_sql::parse(sql)?
                .into_iter()
                .map(|statement| Piece::Onehop(Box::new(statement)))
                .collect());
        };
        if !parsed.iter().any(is_session_statement) {
            return Ok(onehop_sql::parse(sql)?
                .into_iter()
                .map(|statement| Piece::Onehop(Box::new(statement)))
                .collect());
        }
        let mut pieces = Vec::with_capacity(parsed.len());
        for statement in parsed {
            if let ast::Statement::Copy { to: false, values, .. } = &statement
                && !values.is_empty()
            {
                return Err(PgError::new(
                    "0A000",
                    "COPY FROM STDIN ends its query string: its data comes as copy data, and the statements after \
                     it go in a query of their own",
                ));
            }
            if let ast::Statement::Copy { .. } = &statement {
                pieces.push(Piece::Copy(Box::new(copy::plan(&statement)?)));
            } else if is_session_statement(&statement) {
                pieces.push(Piece::Session(Box::new(statement)));
            } else {
                pieces.extend(
                    onehop_sql::parse(&statement.to_string())?
                        .into_iter()
                        .map(|statement| Piece::Onehop(Box::new(statement))),
                );
            }
        }
        Ok(pieces)
    }

    async fn execute(&mut self, piece: Piece, parameters: &[Value]) -> Result<Outcome, PgError> {
        match piece {
            Piece::Session(statement) => self.session_statement(*statement).await,
            Piece::Copy(copy) => match *copy {
                copy::Copy::Out { query, format } => match self.onehop_statement(*query, &[]).await? {
                    Outcome::Rows { columns, rows, .. } => Ok(Outcome::CopyOut { columns, rows, format }),
                    _ => Err(PgError::new("42601", "COPY ( … ) TO STDOUT copies the answer of one SELECT")),
                },
                copy::Copy::In { target, columns, format } => self.copy_in(target, columns, format),
            },
            Piece::Subscribe(plan) => {
                self.cancel.reset();
                let following = subscribe::open(&self.engine, &self.principal, *plan).await?;
                Ok(Outcome::Subscribe(Box::new(following)))
            }
            Piece::Onehop(statement) => self.onehop_statement(*statement, parameters).await,
        }
    }

    /// Runs one of onehop's statements, in the session's transaction if one is open.
    async fn onehop_statement(&mut self, mut statement: Statement, parameters: &[Value]) -> Result<Outcome, PgError> {
        statement.bind(parameters)?;
        // A cancel that came after the last query ended is not for this one.
        self.cancel.reset();
        let output = match &mut self.transaction {
            Transaction::Idle => {
                onehop_sql::execute_cancellable(&self.engine, &self.principal, &statement, Some(&self.cancel)).await?
            }
            Transaction::Open { writes, .. } if writes.is_empty() && statement.is_definition() => {
                // Drivers and ORMs wrap their CREATE TABLEs in a transaction (SQLAlchemy's
                // create_all, migration tools): before any write, a definition runs at
                // once, as MySQL runs them, and says that a ROLLBACK will not undo it.
                let output =
                    onehop_sql::execute_cancellable(&self.engine, &self.principal, &statement, Some(&self.cancel))
                        .await?;
                let mut outcome = Outcome::of(output);
                if let Outcome::Command { notice, .. } = &mut outcome {
                    let done = format!(
                        "{} took effect at once: definitions are not part of a transaction, and ROLLBACK \
                                 does not undo them",
                        statement.label()
                    );
                    *notice = Some(match notice.take() {
                        Some(earlier) => format!("{earlier}; {done}"),
                        None => done,
                    });
                }
                return Ok(outcome);
            }
            Transaction::Open { writes, .. } => {
                onehop_sql::execute_in(&self.engine, &self.principal, &statement, Some(&self.cancel), writes).await?
            }
            Transaction::Failed { .. } => {
                return Err(PgError::new(
                    "25P02",
                    "current transaction is aborted, commands ignored until end of transaction block",
                ));
            }
        };
        Ok(Outcome::of(output))
    }

    /// SET, SHOW of a setting, and the transaction statements.
    async fn session_statement(&mut self, statement: ast::Statement) -> Result<Outcome, PgError> {
        let command = |tag: &str| Ok(Outcome::Command { tag: tag.to_string(), notice: None });
        match statement {
            ast::Statement::StartTransaction { .. } => {
                if self.transaction.is_idle() {
                    self.transaction = Transaction::open();
                    return command("BEGIN");
                }
                let notice = "there is already a transaction in progress".to_string();
                Ok(Outcome::Command { tag: "BEGIN".into(), notice: Some(notice) })
            }
            ast::Statement::Commit { .. } => match std::mem::replace(&mut self.transaction, Transaction::Idle) {
                Transaction::Idle => {
                    let notice = "there is no transaction in progress".to_string();
                    Ok(Outcome::Command { tag: "COMMIT".into(), notice: Some(notice) })
                }
                Transaction::Failed { .. } => command("ROLLBACK"),
                Transaction::Open { writes, .. } => {
                    writes.commit().await?;
                    command("COMMIT")
                }
            },
            ast::Statement::Rollback { savepoint: Some(name), .. } => {
                let savepoints = match &mut self.transaction {
                    Transaction::Idle => {
                        return Err(PgError::new(
                            "25P01",
                            "ROLLBACK TO SAVEPOINT can only be used in transaction blocks",
                        ));
                    }
                    Transaction::Open { savepoints, .. } | Transaction::Failed { savepoints } => savepoints,
                };
                let Some(position) = savepoints.iter().rposition(|(saved, _)| *saved == name.value) else {
                    return Err(PgError::new("3B001", format!("savepoint \"{}\" does not exist", name.value)));
                };
                // Back to the writes as the savepoint found them; it stays, later ones go.
                savepoints.truncate(position + 1);
                let writes = savepoints[position].1.clone();
                let savepoints = std::mem::take(savepoints);
                self.transaction = Transaction::Open { writes, savepoints };
                command("ROLLBACK")
            }
            ast::Statement::Rollback { .. } => {
                let idle = self.transaction.is_idle();
                self.transaction = Transaction::Idle;
                let notice = idle.then(|| "there is no transaction in progress".to_string());
                Ok(Outcome::Command { tag: "ROLLBACK".into(), notice })
            }
            ast::Statement::Savepoint { name } => match &mut self.transaction {
                Transaction::Idle => Err(PgError::new("25P01", "SAVEPOINT can only be used in transaction blocks")),
                Transaction::Failed { .. } => Err(PgError::new(
                    "25P02",
                    "current transaction is aborted, commands ignored until end of transaction block",
                )),
                Transaction::Open { writes, savepoints } => {
                    savepoints.push((name.value, writes.clone()));
                    command("SAVEPOINT")
                }
            },
            ast::Statement::ReleaseSavepoint { name } => {
                let savepoints = match &mut self.transaction {
                    Transaction::Idle => {
                        return Err(PgError::new("25P01", "RELEASE SAVEPOINT can only be used in transaction blocks"));
                    }
                    Transaction::Failed { .. } => {
                        return Err(PgError::new(
                            "25P02",
                            "current transaction is aborted, commands ignored until end of transaction block",
                        ));
                    }
                    Transaction::Open { savepoints, .. } => savepoints,
                };
                let Some(position) = savepoints.iter().rposition(|(saved, _)| *saved == name.value) else {
                    return Err(PgError::new("3B001", format!("savepoint \"{}\" does not exist", name.value)));
                };
                // Its writes stay in the transaction; it and the savepoints after it go.
                savepoints.truncate(position);
                command("RELEASE")
            }
            ast::Statement::Set(set) => {
                if let ast::Set::SingleAssignment { variable, values, .. } = set {
                    let value =
                        values.iter().map(|value| value.to_string().trim_matches('\'').to_string()).collect::<Vec<_>>();
                    self.settings.insert(variable.to_string().to_ascii_lowercase(), value.join(", "));
                }
                command("SET")
            }
            ast::Statement::ShowVariable { variable } => {
                let name = variable.iter().map(|part| part.value.to_ascii_lowercase()).collect::<Vec<_>>().join(" ");
                let value = match self.settings.get(&name) {
                    Some(value) => value.clone(),
                    None => setting_default(&name).map(str::to_string).unwrap_or_default(),
                };
                let column = variable.last().map_or(name.clone(), |part| part.value.to_ascii_lowercase());
                Ok(Outcome::Rows { columns: vec![column], rows: vec![vec![Value::String(value)]], verb: None })
            }
            ast::Statement::Discard { .. } => {
                self.statements.clear();
                self.portals.clear();
                command("DISCARD ALL")
            }
            ast::Statement::Deallocate { name, .. } => {
                self.statements.remove(&name.value);
                command("DEALLOCATE")
            }
            other => Err(PgError::new("0A000", format!("{other} is not supported"))),
        }
    }

    /// Appends an outcome's rows and its completion (by the simple query protocol, `simple`,
    /// with the rows' description first), or begins a COPY FROM STDIN.
    fn send(&mut self, outcome: Outcome, types: &[u32], binary: &[bool], simple: bool) {
        match outcome {
            Outcome::Command { tag, notice } => {
                if let Some(notice) = notice {
                    self.out.error(true, "00000", &notice, None, None);
                }
                self.out.command_complete(&tag);
            }
            Outcome::Rows { columns, rows, verb } => {
                if simple {
                    self.describe_rows(&columns, types, binary);
                }
                for row in &rows {
                    self.data_row(row, types, binary);
                }
                self.out.command_complete(&rows_tag(verb.as_deref(), rows.len() as u64));
            }
            Outcome::CopyOut { columns, rows, format } => {
                self.out.copy_response(true, columns.len());
                if format.header {
                    let names: Vec<Option<&str>> = columns.iter().map(|name| Some(name.as_str())).collect();
                    self.out.copy_data(&copy::encode_line(&names, &format));
                }
                for row in &rows {
                    self.copy_line(row, types, &format);
                }
                self.out.copy_done();
                self.out.command_complete(&format!("COPY {}", rows.len()));
            }
            Outcome::CopyIn(mut copy) => {
                copy.simple = simple;
                self.out.copy_response(false, copy.columns.len());
                self.copy_in = Some(copy);
            }
            Outcome::Subscribe(mut following) => {
                following.simple = simple;
                following.binary = binary.to_vec();
                let (columns, types) = (following.shape.columns.clone(), following.shape.types.clone());
                match &following.copy {
                    Some(_) => self.out.copy_response(true, columns.len()),
                    None if simple => self.describe_rows(&columns, &types, binary),
                    None => {}
                }
                for row in std::mem::take(&mut following.snapshot) {
                    self.subscribed_row(&following, &row);
                }
                self.following = Some(following);
            }
        }
    }

    /// Checks a COPY FROM STDIN before its data comes: the target exists, the user may write
    /// it, and its columns are known.
    fn copy_in(&self, target: String, columns: Vec<String>, format: copy::Format) -> Result<Outcome, PgError> {
        let kind = match relation(&self.engine, &target)? {
            Relation::Table => ObjectKind::Table,
            Relation::Stream => ObjectKind::Stream,
            Relation::View => {
                return Err(PgError::new("42809", format!("{target} is a view: COPY FROM writes a table or a stream")));
            }
        };
        let table = self.engine.table(&target).ok();
        self.engine.access().authorize(&self.principal, Privilege::Write, kind, &target).map_err(SqlError::from)?;
        let def = table.map(|table| table.def());
        let columns = match (columns.is_empty(), &def) {
            (false, _) => columns,
            (true, Some(def)) => def.columns.iter().map(|column| column.name.clone()).collect(),
            (true, None) => {
                return Err(PgError::new(
                    "42601",
                    format!(
                        "{target} is a stream, whose fields are not declared: name them, COPY {target} (field, …) FROM STDIN"
                    ),
                ));
            }
        };
        let types: Vec<Option<ColumnType>> = columns
            .iter()
            .map(|name| def.as_ref().and_then(|def| def.column(name)).map(|column| column.ty.clone()))
            .collect();
        if let Some((name, _)) = columns.iter().zip(&types).find(|(_, ty)| matches!(ty, Some(ColumnType::Array(_)))) {
            return Err(PgError::new(
                "0A000",
                format!("COPY FROM does not fill the array column {name}: write those rows with INSERT or over HTTP"),
            ));
        }
        let copy = CopyIn { target, columns, types, format, data: Vec::new(), too_big: false, simple: true };
        Ok(Outcome::CopyIn(Box::new(copy)))
    }

    /// Keeps a COPY's data, up to query_memory_max.
    fn copy_data(&mut self, data: &[u8]) {
        let max = self.engine.options().query_memory_bytes_max;
        let Some(copy) = &mut self.copy_in else { return };
        if copy.too_big {
            return;
        }
        if (copy.data.len() + data.len()) as u64 > max {
            copy.too_big = true;
            copy.data = Vec::new();
        } else {
            copy.data.extend_from_slice(data);
        }
    }

    /// Ends a COPY FROM STDIN: its rows written (or, when the client gave up, `failed`, none).
    async fn copy_done(&mut self, failed: Option<String>) {
        let Some(copy) = self.copy_in.take() else { return };
        let simple = copy.simple;
        let result = match failed {
            Some(reason) => Err(PgError::new("57014", format!("COPY from stdin failed: {reason}"))),
            None => self.write_copy(*copy).await,
        };
        match result {
            Ok(rows) => self.out.command_complete(&format!("COPY {rows}")),
            Err(error) => {
                self.fail(&error);
                // In the extended protocol, what follows is skipped until Sync.
                self.skipping = !simple;
            }
        }
        if simple {
            let status = self.status();
            self.out.ready(status);
        }
    }

    /// A COPY's rows, as INSERTs of `COPY_ROWS_PER_INSERT` rows in one transaction (the
    /// session's, if one is open): all of them written, or none.
    async fn write_copy(&mut self, copy: CopyIn) -> Result<u64, PgError> {
        if copy.too_big {
            return Err(PgError::new(
                "54000",
                format!(
                    "the COPY data is larger than query_memory_max ({} bytes): copy it in parts",
                    self.engine.options().query_memory_bytes_max
                ),
            ));
        }
        if let Transaction::Failed { .. } = self.transaction {
            return Err(PgError::new(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            ));
        }
        let lines = copy::decode(&copy.data, &copy.format)?;
        drop(copy.data);
        let width = copy.columns.len();
        for (index, line) in lines.iter().enumerate() {
            if line.len() != width {
                return Err(PgError::new(
                    "22P04",
                    format!(
                        "COPY {}, row {}: {} fields for the {width} columns {}",
                        copy.target,
                        index + 1,
                        line.len(),
                        copy.columns.join(", ")
                    ),
                ));
            }
        }
        let quoted = |name: &str| ast::Ident::with_quote('"', name).to_string();
        let names = copy.columns.iter().map(|name| quoted(name)).collect::<Vec<_>>().join(", ");
        let insert = format!("INSERT INTO {} ({names}) VALUES ", quoted(&copy.target));
        self.cancel.reset();
        let mut own = onehop_sql::Transaction::new();
        let mut written = 0;
        for (chunk_index, chunk) in lines.chunks(COPY_ROWS_PER_INSERT).enumerate() {
            let rows = (0..chunk.len())
                .map(|row| {
                    let placeholders = (1..=width).map(|column| format!("${}", row * width + column));
                    format!("({})", placeholders.collect::<Vec<_>>().join(", "))
                })
                .collect::<Vec<_>>()
                .join(", ");
            let mut statement = onehop_sql::parse(&format!("{insert}{rows}"))?.remove(0);
            let mut values = Vec::with_capacity(chunk.len() * width);
            for (row, line) in chunk.iter().enumerate() {
                for ((field, ty), column) in line.iter().zip(&copy.types).zip(&copy.columns) {
                    values.push(match field {
                        None => Value::Null,
                        Some(text) => copy::field_value(text, ty.as_ref()).map_err(|reason| {
                            let number = chunk_index * COPY_ROWS_PER_INSERT + row + 1;
                            PgError::new(
                                "22P02",
                                format!("COPY {}, row {number}, column {column}: {reason}", copy.target),
                            )
                        })?,
                    });
                }
            }
            statement.bind(&values)?;
            let writes = match &mut self.transaction {
                Transaction::Open { writes, .. } => writes,
                _ => &mut own,
            };
            let output =
                onehop_sql::execute_in(&self.engine, &self.principal, &statement, Some(&self.cancel), writes).await?;
            if let onehop_sql::Output::Changed { rows, .. } = output {
                written += rows;
            }
        }
        own.commit().await?;
        Ok(written)
    }

    fn describe_rows(&mut self, columns: &[String], types: &[u32], binary: &[bool]) {
        let fields: Vec<Field> = columns
            .iter()
            .zip(types)
            .zip(binary)
            .map(|((name, type_oid), binary)| Field { name, type_oid: *type_oid, format: i16::from(*binary) })
            .collect();
        self.out.row_description(&fields);
    }

    fn data_row(&mut self, row: &[Value], types: &[u32], binary: &[bool]) {
        let values: Vec<Option<Vec<u8>>> = row
            .iter()
            .zip(types)
            .zip(binary)
            .map(|((value, oid), binary)| types::encode(value, *oid, *binary))
            .collect();
        self.out.data_row(&values);
    }

    /// Parse, Bind, Describe, Execute and Close.
    async fn extended(&mut self, message: Frontend) -> Result<(), PgError> {
        match message {
            Frontend::Parse { name, query, types } => {
                if !name.is_empty() && self.statements.contains_key(&name) {
                    return Err(PgError::new("42P05", format!("prepared statement \"{name}\" already exists")));
                }
                let mut pieces = self.statements_of(&query)?;
                if pieces.len() > 1 {
                    return Err(PgError::new("42601", "cannot insert multiple commands into a prepared statement"));
                }
                let piece = pieces.pop();
                // An untyped parameter (node-postgres sends every one so) takes the type of the
                // column it meets, as Postgres infers it.
                let inferred = match &piece {
                    Some(Piece::Onehop(statement)) => statement.parameter_types(&self.engine),
                    _ => Vec::new(),
                };
                self.statements.insert(name, Prepared { types, piece, inferred });
                self.out.parse_complete();
            }
            Frontend::Bind { portal, statement, formats, parameters, results } => {
                let prepared = self.statements.get(&statement).ok_or_else(|| {
                    PgError::new("26000", format!("prepared statement \"{statement}\" does not exist"))
                })?;
                let (piece, types) = (prepared.piece.clone(), &prepared.types);
                let inferred = &prepared.inferred;
                let format = |index: usize| match formats.as_slice() {
                    [] => false,
                    [one] => *one == 1,
                    many => many.get(index).is_some_and(|format| *format == 1),
                };
                let mut values = Vec::with_capacity(parameters.len());
                for (index, parameter) in parameters.iter().enumerate() {
                    values.push(match parameter {
                        None => Value::Null,
                        Some(bytes) => {
                            let oid = match types.get(index).copied().unwrap_or(types::UNKNOWN) {
                                types::UNKNOWN => {
                                    inferred.get(index).and_then(Option::as_ref).map_or(types::UNKNOWN, types::oid_of)
                                }
                                oid => oid,
                            };
                            types::decode_parameter(bytes, oid, format(index)).map_err(|reason| {
                                PgError::new("22P02", format!("parameter ${}: {reason}", index + 1))
                            })?
                        }
                    });
                }
                let outcome = match piece {
                    Some(piece) => Some(self.execute(piece, &values).await?),
                    None => None,
                };
                let types = outcome.as_ref().map(outcome_types).unwrap_or_default();
                let binary = (0..types.len())
                    .map(|index| match results.as_slice() {
                        [] => false,
                        [one] => *one == 1,
                        many => many.get(index).is_some_and(|format| *format == 1),
                    })
                    .collect();
                let (outcome, rows) = match outcome {
                    Some(Outcome::Rows { columns, rows, verb }) => {
                        (Some(Outcome::Rows { columns, rows: Vec::new(), verb }), rows.into())
                    }
                    other => (other, VecDeque::new()),
                };
                self.portals.insert(portal, Portal { outcome, types, binary, rows, sent: 0 });
                self.out.bind_complete();
            }
            Frontend::Describe { kind: b'S', name } => {
                let prepared = self
                    .statements
                    .get(&name)
                    .ok_or_else(|| PgError::new("26000", format!("prepared statement \"{name}\" does not exist")))?;
                let (piece, mut types) = (prepared.piece.clone(), prepared.types.clone());
                match piece {
                    Some(Piece::Onehop(mut statement)) => {
                        let count = statement.parameter_count();
                        types.resize(count.max(types.len()), types::TEXT);
                        for oid in &mut types {
                            if *oid == types::UNKNOWN {
                                *oid = types::TEXT;
                            }
                        }
                        self.out.parameter_description(&types);
                        if matches!(*statement, Statement::Query { .. } | Statement::Write { .. }) {
                            statement.bind(&vec![Value::Null; count])?;
                        }
                        let columns = match &*statement {
                            Statement::Query { query, .. } => {
                                Some(onehop_sql::query::columns(&self.engine, Some(&self.principal), query)?)
                            }
                            Statement::Write { statement: write, .. } => {
                                onehop_sql::query::write::returning_columns(&self.engine, Some(&self.principal), write)?
                            }
                            _ => None,
                        };
                        match columns {
                            Some(columns) => {
                                let text = vec![types::TEXT; columns.len()];
                                self.describe_rows(&columns, &text, &vec![false; columns.len()]);
                            }
                            None => self.out.no_data(),
                        }
                    }
                    Some(Piece::Subscribe(plan)) if plan.copy.is_none() => {
                        self.out.parameter_description(&[]);
                        let shape = subscribe::shape(&self.engine, &self.principal, &plan)?;
                        self.describe_rows(&shape.columns, &shape.types, &vec![false; shape.columns.len()]);
                    }
                    Some(Piece::Session(statement)) if matches!(*statement, ast::Statement::ShowVariable { .. }) => {
                        let ast::Statement::ShowVariable { variable } = *statement else { unreachable!("matched") };
                        self.out.parameter_description(&[]);
                        let column = variable.last().map_or(String::new(), |part| part.value.to_ascii_lowercase());
                        self.describe_rows(&[column], &[types::TEXT], &[false]);
                    }
                    _ => {
                        self.out.parameter_description(&types);
                        self.out.no_data();
                    }
                }
            }
            Frontend::Describe { name, .. } => {
                let portal = self
                    .portals
                    .get(&name)
                    .ok_or_else(|| PgError::new("34000", format!("portal \"{name}\" does not exist")))?;
                match &portal.outcome {
                    Some(Outcome::Rows { columns, .. }) => {
                        let (columns, types, binary) = (columns.clone(), portal.types.clone(), portal.binary.clone());
                        self.describe_rows(&columns, &types, &binary);
                    }
                    Some(Outcome::Subscribe(following)) if following.copy.is_none() => {
                        let (columns, binary) = (following.shape.columns.clone(), portal.binary.clone());
                        let types = following.shape.types.clone();
                        self.describe_rows(&columns, &types, &binary);
                    }
                    _ => self.out.no_data(),
                }
            }
            Frontend::Execute { portal: name, max_rows } => {
                let mut portal = self
                    .portals
                    .remove(&name)
                    .ok_or_else(|| PgError::new("34000", format!("portal \"{name}\" does not exist")))?;
                match portal.outcome.take() {
                    None => self.out.empty_query(),
                    Some(Outcome::Rows { columns, rows, verb }) => {
                        let limit = if max_rows > 0 { max_rows as usize } else { usize::MAX };
                        let mut sent = 0;
                        while sent < limit
                            && let Some(row) = portal.rows.pop_front()
                        {
                            let (types, binary) = (portal.types.clone(), portal.binary.clone());
                            self.data_row(&row, &types, &binary);
                            sent += 1;
                        }
                        portal.sent += sent;
                        if portal.rows.is_empty() {
                            self.out.command_complete(&rows_tag(verb.as_deref(), portal.sent as u64));
                            portal.outcome = None;
                        } else {
                            self.out.portal_suspended();
                            portal.outcome = Some(Outcome::Rows { columns, rows, verb });
                            self.portals.insert(name, portal);
                        }
                    }
                    Some(command) => {
                        let (types, binary) = (portal.types.clone(), portal.binary.clone());
                        self.send(command, &types, &binary, false);
                    }
                }
            }
            Frontend::Close { kind, name } => {
                if kind == b'S' {
                    self.statements.remove(&name);
                } else {
                    self.portals.remove(&name);
                }
                self.out.close_complete();
            }
            _ => {}
        }
        Ok(())
    }
}

/// A piece of a query string: one of onehop's statements, or one answered here.
#[derive(Clone)]
enum Piece {
    Onehop(Box<Statement>),
    Session(Box<ast::Statement>),
    Copy(Box<copy::Copy>),
    Subscribe(Box<subscribe::Plan>),
}

/// Whether this module answers `statement` (not onehop's SQL).
fn is_session_statement(statement: &ast::Statement) -> bool {
    match statement {
        ast::Statement::StartTransaction { .. }
        | ast::Statement::Commit { .. }
        | ast::Statement::Rollback { .. }
        | ast::Statement::Savepoint { .. }
        | ast::Statement::ReleaseSavepoint { .. }
        | ast::Statement::Set(_)
        | ast::Statement::Discard { .. }
        | ast::Statement::Deallocate { .. }
        | ast::Statement::Copy { .. } => true,
        ast::Statement::ShowVariable { variable } => {
            let name = variable.iter().map(|part| part.value.to_ascii_lowercase()).collect::<Vec<_>>().join(" ");
            setting_default(&name).is_some()
        }
        _ => false,
    }
}

/// The settings `SHOW` answers when no `SET` changed them.
fn setting_default(name: &str) -> Option<&'static str> {
    Some(match name {
        "server_version" => SERVER_VERSION,
        "server_version_num" => "150000",
        "server_encoding" | "client_encoding" => "UTF8",
        "datestyle" => "ISO, MDY",
        "timezone" => "UTC",
        "integer_datetimes" | "standard_conforming_strings" => "on",
        "transaction isolation level" | "transaction_isolation" | "default_transaction_isolation" => "read committed",
        "search_path" => "\"$user\", public",
        "max_identifier_length" => "63",
        "application_name" => "",
        "extra_float_digits" => "1",
        "lc_collate" | "lc_ctype" => "C",
        _ => return None,
    })
}

/// The types of an outcome's columns, from its values.
/// The tag that ends `rows` rows of a query (`SELECT n`) or of a write, as Postgres spells it:
/// `INSERT 0 n` (the 0 an old object id), `UPDATE n`, `DELETE n`. Drivers read a write's row
/// count from it, with RETURNING or without.
fn rows_tag(verb: Option<&str>, rows: u64) -> String {
    match verb {
        None => format!("SELECT {rows}"),
        Some("INSERT") => format!("INSERT 0 {rows}"),
        Some(verb) => format!("{verb} {rows}"),
    }
}

fn outcome_types(outcome: &Outcome) -> Vec<u32> {
    match outcome {
        Outcome::Rows { columns, rows, .. } | Outcome::CopyOut { columns, rows, .. } => {
            (0..columns.len()).map(|index| types::column_type(rows.iter().filter_map(|row| row.get(index)))).collect()
        }
        Outcome::Subscribe(following) => following.shape.types.clone(),
        Outcome::Command { .. } | Outcome::CopyIn(_) => Vec::new(),
    }
}
