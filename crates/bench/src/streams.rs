//! `onehop bench streams`: study 5 (../shared/BENCHMARKS.md), stream processing against Kafka
//! Streams 4.1, exactly once and at least once, side by side in one invocation.
//!
//! Both sides get the same input from the same program (the peers' glue, `onehop-peer-glue
//! streams`): an open-loop Kafka producer at the scenario's rate, and one latency consumer of
//! the outputs (read_committed for `eos`) that times each output from the moment the input
//! record that made it was due, on its own clock. onehop is fed and read through its Kafka
//! listener, each scenario defined as SQL (transforms, and a view whose change stream is the
//! output), durable at `fsync`; Kafka Streams runs as its own JVM application
//! (`bench/baselines/streams`, `S5Streams`) on the `kafka` target's brokers (three, RF 3, min
//! ISR 2). The harness reads the target's CPU over the measured window and its resident memory,
//! the brokers' apart, and writes summary.md, meta.json, one CDF plot per scenario and mode,
//! and the peers' logs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::client::http1::KeepAlive;
use crate::host::{HostSummary, HostUsage};
use crate::plot::{Chart, Series};
use crate::run::rss_mb;
use crate::server::ServerProcess;
use crate::target::cluster;
use crate::target::peers::kafka::{JVM_OPTIONS, KafkaTarget};
use crate::target::peers::{PeerProcess, installed, system_program, version_of};
use crate::target::{Target, TargetOptions};

pub const TARGETS: [&str; 3] = ["onehop", "onehop-cluster", "kafka-streams"];
pub const SCENARIOS: [&str; 4] = ["a", "b", "c", "d"];
pub const MODES: [&str; 2] = ["eos", "alo"];

/// Partitions of every input and output topic, as scenario A's 12.
const PARTITIONS: u32 = 12;
/// Distinct record keys of the input.
const KEYS: u32 = 10_000;
/// Scenario B's vocabulary.
const WORDS: u32 = 1_000;
/// Scenario C's inputs and outputs, in the glue's order (the topic names end with them).
const ROUTING_INPUTS: [&str; 4] = ["users", "products", "orders", "clicks"];
const ROUTING_OUTPUTS: [&str; 4] = ["high", "medium", "low", "customers"];
/// Scenario D's inputs, in the glue's order.
const JOIN_INPUTS: [&str; 5] = ["customers", "products", "orders", "shipments", "reviews"];
/// Scenario D's customers and products at the study's full rate; a row at a fraction of the
/// rate has that fraction of them (1 000 and 500 at ¼), so that a run holds as many orders per
/// customer and product at every rate.
const JOIN_CUSTOMERS: f64 = 4_000.0;
const JOIN_PRODUCTS: f64 = 2_000.0;
/// Kafka Streams' settings the study leaves out, pinned: the study's commit interval; stream
/// threads one per core of this machine; the record cache off, so that every changed count goes
/// downstream (the scenario emits every change). Its producer's linger is an option
/// (`StreamsOptions::ks_linger_ms`).
const KS_COMMIT_INTERVAL_MS: u32 = 100;
const KS_THREADS: u32 = 2;
const KS_CACHE_BYTES: u64 = 0;
/// Heap of the application's JVM.
const KS_HEAP: &str = "1g";
const KS_MAIN_CLASS: &str = "dev.onehop.bench.S5Streams";
/// How long an application may take from start to RUNNING.
const KS_READY_TIMEOUT: Duration = Duration::from_secs(240);

pub struct StreamsOptions {
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub targets: Vec<String>,
    pub scenarios: Vec<String>,
    pub modes: Vec<String>,
    /// Fractions of the study's rates, one row each (0.25: the standard row here).
    pub scales: Vec<f64>,
    pub warmup: Duration,
    pub measure: Duration,
    pub kafka_brokers: u32,
    /// Kafka Streams' producer linger.ms (0: each output sent at once; Kafka Streams' own default is 100).
    pub ks_linger_ms: u32,
    /// Kill the processing side (onehop's server, Kafka Streams' app) with SIGKILL in the middle
    /// of each measured window and start it again on its data.
    pub kill: bool,
    pub out: PathBuf,
    pub json: bool,
}

/// The study's input rate of a scenario, records per second.
fn study_rate(scenario: &str) -> f64 {
    match scenario {
        "a" => 20_000.0,
        "b" => 7_500.0,
        "c" => 7_000.0,
        _ => 300.0,
    }
}

/// Published figures (ms, p50 / p95 / p99; CPU cores; container MB): Kafka Streams, then the
/// challenger.
fn published(scenario: &str, mode: &str) -> &'static str {
    match (scenario, mode) {
        ("a", "eos") => "KS 100 / 164 / 180 ms, 1.3 cores, 432 MB; challenger 124 / 192 / 202 ms, 1.3 cores, 504 MB",
        ("a", _) => "KS 45 / 65 / 75 ms, 1.2 cores, 430 MB; challenger 42 / 62 / 72 ms, 1.2 cores, 657 MB",
        ("b", "eos") => {
            "KS 155 / 197 / 215 ms, 3.0 cores, 1 769 MB; challenger 121 / 192 / 202 ms, 2.2 cores, 1 219 MB"
        }
        ("b", _) => "KS 40 / 65 / 72 ms, 3.5 cores, 2 278 MB; challenger 39 / 54 / 62 ms, 1.8 cores, 2 323 MB",
        ("c", "eos") => "KS 218 / 338 / 414 ms, 2.3 cores, 1 252 MB; challenger 116 / 181 / 197 ms, 1.0 cores, 518 MB",
        ("c", _) => "KS 50 / 79 / 92 ms, 2.6 cores, 1 654 MB; challenger 37 / 52 / 61 ms, 1.1 cores, 506 MB",
        ("d", "eos") => {
            "KS 1 595 / 2 915 / 3 298 ms, 4.3 cores, 8 667 MB; challenger 144 / 214 / 243 ms, 2.9 cores, 1 105 MB"
        }
        _ => "KS 268 / 563 / 704 ms, 6.8 cores, 7 932 MB; challenger 40 / 55 / 63 ms, 2.0 cores, 1 802 MB",
    }
}

