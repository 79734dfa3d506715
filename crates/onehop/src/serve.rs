//! `onehop serve`: lock the data directory, recover the log, serve, and shut down cleanly.

use std::sync::Arc;

use anyhow::{Context, bail};
use onehop_engine::{Engine, EngineOptions, set_system_recovery};
use onehop_log::{DirLock, Log, LogOptions, RecoveryPolicy};
use onehop_server::http::origin::AllowedOrigins;
use onehop_server::kafka::{KAFKA_REQUEST_ENVELOPE_BYTES, KafkaConfig, KafkaListener, KafkaServer};
use onehop_server::mqtt::{Broker, MqttConfig, max_packet_bytes_for, serve_mqtt, serve_mqtt_tls};
use onehop_server::{AppState, HttpConfig, install_metrics, serve_http};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing_subscriber::EnvFilter;

use crate::cli::ServeArgs;
use crate::settings::Settings;

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    // openraft logs a peer it cannot reach as an error, which in a cluster is routine (a node
    // restarting); onehop logs the cluster's own events (`cluster::watch`). A filter that names
    // openraft shows its lines again.
    let log_filter = match settings.log_filter.contains("openraft") {
        true => settings.log_filter.clone(),
        false => format!("{},openraft=off", settings.log_filter),
    };
    let filter =
        EnvFilter::try_new(&log_filter).with_context(|| format!("bad log filter {:?}", settings.log_filter))?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("onehop-worker")
        .build()
        .context("starting the runtime")?;
    runtime.block_on(serve(settings))
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    // Installed first, so a signal that arrives during start-up still means a clean stop.
    let shutdown = shutdown_signal().context("installing SIGINT/SIGTERM handlers")?;
    // Held until the process exits; a second server on the same directory is refused here.
    let lock = DirLock::acquire(&settings.data_dir)?;
    tracing::info!(
        data_dir = %settings.data_dir.display(),
        config_file = ?settings.config_file,
        durability = %settings.stream_defaults.durability,
        "starting onehop"
    );
    let metrics = install_metrics().map_err(anyhow::Error::msg)?;
    if settings.cluster.is_some() {
        let data_dir = settings.data_dir.clone();
        tokio::task::spawn_blocking(move || crate::cluster::install_pending_snapshot(&data_dir))
            .await
            .context("snapshot install thread")??;
    }
    let log_dir = settings.data_dir.join("log");
    let options = log_options(&settings);
    let (log, opened) = tokio::task::spawn_blocking(move || Log::open(log_dir, options))
        .await
        .context("log recovery thread")?
        .context("opening the log")?;
    let truncated: u64 = opened.iter().map(|partition| partition.recovery.truncated_bytes).sum();
    tracing::info!(partitions = opened.len(), truncated_bytes = truncated, "log recovered");
    for discarded in opened.iter().flat_map(|partition| &partition.recovery.discarded) {
        tracing::warn!(
            segment = %discarded.segment.display(), copy = %discarded.copy.display(),
            offsets = ?discarded.offsets, "damaged bytes were set aside; the original file is kept as the copy"
        );
    }
    let log = Arc::new(log);
    let options = EngineOptions {
        stream_defaults: settings.stream_defaults.clone(),
        default_partitions: 1,
        auto_create: settings.auto_create,
        subscriber_queue_capacity: settings.subscriber_queue,
        empty_first_level_stream: settings.mqtt_empty_first_level_stream.clone(),
        cluster_node: settings.cluster.is_some(),
        idempotency_window: settings.idempotency_window,
        idempotency_keys_max: settings.idempotency_keys_max,
        query_memory_bytes_max: settings.query_memory_max,
        query_time_max: settings.query_time_max,
        query_stream_records_max: settings.query_stream_records_max,
        checkpoint_interval: settings.checkpoint_interval,
    };
    let engine = {
        let log = log.clone();
        tokio::task::spawn_blocking(move || Engine::open(log, options))
            .await
            .context("catalog replay thread")?
            .context("opening the catalog")?
    };
    let engine = Arc::new(engine);
    let orphans = engine.orphans();
    if !orphans.is_empty() {
        tracing::error!(
            ?orphans,
            "topics with data that the catalog neither defines nor dropped are kept, not served; define each \
             again (CREATE STREAM / CREATE TABLE, or the schema file) to take its data back"
        );
    }
    let cluster = match &settings.cluster {
        Some(cluster) => Some(crate::cluster::start(cluster, &settings.data_dir, &engine).await?),
        None => None,
    };
    if let Some((name, password)) = &settings.admin
        && bootstrap_superuser(&engine, name, password).await?
    {
        tracing::info!(user = name, "first superuser created (ADMIN ON ALL): every client must now log in");
    }
    refuse_open_listeners(&engine, &settings)?;
    if let Some(schema) = &settings.schema {
        apply_schema(&engine, schema).await?;
    }
    if let Some(jwt) = &settings.jwt {
        if !engine.access().enabled() {
            bail!(
                "jwt_keys is set but no user is defined, so access is off and tokens would not be checked: create \
                 the first user (--admin-user NAME with {} set), then the roles and grants the tokens name",
                crate::settings::ADMIN_PASSWORD_ENV
            );
        }
        let verifier = jwt.load()?;
        tracing::info!(keys = verifier.key_count(), file = %jwt.keys.display(), "JWTs signed by these keys are accepted");
        engine.access().set_jwt(Some(Arc::new(verifier)));
    }
    let listener = tokio::net::TcpListener::bind(settings.http_addr)
        .await
        .with_context(|| format!("cannot listen on {}", settings.http_addr))?;
    let address = listener.local_addr()?;
    if !address.ip().is_loopback() {
        tracing::warn!(%address, "listening on a non-loopback address: reachable from other machines");
    }
    let mqtt_listener = tokio::net::TcpListener::bind(settings.mqtt_addr)
        .await
        .with_context(|| format!("cannot listen for MQTT on {}", settings.mqtt_addr))?;
    let mqtt_address = mqtt_listener.local_addr()?;
    if !mqtt_address.ip().is_loopback() {
        tracing::warn!(address = %mqtt_address, "MQTT is listening on a non-loopback address: reachable from other machines");
    }
    tracing::info!(address = %mqtt_address, "listening on mqtt://{mqtt_address}");
    let kafka_listener = match settings.kafka_addr {
        None => {
            tracing::info!("the Kafka listener is off (kafka_addr = \"off\")");
            None
        }
        Some(address) => {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen for Kafka on {address} (kafka_addr \"off\" turns it off)"))?;
            let address = listener.local_addr()?;
            if !address.ip().is_loopback() {
                tracing::warn!(%address, "Kafka is listening on a non-loopback address: reachable from other machines");
            }
            tracing::info!(%address, "listening on kafka://{address}");
            Some(listener)
        }
    };
    let pg_listener = match settings.pg_addr {
        None => {
            tracing::info!("the Postgres listener is off (pg_addr = \"off\")");
            None
        }
        Some((address, chosen)) => match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => {
                let address = listener.local_addr()?;
                if !address.ip().is_loopback() {
                    tracing::warn!(%address, "Postgres is listening on a non-loopback address: reachable from other machines");
                }
                tracing::info!(%address, "listening on postgres://{address}");
                Some(listener)
            }
            Err(failure) if !chosen => {
                tracing::warn!(%address, reason = %failure, "the Postgres listener is off: its default address is taken (a \
                    Postgres running here?); choose one with --pg-addr");
                None
            }
            Err(error) => {
                return Err(error).with_context(|| {
                    format!("cannot listen for Postgres on {address} (pg_addr \"off\" turns it off)")
                });
            }
        },
    };
    let tls = match &settings.tls {
        Some(files) => {
            let tls = onehop_server::tls::Tls::open(files.clone()).context("TLS")?;
            if let Some(client_ca) = &files.client_ca {
                tracing::info!(
                    client_ca = %client_ca.display(),
                    required = files.client_cert_required,
                    "TLS clients may log in with a certificate these CAs signed, as the user its common name is"
                );
            }
            Some(tls)
        }
        None => None,
    };
    let https_listener = match (settings.https_addr, &tls) {
        (Some(https_address), Some(tls)) => {
            let listener = tokio::net::TcpListener::bind(https_address)
                .await
                .with_context(|| format!("cannot listen for HTTPS on {https_address}"))?;
            let https_address = listener.local_addr()?;
            tracing::info!(address = %https_address, cert = %tls.files().cert.display(), "listening on https://{https_address}");
            Some((listener, tls.clone()))
        }
        _ => None,
    };
    let mqtt_tls = match (settings.mqtt_tls_addr, &tls) {
        (Some(tls_address), Some(tls)) => {
            let tls = tls.clone();
            let listener = tokio::net::TcpListener::bind(tls_address)
                .await
                .with_context(|| format!("cannot listen for MQTT over TLS on {tls_address}"))?;
            let tls_address = listener.local_addr()?;
            tracing::info!(address = %tls_address, cert = %tls.files().cert.display(), "listening on mqtts://{tls_address}");
            Some((listener, tls))
        }
        _ => None,
    };
    tracing::info!(%address, "listening on http://{address}");
    // One signal stops both listeners.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stopped| *stopped).await;
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let idempotency =
        tokio::spawn(onehop_engine::idempotency::Idempotency::keep_checkpointed(engine.clone(), stopped.clone()));
    let mqtt_config = MqttConfig {
        connections_max: settings.connections_max,
        subscriptions_max: settings.mqtt_subscriptions_max,
        // A message is one record: the packet may add its topic and properties.
        max_packet_bytes: max_packet_bytes_for(settings.stream_defaults.record_bytes_max),
        ..MqttConfig::default()
    };
    let broker = Broker::open(engine.clone(), mqtt_config).await.context("opening the MQTT broker")?;
    let mqtt = tokio::spawn(serve_mqtt(mqtt_listener, broker.clone(), until_stopped(stopped.clone())));
    reload_on_hangup(tls.clone(), settings.jwt.clone(), engine.clone())?;
    let mqtt_tls = mqtt_tls.map(|(listener, tls)| {
        tokio::spawn(serve_mqtt_tls(listener, broker.clone(), tls, until_stopped(stopped.clone())))
    });
    let kafka = match kafka_listener {
        None => None,
        Some(listener) => {
            let mut endpoint = KafkaListener::at(listener.local_addr()?);
            if settings.kafka_tls {
                endpoint.tls = tls.clone();
            }
            if let Some((host, port)) = &settings.kafka_advertised_addr {
                (endpoint.advertised_host, endpoint.advertised_port) = (host.clone(), *port);
                tracing::info!(host, port, "Kafka clients are told to connect to {host}:{port}");
            }
            let mut listeners = vec![(listener, endpoint)];
            if let (Some(address), Some(tls)) = (settings.kafka_tls_addr, &tls) {
                let listener = tokio::net::TcpListener::bind(address)
                    .await
                    .with_context(|| format!("cannot listen for Kafka over TLS on {address}"))?;
                let address = listener.local_addr()?;
                tracing::info!(%address, cert = %tls.files().cert.display(), "listening on kafkas://{address}");
                let mut endpoint = KafkaListener::at(address);
                endpoint.tls = Some(tls.clone());
                if let Some((host, port)) = &settings.kafka_tls_advertised_addr {
                    (endpoint.advertised_host, endpoint.advertised_port) = (host.clone(), *port);
                    tracing::info!(host, port, "Kafka clients over TLS are told to connect to {host}:{port}");
                }
                listeners.push((listener, endpoint));
            }
            let mut config = KafkaConfig::new();
            config.connections_max = settings.connections_max;
            config.idle_timeout = settings.kafka_idle_timeout;
            config.authentication_timeout = settings.kafka_authentication_timeout;
            // A produce request carries batches for many partitions, each at most the largest
            // batch: Kafka's 100 MiB (socket.request.max.bytes), or room for one largest batch
            // and its framing when that is more. Each batch is then checked on its own.
            config.request_bytes_max =
                config.request_bytes_max.max(settings.stream_defaults.batch_bytes_max + KAFKA_REQUEST_ENVELOPE_BYTES);
            if let Some(cluster) = &settings.cluster {
                config.node_id = i32::try_from(cluster.node_id).context("a node id above 2147483647")?;
            }
            let server = KafkaServer::open(engine.clone(), config).await.context("opening the Kafka front end")?;
            if let Some(node) = &cluster {
                // The other nodes tell their Kafka clients where this one is.
                let advertised = |tls: bool| {
                    listeners
                        .iter()
                        .find(|(_, endpoint)| endpoint.tls.is_some() == tls)
                        .map(|(_, endpoint)| (endpoint.advertised_host.clone(), endpoint.advertised_port))
                };
                let info = crate::cluster::NodeInfo { kafka: advertised(false), kafka_tls: advertised(true) };
                node.set_info(bytes::Bytes::from(serde_json::to_vec(&info).expect("node info serializes")));
                // Before clients can reach this node: the others then never send them to the
                // address it had before a restart.
                node.announce().await;
                server.set_cluster(Arc::new(crate::cluster::KafkaView(node.clone())));
            }
            Some(tokio::spawn(server.serve(listeners, until_stopped(stopped.clone()))))
        }
    };
    let pg = pg_listener.map(|listener| {
        let config = onehop_server::pg::PgConfig {
            connections_max: settings.connections_max,
            tls: tls.clone(),
            idle_timeout: settings.pg_idle_timeout,
        };
        tokio::spawn(onehop_server::pg::serve(listener, engine.clone(), config, until_stopped(stopped.clone())))
    });
    let mut state = AppState::new(engine.clone(), Some(metrics));
    state.subscriptions_per_socket_max = settings.subscriptions_per_socket_max;
    state.mqtt = Some(broker);
    state.cluster = cluster
        .clone()
        .map(|node| Arc::new(crate::cluster::Status(node)) as Arc<dyn onehop_server::http::ClusterStatus>);
    state.allowed_origins = Arc::new(allowed_origins(&settings));
    if let Some(dir) = &settings.static_dir {
        let files = onehop_server::http::files::StaticFiles::new(dir)
            .with_context(|| format!("static_dir {}: the directory of files to serve", dir.display()))?;
        tracing::info!(static_dir = %files.root().display(), "serving its files where no route is, to anyone");
        state.files = Some(Arc::new(files));
    }
    let bodies = onehop_server::http::body::BodyBudget::new(settings.http_body_bytes_in_flight_max);
    state.bodies = Arc::new(bodies.releasing_with(crate::release_free_memory));
    state.body_read_timeout = settings.http_body_read_timeout;
    let http = HttpConfig {
        connections_max: settings.connections_max,
        header_read_timeout: settings.http_header_read_timeout,
        idle_timeout: settings.http_idle_timeout,
        shutdown_timeout: settings.shutdown_timeout,
        tls: None,
    };
    let https = https_listener.map(|(listener, tls)| {
        let https = HttpConfig { tls: Some(tls), ..http.clone() };
        tokio::spawn(serve_http(listener, state.clone(), https, until_stopped(stopped.clone())))
    });
    serve_http(listener, state, http, until_stopped(stopped)).await.context("HTTP server")?;
    if let Some(https) = https {
        https.await.context("HTTPS listener task")?.context("HTTPS server")?;
    }
    mqtt.await.context("MQTT listener task")?.context("MQTT server")?;
    if let Some(mqtt_tls) = mqtt_tls {
        mqtt_tls.await.context("MQTT over TLS listener task")?.context("MQTT over TLS server")?;
    }
    if let Some(kafka) = kafka {
        kafka.await.context("Kafka listener task")?.context("Kafka server")?;
    }
    if let Some(pg) = pg {
        pg.await.context("Postgres listener task")?;
    }
    // The idempotency keys' last checkpoint, so that the next start reads on little.
    idempotency.await.context("idempotency checkpoint task")?;
    // No new requests now; close the log: queued appends are written and synced and each
    // active segment's index is written, so the next start needs no tail scan.
    tracing::info!("shutting down: checkpointing views, flushing the log");
    if let Some(node) = cluster
        && let Err(error) = node.shutdown().await
    {
        tracing::warn!(%error, "stopping the cluster node");
    }
    engine.stop_derived().await;
    drop(engine);
    tokio::task::spawn_blocking(move || log.close()).await.context("closing the log")?;
    drop(lock);
    tracing::info!("stopped cleanly");
    Ok(())
}

