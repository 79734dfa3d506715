//! Ad-hoc queries on a real engine: tables written as every front end writes them, a stream
//! published to, a view fed by it; SELECT with joins, grouping, ordering, subqueries and set
//! operations answered from them, EXPLAIN naming each input's access path, grants and limits
//! holding.

mod common;

use std::time::{Duration, Instant};

use common::{fresh, run};
use onehop_engine::{Engine, NewRecord, Precondition, Write};
use onehop_sql::Output;
use serde_json::{Value, json};

async fn put(engine: &Engine, table: &str, id: &str, row: Value) {
    let Value::Object(row) = row else { panic!("a row is an object") };
    engine.table(table).unwrap().write(id, Write::Put(row), Precondition::None, None).await.unwrap();
}

/// The shop: customers, products (indexed by category), orders (indexed by customer), and a
/// stream of clicks.
async fn shop() -> (tempfile::TempDir, std::sync::Arc<Engine>) {
    let (dir, engine) = fresh();
    run(
        &engine,
        "CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT, city TEXT); \
         CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT, category TEXT, price DOUBLE PRECISION); \
         CREATE INDEX ON products (category); \
         CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT, product TEXT, qty BIGINT); \
         CREATE INDEX ON orders (customer); \
         CREATE STREAM clicks WITH (partitions = 2)",
    )
    .await
    .unwrap();
    for (id, name, city) in [("c1", "Ada", "Oslo"), ("c2", "Bo", "Lund"), ("c3", "Cy", "Oslo")] {
        put(&engine, "customers", id, json!({"name": name, "city": city})).await;
    }
    for (id, title, category, price) in [
        ("p1", "lamp", "home", 20.0),
        ("p2", "desk", "home", 150.0),
        ("p3", "pen", "office", 2.5),
        ("p4", "ink", "office", 7.5),
    ] {
        put(&engine, "products", id, json!({"title": title, "category": category, "price": price})).await;
    }
    for (id, customer, product, qty) in [
        ("o1", "c1", "p1", 2),
        ("o2", "c1", "p3", 10),
        ("o3", "c2", "p2", 1),
        ("o4", "c2", "p9", 1),
        ("o5", "c9", "p1", 3),
    ] {
        put(&engine, "orders", id, json!({"customer": customer, "product": product, "qty": qty})).await;
    }
    let clicks = engine.stream("clicks").unwrap();
    for i in 0..10u32 {
        let record = NewRecord {
            key: Some(format!("u{}", i % 3).into()),
            subject: Some(format!("clicks/p{}", i % 4).into()),
            value: Some(json!({"page": format!("p{}", i % 4), "ms": i * 10}).to_string().into()),
            ..NewRecord::default()
        };
        clicks.publish(&[record], None).await.unwrap();
    }
    (dir, engine)
}

/// The answer of one query: its columns and rows.
async fn query(engine: &Engine, sql: &str) -> (Vec<String>, Vec<Vec<Value>>) {
    match run(engine, sql).await.unwrap_or_else(|error| panic!("{sql}: {error}")).pop().unwrap() {
        Output::Rows { columns, rows, .. } => (columns, rows),
        other => panic!("{sql}: {other:?}"),
    }
}

async fn rows(engine: &Engine, sql: &str) -> Vec<Vec<Value>> {
    query(engine, sql).await.1
}

async fn refused(engine: &Engine, sql: &str) -> String {
    match run(engine, sql).await {
        Err(error) => format!("{} {error}", error.code()),
        Ok(outputs) => panic!("{sql} answered {outputs:?}"),
    }
}

