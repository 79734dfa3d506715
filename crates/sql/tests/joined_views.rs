//! Joined views on a real engine: defined in SQL over five tables, kept live as any input
//! changes, read by key and in pages, their changes in the change stream, rebuilt after a
//! restart; bad definitions refused by name; and a model test holding the incremental state
//! beside the same SELECT evaluated from scratch by the query engine after every change.

mod common;

use std::time::{Duration, Instant};

use common::{close, fresh, open, run};
use onehop_engine::view::join::state::JoinState;
use onehop_engine::{Engine, Position, Precondition, Write};
use onehop_sql::Output;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const TABLES: &str = "CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT, tier BIGINT); \
     CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT, category TEXT); \
     CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT, product TEXT, qty BIGINT); \
     CREATE TABLE shipments (id TEXT PRIMARY KEY, order_id TEXT, carrier TEXT); \
     CREATE TABLE reviews (id TEXT PRIMARY KEY, product TEXT, stars BIGINT)";

/// Five inputs: a PK join, an FK→PK left join, a left join that fans out (shipments of the
/// order), one on a non-key column with a residual condition (reviews of the product), and a
/// WHERE.
const ORDERS_QUERY: &str = "SELECT o.id AS order_id, o.qty, c.name, c.tier, p.title, s.carrier, r.stars \
     FROM orders o JOIN customers c ON c.id = o.customer \
     LEFT JOIN products p ON p.id = o.product \
     LEFT JOIN shipments s ON s.order_id = o.id \
     LEFT JOIN reviews r ON r.product = o.product AND r.stars >= 2 \
     WHERE o.qty IS NULL OR o.qty <> 3";

/// Nested 1:N: each product's reviews, counted, averaged and collected in order.
const REVIEWS_QUERY: &str = "SELECT product, COUNT(*) AS n, AVG(stars) AS rating, \
     JSON_AGG(stars ORDER BY stars DESC) AS stars, ARRAY_AGG(id ORDER BY id) AS ids \
     FROM reviews GROUP BY product";

/// …joined into the product: a joined view reading an aggregate view.
const PAGES_QUERY: &str = "SELECT p.id, p.title, r.n, r.rating, r.stars \
     FROM products p LEFT JOIN product_reviews r ON r.product = p.id";

/// Aggregates over a join: orders by their customer's tier, each shipment of an order one
/// more joined row, so counted once per shipment (as the same SELECT counts them).
const TIERS_QUERY: &str = "SELECT c.tier, COUNT(*) AS n, SUM(o.qty) AS items, COUNT(s.carrier) AS shipped, \
     JSON_AGG(o.id ORDER BY o.id, s.carrier) AS orders \
     FROM orders o JOIN customers c ON c.id = o.customer LEFT JOIN shipments s ON s.order_id = o.id \
     WHERE o.qty IS NULL OR o.qty <> 3 GROUP BY c.tier";

/// A join on expressions: products with the customers whose name is the product's title, in
/// any case.
const NAMESAKES_QUERY: &str = "SELECT p.id, p.title, c.name AS namesake \
     FROM products p LEFT JOIN customers c ON LOWER(c.name) = LOWER(p.title)";

async fn put(engine: &Engine, table: &str, id: &str, row: Value) {
    let Value::Object(row) = row else { panic!("a row is an object") };
    engine.table(table).unwrap().write(id, Write::Put(row), Precondition::None, None).await.unwrap();
}

async fn delete(engine: &Engine, table: &str, id: &str) {
    engine.table(table).unwrap().write(id, Write::Delete, Precondition::None, None).await.unwrap();
}

/// The query's rows as the query engine answers them now, each as its JSON text, sorted.
async fn from_scratch(engine: &Engine, query: &str) -> Vec<String> {
    let Output::Rows { columns, rows, .. } = run(engine, query).await.unwrap().pop().unwrap() else {
        panic!("{query} answers rows")
    };
    let mut rows: Vec<String> = rows
        .into_iter()
        .map(|row| Value::Object(columns.iter().cloned().zip(row).collect::<Map<_, _>>()).to_string())
        .collect();
    rows.sort();
    rows
}

/// Rows of a page of a view (or of a joined state), each as its JSON text, sorted.
fn texts(page: Vec<(String, Vec<Value>)>) -> Vec<String> {
    let mut rows: Vec<String> = page.into_iter().flat_map(|(_, rows)| rows).map(|row| row.to_string()).collect();
    rows.sort();
    rows
}