/// The log's settings, with the recovery policies: damage stops the start unless
/// `--discard-damaged`; the catalog's tail is never cut on a guess, unless `--recover-catalog`.
fn log_options(settings: &Settings) -> LogOptions {
    let mut options = LogOptions {
        maintenance_interval: settings.maintenance_interval,
        recovery: RecoveryPolicy {
            discard_damaged: settings.discard_damaged,
            remedy: "restore the data directory from a backup, or start once with --discard-damaged to accept \
                     the loss: damaged bytes are set aside (a copy of the file is kept beside it), every valid \
                     batch is kept, and no lost offset is given out again. `onehop check --data-dir DIR` (read-only) \
                     lists every damaged batch and missing segment"
                .into(),
            ..RecoveryPolicy::default()
        },
        journal: settings.log_journal.then(onehop_log::JournalOptions::default),
        ..LogOptions::default()
    };
    set_system_recovery(&mut options, settings.recover_catalog);
    options
}

/// The allow-list of other origins, said at start; allowing every origin is worth a warning.
fn allowed_origins(settings: &Settings) -> AllowedOrigins {
    let allowed = settings.allowed_origins.clone();
    match &allowed {
        AllowedOrigins::Any => tracing::warn!(
            "allowed_origins is \"*\": any web page a user opens can read and write here through the user's browser"
        ),
        _ if allowed.is_none() => {
            tracing::info!("browser pages from other origins are refused; allowed_origins lists those to let in")
        }
        _ => tracing::info!(allowed_origins = %allowed, "browser pages from these origins may use the server"),
    }
    allowed
}