fn topology(scenario: &str) -> &'static str {
    match scenario {
        "a" => {
            "stateless: upper-case each 1 KB text value, keep those longer than 5 characters (one input in ten is 1–5 letters)"
        }
        "b" => {
            "word count: split each sentence (50–1 000 B, about 200) into words on spaces, count per word over a 1 000-word vocabulary, emit every changed count"
        }
        "d" => {
            "joins over five inputs of JSON objects of 2–50 KB (log-uniform; JSON in place of the study's Avro, of the same sizes): \
             customers and products first (4 000 and 2 000 times the rate's fraction of the study's: 1 000 and 500 at ×0.25), then customer and product versions, new orders, shipments and new reviews at \
             2 : 3 : 20 : 15 : 10 of the rate (the study's 12 + 18 + 120 + 90 + 60), every order of a customer and a product that \
             exist (every FK lookup hits), a shipment for three orders in four (the oldest unshipped, keyed by its order); one \
             enriched record per order, kept as any input changes: orders ⟕ shipments (PK) ⋈ customers (FK order→customer) ⋈ \
             products (FK order→product) ⟕ each product's review summary (FK review→product: count, average stars, the reviews in \
             id order, each with its author's name through FK review→customer)"
        }
        _ => {
            "routing over four inputs of JSON objects of 2–30 KB (log-uniform; JSON in place of the study's Protobuf, of the same sizes), \
             user events, product updates, orders and clicks at 3 : 2 : 1 : 4 of the rate (the study's 2 100 + 1 400 + 700 + 2 800). \
             Path A merges user events and product updates, splits each into its 1–4 tags (one output per tag, {seq, kind, tag, priority}, \
             keyed by the tag) and routes them by priority (high 1 in 10, medium 2, low 7) into three outputs; path B keeps orders not \
             cancelled (9 in 10) and clicks not by bots (4 in 5), merges them and re-keys each record, whole, by its customer into one output"
        }
    }
}

/// onehop's definition of a scenario: its statements, the topics its input is written to and
/// the topics its output is read from (comma-separated, in the glue's order).
struct Definition {
    statements: String,
    inputs: String,
    outputs: String,
}

fn onehop_sql(scenario: &str) -> Definition {
    let (statements, inputs, outputs) = match scenario {
        "a" => (
            format!(
                "CREATE STREAM s5a_in WITH (partitions = {PARTITIONS});\n\
                 CREATE STREAM s5a_out WITH (partitions = {PARTITIONS}, value_format = 'text') AS\n  \
                 SELECT UPPER(value) AS line FROM s5a_in WHERE LENGTH(value) > 5;"
            ),
            "s5a_in".to_string(),
            "s5a_out".to_string(),
        ),
        "c" => {
            let mut statements = String::new();
            for input in ROUTING_INPUTS {
                statements.push_str(&format!("CREATE STREAM s5c_{input} WITH (partitions = {PARTITIONS});\n"));
            }
            // Path A: one merged, re-keyed stream of tags, then one transform per priority.
            statements.push_str(&format!(
                "CREATE STREAM s5c_tagged WITH (partitions = {PARTITIONS}) AS\n  \
                 SELECT seq, kind, tag, priority, tag AS _key FROM s5c_users CROSS JOIN UNNEST(tags) AS tag\n  \
                 UNION ALL\n  \
                 SELECT seq, kind, tag, priority, tag AS _key FROM s5c_products CROSS JOIN UNNEST(tags) AS tag;\n"
            ));
            for priority in &ROUTING_OUTPUTS[..3] {
                statements.push_str(&format!(
                    "CREATE STREAM s5c_{priority} WITH (partitions = {PARTITIONS}) AS\n  \
                     SELECT * FROM s5c_tagged WHERE priority = '{priority}';\n"
                ));
            }
            // Path B: the records themselves, filtered, merged and re-keyed.
            statements.push_str(&format!(
                "CREATE STREAM s5c_customers WITH (partitions = {PARTITIONS}, value_format = 'text') AS\n  \
                 SELECT value AS record, customer AS _key FROM s5c_orders WHERE status <> 'cancelled'\n  \
                 UNION ALL\n  \
                 SELECT value, customer AS _key FROM s5c_clicks WHERE NOT bot;"
            ));
            let names = |names: &[&str]| names.iter().map(|name| format!("s5c_{name}")).collect::<Vec<_>>().join(",");
            (statements, names(&ROUTING_INPUTS), names(&ROUTING_OUTPUTS))
        }
        "d" => {
            let mut statements = String::new();
            for input in JOIN_INPUTS {
                statements.push_str(&format!(
                    "CREATE STREAM s5d_{input} WITH (partitions = {PARTITIONS}, cleanup = 'compact');\n"
                ));
            }
            // Compacted streams read as tables: each key's newest record is a row, its key the
            // column `key`. Every join is on a row's key, so there is one row per order.
            statements.push_str(
                "CREATE VIEW s5d_review_summaries AS\n  \
                 SELECT r.product, COUNT(*) AS reviews, AVG(r.stars) AS rating, MAX(r.seq) AS review_seq,\n    \
                 JSON_AGG(JSON_BUILD_OBJECT('id', r.key, 'seq', r.seq, 'stars', r.stars, 'author', c.name) ORDER BY r.key) AS latest\n  \
                 FROM s5d_reviews r JOIN s5d_customers c ON c.key = r.customer\n  \
                 GROUP BY r.product;\n\
                 CREATE VIEW s5d_enriched AS\n  \
                 SELECT o.key AS order_id, o.seq AS order_seq, o.amount, o.customer, c.seq AS customer_seq, c.name, c.tier,\n    \
                 o.product, p.seq AS product_seq, p.title, p.price, s.seq AS shipment_seq, s.carrier, s.status,\n    \
                 r.reviews, r.rating, r.review_seq, r.latest\n  \
                 FROM s5d_orders o\n  \
                 JOIN s5d_customers c ON c.key = o.customer\n  \
                 JOIN s5d_products p ON p.key = o.product\n  \
                 LEFT JOIN s5d_shipments s ON s.key = o.key\n  \
                 LEFT JOIN s5d_review_summaries r ON r.product = o.product;",
            );
            let inputs = JOIN_INPUTS.iter().map(|name| format!("s5d_{name}")).collect::<Vec<_>>().join(",");
            (statements, inputs, "__view.s5d_enriched".to_string())
        }
        _ => (
            format!(
                "CREATE STREAM s5b_in WITH (partitions = {PARTITIONS});\n\
                 CREATE STREAM s5b_words WITH (partitions = {PARTITIONS}) AS\n  \
                 SELECT word AS _key, word FROM s5b_in CROSS JOIN UNNEST(SPLIT(value, ' ')) AS w(word)\n  \
                 WHERE LENGTH(word) > 0;\n\
                 CREATE VIEW s5b_counts AS SELECT word, COUNT(*) AS count FROM s5b_words GROUP BY word;"
            ),
            "s5b_in".to_string(),
            "__view.s5b_counts".to_string(),
        ),
    };
    Definition { statements, inputs, outputs }
}

