//! `onehop bench query`: what an ad-hoc query costs on onehop against Postgres 15, on the
//! same data, through the same client (`client::pg`, the extended protocol with a statement
//! parsed once).
//!
//! - Point select by primary key (`SELECT … FROM products WHERE id = $1`) at a fixed rate,
//!   open loop (latency from when each query was due, so a stall is not hidden): over onehop's
//!   Postgres listener, over onehop's `GET /tables/products/{id}`, and over Postgres.
//! - A three-table join with GROUP BY over the orders (100 000 by default): orders ⋈ customers
//!   ⋈ products grouped by region and category, run several times on each; the answers are
//!   compared, so a faster wrong answer cannot win.
//!
//! Goals (issue "Ask anything"): the point select's p50 on onehop ≤ Postgres's and within
//! 1.5× onehop's own REST GET; the join within 2× Postgres's time. Writes summary.md,
//! query-latency.svg and the peers' logs under `--out`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde_json::json;

use crate::client::http1;
use crate::client::pg::{PgClient, Row};
use crate::histogram::{Percentiles, latency_histogram, ms, record};
use crate::plot::Chart;
use crate::server::ServerProcess;
use crate::target::peers::postgres::{self, PostgresPeer};

pub struct QueryOptions {
    pub exe: PathBuf,
    pub dir: PathBuf,
    /// Point selects per second.
    pub rate: u32,
    pub duration: Duration,
    pub warmup: Duration,
    pub orders: u32,
    /// Runs of the join on each side (after one not counted).
    pub join_runs: u32,
    pub out: PathBuf,
    pub json: bool,
}

const PRODUCTS: u32 = 1000;
const CUSTOMERS: u32 = 1000;
const CATEGORIES: [&str; 8] = ["books", "garden", "games", "kitchen", "music", "office", "sport", "toys"];
const REGIONS: [&str; 5] = ["north", "south", "east", "west", "centre"];
/// Rows per INSERT while loading.
const LOAD_BATCH: u32 = 500;

const SCHEMA: &str = "CREATE TABLE products (id TEXT PRIMARY KEY, name TEXT, category TEXT, price DOUBLE PRECISION); \
     CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT, region TEXT); \
     CREATE TABLE orders (id TEXT PRIMARY KEY, customer_id TEXT, product_id TEXT, qty BIGINT)";
const POINT: &str = "SELECT id, name, category, price FROM products WHERE id = $1";
const JOIN: &str = "SELECT c.region, p.category, COUNT(*) AS orders, SUM(o.qty) AS qty \
     FROM orders o JOIN customers c ON c.id = o.customer_id JOIN products p ON p.id = o.product_id \
     GROUP BY c.region, p.category ORDER BY c.region, p.category";

/// A small deterministic generator (xorshift64*): both sides get the same rows.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// The INSERT statements of the data set, in order.
fn inserts(orders: u32) -> Vec<String> {
    let mut rng = Rng(0x005e_ed0f_0e1e);
    let mut statements = Vec::new();
    let mut batch = |table: &str, columns: &str, rows: Vec<String>| {
        for chunk in rows.chunks(LOAD_BATCH as usize) {
            statements.push(format!("INSERT INTO {table} ({columns}) VALUES {}", chunk.join(", ")));
        }
    };
    let products = (0..PRODUCTS)
        .map(|i| {
            let category = CATEGORIES[i as usize % CATEGORIES.len()];
            format!("('p{i}', 'product {i}', '{category}', {}.5)", 1 + i % 200)
        })
        .collect();
    batch("products", "id, name, category, price", products);
    let customers = (0..CUSTOMERS)
        .map(|i| format!("('c{i}', 'customer {i}', '{}')", REGIONS[i as usize % REGIONS.len()]))
        .collect();
    batch("customers", "id, name, region", customers);
    let orders = (0..orders)
        .map(|i| {
            let (customer, product, qty) = (rng.below(CUSTOMERS as u64), rng.below(PRODUCTS as u64), 1 + rng.below(9));
            format!("('o{i}', 'c{customer}', 'p{product}', {qty})")
        })
        .collect();
    batch("orders", "id, customer_id, product_id, qty", orders);
    statements
}

/// One side of the point-select runs: how a query is sent.
enum Point {
    Pg(PgClient),
    /// onehop's `GET /tables/products/{id}` on a keep-alive connection, opened when its run
    /// starts (an idle one would be closed while the others run).
    Rest {
        connection: Option<http1::KeepAlive>,
        host: String,
    },
}

impl Point {
    fn get(&mut self, id: &str) -> anyhow::Result<()> {
        match self {
            Point::Pg(client) => {
                let rows = client.execute("point", &[id])?;
                if rows.len() != 1 {
                    bail!("the point select of {id} answered {} rows", rows.len());
                }
                Ok(())
            }
            Point::Rest { connection, host } => {
                if connection.is_none() {
                    *connection = Some(http1::KeepAlive::connect(host)?);
                }
                let connection = connection.as_mut().expect("connected above");
                let (status, _) = connection.send("GET", &format!("/tables/products/{id}"), &[])?;
                if status != 200 {
                    bail!("GET /tables/products/{id} answered {status}");
                }
                Ok(())
            }
        }
    }
}

