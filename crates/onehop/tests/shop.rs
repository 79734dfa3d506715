//! Study 2's shop on onehop, through the binary: `onehop bench shop --load` writes the
//! catalogue into a server that asks for credentials, and the pages — the home page's HTML
//! from `--static-dir`, its first 8 products, the whole listing, one category, each product's
//! detail — answer exactly what the data says: the contract the microservices stack is held to
//! too. A price, a stock and a review change reach the product's page, and a restart serves
//! the same pages.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{DataDir, curl, last_json_line, onehop, run_expecting_success};
use onehop_bench::shop::{DEFAULT_SEED, HOME_HTML, Shop};
use serde_json::{Value, json};

const ROOT: (&str, &str) = ("root", "shop-test-password");

/// The answer to a GET as root: its status and JSON.
fn get_json(address: SocketAddr, target: &str) -> (u16, Value) {
    let user = format!("{}:{}", ROOT.0, ROOT.1);
    let (status, body) = curl(address, target, &["-u", &user]);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The page rows of a view listing, in key order.
fn listing(address: SocketAddr, target: &str) -> Vec<Value> {
    let (status, answer) = get_json(address, target);
    assert_eq!(status, 200, "{target}: {answer}");
    answer["keys"].as_array().unwrap().iter().map(|entry| entry["rows"][0].clone()).collect()
}

fn detail(address: SocketAddr, id: &str) -> Value {
    let (status, answer) = get_json(address, &format!("/views/product_pages/{id}"));
    assert_eq!(status, 200, "{id}: {answer}");
    answer["rows"][0].clone()
}

/// Waits until product `id`'s page is `wanted` (20 s at most).
fn page_becomes(address: SocketAddr, id: &str, wanted: &Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = detail(address, id);
        if page == *wanted {
            return;
        }
        assert!(Instant::now() < deadline, "{id}'s page is\n  {page}\nnot\n  {wanted}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn write(address: SocketAddr, method: &str, target: &str, body: &str) {
    let user = format!("{}:{}", ROOT.0, ROOT.1);
    let (status, answer) = curl(address, target, &["-u", &user, "-X", method, "-d", body]);
    assert!((200..300).contains(&status), "{method} {target}: {status} {answer}");
}

#[test]
fn the_shop_loads_and_its_pages_are_what_the_data_says() {
    let dir = DataDir::new();
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    let site_arg = site.to_str().unwrap();
    let admin = [("ONEHOP_ADMIN_PASSWORD", ROOT.1)];
    let server = dir.start(&["--static-dir", site_arg, "--admin-user", ROOT.0], &admin);
    let address = server.address;
    let url = format!("http://{address}");
    let (stdout, stderr) = run_expecting_success(
        onehop()
            .args(["bench", "shop", "--load", "--url", &url, "--user", ROOT.0, "--site", site_arg, "--json"])
            .env("ONEHOP_PASSWORD", ROOT.1),
    );
    let line = last_json_line(&stdout);
    let shop = Shop::generate(DEFAULT_SEED);
    assert_eq!((line["products"].as_u64(), line["categories"].as_u64()), (Some(1013), Some(8)), "{line}");
    assert_eq!(line["reviews"].as_u64(), Some(shop.reviews.len() as u64), "{line}");
    assert!(stderr.contains("written") && stderr.contains("batches"), "progress is shown: {stderr}");

    // The home page: its HTML, to anyone, and its first 8 products.
    let (status, body) = curl(address, "/", &[]);
    assert_eq!((status, body.as_str()), (200, HOME_HTML));
    let mut expected = shop.pages();
    assert_eq!(listing(address, "/views/product_pages?limit=8"), expected[..8]);
    // The whole catalogue, one category, and products one by one.
    assert_eq!(listing(address, "/views/product_pages?limit=10000"), expected);
    let garden: Vec<Value> = expected.iter().filter(|page| page["category_id"] == "garden").cloned().collect();
    assert_eq!(garden.len(), 82);
    assert_eq!(listing(address, "/views/product_pages?category_id=garden&limit=10000"), garden);
    for page in expected.iter().step_by(37) {
        assert_eq!(detail(address, page["id"].as_str().unwrap()), *page);
    }
    let (status, answer) = get_json(address, "/views/product_pages/p_books_999");
    assert_eq!(status, 404, "{answer}");

    // Writes through the tables reach the product's page: a price, a stock, a first review.
    let at = expected.iter().position(|page| page["review_count"] == 0).unwrap();
    let id = expected[at]["id"].as_str().unwrap().to_string();
    write(address, "PUT", &format!("/tables/prices/{id}"), r#"{"amount": 12.5, "currency": "EUR"}"#);
    write(address, "PATCH", &format!("/tables/inventory/{id}"), r#"{"stock": 0}"#);
    let review = format!(r#"{{"product_id": "{id}", "rating": 5, "title": "love it", "author": "Gus"}}"#);
    write(address, "PUT", "/tables/reviews/r_new", &review);
    let page = &mut expected[at];
    page["price"] = json!(12.5);
    page["stock"] = json!(0);
    page["review_count"] = json!(1);
    page["rating"] = json!(5.0);
    page["reviews"] = json!([{"id": "r_new", "rating": 5, "title": "love it", "author": "Gus"}]);
    page_becomes(address, &id, &expected[at]);

    // A restart builds the pages again from the tables.
    drop(server);
    let server = dir.start(&["--static-dir", site_arg, "--admin-user", ROOT.0], &admin);
    page_becomes(server.address, &id, &expected[at]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while listing(server.address, "/views/product_pages?limit=10000") != expected {
        assert!(Instant::now() < deadline, "the listing after the restart is not the shop's");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A page's JSON from the microservices stack's gateway.
fn gateway_json(address: SocketAddr, target: &str) -> (u16, Value) {
    let (status, body) = curl(address, target, &[]);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The same pages from study 2's microservices stack, in both layouts (the fair one and the
/// study's own): started by the harness on a Postgres of its own with the same seed's data,
/// the gateway's home, listing, category and detail pages equal the pages computed from the
/// data, compared by value with keys in order. Needs `scripts/peers install microservices`.
#[test]
fn the_microservices_stack_answers_the_same_pages_in_both_layouts() {
    use onehop_bench::shop::canonical;
    use onehop_bench::target::peers::shop_stack::{Layout, ShopStack};
    let shop = Shop::generate(DEFAULT_SEED);
    let expected = shop.pages();
    let canonical_all = |pages: &[Value]| pages.iter().map(canonical).collect::<Vec<_>>();
    for layout in [Layout::Indexed, Layout::Published] {
        let dir = tempfile::tempdir().unwrap();
        let (site, logs) = (dir.path().join("site"), dir.path().join("logs"));
        std::fs::create_dir_all(&logs).unwrap();
        onehop_bench::shop::write_site(&site).unwrap();
        let stack = ShopStack::start(dir.path(), &logs, layout, &shop, &site)
            .unwrap_or_else(|error| panic!("{layout:?}: {error:#}"));
        let address: SocketAddr = stack.address().parse().unwrap();
        let (status, body) = curl(address, "/", &[]);
        assert_eq!((status, body.as_str()), (200, HOME_HTML), "{layout:?}");
        let (status, answer) = gateway_json(address, "/api/products?limit=10000");
        assert_eq!(status, 200, "{layout:?}: {answer}");
        let products = answer["products"].as_array().unwrap();
        assert_eq!(canonical_all(products), canonical_all(&expected), "{layout:?}: the listing");
        let (_, answer) = gateway_json(address, "/api/products?limit=8");
        assert_eq!(canonical_all(answer["products"].as_array().unwrap()), canonical_all(&expected[..8]));
        let garden: Vec<Value> = expected.iter().filter(|page| page["category_id"] == "garden").cloned().collect();
        let (_, answer) = gateway_json(address, "/api/products?category=garden&limit=10000");
        assert_eq!(canonical_all(answer["products"].as_array().unwrap()), canonical_all(&garden), "{layout:?}");
        for page in expected.iter().step_by(37) {
            let (status, answer) = gateway_json(address, &format!("/api/products/{}", page["id"].as_str().unwrap()));
            assert_eq!(status, 200, "{layout:?}: {answer}");
            assert_eq!(canonical(&answer), canonical(page), "{layout:?}");
        }
        let (status, _) = gateway_json(address, "/api/products/p_books_999");
        assert_eq!(status, 404, "{layout:?}");
        // The writes the harness makes while reading, each through the service owning the row;
        // the next read of the page shows it.
        let id = expected[5]["id"].as_str().unwrap();
        let put = |target: &str, body: &str| {
            curl(address, target, &["-X", "PUT", "-H", "content-type: application/json", "-d", body])
        };
        let (status, body) = put(&format!("/api/products/{id}/stock"), r#"{"stock": 4242}"#);
        assert_eq!(status, 200, "{layout:?}: {body}");
        let (status, body) = put(&format!("/api/products/{id}/price"), r#"{"amount": 12.34}"#);
        assert_eq!(status, 200, "{layout:?}: {body}");
        let (_, page) = gateway_json(address, &format!("/api/products/{id}"));
        assert_eq!((page["stock"].as_u64(), page["price"].as_f64()), (Some(4242), Some(12.34)), "{layout:?}: {page}");
        assert_eq!(page["currency"], expected[5]["currency"], "the rest of the row is kept");
        let (status, _) = put("/api/products/p_books_999/stock", r#"{"stock": 1}"#);
        assert_eq!(status, 404, "{layout:?}");
        let (status, body) = put(&format!("/api/products/{id}/stock"), r#"{"stock": "many"}"#);
        assert_eq!(status, 400, "{layout:?}: {body}");
        assert_eq!(stack.settings()["layout"], layout.name());
        assert_eq!(stack.pids().len(), 6, "Postgres, four services and the gateway");
    }
}

/// `onehop bench shop` end to end, briefly: onehop and the indexed microservices stack, every
/// page at 3 VUs and at 10 loads/s (open loop) for 2 s, each run on a stack of its own. Every
/// page load succeeds on both, every write made meanwhile is acknowledged and then seen on its
/// product's page, and the report (summary.md with the published figures beside, meta.json, a
/// chart per page and one of staleness) is written. Needs `scripts/peers install microservices`.
#[test]
fn bench_shop_runs_every_page_against_both_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let (stdout, stderr) = run_expecting_success(
        onehop()
            .args(["bench", "shop", "--target", "onehop,microservices", "--vus", "3", "--rates", "10"])
            .args(["--duration", "2", "--json"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--out")
            .arg(&out),
    );
    assert!(stderr.contains("run 12 of 12"), "progress is shown: {stderr}");
    let lines: Vec<Value> =
        stdout.lines().filter(|line| line.starts_with('{')).map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 12, "{stdout}");
    for line in &lines {
        let errors = &line["errors"];
        let failed: u64 =
            ["timeout", "refused", "reset", "status"].iter().map(|kind| errors[kind].as_u64().unwrap()).sum();
        assert_eq!(failed, 0, "{line}");
        if line["rate"].is_null() {
            assert!(line["ok"].as_u64().unwrap() >= 3, "every VU loaded its page: {line}");
        } else {
            // Open loop at 10/s for 2 s: 20 loads due, each made and answered.
            assert_eq!(
                (line["loads"].as_u64(), line["ok"].as_u64(), line["dropped"].as_u64()),
                (Some(20), Some(20), Some(0)),
                "{line}"
            );
        }
        assert!(line["cpu_s"].as_f64().unwrap() > 0.0 && line["rss_max_mib"].as_f64().unwrap() > 0.0, "{line}");
        // The writes while reading (100/s by default): each acknowledged and then seen on its
        // product's page.
        let writes = &line["writes"];
        assert!(writes["done"].as_u64().unwrap() > 0, "{line}");
        assert_eq!((writes["errors"].as_u64(), writes["never_fresh"].as_u64()), (Some(0), Some(0)), "{line}");
        assert!(writes["staleness_p99_ms"].as_f64().unwrap() > 0.0, "{line}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## listing") && summary.contains("40 740 / 59 998 / 0.45 / 35"), "{summary}");
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["targets"]["microservices"]["layout"], "indexed", "{meta}");
    assert!(summary.contains("## Writes while reading"), "{summary}");
    for chart in ["home", "listing", "detail", "staleness"] {
        assert!(std::fs::read_to_string(out.join(format!("shop-{chart}.svg"))).unwrap().contains("<svg"));
    }
    let output = onehop().args(["bench", "shop", "--target", "kafka"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown shop target kafka"));
    let output = onehop().args(["bench", "shop", "--rates", "0"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--rates 0: a rate is"), "{output:?}");
    // Nothing of the runs is left in --dir but the report.
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into())
        .collect();
    assert_eq!(left, ["results"], "{left:?}");
}