/// One run's figures: the glue's line, and what the harness measured of the processes.
struct RunResult {
    target: String,
    scenario: String,
    mode: String,
    scale: f64,
    glue: Value,
    /// The processing side: onehop's server, or Kafka Streams' application.
    usage: HostSummary,
    rss_mb: Option<f64>,
    /// Kafka Streams' brokers, apart.
    brokers_cores: Option<f64>,
    brokers_rss_mb: Option<f64>,
    driver_cores: Option<f64>,
}

pub fn run(options: &StreamsOptions) -> anyhow::Result<()> {
    check(&options.targets, &TARGETS, "target")?;
    check(&options.scenarios, &SCENARIOS, "scenario")?;
    check(&options.modes, &MODES, "mode")?;
    if options.scales.iter().any(|scale| !scale.is_finite() || *scale <= 0.0) {
        bail!("--scales are fractions of the study's rates, above 0");
    }
    let glue = installed("bin/onehop-peer-glue", "kafka")?;
    std::fs::create_dir_all(&options.out)?;
    let logs = options.out.join("peer-logs");
    std::fs::create_dir_all(&logs)?;
    let mut kafka: Option<KafkaTarget> = None;
    let mut results = Vec::new();
    let runs = options.targets.len() * options.scenarios.len() * options.modes.len() * options.scales.len();
    let mut index = 0;
    for scale in &options.scales {
        for scenario in &options.scenarios {
            for mode in &options.modes {
                for target in &options.targets {
                    index += 1;
                    let rate = study_rate(scenario) * scale;
                    eprintln!(
                        "bench streams: run {index} of {runs}: {target}, scenario {scenario}, {mode}, {rate:.0} records/s \
                         ({:.0} s warm-up, {:.0} s measured)",
                        options.warmup.as_secs_f64(),
                        options.measure.as_secs_f64()
                    );
                    let run = Run { options, glue: &glue, logs: &logs, scenario, mode, rate, scale: *scale };
                    let result = match target.as_str() {
                        "onehop" => run.onehop()?,
                        "onehop-cluster" => run.onehop_cluster()?,
                        _ => {
                            if kafka.is_none() {
                                eprintln!("bench streams: starting {} Kafka broker(s)", options.kafka_brokers);
                                kafka = Some(start_kafka(options, &logs)?);
                            }
                            run.kafka_streams(kafka.as_ref().expect("started"))?
                        }
                    };
                    eprintln!("bench streams: {}", describe(&result));
                    results.push(result);
                }
            }
        }
    }
    let kafka_settings = kafka.as_ref().map(|kafka| kafka.settings());
    drop(kafka);
    write_report(options, &results, kafka_settings)?;
    // An output lost, doubled or not made by the input fails the run, on either side (a
    // doubled one is allowed only to Kafka Streams at least once through a kill): the smoke
    // run in CI stands on it.
    let wrong: Vec<String> = results
        .iter()
        .filter(|r| {
            // At least once allows an output twice after a crash, and a count that counts the
            // replayed input again; and since a count's store and its output are written apart,
            // a count whose output the crash lost and whose store it kept is never emitted
            // (the next one is). Nothing else is allowed.
            let fields: &[&str] =
                match (options.kill && r.target == "kafka-streams" && r.mode == "alo", r.scenario.as_str()) {
                    (true, "a" | "c" | "d") => &["missing", "unexplained"],
                    (true, _) => &["unexplained"],
                    _ => &["missing", "duplicates", "unexplained", "overcounts"],
                };
            fields.iter().any(|field| r.glue[*field].as_i64() != Some(0))
        })
        .map(|r| {
            format!(
                "{} {} {}: {} missing, {} duplicates, {} over-counted, {} unexplained",
                r.target,
                r.scenario,
                r.mode,
                r.glue["missing"],
                r.glue["duplicates"],
                r.glue["overcounts"],
                r.glue["unexplained"]
            )
        })
        .collect();
    if !wrong.is_empty() {
        bail!("outputs did not match the input: {}", wrong.join("; "));
    }
    Ok(())
}