#[tokio::test]
async fn selects_filter_project_order_and_limit() {
    let (_dir, engine) = shop().await;
    let (columns, answer) = query(&engine, "SELECT * FROM customers WHERE city = 'Oslo' ORDER BY id").await;
    assert_eq!(columns, ["id", "name", "city"]);
    assert_eq!(answer, [vec![json!("c1"), json!("Ada"), json!("Oslo")], vec![json!("c3"), json!("Cy"), json!("Oslo")]]);
    let answer =
        rows(&engine, "SELECT title, price * 2 AS double FROM products WHERE price > 5 ORDER BY price DESC LIMIT 2")
            .await;
    assert_eq!(answer, [vec![json!("desk"), json!(300.0)], vec![json!("lamp"), json!(40.0)]]);
    let answer = rows(&engine, "SELECT id FROM products ORDER BY 1 LIMIT 2 OFFSET 1").await;
    assert_eq!(answer, [vec![json!("p2")], vec![json!("p3")]]);
    let answer = rows(&engine, "SELECT DISTINCT city FROM customers ORDER BY city").await;
    assert_eq!(answer, [vec![json!("Lund")], vec![json!("Oslo")]]);
    let answer = rows(&engine, "SELECT UPPER(name) || '!' AS shout FROM customers WHERE name LIKE 'A%'").await;
    assert_eq!(answer, [vec![json!("ADA!")]]);
    assert_eq!(rows(&engine, "SELECT 1 + 1 AS two, 'x' AS x").await, [vec![json!(2), json!("x")]]);
    assert!(rows(&engine, "SELECT 1 WHERE 1 = 2").await.is_empty());
    assert_eq!(rows(&engine, "SELECT COUNT(*) WHERE false").await, [vec![json!(0)]]);
    // Null sorts last ascending, first descending, as in Postgres.
    put(&engine, "products", "p5", json!({"title": "gift", "category": "home"})).await;
    let answer = rows(&engine, "SELECT id FROM products ORDER BY price DESC, id").await;
    assert_eq!(answer[0], [json!("p5")]);
    let answer = rows(&engine, "SELECT id FROM products ORDER BY price").await;
    assert_eq!(answer.last().unwrap(), &[json!("p5")]);
}

#[tokio::test]
async fn joins_inner_left_cross_and_using() {
    let (_dir, engine) = shop().await;
    let answer = rows(
        &engine,
        "SELECT o.id, c.name, p.title FROM orders o JOIN customers c ON c.id = o.customer \
         JOIN products p ON p.id = o.product ORDER BY o.id",
    )
    .await;
    assert_eq!(
        answer,
        [
            vec![json!("o1"), json!("Ada"), json!("lamp")],
            vec![json!("o2"), json!("Ada"), json!("pen")],
            vec![json!("o3"), json!("Bo"), json!("desk")],
        ]
    );
    // LEFT JOIN keeps the orders without a customer or a product, with nulls.
    let answer = rows(
        &engine,
        "SELECT o.id, c.name, p.title FROM orders AS o LEFT JOIN customers AS c ON o.customer = c.id \
         LEFT JOIN products AS p ON o.product = p.id WHERE o.id IN ('o4', 'o5') ORDER BY o.id",
    )
    .await;
    assert_eq!(answer, [vec![json!("o4"), json!("Bo"), Value::Null], vec![json!("o5"), Value::Null, json!("lamp")]]);
    // A condition on the right input in ON filters matches; in WHERE, rows.
    let answer = rows(
        &engine,
        "SELECT c.id, o.id FROM customers c LEFT JOIN orders o ON o.customer = c.id AND o.qty > 5 ORDER BY c.id",
    )
    .await;
    assert_eq!(
        answer,
        [vec![json!("c1"), json!("o2")], vec![json!("c2"), Value::Null], vec![json!("c3"), Value::Null]]
    );
    // A join on an expression that is not a key is hashed; a cross join tries every pair.
    let answer = rows(
        &engine,
        "SELECT a.id, b.id FROM customers a JOIN customers b ON LOWER(a.city) = LOWER(b.city) AND a.id < b.id",
    )
    .await;
    assert_eq!(answer, [vec![json!("c1"), json!("c3")]]);
    assert_eq!(rows(&engine, "SELECT COUNT(*) FROM customers CROSS JOIN products").await, [vec![json!(12)]]);
    assert_eq!(rows(&engine, "SELECT COUNT(*) FROM customers, products WHERE price > 100").await, [vec![json!(3)]]);
    let answer = rows(
        &engine,
        "SELECT id, name FROM (SELECT customer AS id, qty FROM orders) q JOIN customers USING (id) \
         WHERE qty = 10",
    )
    .await;
    assert_eq!(answer, [vec![json!("c1"), json!("Ada")]]);
}

