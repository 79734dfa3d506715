//! `onehop bench shop --target …` (study 2): the shop's pages under virtual users with k6's
//! semantics, against onehop and the microservices stack, in one invocation.
//!
//! k6 cannot be installed here, so the harness is the load: each virtual user (VU) has its own
//! keep-alive connection and loops — GET the page, check the status and the body's length,
//! `sleep(1)` — with a 60 s request timeout, every VU started at once (no ramp), for the run's
//! duration. A page run is one target, one page, one VU level, on a stack started for it and
//! stopped after it, so no run inherits another's state (the study's crashed gateway made its
//! later rows "0 ms, 100 % errors").
//!
//! - home: `GET /` (the HTML, from onehop's `--static-dir` or the gateway) and the first 8
//!   products, one after the other: one page load, timed whole.
//! - listing: the whole catalogue (1 013 products).
//! - detail: one product, a different one each time (each VU draws from the catalogue).
//!
//! Per run: p50, p95, p99, p99.9 of the successful page loads, requests per second, errors by
//! kind (timeout, refused, reset, status: a status other than 200 or a body shorter than the
//! page's), and the target's CPU and peak RSS (every process of it, sampled each second).
//! Meanwhile `--writes-per-s` price and stock changes go through the stack's own write API,
//! and the pages' staleness is measured ([`crate::shop_writes`]).
//! Writes summary.md (with the study's published figures beside, other hardware),
//! meta.json and one percentile chart per page under `--out`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::http1;
use crate::histogram::{Percentiles, latency_histogram, ms, record};
use crate::plan::Rng;
use crate::plot::Chart;
use crate::server::ServerProcess;
use crate::shop::{self, Shop};
use crate::shop_writes::{self, Api, Writes};
use crate::target::peers::shop_stack::{Layout, ShopStack};

/// k6's default request timeout, as the study's script left it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause after each iteration (`sleep(1)`).
const THINK_TIME: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShopTarget {
    Onehop,
    Microservices,
    MicroservicesAsPublished,
}

impl ShopTarget {
    pub fn parse(name: &str) -> anyhow::Result<ShopTarget> {
        Ok(match name {
            "onehop" => ShopTarget::Onehop,
            "microservices" => ShopTarget::Microservices,
            "microservices-as-published" => ShopTarget::MicroservicesAsPublished,
            other => bail!("unknown shop target {other}: onehop, microservices, microservices-as-published"),
        })
    }

    fn api(self) -> Api {
        if self == ShopTarget::Onehop { Api::Onehop } else { Api::Gateway }
    }