/// Scenario D's customers or products at a fraction of the study's rate (ten at the least).
fn join_count(full: f64, scale: f64) -> String {
    ((full * scale).round() as u64).max(10).to_string()
}

fn check(given: &[String], known: &[&str], what: &str) -> anyhow::Result<()> {
    for item in given {
        if !known.contains(&item.as_str()) {
            bail!("unknown {what} {item:?}; the {what}s: {}", known.join(", "));
        }
    }
    Ok(())
}

fn start_kafka(options: &StreamsOptions, logs: &Path) -> anyhow::Result<KafkaTarget> {
    KafkaTarget::start(&TargetOptions {
        url: None,
        mqtt_address: None,
        exe: options.exe.clone(),
        dir: options.dir.clone(),
        kafka_brokers: options.kafka_brokers,
        kafka_fsync: false,
        logs: Some(logs.to_path_buf()),
    })
}

struct Run<'a> {
    options: &'a StreamsOptions,
    glue: &'a Path,
    logs: &'a Path,
    scenario: &'a str,
    mode: &'a str,
    rate: f64,
    scale: f64,
}

impl Run<'_> {
    fn label(&self, target: &str) -> String {
        let kill = if self.options.kill { "-kill" } else { "" };
        format!("{target}-{}-{}-x{}{kill}", self.scenario, self.mode, self.scale)
    }

    fn onehop(&self) -> anyhow::Result<RunResult> {
        let server = ServerProcess::start(&self.options.exe, &self.options.dir, &["--durability", "fsync"])?;
        let host = server.url.trim_start_matches("http://").trim_end_matches('/').to_string();
        let mut http = KeepAlive::connect(&host).with_context(|| format!("connecting to {host}"))?;
        let definition = onehop_sql(self.scenario);
        let (status, body) = http.send("POST", "/sql", definition.statements.as_bytes())?;
        if status != 200 {
            bail!("defining scenario {}: {status} {}", self.scenario, String::from_utf8_lossy(&body));
        }
        let address = server.kafka.clone();
        let mut side = OnehopSide(server);
        let measured =
            self.glue_run("onehop", &address, &definition.inputs, &definition.outputs, "json", &mut side, &[])?;
        Ok(self.result("onehop", measured))
    }

    /// The same SQL on three nodes (every write committed on a majority, fdatasynced), fed and
    /// read through every node's Kafka listener; a kill run kills the leader.
    fn onehop_cluster(&self) -> anyhow::Result<RunResult> {
        let (nodes, leader) = cluster::start_nodes(&self.options.exe, &self.options.dir, cluster::NODES)?;
        let leader = &nodes[leader as usize - 1];
        let host = leader.url.trim_start_matches("http://").trim_end_matches('/').to_string();
        let mut http = KeepAlive::connect(&host).with_context(|| format!("connecting to {host}"))?;
        let definition = onehop_sql(self.scenario);
        let (status, body) = http.send("POST", "/sql", definition.statements.as_bytes())?;
        if status != 200 {
            bail!("defining scenario {} on the cluster: {status} {}", self.scenario, String::from_utf8_lossy(&body));
        }
        let address = nodes.iter().map(|node| node.kafka.clone()).collect::<Vec<_>>().join(",");
        let mut side = ClusterSide(nodes);
        let measured =
            self.glue_run("onehop-cluster", &address, &definition.inputs, &definition.outputs, "json", &mut side, &[])?;
        Ok(self.result("onehop-cluster", measured))
    }

    fn kafka_streams(&self, kafka: &KafkaTarget) -> anyhow::Result<RunResult> {
        let lib = installed("kafka-streams/lib", "kafka-streams")?;
        let java = system_program("java", "kafka-streams")?;
        let state = tempfile::Builder::new().prefix("onehop-peer-s5-").tempdir_in(&self.options.dir)?;
        std::fs::create_dir_all(state.path().join("tmp"))?;
        let log4j = state.path().join("log4j2.properties");
        std::fs::write(
            &log4j,
            crate::target::peers::kafka::log4j2_properties("the app's", &[("clients", "org.apache.kafka.clients")]),
        )?;
        let topic = crate::client::unique_name(&format!("s5{}{}", self.scenario, self.mode));
        let names = |names: &[&str]| names.iter().map(|name| format!("{topic}-{name}")).collect::<Vec<_>>().join(",");
        let (input, output) = match self.scenario {
            "c" => (names(&ROUTING_INPUTS), names(&ROUTING_OUTPUTS)),
            "d" => (names(&JOIN_INPUTS), format!("{topic}-enriched")),
            _ => (format!("{topic}-in"), format!("{topic}-out")),
        };
        let ready = state.path().join("ready");
        let guarantee = if self.mode == "eos" { "exactly_once_v2" } else { "at_least_once" };
        let mut args: Vec<String> = vec![format!("-Xms{KS_HEAP}"), format!("-Xmx{KS_HEAP}")];
        args.extend(JVM_OPTIONS.iter().map(|option| option.to_string()));
        args.push(format!("-Djava.io.tmpdir={}", state.path().join("tmp").display()));
        args.push(format!("-Dlog4j2.configurationFile={}", log4j.display()));
        args.extend(["-cp".into(), format!("{}/*", lib.display()), KS_MAIN_CLASS.into()]);
        let flags = [
            ("brokers", kafka.bootstrap().to_string()),
            ("scenario", self.scenario.to_string()),
            ("guarantee", guarantee.to_string()),
            ("input", input.clone()),
            ("output", output.clone()),
            ("partitions", PARTITIONS.to_string()),
            ("replication", kafka.replication().to_string()),
            ("threads", KS_THREADS.to_string()),
            ("commit-interval-ms", KS_COMMIT_INTERVAL_MS.to_string()),
            ("cache-bytes", KS_CACHE_BYTES.to_string()),
            ("linger-ms", self.options.ks_linger_ms.to_string()),
            ("state-dir", state.path().join("state").display().to_string()),
            ("ready", ready.display().to_string()),
        ];
        for (flag, value) in flags {
            args.extend([format!("--{flag}"), value]);
        }
        let log = self.logs.join(format!("{}.log", self.label("kafka-streams")));
        let mut side = StreamsApp::start(java, args, ready, log)?;
        let brokers = kafka.pids();
        let measured =
            self.glue_run("kafka-streams", kafka.bootstrap(), &input, &output, "long", &mut side, &brokers)?;
        Ok(self.result("kafka-streams", measured))
    }

    /// Runs the glue against `address` and measures `side` (the processing side) and `others`
    /// (its brokers) over the measured window; with `--kill`, kills `side` with SIGKILL in the
    /// window's middle and starts it again.
    #[allow(clippy::too_many_arguments)]
    fn glue_run(
        &self,
        target: &str,
        address: &str,
        input: &str,
        output: &str,
        count_format: &str,
        side: &mut dyn Side,
        others: &[u32],
    ) -> anyhow::Result<Measured> {
        let log = self.logs.join(format!("glue-{}.log", self.label(target)));
        let mut child = Command::new(self.glue)
            .args(["streams", "--address", address, "--scenario", self.scenario, "--mode", self.mode])
            .args(["--input", input, "--outputs", output, "--count-format", count_format])
            .args(["--rate", &format!("{:.3}", self.rate), "--keys", &KEYS.to_string(), "--words", &WORDS.to_string()])
            .args([
                "--customers",
                &join_count(JOIN_CUSTOMERS, self.scale),
                "--products",
                &join_count(JOIN_PRODUCTS, self.scale),
            ])
            .arg(format!("--warmup={}ms", self.options.warmup.as_millis()))
            .arg(format!("--measure={}ms", self.options.measure.as_millis()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting the glue")?;
        let clock = Instant::now();
        let wall = || clock.elapsed().as_nanos() as u64;
        let stdout = child.stdout.take().expect("stdout is piped");
        let pids = Arc::new(Mutex::new(side.pids()));
        let phase = Arc::new(AtomicU8::new(WAITING));
        let sampler = rss_sampler(pids.clone(), others.to_vec(), phase.clone());
        let stop_sampler = StopSampler(phase.clone());
        let driver = [child.id()];
        // The side's CPU over the window, in parts when a kill cuts it in two.
        let mut used: Option<HostUsage> = None;
        let (mut before, mut before_others, mut before_driver) = (None, None, None);
        let (mut usage_others, mut usage_driver) = (None, None);
        let mut line_json = None;
        let mut failure = None;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match line.as_str() {
                "phase measure" => {
                    before = Some(HostUsage::take(wall(), &side.pids()));
                    before_others = Some(HostUsage::take(wall(), others));
                    before_driver = Some(HostUsage::take(wall(), &driver));
                    phase.store(SAMPLING, Ordering::Relaxed);
                }
                "phase half" if self.options.kill => {
                    if let Some(start) = before.take() {
                        let part = HostUsage::take(wall(), &side.pids()).since(&start);
                        used = Some(merged(used, part));
                    }
                    eprintln!("bench streams: kill -9 of the processing side, then a start on its data");
                    if let Err(error) = side.crash_and_restart() {
                        let _ = child.kill();
                        failure = Some(error);
                        break;
                    }
                    *pids.lock().expect("pids") = side.pids();
                    before = Some(HostUsage::take(wall(), &side.pids()));
                }
                "phase drain" => {
                    let now = wall();
                    if let Some(start) = before.take() {
                        used = Some(merged(used, HostUsage::take(now, &side.pids()).since(&start)));
                    }
                    usage_others = before_others.map(|before| HostUsage::take(now, others).since(&before));
                    usage_driver = before_driver.map(|before| HostUsage::take(now, &driver).since(&before));
                    phase.store(DONE, Ordering::Relaxed);
                }
                line if line.starts_with('{') => line_json = serde_json::from_str::<Value>(line).ok(),
                _ => {}
            }
        }
        let status = child.wait()?;
        drop(stop_sampler);
        let (rss, rss_others) = sampler.join().unwrap_or((None, None));
        if let Some(error) = failure {
            return Err(error.context("restarting the processing side after its kill"));
        }
        let Some(glue) = line_json.filter(|_| status.success()) else {
            bail!("the streams run against {address} failed ({status}); its log: {}", log.display());
        };
        let Some(usage) = used else {
            bail!("the glue never reported its measured window; its log: {}", log.display())
        };
        Ok(Measured {
            glue,
            usage: usage.summary(),
            rss,
            others: usage_others.map(|usage| usage.summary()),
            rss_others,
            driver_cores: usage_driver.and_then(|usage| usage.summary().target_cores),
        })
    }

    fn result(&self, target: &str, measured: Measured) -> RunResult {
        RunResult {
            target: target.into(),
            scenario: self.scenario.into(),
            mode: self.mode.into(),
            scale: self.scale,
            glue: measured.glue,
            usage: measured.usage,
            rss_mb: measured.rss,
            brokers_cores: measured.others.and_then(|usage| usage.target_cores),
            brokers_rss_mb: measured.rss_others,
            driver_cores: measured.driver_cores,
        }
    }
}

