//! `onehop bench view-join`: how fresh a joined view is. A five-input view (orders ⋈ customers
//! ⋈ regions, ⟕ products, ⟕ shipments) and a single-source view (a projection of orders) run
//! side by side in one server; writes go to the joined view's inputs at a fixed rate, open
//! loop, each stamping its row with its sequence number; one SSE subscriber per view reads
//! its changes. Freshness is from when a write was due to the first change carrying its stamp
//! reaching the subscriber: for the joined view every write (of any input), for the
//! single-source view the writes to orders.
//!
//! The write mix: orders 40 %, customers 20 %, products 20 %, shipments 20 %. A customer or a
//! product is under about `orders / 1 000` orders, so such a write changes that many joined
//! rows; regions (each under a fifth of the orders) are written once, when loaded, and not in
//! the mix: a dimension that fans out to a fifth of the view is a batch job, measured apart
//! (docs/views.md).
//!
//! Goal (issue "Views that join"): the joined view's p99 within 2× the single-source view's.
//! Writes summary.md and view-join-latency.svg under `--out`, with the server's CPU and RSS.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::client::http1::{self, Chunked, Framing, KeepAlive};
use crate::client::sse::take_events;
use crate::histogram::{Percentiles, latency_histogram, ms, record};
use crate::host::process_cpu_ns;
use crate::plan::Rng;
use crate::plot::Chart;
use crate::run::rss_mb;
use crate::server::ServerProcess;

pub struct ViewJoinOptions {
    pub exe: PathBuf,
    pub dir: PathBuf,
    /// Writes per second, over all inputs.
    pub rate: u32,
    pub duration: Duration,
    pub warmup: Duration,
    pub orders: u32,
    pub out: PathBuf,
    pub json: bool,
}

const CUSTOMERS: u32 = 1000;
const PRODUCTS: u32 = 1000;
const REGIONS: u32 = 5;
/// Rows per INSERT while loading.
const LOAD_BATCH: u32 = 500;

const SCHEMA: &str = "CREATE TABLE regions (id TEXT PRIMARY KEY, name TEXT, stamp BIGINT); \
     CREATE TABLE customers (id TEXT PRIMARY KEY, region TEXT, name TEXT, stamp BIGINT); \
     CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT, stamp BIGINT); \
     CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT, product TEXT, qty BIGINT, stamp BIGINT); \
     CREATE TABLE shipments (id TEXT PRIMARY KEY, carrier TEXT, stamp BIGINT)";
const JOINED: &str = "CREATE VIEW joined AS SELECT o.id, o.qty, o.stamp AS o_stamp, c.name, c.stamp AS c_stamp, \
     g.name AS region, g.stamp AS g_stamp, p.title, p.stamp AS p_stamp, s.carrier, s.stamp AS s_stamp \
     FROM orders o JOIN customers c ON c.id = o.customer JOIN regions g ON g.id = c.region \
     LEFT JOIN products p ON p.id = o.product LEFT JOIN shipments s ON s.id = o.id";
const SINGLE: &str = "CREATE VIEW single AS SELECT id, qty, stamp FROM orders";
/// The stamp columns of each view's rows.
const JOINED_STAMPS: [&str; 5] = ["o_stamp", "c_stamp", "g_stamp", "p_stamp", "s_stamp"];
const SINGLE_STAMPS: [&str; 1] = ["stamp"];

/// The benchmark's HTTP connection: writes, and its statements.
struct Http(KeepAlive);

impl Http {
    fn connect(host: &str) -> anyhow::Result<Http> {
        Ok(Http(KeepAlive::connect(host).with_context(|| format!("connecting to {host}"))?))
    }

    fn send(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        Ok(self.0.send(method, path, body)?)
    }