#[tokio::test]
async fn groups_aggregates_and_having() {
    let (_dir, engine) = shop().await;
    let answer = rows(
        &engine,
        "SELECT category, COUNT(*) AS n, SUM(price) AS total, AVG(price), MIN(title), MAX(price) \
         FROM products GROUP BY category ORDER BY category",
    )
    .await;
    assert_eq!(
        answer,
        [
            vec![json!("home"), json!(2), json!(170.0), json!(85.0), json!("desk"), json!(150.0)],
            vec![json!("office"), json!(2), json!(10.0), json!(5.0), json!("ink"), json!(7.5)],
        ]
    );
    let answer = rows(
        &engine,
        "SELECT c.name, SUM(o.qty) AS items, JSON_AGG(o.id ORDER BY o.qty DESC) AS ids, STRING_AGG(o.product, ',' ORDER BY o.product) \
         FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.name HAVING SUM(o.qty) > 1 ORDER BY items DESC",
    )
    .await;
    assert_eq!(
        answer,
        [
            vec![json!("Ada"), json!(12), json!(["o2", "o1"]), json!("p1,p3")],
            vec![json!("Bo"), json!(2), json!(["o3", "o4"]), json!("p2,p9")],
        ]
    );
    // Without GROUP BY, one row even over nothing; COUNT(DISTINCT) and FILTER.
    let answer = rows(
        &engine,
        "SELECT COUNT(*), SUM(qty), COUNT(DISTINCT customer), COUNT(*) FILTER (WHERE qty > 1) FROM orders WHERE qty < 100",
    )
    .await;
    assert_eq!(answer, [vec![json!(5), json!(17), json!(3), json!(3)]]);
    assert_eq!(
        rows(&engine, "SELECT COUNT(*), SUM(qty) FROM orders WHERE qty > 100").await,
        [vec![json!(0), Value::Null]]
    );
    // GROUP BY a position or an alias of the SELECT list.
    let answer =
        rows(&engine, "SELECT UPPER(city) AS town, COUNT(*) FROM customers GROUP BY town ORDER BY 2 DESC").await;
    assert_eq!(answer, [vec![json!("OSLO"), json!(2)], vec![json!("LUND"), json!(1)]]);
    let answer = rows(&engine, "SELECT city, COUNT(*) FROM customers GROUP BY 1 ORDER BY city").await;
    assert_eq!(answer, [vec![json!("Lund"), json!(1)], vec![json!("Oslo"), json!(2)]]);
    let error = refused(&engine, "SELECT city, name, COUNT(*) FROM customers GROUP BY city").await;
    assert!(error.contains("must appear in GROUP BY"), "{error}");
    let error = refused(&engine, "SELECT name FROM customers WHERE COUNT(*) > 1").await;
    assert!(error.contains("aggregates are not allowed in WHERE"), "{error}");
}

#[tokio::test]
async fn subqueries_ctes_and_set_operations() {
    let (_dir, engine) = shop().await;
    let answer = rows(
        &engine,
        "SELECT name FROM customers WHERE id IN (SELECT customer FROM orders WHERE qty >= 2) ORDER BY name",
    )
    .await;
    assert_eq!(answer, [vec![json!("Ada")]]);
    let answer = rows(&engine, "SELECT title FROM products WHERE price = (SELECT MAX(price) FROM products)").await;
    assert_eq!(answer, [vec![json!("desk")]]);
    let answer =
        rows(&engine, "SELECT COUNT(*) FROM customers WHERE EXISTS (SELECT 1 FROM orders WHERE qty > 5)").await;
    assert_eq!(answer, [vec![json!(3)]]);
    let answer = rows(
        &engine,
        "WITH spend AS (SELECT o.customer, SUM(o.qty * p.price) AS total FROM orders o JOIN products p ON p.id = o.product \
         GROUP BY o.customer) SELECT c.name, s.total FROM spend s JOIN customers c ON c.id = s.customer ORDER BY s.total DESC",
    )
    .await;
    assert_eq!(answer, [vec![json!("Bo"), json!(150.0)], vec![json!("Ada"), json!(65.0)]]);
    let answer = rows(&engine, "SELECT city FROM customers UNION SELECT category FROM products ORDER BY 1").await;
    assert_eq!(answer, [vec![json!("Lund")], vec![json!("Oslo")], vec![json!("home")], vec![json!("office")]]);
    assert_eq!(rows(&engine, "SELECT city FROM customers UNION ALL SELECT city FROM customers").await.len(), 6);
    let answer =
        rows(&engine, "SELECT customer FROM orders INTERSECT SELECT id FROM customers ORDER BY customer").await;
    assert_eq!(answer, [vec![json!("c1")], vec![json!("c2")]]);
    let answer = rows(&engine, "SELECT id FROM customers EXCEPT SELECT customer FROM orders").await;
    assert_eq!(answer, [vec![json!("c3")]]);
    let answer = rows(&engine, "VALUES (1, 'a'), (2, 'b') ORDER BY 1 DESC").await;
    assert_eq!(answer, [vec![json!(2), json!("b")], vec![json!(1), json!("a")]]);
    let error = refused(&engine, "SELECT (SELECT id FROM customers)").await;
    assert!(error.contains("more than one row"), "{error}");
}