struct Measured {
    glue: Value,
    usage: HostSummary,
    rss: Option<f64>,
    others: Option<HostSummary>,
    rss_others: Option<f64>,
    /// The glue's own CPU: the generator and the latency consumer.
    driver_cores: Option<f64>,
}

fn merged(total: Option<HostUsage>, part: HostUsage) -> HostUsage {
    match total {
        Some(mut total) => {
            total.merge(&part);
            total
        }
        None => part,
    }
}

/// The processing side of a run: what is measured, and what a `--kill` run kills.
trait Side {
    fn pids(&self) -> Vec<u32>;
    /// Kills it with SIGKILL and starts it again on its data; returns once it serves.
    fn crash_and_restart(&mut self) -> anyhow::Result<()>;
}

struct OnehopSide(ServerProcess);

impl Side for OnehopSide {
    fn pids(&self) -> Vec<u32> {
        vec![self.0.pid()]
    }

    fn crash_and_restart(&mut self) -> anyhow::Result<()> {
        self.0.kill_9()?;
        self.0.restart()
    }
}

/// onehop's nodes as a cluster; a kill kills the leader of the moment and starts it again.
struct ClusterSide(Vec<ServerProcess>);

impl Side for ClusterSide {
    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(ServerProcess::pid).collect()
    }

    fn crash_and_restart(&mut self) -> anyhow::Result<()> {
        let leader = cluster::wait_for_leader(&self.0)? as usize - 1;
        eprintln!("bench streams: the leader is node {}", leader + 1);
        self.0[leader].kill_9()?;
        self.0[leader].restart()
    }
}