    fn sql(&mut self, statements: &str) -> anyhow::Result<()> {
        let (status, body) = self.send("POST", "/sql", statements.as_bytes())?;
        if status != 200 {
            bail!("{statements}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }
}

/// When each stamp's write was due, and its freshness once a change carrying it arrived.
#[derive(Default)]
struct Ledger {
    due: HashMap<u64, Instant>,
    /// Stamps of writes the view must show, measured (not warm-up).
    measured: HashMap<u64, bool>,
}

/// Per view: the stamps its subscriber has seen, and the histogram of the measured ones.
struct Seen {
    first: HashMap<u64, ()>,
    histogram: Histogram<u64>,
    /// Measured writes this view should show.
    expected: u64,
}

/// Follows `/views/{view}` over SSE until `stop`, recording the first arrival of each stamp.
fn subscribe(
    host: String,
    view: &'static str,
    stamps: &'static [&'static str],
    ledger: Arc<Mutex<Ledger>>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let mut stream = TcpStream::connect(&host)?;
    stream.set_nodelay(true)?;
    let mut request = http1::request("GET", &host, &format!("/views/{view}"), None, None, b"");
    request.truncate(request.len() - 2);
    request.extend_from_slice(b"Accept: text/event-stream\r\n\r\n");
    stream.write_all(&request)?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut raw = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let head = loop {
        let read = stream.read(&mut chunk).context("reading the subscription's head")?;
        if read == 0 {
            bail!("the server closed the subscription to {view}");
        }
        raw.extend_from_slice(&chunk[..read]);
        if let Some(head) = http1::parse_head(&raw).map_err(anyhow::Error::msg)? {
            break head;
        }
    };
    if head.status != 200 {
        bail!("subscribing to {view}: {}", head.status);
    }
    raw.drain(..head.length);
    let mut chunked = (head.framing == Framing::Chunked).then(Chunked::default);
    Ok(std::thread::spawn(move || {
        let mut buffer = Vec::new();
        loop {
            if !raw.is_empty() {
                match chunked.as_mut() {
                    Some(decoder) => {
                        if decoder.feed(&raw, &mut buffer).is_err() {
                            return;
                        }
                    }
                    None => buffer.extend_from_slice(&raw),
                }
                raw.clear();
                let now = Instant::now();
                take_events(&mut buffer, |event, data| {
                    if event != "record" {
                        return;
                    }
                    let Ok(change) = serde_json::from_str::<Value>(data) else { return };
                    let ledger = ledger.lock().expect("ledger lock");
                    let mut seen = seen.lock().expect("seen lock");
                    // The write a change comes from is the newest of the row's stamps: the
                    // others are of rows written before. (A product written while no order had
                    // it shows up, old, when an order takes it: that is not its write's change.)
                    let Some(stamp) = stamps.iter().filter_map(|column| change["row"][column].as_u64()).max() else {
                        return;
                    };
                    if seen.first.insert(stamp, ()).is_some() {
                        return;
                    }
                    if ledger.measured.get(&stamp) == Some(&true)
                        && let Some(due) = ledger.due.get(&stamp)
                    {
                        record(&mut seen.histogram, now.saturating_duration_since(*due).as_nanos() as u64);
                    }
                });
            }
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(read) => raw.extend_from_slice(&chunk[..read]),
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                }
                Err(_) => return,
            }
        }
    }))
}

/// The data set's INSERTs.
fn load(http: &mut Http, orders: u32) -> anyhow::Result<()> {
    let mut rng = Rng::new(0x0051_ab1e_5eed, 0);
    let insert = |http: &mut Http, table: &str, columns: &str, rows: Vec<String>| -> anyhow::Result<()> {
        for chunk in rows.chunks(LOAD_BATCH as usize) {
            http.sql(&format!("INSERT INTO {table} ({columns}) VALUES {}", chunk.join(", ")))?;
        }
        Ok(())
    };
    insert(http, "regions", "id, name, stamp", (0..REGIONS).map(|i| format!("('g{i}', 'region {i}', 0)")).collect())?;
    let customers = (0..CUSTOMERS).map(|i| format!("('c{i}', 'g{}', 'customer {i}', 0)", i % REGIONS)).collect();
    insert(http, "customers", "id, region, name, stamp", customers)?;
    insert(
        http,
        "products",
        "id, title, stamp",
        (0..PRODUCTS).map(|i| format!("('p{i}', 'product {i}', 0)")).collect(),
    )?;
    let rows = (0..orders)
        .map(|i| {
            let (customer, product) = (rng.below(CUSTOMERS), rng.below(PRODUCTS));
            format!("('o{i}', 'c{customer}', 'p{product}', 1, 0)")
        })
        .collect();
    insert(http, "orders", "id, customer, product, qty, stamp", rows)?;
    insert(http, "shipments", "id, carrier, stamp", (0..orders / 2).map(|i| format!("('o{i}', 'dhl', 0)")).collect())?;
    Ok(())
}

