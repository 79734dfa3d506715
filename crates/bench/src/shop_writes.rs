//! Study 2's writes while reading: price and stock changes at a fixed rate through a stack's
//! own write API during a page run, and how stale the pages are.
//!
//! The schedule is fixed: write `n` is due at `n / rate` seconds from the start, and its latency
//! counts from when it was due, so a write made late (its writer still busy with an earlier
//! one) counts its wait as latency, not omitted; a writer still behind when the run ends stops
//! there, and the writes it did not make show as a lower rate. [`WRITERS`] threads share the
//! schedule, each with its own keep-alive connection and its own products (product `i` belongs
//! to writer `i % WRITERS`), so no two changes of one product are in flight at once. After each
//! acknowledgement the writer reads the product's page until it shows the new value: the
//! staleness is the acknowledgement to the end of the first such read (so it includes one page
//! read; a page that did not show it in [`FRESH_WITHIN`] counts as never fresh).
//!
//! - onehop: `PATCH /tables/inventory/{id}` `{"stock": N}` and `PATCH /tables/prices/{id}`
//!   `{"amount": X}`, the page `GET /views/product_pages/{id}`.
//! - the microservices: `PUT /api/products/{id}/stock` and `…/price` on the gateway, which
//!   forwards to the inventory or pricing service; the page `GET /api/products/{id}`.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::client::http1::KeepAlive;
use crate::histogram::{latency_histogram, merge, record};

/// Threads that share the schedule.
pub const WRITERS: usize = 8;
/// How long a page may take to show a change before it counts as never fresh.
pub const FRESH_WITHIN: Duration = Duration::from_secs(10);
/// How long one request may take before the writer counts an error and reconnects.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Whose write API the writes go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// onehop's tables and its `product_pages` view.
    Onehop,
    /// The microservices' gateway.
    Gateway,
}

/// One change: a product's stock or price, to a value no other write of the run sets.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    Stock(u64),
    Price(f64),
}

impl Change {
    /// The `n`th write's change: stock and price in turn, values that grow with `n`.
    fn nth(n: u64) -> Change {
        if n.is_multiple_of(2) { Change::Stock(1_000_000 + n) } else { Change::Price((1_000_000 + n) as f64 / 100.0) }
    }

    /// The request that makes it: method, target and body.
    fn request(self, api: Api, product: &str) -> (&'static str, String, Vec<u8>) {
        let (field, value) = match self {
            Change::Stock(stock) => ("stock", json!({"stock": stock})),
            Change::Price(amount) => ("price", json!({"amount": amount})),
        };
        let body = value.to_string().into_bytes();
        match (api, field) {
            (Api::Onehop, "stock") => ("PATCH", format!("/tables/inventory/{product}"), body),
            (Api::Onehop, _) => ("PATCH", format!("/tables/prices/{product}"), body),
            (Api::Gateway, _) => ("PUT", format!("/api/products/{product}/{field}"), body),
        }
    }

    /// Whether a page (as the stack answers it) shows the change.
    fn shown_in(self, api: Api, answer: &[u8]) -> bool {
        let Ok(answer) = serde_json::from_slice::<Value>(answer) else { return false };
        let page = match api {
            Api::Onehop => &answer["rows"][0],
            Api::Gateway => &answer,
        };
        match self {
            Change::Stock(stock) => page["stock"].as_u64() == Some(stock),
            Change::Price(amount) => page["price"].as_f64() == Some(amount),
        }
    }
}

fn page_target(api: Api, product: &str) -> String {
    match api {
        Api::Onehop => format!("/views/product_pages/{product}"),
        Api::Gateway => format!("/api/products/{product}"),
    }
}

/// What the writes of a run measured.
pub struct Writes {
    /// Writes per second asked for.
    pub rate: u32,
    /// From when a write was due to its acknowledgement.
    pub latency: Histogram<u64>,
    /// From a write's acknowledgement to the end of the first page read that showed it.
    pub staleness: Histogram<u64>,
    /// Writes acknowledged.
    pub done: u64,
    /// Writes refused or failed.
    pub errors: u64,
    /// Acknowledged writes no page showed within [`FRESH_WITHIN`].
    pub never_fresh: u64,
    pub first_error: Option<String>,
}

impl Writes {
    fn new(rate: u32) -> Writes {
        Writes {
            rate,
            latency: latency_histogram(),
            staleness: latency_histogram(),
            done: 0,
            errors: 0,
            never_fresh: 0,
            first_error: None,
        }
    }

    fn fail(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }

    fn add(&mut self, other: Writes) {
        merge(&mut self.latency, &other.latency);
        merge(&mut self.staleness, &other.staleness);
        self.done += other.done;
        self.errors += other.errors;
        self.never_fresh += other.never_fresh;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Writes `rate` changes per second to the stack at `address` from `started` until `until`,
/// then answers what they measured (a thread per writer; call from outside an async runtime).
pub fn run(address: &str, api: Api, products: &[String], rate: u32, started: Instant, until: Instant) -> Writes {
    let mut total = Writes::new(rate);
    if rate == 0 || products.is_empty() {
        return total;
    }
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let address = address.to_string();
            let mine: Vec<String> = products.iter().skip(writer).step_by(WRITERS).cloned().collect();
            std::thread::spawn(move || writer_loop(writer, &address, api, &mine, rate, started, until))
        })
        .collect();
    for writer in writers {
        match writer.join() {
            Ok(writes) => total.add(writes),
            Err(_) => total.fail("a writer thread panicked".into()),
        }
    }
    total
}

/// Writer `writer`'s share of the schedule: writes `writer`, `writer + WRITERS`, ….
fn writer_loop(
    writer: usize,
    address: &str,
    api: Api,
    products: &[String],
    rate: u32,
    started: Instant,
    until: Instant,
) -> Writes {
    let mut writes = Writes::new(rate);
    if products.is_empty() {
        return writes;
    }
    let mut connection: Option<KeepAlive> = None;
    let mut n = writer as u64;
    loop {
        let due = started + Duration::from_secs_f64(n as f64 / f64::from(rate));
        // A writer that fell behind (a stack too slow to answer) stops with the run: the writes
        // it did not make show as a lower rate.
        if due >= until || Instant::now() >= until {
            return writes;
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let product = &products[(n / WRITERS as u64) as usize % products.len()];
        let change = Change::nth(n);
        n += WRITERS as u64;
        let (method, target, body) = change.request(api, product);
        let answer = connect(&mut connection, address).and_then(|http| http.send(method, &target, &body));
        let acked = match answer {
            Ok((200 | 201, _)) => Instant::now(),
            Ok((status, body)) => {
                writes.fail(format!("{method} {target}: status {status}: {}", String::from_utf8_lossy(&body)));
                continue;
            }
            Err(error) => {
                writes.fail(format!("{method} {target}: {error}"));
                connection = None;
                continue;
            }
        };
        record(&mut writes.latency, acked.duration_since(due).as_nanos() as u64);
        writes.done += 1;
        let page = page_target(api, product);
        loop {
            let read = connect(&mut connection, address).and_then(|http| http.send("GET", &page, b""));
            match read {
                Ok((200, answer)) if change.shown_in(api, &answer) => {
                    record(&mut writes.staleness, acked.elapsed().as_nanos() as u64);
                    break;
                }
                Ok(_) => {}
                Err(error) => {
                    writes.fail(format!("GET {page}: {error}"));
                    connection = None;
                }
            }
            if acked.elapsed() >= FRESH_WITHIN {
                writes.never_fresh += 1;
                break;
            }
        }
    }
}

/// The writer's connection, made if there is none.
fn connect<'a>(connection: &'a mut Option<KeepAlive>, address: &str) -> std::io::Result<&'a mut KeepAlive> {
    if connection.is_none() {
        let http = KeepAlive::connect(address)?;
        http.set_timeout(REQUEST_TIMEOUT)?;
        *connection = Some(http);
    }
    Ok(connection.as_mut().expect("made above"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_of_a_run_sets_a_value_of_its_own_and_a_page_shows_it_by_value() {
        let changes: Vec<Change> = (0..1000).map(Change::nth).collect();
        for (at, change) in changes.iter().enumerate() {
            assert!(!changes[..at].contains(change), "{change:?} twice");
        }
        let stock = Change::Stock(1_000_004);
        assert!(stock.shown_in(Api::Gateway, br#"{"id":"p_0_1","stock":1000004,"price":1.5}"#));
        assert!(stock.shown_in(Api::Onehop, br#"{"rows":[{"id":"p_0_1","stock":1000004}]}"#));
        assert!(!stock.shown_in(Api::Onehop, br#"{"rows":[{"id":"p_0_1","stock":1000002}]}"#));
        let price = Change::nth(7);
        let Change::Price(amount) = price else { panic!("{price:?}") };
        let page = json!({"rows": [{"price": amount}]}).to_string();
        assert!(price.shown_in(Api::Onehop, page.as_bytes()));
        assert!(!price.shown_in(Api::Gateway, page.as_bytes()));
        assert_eq!(price.request(Api::Gateway, "p_0_1").1, "/api/products/p_0_1/price");
        assert_eq!(stock.request(Api::Onehop, "p_0_1").1, "/tables/inventory/p_0_1");
    }
}