    pub fn name(self) -> &'static str {
        match self {
            ShopTarget::Onehop => "onehop",
            ShopTarget::Microservices => "microservices",
            ShopTarget::MicroservicesAsPublished => "microservices-as-published",
        }
    }

    /// The requests of one load of `page` (a detail's product id given).
    fn targets(self, page: Page, product: &str) -> Vec<String> {
        let onehop = self == ShopTarget::Onehop;
        match (page, onehop) {
            (Page::Home, true) => vec!["/".into(), "/views/product_pages?limit=8".into()],
            (Page::Home, false) => vec!["/".into(), "/api/products?limit=8".into()],
            (Page::Listing, true) => vec!["/views/product_pages?limit=10000".into()],
            (Page::Listing, false) => vec!["/api/products?limit=10000".into()],
            (Page::Detail, true) => vec![format!("/views/product_pages/{product}")],
            (Page::Detail, false) => vec![format!("/api/products/{product}")],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    Home,
    Listing,
    Detail,
}

impl Page {
    pub fn parse(name: &str) -> anyhow::Result<Page> {
        Ok(match name {
            "home" => Page::Home,
            "listing" => Page::Listing,
            "detail" => Page::Detail,
            other => bail!("unknown page {other}: home, listing, detail"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Page::Home => "home",
            Page::Listing => "listing",
            Page::Detail => "detail",
        }
    }

    /// The shortest body each request of the page may have: the check k6's script makes.
    fn min_bytes(self) -> &'static [usize] {
        match self {
            Page::Home => &[1000, 2000],
            Page::Listing => &[300_000],
            Page::Detail => &[200],
        }
    }
}

pub struct ShopOptions {
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub targets: Vec<ShopTarget>,
    pub pages: Vec<Page>,
    pub vus: Vec<u32>,
    /// Open-loop runs' rates (page loads per second), after the VU levels.
    pub rates: Vec<u32>,
    pub duration: Duration,
    pub writes_per_s: u32,
    pub seed: u64,
    pub out: PathBuf,
    pub json: bool,
}

/// How a run loads the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// Closed loop: this many VUs, each loading a page, then sleeping 1 s.
    Vus(u32),
    /// Open loop: a page load started this many times a second, whether or not the earlier
    /// ones were answered (k6's constant-arrival-rate), each timed from when it was due.
    Rate(u32),
}

impl Load {
    fn label(self) -> String {
        match self {
            Load::Vus(vus) => format!("{vus} VUs"),
            Load::Rate(rate) => format!("{rate}/s"),
        }
    }
}

/// Page loads in flight at most in an open-loop run, each on a connection of its own: past it a
/// due load is dropped (counted, as k6 counts dropped iterations when it runs out of VUs).
const OPEN_LOOP_IN_FLIGHT_MAX: u64 = 2000;

/// Errors of a run, by kind, and the first one's story.
#[derive(Default)]
struct Errors {
    timeout: AtomicU64,
    refused: AtomicU64,
    reset: AtomicU64,
    status: AtomicU64,
    first: std::sync::Mutex<Option<String>>,
}

/// A page load's failure: which counter it goes to, and what happened.
enum Failure {
    Timeout(String),
    Refused(String),
    Reset(String),
    Status(String),
}

impl Errors {
    fn note(&self, failure: Failure) {
        let (counter, what) = match failure {
            Failure::Timeout(what) => (&self.timeout, what),
            Failure::Refused(what) => (&self.refused, what),
            Failure::Reset(what) => (&self.reset, what),
            Failure::Status(what) => (&self.status, what),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.first.lock().expect("first error lock").get_or_insert(what);
    }

    fn counts(&self) -> [u64; 4] {
        [&self.timeout, &self.refused, &self.reset, &self.status].map(|counter| counter.load(Ordering::Relaxed))
    }
}

/// What one page run measured.
struct RunResult {
    target: ShopTarget,
    page: Page,
    load: Load,
    latency: Histogram<u64>,
    loads: u64,
    /// Open loop: loads that were due while [`OPEN_LOOP_IN_FLIGHT_MAX`] were in flight.
    dropped: u64,
    seconds: f64,
    errors: [u64; 4],
    cpu_s: f64,
    /// The harness's own CPU meanwhile (its VUs and writers share the machine with the target).
    harness_cpu_s: f64,
    rss_max_mib: f64,
    first_error: Option<String>,
    writes: Writes,
}

/// The stack a run measures: onehop, or the microservices.
enum Stack {
    Onehop(ServerProcess),
    Micro(ShopStack),
}

impl Stack {
    fn start(target: ShopTarget, options: &ShopOptions, shop: &Shop, work: &std::path::Path) -> anyhow::Result<Stack> {
        let site = work.join("site");
        shop::write_site(&site)?;
        match target {
            ShopTarget::Onehop => {
                let site_arg = site.to_str().context("the site's path is not UTF-8")?;
                let server = ServerProcess::start(&options.exe, work, &["--static-dir", site_arg])?;
                let address = server.url.trim_start_matches("http://").to_string();
                shop::load_onehop(&address, None, shop, |_| {})?;
                Ok(Stack::Onehop(server))
            }
            ShopTarget::Microservices | ShopTarget::MicroservicesAsPublished => {
                let layout = if target == ShopTarget::Microservices { Layout::Indexed } else { Layout::Published };
                let logs = options.out.join("peer-logs").join(target.name());
                std::fs::create_dir_all(&logs)?;
                Ok(Stack::Micro(ShopStack::start(work, &logs, layout, shop, &site)?))
            }
        }
    }

    fn address(&self) -> String {
        match self {
            Stack::Onehop(server) => server.url.trim_start_matches("http://").to_string(),
            Stack::Micro(stack) => stack.address().to_string(),
        }
    }

    fn pids(&self) -> Vec<u32> {
        match self {
            Stack::Onehop(server) => vec![server.pid()],
            Stack::Micro(stack) => stack.pids(),
        }
    }

    fn settings(&self) -> Value {
        match self {
            Stack::Onehop(_) => json!({
                "stack": "onehop serve, one node, its defaults",
                "pages": "the joined view product_pages (review_summaries joined in), the home page from --static-dir",
            }),
            Stack::Micro(stack) => stack.settings(),
        }
    }
}

/// Lets this process (and the stacks it starts) hold a socket per VU: the soft file limit
/// raised to the hard one.
fn raise_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// One load of `page` over `connection` (made if there is none): its requests in turn, each
/// with its status and length checked, each within [`REQUEST_TIMEOUT`]. A failed exchange
/// drops the connection.
async fn page_load(
    connection: &mut Option<tokio::net::TcpStream>,
    address: &str,
    requests: &[String],
    page: Page,
    buffer: &mut Vec<u8>,
) -> Result<(), Failure> {
    for (request, min_bytes) in requests.iter().zip(page.min_bytes()) {
        if connection.is_none() {
            let stream = tokio::net::TcpStream::connect(address).await.map_err(|error| {
                let what = format!("connecting: {error}");
                if error.kind() == std::io::ErrorKind::ConnectionRefused {
                    Failure::Refused(what)
                } else {
                    Failure::Reset(what)
                }
            })?;
            let _ = stream.set_nodelay(true);
            *connection = Some(stream);
        }
        let stream = connection.as_mut().expect("connected above");
        let exchange = async {
            stream.write_all(&http1::request("GET", address, request, None, None, b"")).await?;
            buffer.clear();
            let mut chunk = [0u8; 64 * 1024];
            loop {
                let read = stream.read(&mut chunk).await?;
                if read == 0 {
                    return Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "closed mid-response"));
                }
                buffer.extend_from_slice(&chunk[..read]);
                if let Some((status, body, _)) = http1::parse_response(buffer).map_err(std::io::Error::other)? {
                    return Ok((status, body.len()));
                }
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Err(_) => {
                *connection = None;
                return Err(Failure::Timeout(format!("GET {request}: no answer in {REQUEST_TIMEOUT:?}")));
            }
            Ok(Err(error)) => {
                *connection = None;
                return Err(Failure::Reset(format!("GET {request}: {error}")));
            }
            Ok(Ok((status, length))) if status != 200 || length < *min_bytes => {
                return Err(Failure::Status(format!("GET {request}: status {status}, {length} bytes")));
            }
            Ok(Ok(_)) => {}
        }
    }
    Ok(())
}

/// What a run's loads share: where they go, what they load, and the errors they meet.
struct Loader {
    address: String,
    target: ShopTarget,
    page: Page,
    products: Vec<String>,
    errors: Errors,
}

impl Loader {
    /// The requests of a load of a product drawn with `rng`.
    fn requests(&self, rng: &mut Rng) -> Vec<String> {
        let product = &self.products[rng.below(self.products.len() as u32) as usize];
        self.target.targets(self.page, product)
    }
}

/// One VU's loop until `until`: its page loads' latencies and how many it made.
async fn virtual_user(number: u32, loader: Arc<Loader>, until: Instant) -> (Histogram<u64>, u64) {
    let mut histogram = latency_histogram();
    let mut loads = 0u64;
    let mut rng = Rng::new(0x5107_2000, u64::from(number));
    let mut connection = None;
    let mut buffer = Vec::with_capacity(64 * 1024);
    while Instant::now() < until {
        let requests = loader.requests(&mut rng);
        let started = Instant::now();
        match page_load(&mut connection, &loader.address, &requests, loader.page, &mut buffer).await {
            Ok(()) => record(&mut histogram, started.elapsed().as_nanos() as u64),
            Err(failure) => loader.errors.note(failure),
        }
        loads += 1;
        tokio::time::sleep(THINK_TIME).await;
    }
    (histogram, loads)
}

/// An open-loop run: a load due every `1 / rate` s from `started` until `until`, each on an
/// idle connection (or a new one), timed from when it was due; then waits for those in
/// flight. The latencies, the loads started and those dropped.
async fn arrivals(loader: Arc<Loader>, rate: u32, started: Instant, until: Instant) -> (Histogram<u64>, u64, u64) {
    let idle: Arc<std::sync::Mutex<Vec<tokio::net::TcpStream>>> = Arc::default();
    let latency = Arc::new(std::sync::Mutex::new(latency_histogram()));
    let in_flight = Arc::new(AtomicU64::new(0));
    let mut rng = Rng::new(0x5107_2001, u64::from(rate));
    let (mut loads, mut dropped) = (0u64, 0u64);
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0u64.. {
        let due = started + Duration::from_secs_f64(n as f64 / f64::from(rate));
        if due >= until {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        while tasks.try_join_next().is_some() {}
        if in_flight.load(Ordering::Relaxed) >= OPEN_LOOP_IN_FLIGHT_MAX {
            dropped += 1;
            continue;
        }
        loads += 1;
        in_flight.fetch_add(1, Ordering::Relaxed);
        let requests = loader.requests(&mut rng);
        let (loader, idle, latency, in_flight) = (loader.clone(), idle.clone(), latency.clone(), in_flight.clone());
        tasks.spawn(async move {
            let mut connection = idle.lock().expect("idle connections lock").pop();
            let mut buffer = Vec::new();
            match page_load(&mut connection, &loader.address, &requests, loader.page, &mut buffer).await {
                Ok(()) => record(&mut latency.lock().expect("latency lock"), due.elapsed().as_nanos() as u64),
                Err(failure) => loader.errors.note(failure),
            }
            if let Some(connection) = connection {
                idle.lock().expect("idle connections lock").push(connection);
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    while tasks.join_next().await.is_some() {}
    let latency = latency.lock().expect("latency lock").clone();
    (latency, loads, dropped)
}

/// One page run against a started stack, with `writes_per_s` writes meanwhile.
fn page_run(
    target: ShopTarget,
    page: Page,
    load: Load,
    stack: &Stack,
    shop: &Shop,
    duration: Duration,
    writes_per_s: u32,
) -> RunResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let products: Vec<String> = shop.products.iter().map(|product| product.id.clone()).collect();
    let loader = Arc::new(Loader {
        address: stack.address(),
        target,
        page,
        products: products.clone(),
        errors: Errors::default(),
    });
    let pids = stack.pids();
    let cpu_before: u64 = pids.iter().filter_map(|pid| crate::host::process_cpu_ns(*pid)).sum();
    let harness_before = crate::host::own_cpu_ns();
    let started = Instant::now();
    let until = started + duration;
    let writer = {
        let address = loader.address.clone();
        std::thread::spawn(move || shop_writes::run(&address, target.api(), &products, writes_per_s, started, until))
    };
    let (latency, loads, dropped, rss_max_mib) = runtime.block_on(async {
        let sampler = {
            let pids = pids.clone();
            tokio::spawn(async move {
                let mut rss_max = 0f64;
                while Instant::now() < until {
                    rss_max = rss_max.max(pids.iter().filter_map(|pid| crate::run::rss_mb(*pid)).sum());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                rss_max
            })
        };
        let (latency, loads, dropped) = match load {
            Load::Vus(vus) => {
                let tasks: Vec<_> =
                    (0..vus).map(|number| tokio::spawn(virtual_user(number, loader.clone(), until))).collect();
                let (mut latency, mut loads) = (latency_histogram(), 0u64);
                for task in tasks {
                    if let Ok((histogram, count)) = task.await {
                        crate::histogram::merge(&mut latency, &histogram);
                        loads += count;
                    }
                }
                (latency, loads, 0)
            }
            Load::Rate(rate) => arrivals(loader.clone(), rate, started, until).await,
        };
        (latency, loads, dropped, sampler.await.unwrap_or(0.0))
    });
    let writes = writer.join().unwrap_or_else(|_| panic!("the writes' thread panicked"));
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after: u64 = pids.iter().filter_map(|pid| crate::host::process_cpu_ns(*pid)).sum();
    let harness_after = crate::host::own_cpu_ns();
    let first_error = loader.errors.first.lock().expect("first error lock").clone();
    RunResult {
        target,
        page,
        load,
        latency,
        loads,
        dropped,
        seconds,
        errors: loader.errors.counts(),
        cpu_s: cpu_after.saturating_sub(cpu_before) as f64 / 1e9,
        harness_cpu_s: harness_after.saturating_sub(harness_before) as f64 / 1e9,
        rss_max_mib,
        first_error,
        writes,
    }
}

/// The study's published figures (M1 Max, 10 cores): p50 / p95 ms, req/s, error %, by page and
/// VU level; the microservices' then the study's own unified runtime's.
const PUBLISHED: [(&str, u32, &str, &str); 9] = [
    ("home", 20, "7.25 / 10.2 / 19.8 / 0", "2.94 / 6.55 / 19.9 / 0"),
    ("listing", 20, "40 740 / 59 998 / 0.45 / 35", "5.04 / 15.7 / 19.9 / 0"),
    ("detail", 20, "8.62 / 20.4 / 19.8 / 3.3", "3.12 / 7.22 / 19.9 / 0"),
    ("home", 200, "7.07 / 15.4 / 198 / 0", "0.88 / 7.04 / 199 / 0"),
    ("listing", 200, "59 996 / 59 998 / 3.3 / 100", "3.13 / 45.0 / 197 / 0"),
    ("detail", 200, "– / – / 54.7 / 100", "1.39 / 15.9 / 199 / 0"),
    ("home", 2000, "2.31 / 45.5 / 1 934 / 0.02", "0.73 / 15.0 / 1 941 / 0"),
    ("listing", 2000, "– / – / 812 / 100", "245 / 846 / 603 / 23"),
    ("detail", 2000, "– / – / 1 985 / 100", "2.01 / 41.3 / 1 941 / 0"),
];

pub fn run(options: &ShopOptions) -> anyhow::Result<()> {
    let loads: Vec<Load> = options
        .vus
        .iter()
        .map(|&vus| Load::Vus(vus))
        .chain(options.rates.iter().map(|&rate| Load::Rate(rate)))
        .collect();
    if options.targets.is_empty() || options.pages.is_empty() || loads.is_empty() {
        bail!("bench shop needs at least one target, page, and VU level or rate");
    }
    if options.vus.contains(&0) || options.rates.contains(&0) {
        bail!("--vus and --rates: a VU level or a rate is at least 1");
    }
    std::fs::create_dir_all(&options.out).with_context(|| format!("creating {}", options.out.display()))?;
    let file_limit = raise_file_limit();
    let most_vus = u64::from(options.vus.iter().copied().max().unwrap_or(0));
    let most = if options.rates.is_empty() { most_vus } else { most_vus.max(OPEN_LOOP_IN_FLIGHT_MAX) };
    if file_limit < most * 2 + 256 {
        bail!("the file limit is {file_limit}: {most} connections need a socket each on both sides (ulimit -Hn)");
    }
    let shop = Shop::generate(options.seed);
    let mut results = Vec::new();
    let mut settings = serde_json::Map::new();
    let runs = options.targets.len() * options.pages.len() * loads.len();
    let mut done = 0;
    for &target in &options.targets {
        for &page in &options.pages {
            for &load in &loads {
                done += 1;
                eprintln!(
                    "== run {done} of {runs}: {} {} at {} for {} s (starting the stack)",
                    target.name(),
                    page.name(),
                    load.label(),
                    options.duration.as_secs()
                );
                let work = tempfile::Builder::new().prefix("onehop-bench-shop-").tempdir_in(&options.dir)?;
                let stack = Stack::start(target, options, &shop, work.path())
                    .with_context(|| format!("starting {}", target.name()))?;
                settings.insert(target.name().to_string(), stack.settings());
                let result = page_run(target, page, load, &stack, &shop, options.duration, options.writes_per_s);
                let p = Percentiles::of(&result.latency);
                let stale = Percentiles::of(&result.writes.staleness);
                eprintln!(
                    "   p50 {} ms, p95 {} ms, {:.1} loads/s, {} errors, {} dropped; {} writes, staleness p99 {} ms",
                    ms(p.p50_ns),
                    ms(p.p95_ns),
                    result.loads as f64 / result.seconds,
                    result.errors.iter().sum::<u64>(),
                    result.dropped,
                    result.writes.done,
                    ms(stale.p99_ns)
                );
                drop(stack);
                results.push(result);
            }
        }
    }
    let summary = summary(options, &results);
    std::fs::write(options.out.join("summary.md"), &summary)?;
    for &page in &options.pages {
        let series: Vec<(String, &Histogram<u64>)> = results
            .iter()
            .filter(|result| result.page == page && !result.latency.is_empty())
            .map(|result| (format!("{} {}", result.target.name(), result.load.label()), &result.latency))
            .collect();
        let named: Vec<(&str, &Histogram<u64>)> = series.iter().map(|(name, h)| (name.as_str(), *h)).collect();
        let chart = Chart::percentiles(format!("study 2, {} page: page-load latency", page.name()), "ms", &named);
        std::fs::write(options.out.join(format!("shop-{}.svg", page.name())), chart.to_svg())?;
    }
    if options.writes_per_s > 0 {
        let series: Vec<(String, &Histogram<u64>)> = results
            .iter()
            .filter(|result| !result.writes.staleness.is_empty())
            .map(|result| {
                (
                    format!("{} {} {}", result.target.name(), result.page.name(), result.load.label()),
                    &result.writes.staleness,
                )
            })
            .collect();
        let named: Vec<(&str, &Histogram<u64>)> = series.iter().map(|(name, h)| (name.as_str(), *h)).collect();
        let title = format!("study 2: page staleness under {} writes/s", options.writes_per_s);
        std::fs::write(options.out.join("shop-staleness.svg"), Chart::percentiles(title, "ms", &named).to_svg())?;
    }
    let lines: Vec<Value> = results.iter().map(json_line).collect();
    let meta = json!({
        "workload": "shop",
        "study": "study 2 (../shared/BENCHMARKS.md): the e-commerce pages",
        "load": {
            "model": "closed loop with k6's semantics: each VU its own keep-alive connection, GET, check, sleep 1 s",
            "request_timeout_s": REQUEST_TIMEOUT.as_secs(),
            "duration_s": options.duration.as_secs_f64(),
            "vus": options.vus,
            "rates": options.rates,
            "open_loop": "k6's constant-arrival-rate: a load due every 1/rate s, on an idle connection or a new one, \
                          timed from when it was due; dropped when 2 000 are in flight",
            "writes": {
                "per_s": options.writes_per_s,
                "model": "open loop, stock and price in turn, through each stack's write API; \
                          staleness: the acknowledgement to the end of the first page read showing the value",
                "writers": shop_writes::WRITERS,
                "fresh_within_s": shop_writes::FRESH_WITHIN.as_secs(),
            },
            "file_limit": file_limit,
        },
        "data": {"seed": options.seed, "products": shop.products.len(), "reviews": shop.reviews.len()},
        "targets": settings,
        "runs": lines,
    });
    std::fs::write(options.out.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    print!("{summary}");
    if options.json {
        for line in &lines {
            println!("{line}");
        }
    }
    Ok(())
}

fn json_line(result: &RunResult) -> Value {
    let p = Percentiles::of(&result.latency);
    json!({
        "workload": "shop",
        "target": result.target.name(),
        "page": result.page.name(),
        "vus": match result.load { Load::Vus(vus) => Some(vus), Load::Rate(_) => None },
        "rate": match result.load { Load::Rate(rate) => Some(rate), Load::Vus(_) => None },
        "dropped": result.dropped,
        "loads": result.loads,
        "ok": p.count,
        "loads_per_s": result.loads as f64 / result.seconds,
        "p50_ms": p.p50_ns as f64 / 1e6,
        "p95_ms": p.p95_ns as f64 / 1e6,
        "p99_ms": p.p99_ns as f64 / 1e6,
        "p999_ms": p.p999_ns as f64 / 1e6,
        "errors": {"timeout": result.errors[0], "refused": result.errors[1], "reset": result.errors[2], "status": result.errors[3]},
        "first_error": result.first_error,
        "cpu_s": result.cpu_s,
        "harness_cpu_s": result.harness_cpu_s,
        "rss_max_mib": result.rss_max_mib,
        "writes": {
            "per_s": result.writes.rate,
            "done": result.writes.done,
            "errors": result.writes.errors,
            "never_fresh": result.writes.never_fresh,
            "first_error": result.writes.first_error,
            "latency_p50_ms": Percentiles::of(&result.writes.latency).p50_ns as f64 / 1e6,
            "latency_p99_ms": Percentiles::of(&result.writes.latency).p99_ns as f64 / 1e6,
            "staleness_p50_ms": Percentiles::of(&result.writes.staleness).p50_ns as f64 / 1e6,
            "staleness_p99_ms": Percentiles::of(&result.writes.staleness).p99_ns as f64 / 1e6,
        },
    })
}

fn summary(options: &ShopOptions, results: &[RunResult]) -> String {
    let mut text = String::from("# onehop bench shop (study 2)\n\n");
    text.push_str(&format!(
        "Virtual users with k6's semantics (own keep-alive connection, GET, check, sleep 1 s, 60 s timeout), \
         and open-loop runs at a fixed rate (a load due every 1/rate s on an idle or new connection, timed from \
         when it was due, dropped when 2 000 are in flight), {} s per run, each run on a stack started for it. \
         Latency of successful page loads (home: the HTML and the first 8 products); CPU and peak RSS of every \
         process of the target, and the harness's own CPU (its VUs share the two cores with the target).\n\n",
        options.duration.as_secs()
    ));
    for &page in &options.pages {
        text.push_str(&format!("## {}\n\n", page.name()));
        text.push_str(
            "| target | load | p50 ms | p95 | p99 | p99.9 | loads/s | errors (timeout/refused/reset/status) | dropped | CPU s | RSS MiB | harness CPU s |\n\
             |---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|\n",
        );
        for result in results.iter().filter(|result| result.page == page) {
            let p = Percentiles::of(&result.latency);
            text.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {:.1} | {} / {} / {} / {} | {} | {:.1} | {:.0} | {:.1} |\n",
                result.target.name(),
                result.load.label(),
                ms(p.p50_ns),
                ms(p.p95_ns),
                ms(p.p99_ns),
                ms(p.p999_ns),
                result.loads as f64 / result.seconds,
                result.errors[0],
                result.errors[1],
                result.errors[2],
                result.errors[3],
                result.dropped,
                result.cpu_s,
                result.rss_max_mib,
                result.harness_cpu_s
            ));
        }
        text.push_str("\nPublished (the study, M1 Max, 10 cores; p50 / p95 ms / req/s / error %):\n\n");
        text.push_str("| VUs | microservices | the study's unified runtime |\n|---:|---|---|\n");
        for (_, vus, micro, unified) in PUBLISHED.iter().filter(|(name, ..)| *name == page.name()) {
            text.push_str(&format!("| {vus} | {micro} | {unified} |\n"));
        }
        text.push('\n');
        if let Some(error) = results.iter().filter(|result| result.page == page).find_map(|r| r.first_error.clone()) {
            text.push_str(&format!("First error seen: {error}\n\n"));
        }
    }
    if options.writes_per_s > 0 {
        text.push_str(&writes_summary(options, results));
    }
    text
}

/// The writes-while-reading table: per run, the writes made and the pages' staleness.
fn writes_summary(options: &ShopOptions, results: &[RunResult]) -> String {
    let mut text = format!(
        "## Writes while reading\n\n{} price and stock changes per second (open loop) through each stack's own \
         write API during every run. Write latency: from when the write was due to its acknowledgement. \
         Staleness: from the acknowledgement to the end of the first read of the product's page that shows \
         the new value (one page read included); never fresh: not shown within {} s.\n\n\
         | target | page run | load | writes/s | write p50 ms | p99 | staleness p50 ms | p99 | errors | never fresh |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        options.writes_per_s,
        shop_writes::FRESH_WITHIN.as_secs()
    );
    for result in results {
        let (latency, stale) = (Percentiles::of(&result.writes.latency), Percentiles::of(&result.writes.staleness));
        text.push_str(&format!(
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |\n",
            result.target.name(),
            result.page.name(),
            result.load.label(),
            result.writes.done as f64 / result.seconds,
            ms(latency.p50_ns),
            ms(latency.p99_ns),
            ms(stale.p50_ns),
            ms(stale.p99_ns),
            result.writes.errors,
            result.writes.never_fresh
        ));
    }
    if let Some(error) = results.iter().find_map(|result| result.writes.first_error.clone()) {
        text.push_str(&format!("\nFirst write error seen: {error}\n"));
    }
    text.push('\n');
    text
}