/// Point selects at `rate` for `duration` after `warmup`: the latencies, from when each query
/// was due.
fn point_run(point: &mut Point, options: &QueryOptions, label: &str) -> anyhow::Result<Histogram<u64>> {
    let mut histogram = latency_histogram();
    let mut rng = Rng(0xfeed_beef);
    let interval = Duration::from_secs_f64(1.0 / options.rate.max(1) as f64);
    let start = Instant::now();
    let measured_from = start + options.warmup;
    let end = measured_from + options.duration;
    let mut due = start;
    let mut next_progress = measured_from;
    while due < end {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let id = format!("p{}", rng.below(PRODUCTS as u64));
        point.get(&id).with_context(|| format!("{label}: point select"))?;
        let done = Instant::now();
        if due >= measured_from {
            record(&mut histogram, done.duration_since(due).as_nanos() as u64);
        }
        if done >= next_progress {
            let elapsed = done.saturating_duration_since(measured_from).as_secs();
            eprintln!("  {label}: {elapsed}/{} s, {} queries measured", options.duration.as_secs(), histogram.len());
            next_progress += Duration::from_secs(5);
        }
        due += interval;
    }
    Ok(histogram)
}

/// The join run `runs` times after one warm-up: each run's time, and the answer.
fn join_runs(client: &mut PgClient, runs: u32, label: &str) -> anyhow::Result<(Vec<Duration>, Vec<Row>)> {
    let answer = client.simple(JOIN).with_context(|| format!("{label}: the join"))?;
    let mut times = Vec::with_capacity(runs as usize);
    for run in 0..runs {
        let started = Instant::now();
        let again = client.simple(JOIN)?;
        times.push(started.elapsed());
        if again != answer {
            bail!("{label}: the join answered differently on run {}", run + 1);
        }
        eprintln!("  {label}: join run {}/{runs}: {:.1} ms", run + 1, times[run as usize].as_secs_f64() * 1e3);
    }
    Ok((times, answer))
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// Numbers in the answers as numbers (`6.0` and `6` alike), the rest as text.
fn normalized(rows: &[Row]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|row| {
            row.iter()
                .map(|cell| match cell.as_deref().map(|text| (text, text.parse::<f64>())) {
                    Some((_, Ok(number))) => format!("{number}"),
                    Some((text, Err(_))) => text.to_string(),
                    None => "NULL".into(),
                })
                .collect()
        })
        .collect()
}

fn load(client: &mut PgClient, statements: &[String], label: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    client.simple(SCHEMA).with_context(|| format!("{label}: the schema"))?;
    for (index, statement) in statements.iter().enumerate() {
        client.simple(statement).with_context(|| format!("{label}: loading"))?;
        if (index + 1) % 50 == 0 || index + 1 == statements.len() {
            eprintln!("  {label}: loaded {}/{} batches", index + 1, statements.len());
        }
    }
    Ok(started.elapsed())
}