/// Subqueries that read the row around them run per distinct set of the values they read:
/// scalar, EXISTS and IN, in the SELECT list, WHERE and ON, across a LEFT JOIN.
#[tokio::test]
async fn correlated_subqueries_read_the_row_around_them() {
    let (_dir, engine) = shop().await;
    let answer = rows(
        &engine,
        "SELECT c.name, (SELECT COUNT(*) FROM orders o WHERE o.customer = c.id) AS n, \
         (SELECT SUM(o.qty) FROM orders o WHERE o.customer = c.id) AS qty FROM customers c ORDER BY c.id",
    )
    .await;
    assert_eq!(
        answer,
        [
            vec![json!("Ada"), json!(2), json!(12)],
            vec![json!("Bo"), json!(2), json!(2)],
            vec![json!("Cy"), json!(0), Value::Null]
        ]
    );
    let answer = rows(
        &engine,
        "SELECT c.name FROM customers c WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer = c.id) ORDER BY 1",
    )
    .await;
    assert_eq!(answer, [vec![json!("Cy")]]);
    let answer = rows(
        &engine,
        "SELECT p.title FROM products p WHERE p.id IN (SELECT o.product FROM orders o WHERE o.qty > 1 AND o.product = p.id) \
         ORDER BY 1",
    )
    .await;
    assert_eq!(answer, [vec![json!("lamp")], vec![json!("pen")]]);
    // Reading two inputs: answered once the later one is joined, null on an unmatched row.
    let answer = rows(
        &engine,
        "SELECT o.id, (SELECT COUNT(*) FROM products q WHERE q.category = p.category AND q.price > p.price AND o.qty > 0) \
         AS dearer FROM orders o LEFT JOIN products p ON p.id = o.product ORDER BY o.id",
    )
    .await;
    assert_eq!(
        answer,
        [
            vec![json!("o1"), json!(1)],
            vec![json!("o2"), json!(1)],
            vec![json!("o3"), json!(0)],
            vec![json!("o4"), json!(0)],
            vec![json!("o5"), json!(1)]
        ]
    );
    let error =
        refused(&engine, "SELECT c.id, (SELECT o.id FROM orders o WHERE o.customer = c.id) FROM customers c").await;
    assert!(error.contains("more than one row"), "{error}");
    // Regular expressions, and a quoted number meeting a numeric column.
    let answer =
        rows(&engine, "SELECT title FROM products WHERE title ~ '^(l|d)' AND title !~* 'DESK' ORDER BY 1").await;
    assert_eq!(answer, [vec![json!("lamp")]]);
    let answer = rows(&engine, "SELECT id FROM orders WHERE qty = '10'").await;
    assert_eq!(answer, [vec![json!("o2")]]);
    let error = refused(&engine, "SELECT id FROM products WHERE title ~ '('").await;
    assert!(error.contains("not a regular expression"), "{error}");
    // Arrays and objects built, searched and joined; functions and arrays as rows.
    let answer = rows(
        &engine,
        "SELECT JSON_BUILD_OBJECT('t', title, 'p', price), ARRAY_TO_STRING(ARRAY[title, category], '/'), \
         ARRAY_POSITION(ARRAY['a', category], 'home'), 'home' = ANY (ARRAY[category]) FROM products WHERE id = 'p1'",
    )
    .await;
    assert_eq!(answer, [vec![json!({"t": "lamp", "p": 20.0}), json!("lamp/home"), json!(2), json!(true)]]);
    let answer = rows(&engine, "SELECT n, ordinality FROM generate_series(10, 4, -3) WITH ORDINALITY AS g(n)").await;
    assert_eq!(answer, [vec![json!(10), json!(1)], vec![json!(7), json!(2)], vec![json!(4), json!(3)]]);
    let answer = rows(&engine, "SELECT w FROM unnest(ARRAY['b', 'a']) AS u(w) ORDER BY w").await;
    assert_eq!(answer, [vec![json!("a")], vec![json!("b")]]);
    // Texts split into words, counted: the word count of study 5, ad hoc.
    let answer = rows(
        &engine,
        "SELECT w, COUNT(*) FROM unnest(REGEXP_SPLIT_TO_ARRAY('the cat  and the hat', '\\s+')) AS u(w) \
         GROUP BY w ORDER BY 2 DESC, 1 LIMIT 2",
    )
    .await;
    assert_eq!(answer, [vec![json!("the"), json!(2)], vec![json!("and"), json!(1)]]);
    let answer = rows(&engine, "SELECT STRING_TO_ARRAY('a,b', ','), SPLIT('x y', ' ')").await;
    assert_eq!(answer, [vec![json!(["a", "b"]), json!(["x", "y"])]]);
    let answer = rows(
        &engine,
        "SELECT id, unnest(ARRAY[title, category]) AS part, generate_subscripts(ARRAY[title, category], 1) AS at \
         FROM products WHERE id = 'p3'",
    )
    .await;
    assert_eq!(answer, [vec![json!("p3"), json!("pen"), json!(1)], vec![json!("p3"), json!("office"), json!(2)]]);
    let answer = rows(&engine, "SELECT ARRAY(SELECT id FROM customers WHERE city = 'Oslo' ORDER BY id)").await;
    assert_eq!(answer, [vec![json!(["c1", "c3"])]]);
    let error = refused(&engine, "SELECT * FROM generate_series(1, 3, 0)").await;
    assert!(error.contains("step cannot be 0"), "{error}");
    let error = refused(&engine, "SELECT * FROM products p, unnest(p.tags) t").await;
    assert!(error.contains("LATERAL"), "{error}");
}