/// Waits until view `view` has exactly the rows the query engine answers for `query`.
async fn settled(engine: &Engine, view: &str, query: &str) -> Vec<(String, Vec<Value>)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let expected = from_scratch(engine, query).await;
        let page = engine.view(view).unwrap().page(None, usize::MAX);
        if texts(page.clone()) == expected {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "view {view} did not settle:\n  view:     {page:?}\n  expected: {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The view's change stream: (key, removed, row without its flags and the row it replaced).
fn changes(engine: &Engine, view: &str) -> Vec<(String, bool, Value)> {
    raw_changes(engine, view)
        .into_iter()
        .map(|(key, mut value)| {
            let fields = value.as_object_mut().unwrap();
            let removed = fields.remove("removed").is_some();
            fields.remove("final");
            fields.remove("before");
            (key, removed, value)
        })
        .collect()
}

/// The view's change stream once a change `wanted` holds for is in it (20 s at most).
async fn change_where(
    engine: &Engine,
    view: &str,
    wanted: impl Fn(&(String, bool, Value)) -> bool,
) -> Vec<(String, bool, Value)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = changes(engine, view);
        if all.iter().any(&wanted) {
            return all;
        }
        assert!(Instant::now() < deadline, "view {view} did not write the change: {all:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn changes_after(engine: &Engine, view: &str, count: usize) -> Vec<(String, bool, Value)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = changes(engine, view);
        if all.len() >= count {
            return all;
        }
        assert!(Instant::now() < deadline, "view {view} wrote {} changes, not {count}: {all:?}", all.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_input_view_follows_every_input_and_is_rebuilt_after_a_restart() {
    let (dir, engine) = fresh();
    run(&engine, TABLES).await.unwrap();
    put(&engine, "customers", "c1", json!({"name": "Ada", "tier": 1})).await;
    put(&engine, "customers", "c2", json!({"name": "Bo", "tier": 2})).await;
    put(&engine, "products", "p1", json!({"title": "lamp", "category": "home"})).await;
    put(&engine, "orders", "o1", json!({"customer": "c1", "product": "p1", "qty": 2})).await;
    put(&engine, "orders", "o2", json!({"customer": "c2", "product": "p9", "qty": 1})).await;
    put(&engine, "orders", "o3", json!({"customer": "c9", "product": "p1", "qty": 1})).await;
    run(&engine, &format!("CREATE VIEW enriched AS {ORDERS_QUERY}")).await.unwrap();
    let page = settled(&engine, "enriched", ORDERS_QUERY).await;
    // Shipments and reviews can match several rows: their ids are in the key (empty: none).
    let keys: Vec<&str> = page.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["o1::", "o2::"], "o3's customer does not exist: the inner join drops it");
    assert_eq!(
        page[0].1[0],
        json!({"order_id": "o1", "qty": 2, "name": "Ada", "tier": 1, "title": "lamp", "carrier": null, "stars": null})
    );
    assert_eq!(engine.view("enriched").unwrap().rows("o2::")[0]["title"], Value::Null);

    // Each input changes the rows it reaches, and only those.
    put(&engine, "shipments", "s1", json!({"order_id": "o1", "carrier": "dhl"})).await;
    put(&engine, "reviews", "r1", json!({"product": "p1", "stars": 5})).await;
    put(&engine, "reviews", "r2", json!({"product": "p1", "stars": 1})).await;
    put(&engine, "customers", "c9", json!({"name": "Cy", "tier": 3})).await;
    put(&engine, "customers", "c1", json!({"name": "Ada L.", "tier": 1})).await;
    let page = settled(&engine, "enriched", ORDERS_QUERY).await;
    let keys: Vec<&str> = page.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["o1:s1:r1", "o2::", "o3::r1"]);
    assert_eq!(page[0].1[0]["name"], "Ada L.");
    assert_eq!(page[0].1[0]["carrier"], "dhl");
    // Paging goes on after a key, and a point read finds one joined row.
    let view = engine.view("enriched").unwrap();
    assert_eq!(view.page(Some("o1:s1:r1"), 1)[0].0, "o2::");
    assert_eq!(view.rows("o3::r1")[0]["stars"], 5);
    assert!(view.rows("o3::").is_empty());
    let status = view.status();
    assert_eq!(status.keys, 3);
    let inputs = status.inputs.unwrap();
    assert_eq!(inputs.iter().map(|input| input.rows).collect::<Vec<_>>(), [3, 3, 1, 1, 2]);

    // The change stream (written after the state changes, without waiting): the null-padded
    // row retracted when its match came, the rename once.
    let is_rename =
        |(key, removed, row): &(String, bool, Value)| key == "o1:s1:r1" && !removed && row["name"] == "Ada L.";
    let all = change_where(&engine, "enriched", is_rename).await;
    assert!(all.contains(&("o1::".to_string(), true, page_row(&all, "o1::"))), "{all:?}");

    // A delete of a dimension row removes what went through it; the WHERE removes rows too.
    delete(&engine, "customers", "c9").await;
    put(&engine, "orders", "o2", json!({"customer": "c2", "product": "p9", "qty": 3})).await;
    let page = settled(&engine, "enriched", ORDERS_QUERY).await;
    assert_eq!(page.iter().map(|(key, _)| key.as_str()).collect::<Vec<_>>(), ["o1:s1:r1"]);
    // The order's change is written after the rename's: once it is there, the rename is there
    // exactly once.
    let all = change_where(&engine, "enriched", |(key, removed, _)| key == "o2::" && *removed).await;
    assert_eq!(all.iter().filter(|change| is_rename(change)).count(), 1, "{all:?}");

    // SQL reads it as any view, and DROP TABLE of an input is refused while it reads it.
    let Output::Rows { rows, .. } = run(&engine, "SELECT name, carrier FROM enriched").await.unwrap().pop().unwrap()
    else {
        panic!()
    };
    assert_eq!(rows, vec![vec![json!("Ada L."), json!("dhl")]]);
    let refused = run(&engine, "DROP TABLE reviews").await.unwrap_err().to_string();
    assert!(refused.contains("enriched"), "{refused}");

    // A restart rebuilds it from the tables, and it follows on.
    close(engine).await;
    let engine = open(dir.path());
    settled(&engine, "enriched", ORDERS_QUERY).await;
    put(&engine, "shipments", "s2", json!({"order_id": "o1", "carrier": "ups"})).await;
    let page = settled(&engine, "enriched", ORDERS_QUERY).await;
    assert_eq!(page.len(), 2);
    run(&engine, "DROP VIEW enriched; DROP TABLE reviews").await.unwrap();
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_aggregates_a_join_and_follows_every_input() {
    let (dir, engine) = fresh();
    run(&engine, TABLES).await.unwrap();
    put(&engine, "customers", "c1", json!({"name": "Ada", "tier": 1})).await;
    put(&engine, "customers", "c2", json!({"name": "Bo", "tier": 2})).await;
    put(&engine, "orders", "o1", json!({"customer": "c1", "product": "p1", "qty": 2})).await;
    put(&engine, "orders", "o2", json!({"customer": "c2", "product": "p1", "qty": 1})).await;
    put(&engine, "orders", "o3", json!({"customer": "c9", "product": "p1", "qty": 5})).await;
    run(&engine, &format!("CREATE VIEW tiers AS {TIERS_QUERY}")).await.unwrap();
    let page = settled(&engine, "tiers", TIERS_QUERY).await;
    assert_eq!(
        page,
        vec![
            ("1".to_string(), vec![json!({"tier": 1, "n": 1, "items": 2, "shipped": 0, "orders": ["o1"]})]),
            ("2".to_string(), vec![json!({"tier": 2, "n": 1, "items": 1, "shipped": 0, "orders": ["o2"]})]),
        ],
        "o3's customer does not exist: the inner join leaves it out"
    );

    // A shipment adds a joined row; the customer that was missing brings its order in; a
    // customer moving tier takes its orders from one group to the other.
    put(&engine, "shipments", "s1", json!({"order_id": "o1", "carrier": "dhl"})).await;
    put(&engine, "shipments", "s2", json!({"order_id": "o1", "carrier": "ups"})).await;
    put(&engine, "customers", "c9", json!({"name": "Cy", "tier": 2})).await;
    put(&engine, "customers", "c1", json!({"name": "Ada", "tier": 2})).await;
    let page = settled(&engine, "tiers", TIERS_QUERY).await;
    assert_eq!(
        page,
        vec![(
            "2".to_string(),
            vec![json!({"tier": 2, "n": 4, "items": 10, "shipped": 2, "orders": ["o1", "o1", "o2", "o3"]})]
        )]
    );
    // The group left empty is removed; the group's changes carry what they replace.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut all = raw_changes(&engine, "tiers");
    while !all.iter().any(|(key, row)| key == "1" && row["removed"] == true) {
        assert!(Instant::now() < deadline, "{all:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        all = raw_changes(&engine, "tiers");
    }
    let last_of_2 = all.iter().rev().find(|(key, _)| key == "2").unwrap();
    assert_eq!(last_of_2.1["before"]["n"], 2, "a move of two joined rows changes the group once: {all:?}");

    // WHERE applies to the joined rows; a delete takes its rows out of their group.
    put(&engine, "orders", "o2", json!({"customer": "c2", "product": "p1", "qty": 3})).await;
    delete(&engine, "shipments", "s2").await;
    let page = settled(&engine, "tiers", TIERS_QUERY).await;
    assert_eq!(page[0].1[0]["orders"], json!(["o1", "o3"]));

    // It is read as any view: by key, by SQL, and joined into another view by its key.
    let view = engine.view("tiers").unwrap();
    assert_eq!(view.rows("2")[0]["n"], 2);
    let status = view.status();
    assert_eq!(status.keys, 1);
    assert_eq!(status.inputs.unwrap().len(), 3);
    let Output::Rows { rows, .. } = run(&engine, "SELECT tier, n FROM tiers").await.unwrap().pop().unwrap() else {
        panic!()
    };
    assert_eq!(rows, vec![vec![json!(2), json!(2)]]);
    const WITH_TIER: &str = "SELECT c.id, c.name, t.n FROM customers c LEFT JOIN tiers t ON t.tier = c.tier";
    run(&engine, &format!("CREATE VIEW with_tier AS {WITH_TIER}")).await.unwrap();
    settled(&engine, "with_tier", WITH_TIER).await;

    // A restart rebuilds it from the tables, and it follows on.
    close(engine).await;
    let engine = open(dir.path());
    settled(&engine, "tiers", TIERS_QUERY).await;
    put(&engine, "orders", "o4", json!({"customer": "c1", "product": "p1", "qty": 1})).await;
    let page = settled(&engine, "tiers", TIERS_QUERY).await;
    assert_eq!(page[0].1[0]["n"], 3);
    settled(&engine, "with_tier", WITH_TIER).await;
    close(engine).await;
}

fn page_row(all: &[(String, bool, Value)], key: &str) -> Value {
    all.iter().find(|(found, _, _)| found == key).map(|(_, _, row)| row.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_read_views_and_one_input_views_filter_and_project() {
    let (_dir, engine) = fresh();
    run(&engine, TABLES).await.unwrap();
    run(
        &engine,
        "CREATE VIEW review_stats AS SELECT product, COUNT(*) AS reviews, AVG(stars) AS rating, \
         JSON_AGG(stars ORDER BY stars DESC) AS stars FROM reviews GROUP BY product; \
         CREATE VIEW product_pages AS SELECT p.*, s.reviews, s.rating, s.stars FROM products p LEFT JOIN review_stats s ON s.product = p.id; \
         CREATE VIEW five_stars AS SELECT id, product FROM reviews WHERE stars = 5",
    )
    .await
    .unwrap();
    put(&engine, "products", "p1", json!({"title": "lamp", "category": "home"})).await;
    put(&engine, "products", "p2", json!({"title": "desk", "category": "home"})).await;
    put(&engine, "reviews", "r1", json!({"product": "p1", "stars": 5})).await;
    put(&engine, "reviews", "r2", json!({"product": "p1", "stars": 3})).await;
    put(&engine, "reviews", "r3", json!({"product": "p1", "stars": 4})).await;
    delete(&engine, "reviews", "r3").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = engine.view("product_pages").unwrap().rows("p1");
        if rows.first().is_some_and(|row| row["reviews"] == 2) {
            assert_eq!(
                rows[0],
                json!({"id": "p1", "title": "lamp", "category": "home", "reviews": 2, "rating": 4.0, "stars": [5, 3]})
            );
            break;
        }
        assert!(Instant::now() < deadline, "{rows:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(engine.view("product_pages").unwrap().rows("p2")[0]["reviews"], Value::Null);
    let five = settled(&engine, "five_stars", "SELECT id, product FROM reviews WHERE stars = 5").await;
    assert_eq!(five, vec![("r1".to_string(), vec![json!({"id": "r1", "product": "p1"})])]);
    let refused = run(&engine, "DROP VIEW review_stats").await.unwrap_err().to_string();
    assert!(refused.contains("product_pages"), "{refused}");
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_joined_views_are_refused_by_name_and_nothing_is_created() {
    let (_dir, engine) = fresh();
    run(&engine, &format!("{TABLES}; CREATE STREAM clicks; CREATE TABLE labels (id BIGINT PRIMARY KEY, text TEXT)"))
        .await
        .unwrap();
    let cases = [
        ("SELECT o.id FROM orders o JOIN customers c ON c.id = o.missing", "column o.missing does not exist"),
        (
            "SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer AND nope = 1",
            "nope in an ON condition is not a column",
        ),
        ("SELECT id FROM orders o JOIN customers c ON c.id = o.customer", "column id in the SELECT list is ambiguous"),
        ("SELECT o.id FROM orders o JOIN labels l ON l.id = o.customer", "l.id is BIGINT and o.customer is TEXT"),
        ("SELECT o.id FROM orders o JOIN customers c ON c.tier > 1", "needs an equality"),
        (
            "SELECT o.id FROM orders o JOIN customers c ON c.id = p.id JOIN products p ON p.id = o.product",
            "joined after it",
        ),
        ("SELECT o.id FROM orders o JOIN clicks k ON k.page = o.id", "clicks is a stream of events (not compacted)"),
        ("SELECT o.id FROM orders o JOIN nowhere n ON n.id = o.id", "nowhere is not a table, view or compacted stream"),
        ("SELECT o.id FROM orders o JOIN orders o ON o.id = o.id", "two inputs are named o"),
        ("SELECT * FROM orders o JOIN customers c ON c.id = o.customer", "SELECT * in a view of several inputs"),
        ("SELECT o.id, c.id FROM orders o JOIN customers c ON c.id = o.customer", "two columns are named id"),
        ("SELECT o.id FROM orders o, customers c", "join them with ON"),
        ("SELECT o.id FROM orders o RIGHT JOIN customers c ON c.id = o.customer", "RIGHT JOIN (put that input first)"),
        ("SELECT o.id FROM orders o JOIN customers c USING (id)", "a join without ON"),
        ("SELECT o.id FROM orders o JOIN (SELECT * FROM customers) c ON c.id = o.customer", "define it as a view"),
        ("SELECT o.id AS final FROM orders o", "name the column otherwise"),
        ("SELECT x.id FROM v x", "cannot read itself"),
        (
            "SELECT c.missing, COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.missing",
            "column c.missing does not exist",
        ),
        (
            "SELECT id, COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer GROUP BY id",
            "column id in GROUP BY is ambiguous",
        ),
        (
            "SELECT c.tier, SUM(nope) FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.tier",
            "column nope in the SELECT list is not a column",
        ),
        (
            "SELECT c.tier, FIRST(o.qty) FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.tier",
            "a view of joined inputs aggregates their current rows, so it takes no FIRST or LAST",
        ),
        (
            "SELECT c.name, COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.tier",
            "c.name is neither the GROUP BY expression",
        ),
    ];
    for (select, fragment) in cases {
        let error = run(&engine, &format!("CREATE VIEW v AS {select}")).await.unwrap_err().to_string();
        assert!(error.contains(fragment), "{select}\n  gave: {error}\n  wanted: {fragment}");
        assert!(engine.view("v").is_err(), "{select} created the view");
    }
    let error = run(&engine, "CREATE VIEW v WITH (grace = '1s') AS SELECT id FROM orders").await.unwrap_err();
    assert!(error.to_string().contains("a joined view takes one option, state_bytes_max"), "{error}");
    let error =
        run(&engine, "CREATE VIEW v WITH (state_bytes_max = 'lots') AS SELECT id FROM orders").await.unwrap_err();
    assert_eq!(error.code(), "sql_invalid_option", "{error}");
    close(engine).await;
}

/// One step of the model: a row put (its fields from small domains, some left out) or deleted.
#[derive(Clone, Debug)]
enum Step {
    Put { table: usize, id: usize, fields: Vec<Option<usize>> },
    Delete { table: usize, id: usize },
}

/// Each table's columns after the id, and the values each may take (by index; `None`: left
/// out, which reads as null).
type Columns = &'static [(&'static str, &'static [&'static str])];

const MODEL: [(&str, Columns); 5] = [
    ("customers", &[("name", &["\"Ada\"", "\"ada\"", "\"Bo\""]), ("tier", &["1", "2"])]),
    ("products", &[("title", &["\"ada\"", "\"bo\"", "\"lamp\""]), ("category", &["\"home\""])]),
    (
        "orders",
        &[
            ("customer", &["\"k0\"", "\"k1\"", "\"k2\""]),
            ("product", &["\"k0\"", "\"k1\"", "\"k3\""]),
            ("qty", &["1", "3"]),
        ],
    ),
    ("shipments", &[("order_id", &["\"k0\"", "\"k1\"", "\"k2\""]), ("carrier", &["\"dhl\"", "\"ups\""])]),
    ("reviews", &[("product", &["\"k0\"", "\"k1\""]), ("stars", &["1", "2", "5"])]),
];

fn step() -> impl Strategy<Value = Step> {
    let put = (0..5usize, 0..4usize, prop::collection::vec(prop::option::weighted(0.85, 0..3usize), 3))
        .prop_map(|(table, id, fields)| Step::Put { table, id, fields });
    let delete = (0..5usize, 0..4usize).prop_map(|(table, id)| Step::Delete { table, id });
    prop_oneof![4 => put, 1 => delete]
}

fn row_of(table: usize, fields: &[Option<usize>]) -> Value {
    let mut row = Map::new();
    for ((column, domain), choice) in MODEL[table].1.iter().zip(fields) {
        if let Some(choice) = choice {
            row.insert(column.to_string(), serde_json::from_str(domain[choice % domain.len()]).unwrap());
        }
    }
    Value::Object(row)
}

/// Runs `steps` against the tables, the incremental states beside them, and checks both views
/// against the query engine after every step, then the running views once they settle.
async fn model(steps: Vec<Step>) {
    let (_dir, engine) = fresh();
    run(&engine, TABLES).await.unwrap();
    let views = [
        ("enriched", ORDERS_QUERY),
        ("namesakes", NAMESAKES_QUERY),
        ("product_reviews", REVIEWS_QUERY),
        ("product_pages", PAGES_QUERY),
        ("tiers", TIERS_QUERY),
    ];
    // The joined views over tables alone are also kept here, step by step.
    let mut states = Vec::new();
    for (name, query) in views {
        run(&engine, &format!("CREATE VIEW {name} AS {query}")).await.unwrap();
        if let Some(def) = engine.view(name).unwrap().def().row_join().cloned()
            && def.inputs.iter().all(|input| engine.table(&input.source).is_ok())
        {
            states.push((query, def.clone(), JoinState::new(&def)));
        }
    }
    assert_eq!(states.len(), 2);
    for step in steps {
        let (table, id, after) = match &step {
            Step::Put { table, id, fields } => {
                let id = format!("k{id}");
                put(&engine, MODEL[*table].0, &id, row_of(*table, fields)).await;
                let after =
                    engine.table(MODEL[*table].0).unwrap().get_doc(&id).map(|doc| Value::Object((*doc).clone()));
                (*table, id, after)
            }
            Step::Delete { table, id } => {
                let id = format!("k{id}");
                let table_handle = engine.table(MODEL[*table].0).unwrap();
                if table_handle.get_doc(&id).is_some() {
                    delete(&engine, MODEL[*table].0, &id).await;
                }
                (*table, id, None)
            }
        };
        for (query, def, state) in &mut states {
            let mut changes = Vec::new();
            for (at, input) in def.inputs.iter().enumerate() {
                if input.source == MODEL[table].0 {
                    state.apply(at, &id, after.as_ref(), &mut changes);
                }
            }
            let expected = from_scratch(&engine, query).await;
            assert_eq!(texts(state.page(None, usize::MAX)), expected, "after {step:?}: {query}");
            // The rows kept for reads, and their JSON, are the same rows.
            let kept: Vec<(String, Vec<Value>)> = state
                .page_rows(None, usize::MAX)
                .into_iter()
                .map(|row| (row.key, vec![serde_json::from_slice(&row.json).unwrap()]))
                .collect();
            assert_eq!(texts(kept), expected, "after {step:?}: {query}");
            assert_eq!(state.output_count(), expected.len());
            // Every change names a row that is (or, removed, is no longer) in the view.
            for change in &changes {
                assert_eq!(state.rows(&change.key).is_empty(), change.removed, "{change:?} after {step:?}");
            }
        }
    }
    for (name, query) in views {
        settled(&engine, name, query).await;
    }
    close(engine).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_joined_view_equals_its_query_from_scratch_after_every_change(steps in prop::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(model(steps));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_joined_view_examples_of_the_docs_run_and_agree_with_their_queries() {
    let (_dir, engine) = fresh();
    let blocks = common::sql_blocks("views.md", "## Joined views");
    assert!(!blocks.is_empty());
    for block in &blocks {
        run(&engine, block).await.unwrap_or_else(|error| panic!("{block}\n{error}"));
    }
    put(&engine, "customers", "c1", json!({"name": "Lamp", "tier": 2})).await;
    put(&engine, "products", "p1", json!({"title": "lamp", "category": "home"})).await;
    put(&engine, "orders", "o1", json!({"customer": "c1", "product": "p1", "qty": 1})).await;
    put(&engine, "reviews", "r1", json!({"product": "p1", "stars": 4})).await;
    put(&engine, "shipments", "s1", json!({"order_id": "o1", "carrier": "dhl"})).await;
    // Each view, once settled, is its own SELECT evaluated now.
    for view in ["order_pages", "namesakes", "gold_customers", "tier_sales"] {
        let sql = engine.view(view).unwrap().def().sql.clone();
        let query = &sql[sql.find(" AS\n").or_else(|| sql.find(" AS ")).unwrap() + 4..];
        let page = settled(&engine, view, query).await;
        assert_eq!(page.len(), 1, "{view}: {page:?}");
    }
    let rows = engine.view("order_pages").unwrap().rows("o1:s1");
    assert_eq!(rows[0]["rating"], 4.0, "{rows:?}");
    assert_eq!(rows[0]["latest"], json!([{"id": "r1", "stars": 4}]), "{rows:?}");
    let rows = engine.view("tier_sales").unwrap().rows("2");
    assert_eq!(rows[0], json!({"tier": 2, "orders": 1, "items": 1, "shipments": 1, "titles": ["lamp"]}));
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dimension_row_under_thousands_of_rows_changes_each_of_them_once_in_batches() {
    let (_dir, engine) = fresh();
    run(
        &engine,
        "CREATE TABLE categories (id TEXT PRIMARY KEY, label TEXT); \
         CREATE TABLE items (id TEXT PRIMARY KEY, category TEXT); \
         INSERT INTO categories (id, label) VALUES ('home', 'Home'), ('toys', 'Toys'); \
         CREATE VIEW labelled AS SELECT i.id, c.label FROM items i JOIN categories c ON c.id = i.category",
    )
    .await
    .unwrap();
    let values: Vec<String> =
        (0..3000).map(|i| format!("('i{i:04}', '{}')", if i < 2990 { "home" } else { "toys" })).collect();
    run(&engine, &format!("INSERT INTO items (id, category) VALUES {}", values.join(", "))).await.unwrap();
    let query = "SELECT i.id, c.label FROM items i JOIN categories c ON c.id = i.category";
    settled(&engine, "labelled", query).await;
    // Each item's row was added once (the change stream is written after the state).
    let before = changes_after(&engine, "labelled", 3000).await.len();
    assert_eq!(before, 3000);
    run(&engine, "UPDATE categories SET label = 'Home & garden' WHERE id = 'home'").await.unwrap();
    let page = settled(&engine, "labelled", query).await;
    assert_eq!(page.iter().filter(|(_, rows)| rows[0]["label"] == "Home & garden").count(), 2990);
    let after = changes_after(&engine, "labelled", before + 2990).await;
    let renamed = &after[before..];
    assert_eq!(renamed.len(), 2990, "each row changed once, and only those of the category");
    let mut keys: Vec<&str> = renamed.iter().map(|(key, _, _)| key.as_str()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 2990);
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_view_over_its_state_cap_stops_and_says_so_by_name() {
    let (_dir, engine) = fresh();
    run(
        &engine,
        "CREATE TABLE items (id TEXT PRIMARY KEY, note TEXT); \
         CREATE VIEW capped WITH (state_bytes_max = '8KiB') AS SELECT id, note FROM items",
    )
    .await
    .unwrap();
    assert_eq!(engine.view("capped").unwrap().def().join.as_ref().unwrap().state_bytes_max, Some(8192));
    run(&engine, "INSERT INTO items (id, note) VALUES ('a', 'small')").await.unwrap();
    settled(&engine, "capped", "SELECT id, note FROM items").await;
    let values: Vec<String> = (0..200).map(|i| format!("('i{i:03}', 'a note of some length {i}')")).collect();
    run(&engine, &format!("INSERT INTO items (id, note) VALUES {}", values.join(", "))).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let stopped = loop {
        match engine.view("capped").unwrap().serving() {
            Err(error) => break error,
            Ok(()) => {
                assert!(Instant::now() < deadline, "the view did not stop at its cap");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(stopped.code(), "view_state_limit");
    let message = stopped.to_string();
    assert!(message.contains("\"capped\"") && message.contains("over its state_bytes_max of 8192"), "{message}");
    assert!(stopped.hint().unwrap().contains("state_bytes_max"), "{:?}", stopped.hint());
    let refused = run(&engine, "SELECT * FROM capped").await.unwrap_err();
    assert_eq!(refused.code(), "view_state_limit", "{refused}");
    // A new subscription is refused too, whatever it starts from.
    let target = onehop_engine::subscription::Target::View { view: "capped".into(), key: None };
    for start in
        [onehop_engine::subscription::Start::Snapshot, onehop_engine::subscription::Start::At(Position::Latest)]
    {
        let refused = engine
            .open_subscription(&engine.access().anonymous(), &target, onehop_engine::Filter::default(), start)
            .await
            .err()
            .expect("a capped view's subscription is refused");
        assert_eq!(refused.code(), "view_state_limit", "{refused}");
    }
    // Dropped and defined again with room, it serves.
    run(&engine, "DROP VIEW capped; CREATE VIEW capped WITH (state_bytes_max = '16MiB') AS SELECT id, note FROM items")
        .await
        .unwrap();
    let page = settled(&engine, "capped", "SELECT id, note FROM items").await;
    assert_eq!(page.len(), 201);
    close(engine).await;
}

/// A joined view's rows by key once `done` holds for them (10 s at most).
async fn rows_when(
    engine: &Engine,
    view: &str,
    done: impl Fn(&std::collections::BTreeMap<String, Value>) -> bool,
) -> std::collections::BTreeMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows: std::collections::BTreeMap<String, Value> = engine
            .view(view)
            .unwrap()
            .page(None, usize::MAX)
            .into_iter()
            .map(|(key, mut rows)| {
                let mut row = rows.remove(0);
                row.as_object_mut().unwrap().remove("final");
                (key, row)
            })
            .collect();
        if done(&rows) {
            return rows;
        }
        assert!(Instant::now() < deadline, "{view} did not get there: {rows:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn publish_keyed(engine: &Engine, stream: &str, records: &[(&str, Option<&str>)]) {
    let records: Vec<onehop_log::NewRecord> = records
        .iter()
        .map(|(key, value)| match value {
            Some(value) => onehop_log::NewRecord::keyed(bytes::Bytes::from(key.to_string()), value.as_bytes().to_vec()),
            None => onehop_log::NewRecord::tombstone(bytes::Bytes::from(key.to_string())),
        })
        .collect();
    engine.stream(stream).unwrap().publish(&records, None).await.unwrap();
}

/// Streams read as tables, as Kafka Streams reads a topic into a KTable: each key's newest
/// record is its row (its value's fields and `key`), a tombstone deletes it, a value that is
/// not a JSON object is left out; the view follows them live and loads them again at a start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_view_reads_streams_as_tables_of_their_newest_record_per_key() {
    let (dir, engine) = fresh();
    run(
        &engine,
        "CREATE STREAM customers WITH (partitions = 2, cleanup = 'compact'); \
         CREATE STREAM orders WITH (partitions = 3, cleanup = 'compact')",
    )
    .await
    .unwrap();
    publish_keyed(
        &engine,
        "customers",
        &[("c1", Some(r#"{"name": "Ada"}"#)), ("c2", Some(r#"{"name": "Bo"}"#)), ("c1", Some(r#"{"name": "Ada L."}"#))],
    )
    .await;
    publish_keyed(
        &engine,
        "orders",
        &[
            ("o1", Some(r#"{"customer": "c1", "qty": 2}"#)),
            ("o2", Some(r#"{"customer": "c2", "qty": 1}"#)),
            ("o3", Some(r#"{"customer": "c9", "qty": 7}"#)),
            ("o4", Some("not an object")),
        ],
    )
    .await;
    run(
        &engine,
        "CREATE VIEW enriched AS SELECT o.key AS order_id, o.qty, c.name \
         FROM orders o LEFT JOIN customers c ON c.key = o.customer",
    )
    .await
    .unwrap();
    let row = |order: &str, qty: i64, name: Value| json!({"order_id": order, "qty": qty, "name": name});
    let first = std::collections::BTreeMap::from([
        ("o1".to_string(), row("o1", 2, json!("Ada L."))),
        ("o2".to_string(), row("o2", 1, json!("Bo"))),
        ("o3".to_string(), row("o3", 7, Value::Null)),
    ]);
    rows_when(&engine, "enriched", |rows| *rows == first).await;

    // Live: a customer deleted, an order changed, another deleted, a customer arriving.
    publish_keyed(&engine, "customers", &[("c2", None), ("c9", Some(r#"{"name": "Cy"}"#))]).await;
    publish_keyed(&engine, "orders", &[("o1", Some(r#"{"customer": "c1", "qty": 5}"#)), ("o2", None)]).await;
    let live = std::collections::BTreeMap::from([
        ("o1".to_string(), row("o1", 5, json!("Ada L."))),
        ("o3".to_string(), row("o3", 7, json!("Cy"))),
    ]);
    rows_when(&engine, "enriched", |rows| *rows == live).await;

    // Loaded again at a start: the same rows.
    close(engine).await;
    let engine = open(dir.path());
    rows_when(&engine, "enriched", |rows| *rows == live).await;
    // A stream's fields are not declared: o.* cannot be expanded, and a name two streams may
    // have must be qualified.
    for (sql, fragment) in [
        ("CREATE VIEW v AS SELECT o.* FROM orders o JOIN customers c ON c.key = o.customer", "fields are not declared"),
        ("CREATE VIEW v AS SELECT name FROM orders o JOIN customers c ON c.key = o.customer", "ambiguous"),
    ] {
        let error = run(&engine, sql).await.unwrap_err().to_string();
        assert!(error.contains(fragment), "{sql}: {error}");
    }
    // A stream a view reads cannot be dropped before it.
    assert_eq!(run(&engine, "DROP STREAM customers").await.unwrap_err().code(), "in_use");
    close(engine).await;
}

/// The view's change stream as stored: (key, the whole value with its flags and `before`).
fn raw_changes(engine: &Engine, view: &str) -> Vec<(String, Value)> {
    let output = engine.view(view).unwrap().output().clone();
    let records = output.read(0, Position::Earliest, 100_000, usize::MAX).unwrap();
    records
        .into_iter()
        .map(|record| {
            let value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
            (String::from_utf8(record.key.unwrap().to_vec()).unwrap(), value)
        })
        .collect()
}

/// `raw_changes` once it holds `count` changes (20 s at most).
async fn raw_changes_after(engine: &Engine, view: &str, count: usize) -> Vec<(String, Value)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = raw_changes(engine, view);
        if all.len() >= count {
            assert_eq!(all.len(), count, "{all:?}");
            return all;
        }
        assert!(Instant::now() < deadline, "view {view} wrote {} changes, not {count}: {all:?}", all.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every change of a row that was there carries that row as `before`, for joined views and
/// aggregates over tables alike; a new row and a removal carry none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_carry_the_row_they_replace() {
    let (_dir, engine) = fresh();
    run(
        &engine,
        "CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT); \
         CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT, qty BIGINT); \
         CREATE VIEW named AS SELECT o.id, o.qty, c.name FROM orders o JOIN customers c ON c.id = o.customer; \
         CREATE VIEW totals AS SELECT customer, SUM(qty) AS total FROM orders GROUP BY customer",
    )
    .await
    .unwrap();
    for statement in [
        "INSERT INTO customers (id, name) VALUES ('c1', 'Ada')",
        "INSERT INTO orders (id, customer, qty) VALUES ('o1', 'c1', 2)",
        "UPDATE customers SET name = 'Bo' WHERE id = 'c1'",
        "UPDATE orders SET qty = 5 WHERE id = 'o1'",
        "DELETE FROM orders WHERE id = 'o1'",
    ] {
        run(&engine, statement).await.unwrap();
    }
    let named = raw_changes_after(&engine, "named", 4).await;
    let expected = [
        json!({"final": false, "id": "o1", "qty": 2, "name": "Ada"}),
        json!({"final": false, "id": "o1", "qty": 2, "name": "Bo", "before": {"id": "o1", "qty": 2, "name": "Ada"}}),
        json!({"final": false, "id": "o1", "qty": 5, "name": "Bo", "before": {"id": "o1", "qty": 2, "name": "Bo"}}),
        json!({"final": false, "removed": true, "id": "o1", "qty": 5, "name": "Bo"}),
    ];
    assert_eq!(named.iter().map(|(_, value)| value.clone()).collect::<Vec<_>>(), expected);
    let totals = raw_changes_after(&engine, "totals", 3).await;
    let expected = [
        json!({"final": false, "customer": "c1", "total": 2}),
        json!({"final": false, "customer": "c1", "total": 5, "before": {"customer": "c1", "total": 2}}),
        // SUM over no rows is null, as in SQL.
        json!({"final": false, "removed": true, "customer": "c1", "total": null}),
    ];
    assert_eq!(totals.iter().map(|(_, value)| value.clone()).collect::<Vec<_>>(), expected);
    // A column may not be named as the flag.
    let error = run(&engine, "CREATE VIEW bad AS SELECT o.id AS before FROM orders o").await.unwrap_err();
    assert!(error.to_string().contains("\"before\""), "{error}");
    close(engine).await;
}