pub fn run(options: &QueryOptions) -> anyhow::Result<()> {
    if options.rate == 0 || options.orders == 0 || options.join_runs == 0 {
        bail!("--rate, --orders and --join-runs must be positive");
    }
    std::fs::create_dir_all(&options.out)?;
    let logs = options.out.join("peer-logs");
    std::fs::create_dir_all(&logs)?;
    let statements = inserts(options.orders);

    eprintln!("== starting onehop (Postgres listener on) and Postgres 15");
    let server = ServerProcess::start(&options.exe, &options.dir, &["--pg-addr", "127.0.0.1:0"])?;
    let pg_address = server.pg.clone().context("onehop announced no Postgres listener")?;
    let peer_dir = tempfile::Builder::new().prefix("onehop-bench-postgres-").tempdir_in(&options.dir)?;
    let peer = PostgresPeer::start(peer_dir.path(), &logs)?;

    let mut onehop = PgClient::connect(&pg_address, "bench", "onehop")?;
    let mut reference = PgClient::connect(&peer.address(), postgres::USER, postgres::DATABASE)?;
    eprintln!("== loading {PRODUCTS} products, {CUSTOMERS} customers, {} orders into each", options.orders);
    let onehop_load = load(&mut onehop, &statements, "onehop")?;
    let postgres_load = load(&mut reference, &statements, "postgres")?;
    reference.simple("ANALYZE")?;

    eprintln!("== point select by primary key, {}/s for {} s each", options.rate, options.duration.as_secs());
    onehop.prepare("point", POINT)?;
    reference.prepare("point", POINT)?;
    let host = server.url.trim_start_matches("http://").to_string();
    let mut sides = [
        ("onehop-pg", Point::Pg(onehop)),
        ("onehop-rest", Point::Rest { connection: None, host }),
        ("postgres", Point::Pg(reference)),
    ];
    let mut point = Vec::new();
    for (label, side) in sides.iter_mut() {
        point.push((*label, point_run(side, options, label)?));
    }
    let [(_, Point::Pg(mut onehop)), _, (_, Point::Pg(mut reference))] = sides else {
        unreachable!("the Postgres clients are first and last")
    };

    eprintln!("== the join over {} orders, {} runs each", options.orders, options.join_runs);
    let (onehop_times, onehop_answer) = join_runs(&mut onehop, options.join_runs, "onehop")?;
    let (postgres_times, postgres_answer) = join_runs(&mut reference, options.join_runs, "postgres")?;
    if normalized(&onehop_answer) != normalized(&postgres_answer) {
        bail!(
            "the join's answers differ: onehop {} rows, Postgres {} rows (first: {:?} / {:?})",
            onehop_answer.len(),
            postgres_answer.len(),
            onehop_answer.first(),
            postgres_answer.first()
        );
    }

    let percentiles: Vec<(&str, Percentiles)> =
        point.iter().map(|(label, histogram)| (*label, Percentiles::of(histogram))).collect();
    let p50 = |name: &str| percentiles.iter().find(|(label, _)| *label == name).map_or(0, |(_, p)| p.p50_ns) as f64;
    let (onehop_join, postgres_join) = (median(&onehop_times), median(&postgres_times));
    let vs_postgres = p50("onehop-pg") / p50("postgres").max(1.0);
    let vs_rest = p50("onehop-pg") / p50("onehop-rest").max(1.0);
    let join_ratio = onehop_join.as_secs_f64() / postgres_join.as_secs_f64().max(1e-9);

    let mut summary = String::new();
    summary.push_str("# onehop bench query\n\n");
    summary.push_str(&format!(
        "Point select by primary key at {}/s for {} s (after {} s not counted), open loop, one connection each; \
         the join over {} orders, median of {} runs. Same client (the extended protocol, the statement parsed \
         once) on both Postgres-protocol sides.\n\n",
        options.rate,
        options.duration.as_secs(),
        options.warmup.as_secs(),
        options.orders,
        options.join_runs
    ));
    summary
        .push_str("| point select | queries | p50 | p95 | p99 | p99.9 | max |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (label, p) in &percentiles {
        summary.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} | {} |\n",
            p.count,
            ms(p.p50_ns),
            ms(p.p95_ns),
            ms(p.p99_ns),
            ms(p.p999_ns),
            ms(p.max_ns)
        ));
    }
    summary.push_str(&format!(
        "\n| join (3 tables, GROUP BY) | median | fastest | rows |\n|---|---:|---:|---:|\n\
         | onehop | {:.1} ms | {:.1} ms | {} |\n| postgres | {:.1} ms | {:.1} ms | {} |\n",
        onehop_join.as_secs_f64() * 1e3,
        onehop_times.iter().min().copied().unwrap_or_default().as_secs_f64() * 1e3,
        onehop_answer.len(),
        postgres_join.as_secs_f64() * 1e3,
        postgres_times.iter().min().copied().unwrap_or_default().as_secs_f64() * 1e3,
        postgres_answer.len(),
    ));
    summary.push_str(&format!(
        "\nGoals: point p50 onehop-pg / postgres = {vs_postgres:.2} (goal ≤ 1), onehop-pg / onehop-rest = \
         {vs_rest:.2} (goal ≤ 1.5); join onehop / postgres = {join_ratio:.2} (goal ≤ 2).\n\n\
         Loading (INSERTs of {LOAD_BATCH} rows, each durable before the next): onehop {:.1} s, Postgres {:.1} s.\n\n\
         Postgres: {}\n",
        onehop_load.as_secs_f64(),
        postgres_load.as_secs_f64(),
        peer.settings()
    ));
    std::fs::write(options.out.join("summary.md"), &summary)?;

    let lines: Vec<(&str, &Histogram<u64>)> = point.iter().map(|(label, histogram)| (*label, histogram)).collect();
    let chart =
        Chart::percentiles(format!("Point select by primary key at {}/s", options.rate), "latency (ms)", &lines);
    std::fs::write(options.out.join("query-latency.svg"), chart.to_svg())?;

    println!("{summary}");
    println!("results: {} (summary.md, query-latency.svg, peer-logs/)", options.out.display());
    if options.json {
        let line = json!({
            "bench": "query",
            "rate": options.rate,
            "orders": options.orders,
            "point": percentiles.iter().map(|(label, p)| (label.to_string(), json!(p))).collect::<serde_json::Map<_, _>>(),
            "join_ms": {"onehop": onehop_join.as_secs_f64() * 1e3, "postgres": postgres_join.as_secs_f64() * 1e3},
            "ratios": {"point_vs_postgres": vs_postgres, "point_vs_rest": vs_rest, "join_vs_postgres": join_ratio},
        });
        println!("{line}");
    }
    drop(server);
    Ok(())
}