pub fn run(options: &ViewJoinOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&options.out)?;
    let server = ServerProcess::start(&options.exe, &options.dir, &[])?;
    let host = http1_host(&server.url);
    let mut http = Http::connect(&host)?;
    eprintln!("view-join: loading {} orders, {CUSTOMERS} customers, {PRODUCTS} products", options.orders);
    http.sql(SCHEMA)?;
    load(&mut http, options.orders)?;
    http.sql(JOINED)?;
    http.sql(SINGLE)?;
    // Both views have loaded their inputs once they list their rows.
    let started = Instant::now();
    for view in ["joined", "single"] {
        loop {
            let (status, body) = http.send("GET", &format!("/views/{view}?limit=1"), b"")?;
            let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
            if status == 200 && answer["status"]["restoring"] == false {
                break;
            }
            if started.elapsed() > Duration::from_secs(120) {
                bail!("view {view} did not load: {status} {answer}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen_of =
        |expected| Arc::new(Mutex::new(Seen { first: HashMap::new(), histogram: latency_histogram(), expected }));
    let (joined_seen, single_seen) = (seen_of(0), seen_of(0));
    let readers = [
        subscribe(host.clone(), "joined", &JOINED_STAMPS, ledger.clone(), joined_seen.clone(), stop.clone())?,
        subscribe(host.clone(), "single", &SINGLE_STAMPS, ledger.clone(), single_seen.clone(), stop.clone())?,
    ];
    let measured_start = Instant::now() + options.warmup;
    let end = measured_start + options.duration;
    let interval = Duration::from_secs_f64(1.0 / options.rate.max(1) as f64);
    let mut rng = Rng::new(0x00f7_e54e_5500, 1);
    let (mut due, mut stamp, mut next_progress) = (Instant::now(), 0u64, measured_start);
    let mut cpu_at_measure = None;
    while due < end {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if cpu_at_measure.is_none() && due >= measured_start {
            cpu_at_measure = Some((Instant::now(), process_cpu_ns(server.pid())));
        }
        stamp += 1;
        let measured = due >= measured_start;
        {
            let mut ledger = ledger.lock().expect("ledger lock");
            ledger.due.insert(stamp, due);
            ledger.measured.insert(stamp, measured);
        }
        let pick = rng.below(10);
        let (path, body, order) = match pick {
            0..=3 => {
                let order = rng.below(options.orders);
                let (customer, product) = (rng.below(CUSTOMERS), rng.below(PRODUCTS));
                let body = json!({"customer": format!("c{customer}"), "product": format!("p{product}"), "qty": 1 + pick, "stamp": stamp});
                (format!("/tables/orders/o{order}"), body, true)
            }
            4 | 5 => {
                let customer = rng.below(CUSTOMERS);
                let body = json!({"region": format!("g{}", customer % REGIONS), "name": format!("customer {customer}"), "stamp": stamp});
                (format!("/tables/customers/c{customer}"), body, false)
            }
            6 | 7 => {
                let product = rng.below(PRODUCTS);
                (
                    format!("/tables/products/p{product}"),
                    json!({"title": format!("product {product}"), "stamp": stamp}),
                    false,
                )
            }
            _ => {
                let order = rng.below(options.orders);
                (format!("/tables/shipments/o{order}"), json!({"carrier": "ups", "stamp": stamp}), false)
            }
        };
        let (status, answer) = http.send("PUT", &path, body.to_string().as_bytes())?;
        if !(200..300).contains(&status) {
            bail!("PUT {path}: {status} {}", String::from_utf8_lossy(&answer));
        }
        // A customer or product with no order, or a write that changes nothing the view shows,
        // reaches no joined row: only writes that change one count as expected.
        if measured {
            joined_seen.lock().expect("seen lock").expected += 1;
            if order {
                single_seen.lock().expect("seen lock").expected += 1;
            }
        }
        if Instant::now() >= next_progress {
            let elapsed = Instant::now().saturating_duration_since(measured_start).as_secs();
            eprintln!("  view-join: {elapsed}/{} s, {stamp} writes", options.duration.as_secs());
            next_progress += Duration::from_secs(5);
        }
        due += interval;
    }
    let cpu_seconds = match (cpu_at_measure, process_cpu_ns(server.pid())) {
        (Some((at, Some(before))), Some(after)) => Some((after - before) as f64 / 1e9 / at.elapsed().as_secs_f64()),
        _ => None,
    };
    let rss = rss_mb(server.pid());
    // Let the last changes arrive.
    let drain = Instant::now();
    loop {
        let (joined, single) = (joined_seen.lock().unwrap(), single_seen.lock().unwrap());
        if (joined.histogram.len() >= joined.expected && single.histogram.len() >= single.expected)
            || drain.elapsed() > Duration::from_secs(10)
        {
            break;
        }
        drop((joined, single));
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        let _ = reader.join();
    }
    let (joined, single) = (joined_seen.lock().unwrap(), single_seen.lock().unwrap());
    let (joined_p, single_p) = (Percentiles::of(&joined.histogram), Percentiles::of(&single.histogram));
    let ratio = joined_p.p99_ns as f64 / single_p.p99_ns.max(1) as f64;
    let mut summary = String::new();
    summary.push_str("# onehop bench view-join\n\n");
    summary.push_str(&format!(
        "`onehop bench view-join --rate {} --duration {} --orders {}`: writes over the joined view's inputs \
         at {} /s (orders 40 %, customers, products and shipments 20 % each), {} s measured after {} s.\n\n",
        options.rate,
        options.duration.as_secs(),
        options.orders,
        options.rate,
        options.duration.as_secs(),
        options.warmup.as_secs()
    ));
    summary
        .push_str("| view | changes seen / writes | p50 ms | p95 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n");
    for (label, seen, p) in
        [("joined (5 inputs)", &*joined, &joined_p), ("single source (orders)", &*single, &single_p)]
    {
        summary.push_str(&format!(
            "| {label} | {} / {} | {} | {} | {} | {} |\n",
            seen.histogram.len(),
            seen.expected,
            ms(p.p50_ns),
            ms(p.p95_ns),
            ms(p.p99_ns),
            ms(p.max_ns)
        ));
    }
    summary.push_str(&format!(
        "\nJoined p99 / single-source p99: **{ratio:.2}×** (goal ≤ 2×). Server CPU while measured: {}; RSS at the \
         end: {}.\n",
        cpu_seconds.map_or("unknown".to_string(), |cores| format!("{:.0} % of a core", cores * 100.0)),
        rss.map_or("unknown".to_string(), |mb| format!("{mb:.0} MB"))
    ));
    std::fs::write(options.out.join("summary.md"), &summary)?;
    let chart = Chart::percentiles(
        format!("Joined view freshness at {} writes/s: write to subscriber", options.rate),
        "freshness (ms)",
        &[("joined (5 inputs)", &joined.histogram), ("single source", &single.histogram)],
    );
    std::fs::write(options.out.join("view-join-latency.svg"), chart.to_svg())?;
    println!("{summary}");
    println!("results: {} (summary.md, view-join-latency.svg)", options.out.display());
    if options.json {
        println!(
            "{}",
            json!({
                "benchmark": "view-join",
                "rate": options.rate,
                "joined": {"seen": joined.histogram.len(), "writes": joined.expected, "p50_ms": p_ms(joined_p.p50_ns), "p99_ms": p_ms(joined_p.p99_ns)},
                "single": {"seen": single.histogram.len(), "writes": single.expected, "p50_ms": p_ms(single_p.p50_ns), "p99_ms": p_ms(single_p.p99_ns)},
                "p99_ratio": ratio,
                "server_cpu_cores": cpu_seconds,
                "server_rss_mb": rss,
            })
        );
    }
    Ok(())
}

fn p_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// `host:port` of a server URL.
fn http1_host(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches('/').to_string()
}