/// Reads the TLS certificate and key, and the JWT keys, again on every SIGHUP (a renewed
/// certificate, rotated signing keys): new connections get the new certificate, open ones keep
/// theirs; tokens are checked with the new keys from then on. Files that cannot be used leave
/// the ones in force, and the log says why.
fn reload_on_hangup(
    tls: Option<onehop_server::tls::Tls>,
    jwt: Option<crate::settings::JwtConfig>,
    engine: Arc<Engine>,
) -> anyhow::Result<()> {
    if tls.is_none() && jwt.is_none() {
        return Ok(());
    }
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => tracing::info!(cert = %tls.files().cert.display(), "SIGHUP: TLS certificate read again"),
                    Err(error) => {
                        tracing::error!(%error, "SIGHUP: the TLS certificate could not be read; the one in force stays")
                    }
                }
            }
            if let Some(jwt) = &jwt {
                match jwt.load() {
                    Ok(verifier) => {
                        tracing::info!(keys = verifier.key_count(), file = %jwt.keys.display(), "SIGHUP: JWT keys read again");
                        engine.access().set_jwt(Some(Arc::new(verifier)));
                    }
                    Err(error) => {
                        tracing::error!(%error, "SIGHUP: the JWT keys could not be read; the ones in force stay")
                    }
                }
            }
        }
    });
    Ok(())
}