/// A Kafka Streams application of the run, started again the same way after a kill.
struct StreamsApp {
    java: PathBuf,
    args: Vec<String>,
    ready: PathBuf,
    log: PathBuf,
    app: PeerProcess,
}

impl StreamsApp {
    fn start(java: PathBuf, args: Vec<String>, ready: PathBuf, log: PathBuf) -> anyhow::Result<StreamsApp> {
        let app = StreamsApp::launch(&java, &args, &ready, &log)?;
        Ok(StreamsApp { java, args, ready, log, app })
    }

    /// Starts the app and waits until it says it is RUNNING (the file `ready`).
    fn launch(java: &Path, args: &[String], ready: &Path, log: &Path) -> anyhow::Result<PeerProcess> {
        let _ = std::fs::remove_file(ready);
        let mut command = Command::new(java);
        command.args(args);
        let mut app = PeerProcess::start("the Kafka Streams app", command, log.to_path_buf())?;
        let deadline = Instant::now() + KS_READY_TIMEOUT;
        while !ready.exists() {
            app.check_running()?;
            if Instant::now() > deadline {
                bail!("the Kafka Streams app was not RUNNING within {KS_READY_TIMEOUT:?}; its log: {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(app)
    }
}

impl Side for StreamsApp {
    fn pids(&self) -> Vec<u32> {
        vec![self.app.pid()]
    }

    fn crash_and_restart(&mut self) -> anyhow::Result<()> {
        self.app.kill_9();
        self.app = StreamsApp::launch(&self.java, &self.args, &self.ready, &self.log)?;
        Ok(())
    }
}

/// What the RSS sampler does: wait for the measured window, sample, or return what it saw.
const WAITING: u8 = 0;
const SAMPLING: u8 = 1;
const DONE: u8 = 2;

/// Ends the sampler however the run ends.
struct StopSampler(Arc<AtomicU8>);

impl Drop for StopSampler {
    fn drop(&mut self) {
        self.0.store(DONE, Ordering::Relaxed);
    }
}

/// The highest resident memory of `pids` (summed) and of `others` while `phase` is
/// [`SAMPLING`], read every 500 ms; it returns once `phase` is [`DONE`].
fn rss_sampler(
    pids: Arc<Mutex<Vec<u32>>>,
    others: Vec<u32>,
    phase: Arc<AtomicU8>,
) -> std::thread::JoinHandle<(Option<f64>, Option<f64>)> {
    std::thread::spawn(move || {
        let sum = |pids: &[u32]| -> Option<f64> {
            if pids.is_empty() { None } else { pids.iter().map(|pid| rss_mb(*pid)).sum::<Option<f64>>() }
        };
        let (mut high, mut high_others) = (None::<f64>, None::<f64>);
        loop {
            match phase.load(Ordering::Relaxed) {
                SAMPLING => {
                    let now = pids.lock().expect("pids").clone();
                    high = max_of(high, sum(&now));
                    high_others = max_of(high_others, sum(&others));
                    std::thread::sleep(Duration::from_millis(500));
                }
                WAITING => std::thread::sleep(Duration::from_millis(50)),
                _ => return (high, high_others),
            }
        }
    })
}

fn max_of(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn ms(value: &Value) -> String {
    value.as_f64().map_or("–".into(), |ms| if ms >= 100.0 { format!("{ms:.0}") } else { format!("{ms:.2}") })
}

fn describe(result: &RunResult) -> String {
    let glue = &result.glue;
    format!(
        "{} {} {}: p50 {} ms, p99 {} ms, p99.9 {} ms; {:.0} in/s, {:.0} out/s; {} missing, {} duplicates, {} over-counted; \
         {}, RSS {}, \
         generator and consumer {} cores",
        result.target,
        result.scenario,
        result.mode,
        ms(&glue["p50_ms"]),
        ms(&glue["p99_ms"]),
        ms(&glue["p999_ms"]),
        glue["input_per_s"].as_f64().unwrap_or(0.0),
        glue["output_per_s"].as_f64().unwrap_or(0.0),
        glue["missing"],
        glue["duplicates"],
        glue["overcounts"],
        result.usage.describe(),
        result.rss_mb.map_or("unknown".into(), |mb| format!("{mb:.0} MB")),
        result.driver_cores.map_or("–".into(), |cores| format!("{cores:.2}")),
    )
}

fn settings_of(options: &StreamsOptions, result: &RunResult) -> Value {
    match result.target.as_str() {
        "onehop" | "onehop-cluster" => json!({
            "definition": onehop_sql(&result.scenario).statements,
            "input_topics": onehop_sql(&result.scenario).inputs,
            "output_topics": onehop_sql(&result.scenario).outputs,
            "nodes": if result.target == "onehop" { 1 } else { cluster::NODES },
            "durability": if result.target == "onehop" {
                "fsync (every batch fdatasynced before it is acknowledged); transforms and views exactly once in both modes"
            } else {
                "replicated(1): every write committed once a majority of the 3 nodes' Raft logs hold it fdatasynced; \
                 transforms and views run on the leader, exactly once in both modes; a kill run kills the leader"
            },
            "count_value": "the view's change as JSON, its count in \"count\"",
        }),
        _ => json!({
            "main_class": KS_MAIN_CLASS,
            "processing_guarantee": if result.mode == "eos" { "exactly_once_v2" } else { "at_least_once" },
            "commit_interval_ms": KS_COMMIT_INTERVAL_MS,
            "num_stream_threads": KS_THREADS,
            "statestore_cache_max_bytes": KS_CACHE_BYTES,
            "producer": { "acks": "all", "linger_ms": options.ks_linger_ms, "batch_size": "Kafka's default (16 384 B)" },
            "rocksdb": "Kafka Streams' defaults",
            "heap": KS_HEAP,
            "group_instance_id": "static membership (the input topic's name + \"-instance\"), so that an app started again after a kill takes its place at once",
            "count_value": "Long serde (8 bytes big-endian)",
        }),
    }
}

fn write_report(options: &StreamsOptions, results: &[RunResult], kafka: Option<Value>) -> anyhow::Result<()> {
    let glue_version = installed("bin/onehop-peer-glue", "kafka")
        .map(|glue| version_of(&glue, &["version"]))
        .unwrap_or_else(|_| "unknown".into());
    let mut summary = format!(
        "# bench streams\n\nStudy 5 on this machine: the same input to both sides from one open-loop Kafka producer \
         (franz-go, acks=all, no linger; {glue_version}), {PARTITIONS} partitions, {KEYS} keys; latency from the moment \
         an input record was due to the latency consumer's receipt of the output it made (read_committed in `eos`), one \
         clock. {:.0} s warm-up, {:.0} s measured. onehop: one server, durable at fsync, fed and read through its \
         Kafka listener (onehop-cluster: three nodes, every write committed on a majority, fdatasynced). Kafka Streams: its app's JVM ({KS_THREADS} stream threads, commit {KS_COMMIT_INTERVAL_MS} ms, \
         record cache {KS_CACHE_BYTES} B, producer linger {} ms) on {} broker(s); its brokers' CPU and memory apart. CPU: cores over the measured \
         window (driver: the generator and latency consumer, on the same 2 cores); RSS: the highest seen in it. in/s and \
         out/s: the rates kept, sends acknowledged and outputs received within the measured window (a side that falls \
         behind keeps less than the input's rate).{}\n\n\
         | scenario | mode | rate | target | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms | in/s | out/s | missing | dup | over | cores | RSS MB | brokers cores / MB | driver cores | p99 ÷ onehop's |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        options.warmup.as_secs_f64(),
        options.measure.as_secs_f64(),
        options.ks_linger_ms,
        options.kafka_brokers,
        if options.kill {
            " **Kill runs:** in the middle of each measured window the processing side (onehop's server, the cluster's \
             leader, Kafka Streams' app) was killed with SIGKILL and started again on its data; missing and dup count the outputs lost and \
             written twice across it, over the counts above the true count (input counted again), CPU leaves out the \
             restart."
        } else {
            ""
        }
    );
    let mut lines = Vec::new();
    for result in results {
        let glue = &result.glue;
        let onehop_p99 = results
            .iter()
            .find(|other| {
                other.target == "onehop"
                    && other.scenario == result.scenario
                    && other.mode == result.mode
                    && other.scale == result.scale
            })
            .and_then(|other| other.glue["p99_ms"].as_f64());
        let ratio = match (onehop_p99, glue["p99_ms"].as_f64()) {
            (Some(onehop), Some(mine)) if result.target != "onehop" && onehop > 0.0 => format!("{:.1}×", mine / onehop),
            _ => "–".into(),
        };
        let brokers = match (result.brokers_cores, result.brokers_rss_mb) {
            (Some(cores), Some(mb)) => format!("{cores:.2} / {mb:.0}"),
            _ => "–".into(),
        };
        summary.push_str(&format!(
            "| {} | {} | {:.0}/s (×{}) | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {brokers} | {} | {ratio} |\n",
            result.scenario,
            result.mode,
            glue["rate"].as_f64().unwrap_or(0.0),
            result.scale,
            result.target,
            ms(&glue["p50_ms"]),
            ms(&glue["p95_ms"]),
            ms(&glue["p99_ms"]),
            ms(&glue["p999_ms"]),
            ms(&glue["max_ms"]),
            glue["input_per_s"].as_f64().unwrap_or(0.0),
            glue["output_per_s"].as_f64().unwrap_or(0.0),
            glue["missing"],
            glue["duplicates"],
            glue["overcounts"],
            result.usage.target_cores.map_or("–".into(), |cores| format!("{cores:.2}")),
            result.rss_mb.map_or("–".into(), |mb| format!("{mb:.0}")),
            result.driver_cores.map_or("–".into(), |cores| format!("{cores:.2}")),
        ));
        lines.push(json!({
            "bench": "streams", "target": result.target, "scenario": result.scenario, "mode": result.mode,
            "scale": result.scale, "killed": options.kill, "glue": glue, "host": result.usage, "rss_mb": result.rss_mb,
            "brokers_cores": result.brokers_cores, "brokers_rss_mb": result.brokers_rss_mb,
            "driver_cores": result.driver_cores,
            "settings": settings_of(options, result),
        }));
    }
    summary
        .push_str("\nPublished (study 5: 8 vCPU app node, 3 brokers of 4 vCPU, the full rates), p50 / p95 / p99:\n\n");
    for scenario in &options.scenarios {
        for mode in &options.modes {
            summary.push_str(&format!("- {scenario} {mode}: {}\n", published(scenario, mode)));
        }
    }
    summary.push_str("\nScenarios:\n\n");
    for scenario in &options.scenarios {
        summary.push_str(&format!("- {scenario}: {}\n", topology(scenario)));
    }
    let mut charts = Vec::new();
    for scenario in &options.scenarios {
        for mode in &options.modes {
            for scale in &options.scales {
                let series: Vec<Series> = results
                    .iter()
                    .filter(|r| &r.scenario == scenario && &r.mode == mode && r.scale == *scale)
                    .map(|r| Series { name: r.target.clone(), points: cdf_points(&r.glue) })
                    .collect();
                if series.is_empty() {
                    continue;
                }
                let chart = Chart {
                    title: format!("Study 5 scenario {scenario}, {mode}, ×{scale} rate: latency by percentile"),
                    x_label: "percentile".into(),
                    y_label: "milliseconds".into(),
                    x_log: false,
                    x_range: None,
                    y_log: true,
                    series,
                    x_tick_labels: CDF_TICKS
                        .iter()
                        .enumerate()
                        .map(|(i, (_, label))| (i as f64, label.to_string()))
                        .collect(),
                };
                let name = format!("streams-{scenario}-{mode}-x{scale}.svg");
                std::fs::write(options.out.join(&name), chart.to_svg())?;
                charts.push(name);
            }
        }
    }
    let meta = json!({
        "bench": "streams",
        "warmup_s": options.warmup.as_secs_f64(),
        "measure_s": options.measure.as_secs_f64(),
        "partitions": PARTITIONS, "keys": KEYS, "words": WORDS,
        "join_customers_products": options.scales.iter().map(|scale| json!({
            "scale": scale, "customers": join_count(JOIN_CUSTOMERS, *scale), "products": join_count(JOIN_PRODUCTS, *scale),
        })).collect::<Vec<_>>(),
        "generator": format!("onehop-peer-glue streams ({glue_version}): franz-go producer, acks=all, linger 0, idempotent (franz-go's default), open loop"),
        "latency_consumer": "franz-go, direct assignment from the start of every output partition, fetch max wait 100 ms, read_committed in eos",
        "kafka": kafka,
        "runs": lines,
    });
    std::fs::write(options.out.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    std::fs::write(options.out.join("summary.md"), &summary)?;
    print!("{summary}");
    println!("\nresults: {} (summary.md, meta.json, {}, peer-logs/)", options.out.display(), charts.join(", "));
    if options.json {
        for line in meta["runs"].as_array().into_iter().flatten() {
            println!("{line}");
        }
    }
    Ok(())
}

/// The percentiles the plots are drawn through, and their labels.
const CDF_TICKS: [(f64, &str); 7] =
    [(50.0, "p50"), (90.0, "p90"), (95.0, "p95"), (99.0, "p99"), (99.9, "p99.9"), (99.99, "p99.99"), (100.0, "max")];

fn cdf_points(glue: &Value) -> Vec<(f64, f64)> {
    let cdf: Vec<(f64, f64)> = glue["cdf"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|point| Some((point[0].as_f64()?, point[1].as_f64()?)))
        .collect();
    CDF_TICKS
        .iter()
        .enumerate()
        .filter_map(|(i, (p, _))| {
            cdf.iter().find(|(q, _)| (q - p).abs() < 1e-9).map(|(_, ms)| (i as f64, ms.max(0.001)))
        })
        .collect()
}