#[tokio::test]
async fn streams_are_rows_in_a_range_and_views_are_rows_by_key() {
    let (_dir, engine) = shop().await;
    let (columns, answer) = query(&engine, "SELECT * FROM clicks WHERE _partition = 0 ORDER BY _offset LIMIT 1").await;
    assert_eq!(&columns[..5], ["_key", "_partition", "_offset", "_time", "_subject"]);
    assert_eq!(&columns[5..], ["ms", "page"]);
    assert_eq!(answer[0][1], json!(0));
    let answer = rows(&engine, "SELECT page, COUNT(*) AS n, SUM(ms) FROM clicks GROUP BY page ORDER BY page").await;
    assert_eq!(answer[0], [json!("p0"), json!(3), json!(120)]);
    let total: u64 = answer.iter().map(|row| row[1].as_u64().unwrap()).sum();
    assert_eq!(total, 10);
    let answer = rows(&engine, "SELECT COUNT(*) FROM clicks WHERE _offset >= 2").await;
    let ends = engine.stream("clicks").unwrap().end_offsets();
    let expected: u64 = ends.iter().map(|end| end.saturating_sub(2)).sum();
    assert_eq!(answer, [vec![json!(expected)]]);
    let plan = rows(&engine, "EXPLAIN SELECT * FROM clicks WHERE _partition = 1 AND _offset >= 2").await;
    assert!(plan.iter().any(|line| line[0].as_str().unwrap().contains("partition 1, from offset 2")), "{plan:?}");

    run(
        &engine,
        "CREATE VIEW per_page WITH (start = 'earliest') AS SELECT page, COUNT(*) AS n FROM clicks GROUP BY page",
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = rows(&engine, "SELECT SUM(n) FROM per_page").await;
        if answer == [vec![json!(10)]] {
            break;
        }
        assert!(Instant::now() < deadline, "the view did not count the clicks: {answer:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rows(&engine, "SELECT n FROM per_page WHERE page = 'p1'").await, [vec![json!(3)]]);
    let plan = rows(&engine, "EXPLAIN SELECT n FROM per_page WHERE page = 'p1'").await;
    assert!(
        plan.iter().any(|line| line[0].as_str().unwrap().contains("view per_page AS per_page: by key")),
        "{plan:?}"
    );
}

#[tokio::test]
async fn explain_names_each_inputs_access_path() {
    let (_dir, engine) = shop().await;
    let plan = |sql: &'static str| {
        let engine = engine.clone();
        async move {
            rows(&engine, sql).await.into_iter().map(|line| line[0].as_str().unwrap().to_string()).collect::<Vec<_>>()
        }
    };
    let lines = plan("EXPLAIN SELECT * FROM orders WHERE id = 'o1'").await;
    assert_eq!(lines, ["select", "  table orders AS orders: by primary key, 1 key(s)"]);
    let lines = plan("EXPLAIN SELECT * FROM orders WHERE customer = 'c1' AND qty > 1").await;
    assert_eq!(lines[1], "  table orders AS orders: by index on customer, 1 value(s)");
    let lines = plan("EXPLAIN SELECT * FROM orders WHERE qty > 1").await;
    assert_eq!(lines[1], "  table orders AS orders: scan of every row");
    let lines = plan(
        "EXPLAIN SELECT c.name, COUNT(*) FROM customers c JOIN orders o ON o.customer = c.id \
         LEFT JOIN products p ON p.id = o.product JOIN customers d ON LOWER(d.name) = LOWER(c.name) \
         GROUP BY c.name ORDER BY 2 LIMIT 3",
    )
    .await;
    assert_eq!(
        lines,
        [
            "select",
            "  table customers AS c: scan of every row",
            "  join table orders AS o: by index on customer, per row",
            "  left join table products AS p: by primary key id, per row",
            "  join table customers AS d: read once, hashed on the ON equality",
            "  group by 1 expression(s): 1 aggregate(s)",
            "  sort by 1 term(s)",
            "  limit 3 offset 0",
        ]
    );
    // The plan is the same query's: lookups by key answer what a scan would.
    let by_key = rows(&engine, "SELECT * FROM orders WHERE id IN ('o2', 'o1', 'zz') ORDER BY id").await;
    let scanned = rows(&engine, "SELECT * FROM orders WHERE id || '' IN ('o2', 'o1', 'zz') ORDER BY id").await;
    assert_eq!(by_key, scanned);
    assert_eq!(by_key.len(), 2);
}

#[tokio::test]
async fn bad_queries_are_refused_with_the_reason() {
    let (_dir, engine) = shop().await;
    for (sql, expected) in [
        ("SELECT * FROM nowhere", "nowhere is not a table, view or stream"),
        (
            "SELECT id FROM customers c JOIN orders o ON o.customer = c.id",
            "the column id is ambiguous: write c.id or o.id",
        ),
        ("SELECT x FROM customers c JOIN orders o ON o.customer = c.id", "several may hold it: write c.x or o.x"),
        ("SELECT * FROM customers RIGHT JOIN orders ON true", "LEFT JOIN with the inputs swapped"),
        ("SELECT * FROM customers JOIN orders", "needs ON or USING"),
        ("SELECT city FROM customers UNION SELECT id, name FROM customers", "same number of columns"),
        ("SELECT * FROM customers LIMIT 'ten'", "LIMIT takes a whole number"),
        ("SELECT * FROM customers c, customers c", "named twice in FROM"),
        ("SELECT * FROM customers GROUP BY city", "SELECT * with GROUP BY"),
        ("WITH RECURSIVE r AS (SELECT 1) SELECT * FROM r", "WITH RECURSIVE"),
        ("SELECT * FROM customers ORDER BY 9", "position 9 is not in the SELECT list"),
    ] {
        let error = refused(&engine, sql).await;
        assert!(error.contains(expected), "{sql}: {error}");
    }
    // A write names its columns when the target has none declared, and fits their number.
    let error = refused(&engine, "INSERT INTO clicks VALUES (1)").await;
    assert!(error.contains("needs its columns named"), "{error}");
    let error = refused(&engine, "INSERT INTO customers (id, name) VALUES ('c9')").await;
    assert!(error.contains("2 column(s) and 1 value(s)"), "{error}");
}

/// How many rows a write wrote, or its RETURNING rows.
async fn changed(engine: &Engine, sql: &str) -> (u64, Vec<Vec<Value>>) {
    match run(engine, sql).await.unwrap_or_else(|error| panic!("{sql}: {error}")).pop().unwrap() {
        Output::Changed { rows, .. } => (rows, Vec::new()),
        Output::Rows { rows, .. } => (rows.len() as u64, rows),
        other => panic!("{sql}: {other:?}"),
    }
}

#[tokio::test]
async fn inserts_updates_and_deletes_write_what_http_writes_all_or_none() {
    let (_dir, engine) = shop().await;
    let (rows, _) =
        changed(&engine, "INSERT INTO customers (id, name, city) VALUES ('c4', 'Di', 'Rome'), ('c5', 'Ed', 'Oslo')")
            .await;
    assert_eq!(rows, 2);
    let row = engine.table("customers").unwrap().get("c4").unwrap();
    assert_eq!(row.doc().get("city"), Some(&json!("Rome")));
    // One statement is all or none: a duplicate key anywhere writes nothing.
    let before = engine.table("customers").unwrap().storage().end_offsets();
    let error = refused(&engine, "INSERT INTO customers (id, name) VALUES ('c6', 'Fa'), ('c1', 'again')").await;
    assert!(error.contains("duplicate key value"), "{error}");
    assert!(engine.table("customers").unwrap().get("c6").is_none());
    assert_eq!(engine.table("customers").unwrap().storage().end_offsets(), before, "nothing appended");
    // ON CONFLICT: keep, or write over with the excluded row's values.
    let (rows, _) =
        changed(&engine, "INSERT INTO customers (id, name) VALUES ('c1', 'x') ON CONFLICT (id) DO NOTHING").await;
    assert_eq!(rows, 0);
    let (_, returned) = changed(
        &engine,
        "INSERT INTO customers (id, name, city) VALUES ('c1', 'Ada L.', 'Bergen'), ('c7', 'Gu', 'Lund') \
         ON CONFLICT (id) DO UPDATE SET name = excluded.name, city = customers.city || '/' || excluded.city \
         RETURNING id, name, city",
    )
    .await;
    assert_eq!(
        returned,
        [vec![json!("c1"), json!("Ada L."), json!("Oslo/Bergen")], vec![json!("c7"), json!("Gu"), json!("Lund")]]
    );
    // UPDATE through the planner (by primary key, by index, by scan), with RETURNING.
    let (rows, returned) =
        changed(&engine, "UPDATE orders SET qty = qty * 2 WHERE customer = 'c1' RETURNING id, qty").await;
    assert_eq!(rows, 2);
    assert_eq!(returned, [vec![json!("o1"), json!(4)], vec![json!("o2"), json!(20)]]);
    assert_eq!(engine.table("orders").unwrap().get("o2").unwrap().doc().get("qty"), Some(&json!(20)));
    let (rows, _) = changed(&engine, "UPDATE products SET price = price + 1 WHERE id = 'p3'").await;
    assert_eq!(rows, 1);
    assert_eq!(rows_of(&engine, "SELECT price FROM products WHERE id = 'p3'").await, [vec![json!(3.5)]]);
    let error = refused(&engine, "UPDATE products SET id = 'p0' WHERE id = 'p1'").await;
    assert!(error.contains("primary key cannot change"), "{error}");
    // DELETE with RETURNING the rows as they were.
    let (rows, returned) = changed(&engine, "DELETE FROM orders WHERE qty > 5 RETURNING id").await;
    assert_eq!((rows, returned), (1, vec![vec![json!("o2")]]));
    assert!(engine.table("orders").unwrap().get("o2").is_none());
    // INSERT … SELECT into a stream: records as every front end writes them. Records for
    // several partitions are not written all or none, so they are refused together.
    let error = refused(
        &engine,
        "INSERT INTO clicks (_key, page, ms) SELECT id, 'from-sql', 1 FROM customers WHERE city = 'Lund'",
    )
    .await;
    assert!(error.contains("not written all or none"), "{error}");
    let (rows, _) = changed(
        &engine,
        "INSERT INTO clicks (_key, _subject, page, ms) SELECT 'u9', 'clicks/sql', name, 1 FROM customers WHERE city = 'Lund'",
    )
    .await;
    assert_eq!(rows, 2);
    let answer = rows_of(&engine, "SELECT _key, _subject, page FROM clicks WHERE _key = 'u9' ORDER BY page").await;
    assert_eq!(
        answer,
        [vec![json!("u9"), json!("clicks/sql"), json!("Bo")], vec![json!("u9"), json!("clicks/sql"), json!("Gu")]]
    );
    let error = refused(&engine, "UPDATE clicks SET page = 'x'").await;
    assert!(error.contains("kept as written"), "{error}");
    let error = refused(&engine, "INSERT INTO per_nothing (a) VALUES (1)").await;
    assert!(error.contains("is not a table or stream"), "{error}");
}

async fn rows_of(engine: &Engine, sql: &str) -> Vec<Vec<Value>> {
    rows(engine, sql).await
}