/// Refuses to listen beyond loopback while no user is defined (anyone reaching the port could
/// read and write everything), unless the operator said `insecure_listen`.
fn refuse_open_listeners(engine: &Engine, settings: &Settings) -> anyhow::Result<()> {
    if engine.access().enabled() {
        tracing::info!(users = engine.access().defs().users.len(), "access is on: clients log in");
        return Ok(());
    }
    let open: Vec<String> = [
        Some(settings.http_addr),
        Some(settings.mqtt_addr),
        settings.kafka_addr,
        settings.pg_addr.map(|(address, _)| address),
        settings.mqtt_tls_addr,
        settings.https_addr,
        settings.kafka_tls_addr,
    ]
    .into_iter()
    .flatten()
    .filter(|address| !address.ip().is_loopback())
    .map(|address| address.to_string())
    .collect();
    if open.is_empty() {
        return Ok(());
    }
    if settings.insecure_listen {
        tracing::warn!(
            addresses = ?open,
            "no user is defined and insecure_listen is on: anyone who can reach these addresses can read and write \
             everything"
        );
        return Ok(());
    }
    bail!(
        "refusing to listen on {} with no user defined: anyone who can reach it could read and write everything. \
         Create the first user (--admin-user NAME with {} set), or listen on 127.0.0.1 only, or pass \
         --insecure-listen to accept this",
        open.join(", "),
        crate::settings::ADMIN_PASSWORD_ENV
    )
}

/// Applies the statements of `path` before the server listens; any failure stops the start.
/// Creates the first superuser from the settings, unless it exists. A cluster node creates it
/// through the cluster, once for every node, which takes a majority of the nodes: it waits for
/// one, saying so every few seconds, and opens no listener before (access would be off).
async fn bootstrap_superuser(engine: &Engine, name: &str, password: &str) -> anyhow::Result<bool> {
    let started = std::time::Instant::now();
    loop {
        match engine.bootstrap_superuser(name, password).await {
            Ok(created) => return Ok(created),
            Err(error) if engine.is_replicated() && error.kind() == onehop_engine::ErrorKind::Unavailable => {
                tracing::warn!(
                    %error,
                    waited_s = started.elapsed().as_secs(),
                    "waiting for the cluster to create the first superuser; no listener opens before"
                );
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(error) => return Err(error).context("creating the first superuser"),
        }
    }
}

async fn apply_schema(engine: &Engine, path: &std::path::Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading schema {}", path.display()))?;
    let statements = onehop_sql::parse(&text).with_context(|| format!("schema {}", path.display()))?;
    for statement in &statements {
        let output = onehop_sql::execute(engine, statement)
            .await
            .with_context(|| format!("schema {}: {}", path.display(), statement.label()))?;
        tracing::info!(schema = %path.display(), ?output, "schema statement applied");
    }
    Ok(())
}

/// A future that resolves on the first SIGINT or SIGTERM; the handlers are installed at once.
///
/// After it, a second signal exits the process at once, without the orderly stop. Nothing
/// acknowledged is lost by that: an `fsync` write is acknowledged after its fdatasync, an
/// `async` one once written to the page cache, which outlives the process; what the orderly
/// stop adds (segment indexes, view checkpoints) the next start rebuilds from the log.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        let (name, _) = next_signal(&mut interrupt, &mut terminate).await;
        tracing::info!(signal = name, "shutdown requested");
        tokio::spawn(async move {
            let (name, number) = next_signal(&mut interrupt, &mut terminate).await;
            tracing::warn!(
                signal = name,
                "second signal: exiting at once, without the orderly stop; acknowledged writes are already durable"
            );
            // The status a shell reports for a process the signal ended.
            std::process::exit(128 + number);
        });
    })
}

/// The next SIGINT or SIGTERM: its name and number.
async fn next_signal(interrupt: &mut Signal, terminate: &mut Signal) -> (&'static str, i32) {
    tokio::select! {
        _ = interrupt.recv() => ("SIGINT", 2),
        _ = terminate.recv() => ("SIGTERM", 15),
    }
}
