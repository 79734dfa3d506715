//! onehop's ad-hoc queries against a real Postgres 15 (Debian's, a cluster of the test's own):
//! the same random tables, the same generated queries, the same answers — in order where the
//! query orders them totally, as multisets otherwise. A seed (printed) makes a failure
//! repeatable: `ONEHOP_QUERY_SEED=… cargo test -p onehop-bench --test query_vs_postgres`.

use std::sync::Arc;

use onehop_bench::target::peers::postgres::PostgresPeer;
use onehop_engine::{Engine, EngineOptions, Precondition, Write};
use onehop_log::{Log, LogOptions};
use serde_json::{Map, Value, json};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const SCHEMA: &str = "CREATE TABLE a (id BIGINT PRIMARY KEY, x BIGINT, y TEXT, z DOUBLE PRECISION); \
     CREATE TABLE b (id BIGINT PRIMARY KEY, a_id BIGINT, w BIGINT, t TEXT); \
     CREATE TABLE c (id BIGINT PRIMARY KEY, b_id BIGINT, v BIGINT)";

/// Text values of lowercase letters only: ordered alike by Postgres's collation and by code
/// point.
const WORDS: [&str; 6] = ["ant", "bee", "cat", "dog", "eel", "fox"];

fn maybe_null(rng: &mut Rng, value: Value) -> Value {
    if rng.chance(12) { Value::Null } else { value }
}

/// The three tables' rows: (table, id, row).
fn data(rng: &mut Rng) -> Vec<(&'static str, i64, Map<String, Value>)> {
    let mut rows = Vec::new();
    let object = |value: Value| match value {
        Value::Object(fields) => fields,
        _ => unreachable!(),
    };
    for id in 1..=40 {
        let x = {
            let value = json!(rng.below(20) as i64 - 5);
            maybe_null(rng, value)
        };
        let y = {
            let value = json!(rng.pick(&WORDS));
            maybe_null(rng, value)
        };
        let z = {
            let value = json!((rng.below(1000) as f64) / 8.0);
            maybe_null(rng, value)
        };
        rows.push(("a", id, object(json!({"id": id, "x": x, "y": y, "z": z}))));
    }
    for id in 1..=80 {
        let a_id = {
            let value = json!(rng.below(50) as i64 + 1);
            maybe_null(rng, value)
        };
        let w = {
            let value = json!(rng.below(10) as i64);
            maybe_null(rng, value)
        };
        let t = {
            let value = json!(rng.pick(&WORDS));
            maybe_null(rng, value)
        };
        rows.push(("b", id, object(json!({"id": id, "a_id": a_id, "w": w, "t": t}))));
    }
    for id in 1..=60 {
        let b_id = {
            let value = json!(rng.below(90) as i64 + 1);
            maybe_null(rng, value)
        };
        let v = {
            let value = json!(rng.below(7) as i64);
            maybe_null(rng, value)
        };
        rows.push(("c", id, object(json!({"id": id, "b_id": b_id, "v": v}))));
    }
    rows
}

fn sql_literal(value: &Value) -> String {
    match value {
        Value::Null => "NULL".into(),
        Value::String(text) => format!("'{text}'"),
        other => other.to_string(),
    }
}

/// A WHERE condition on `a` (aliased `alias`).
fn condition(rng: &mut Rng, alias: &str) -> String {
    let k = rng.below(15) as i64 - 3;
    let word = rng.pick(&WORDS);
    let simple = match rng.below(9) {
        0 => format!("{alias}.x > {k}"),
        1 => format!("{alias}.x <= {k}"),
        2 => format!("{alias}.y = '{word}'"),
        3 => format!("{alias}.x IS NULL"),
        4 => format!("{alias}.z BETWEEN {} AND {}", k * 5, k * 5 + 60),
        5 => format!("{alias}.y IN ('{word}', '{}')", rng.pick(&WORDS)),
        6 => format!("{alias}.y LIKE '{}%'", &word[..1]),
        7 => format!("{alias}.id = {}", rng.below(45) + 1),
        _ => format!("{alias}.x + 2 * {alias}.id > {}", k * 4),
    };
    match rng.below(4) {
        0 => format!("{simple} AND {alias}.y IS NOT NULL"),
        1 => format!("({simple} OR {alias}.x = 0)"),
        2 => format!("NOT ({simple})"),
        _ => simple,
    }
}

/// A query and whether its ORDER BY orders its rows totally.
fn query(rng: &mut Rng) -> (String, bool) {
    let k = rng.below(8) as i64;
    let cond = condition(rng, "a");
    match rng.below(17) {
        0 => (format!("SELECT a.id, a.x, a.y, a.z FROM a WHERE {cond} ORDER BY a.x DESC, a.id"), true),
        1 => (format!("SELECT a.y AS y, COUNT(*) AS n, SUM(a.x) AS s, MIN(a.x) AS lo, MAX(a.z) AS hi, COUNT(a.x) AS nx FROM a WHERE {cond} GROUP BY a.y"), false),
        2 => (format!("SELECT a.id AS aid, b.id AS bid, b.w AS w FROM a JOIN b ON b.a_id = a.id WHERE b.w < {k} AND {cond}"), false),
        3 => ("SELECT a.id AS aid, b.id AS bid FROM a LEFT JOIN b ON b.a_id = a.id ORDER BY a.id, b.id".to_string(), true),
        4 => (format!("SELECT a.id AS aid, COUNT(b.id) AS n, SUM(b.w) AS s FROM a LEFT JOIN b ON b.a_id = a.id AND b.w > {k} GROUP BY a.id HAVING COUNT(b.id) > 0"), false),
        5 => ("SELECT DISTINCT b.t AS t, b.w AS w FROM b".to_string(), false),
        6 => (format!("SELECT a.x AS v FROM a WHERE {cond} UNION SELECT b.w FROM b"), false),
        7 => (format!("SELECT a.id AS id FROM a WHERE a.id IN (SELECT b.a_id FROM b WHERE b.w > {k}) AND {cond}"), false),
        8 => ("SELECT a.id AS aid, b.id AS bid, c.id AS cid, c.v AS v FROM a JOIN b ON b.a_id = a.id JOIN c ON c.b_id = b.id".to_string(), false),
        9 => (format!("SELECT a.y AS y, AVG(a.z) AS mean FROM a JOIN b ON b.t = a.y WHERE {cond} GROUP BY a.y"), false),
        10 => (format!("SELECT a.id AS id, a.x AS x FROM a WHERE {cond} ORDER BY a.x NULLS FIRST, a.id LIMIT {} OFFSET {}", k + 1, k / 2), true),
        11 => (format!("SELECT b.t AS t, COUNT(DISTINCT b.a_id) AS n FROM b WHERE b.w >= {k} GROUP BY b.t ORDER BY n DESC, t NULLS LAST"), true),
        // Correlated subqueries: a count and a sum per row, EXISTS and NOT EXISTS, IN.
        12 => (format!("SELECT a.id AS id, (SELECT COUNT(*) FROM b WHERE b.a_id = a.id AND b.w > {k}) AS n, (SELECT SUM(b.w) FROM b WHERE b.a_id = a.id) AS s FROM a WHERE {cond}"), false),
        13 => (format!("SELECT a.id AS id FROM a WHERE {}EXISTS (SELECT 1 FROM b JOIN c ON c.b_id = b.id WHERE b.a_id = a.id AND c.v > {k}) AND {cond}", if rng.chance(50) { "NOT " } else { "" }), false),
        // Joins that probe by primary key, once per row before them: inner, left, grouped.
        15 => (format!("SELECT c.id AS cid, b.id AS bid, a.x AS x, a.y AS y FROM c JOIN b ON b.id = c.b_id LEFT JOIN a ON a.id = b.a_id AND {cond}"), false),
        16 => (format!("SELECT b.t AS t, a.y AS y, COUNT(*) AS n, SUM(c.v) AS s FROM c JOIN b ON b.id = c.b_id JOIN a ON a.id = b.a_id WHERE c.v > {k} GROUP BY b.t, a.y"), false),
        _ => (format!("SELECT b.id AS id FROM b WHERE b.w IN (SELECT c.v FROM c WHERE c.b_id = b.id) OR b.t = (SELECT a.y FROM a WHERE a.id = b.a_id AND a.x > {k})"), false),
    }
}

/// Numbers compared as numbers (Postgres answers SUM and AVG as numerics).
fn same(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(l), Value::Number(r)) => {
            let (l, r) = (l.as_f64().unwrap(), r.as_f64().unwrap());
            (l - r).abs() <= 1e-9 * l.abs().max(r.abs()).max(1.0)
        }
        (Value::Array(l), Value::Array(r)) => l.len() == r.len() && l.iter().zip(r).all(|(l, r)| same(l, r)),
        _ => left == right,
    }
}

/// A row's text for sorting multisets: numbers rounded as `same` compares them.
fn sort_text(row: &[Value]) -> String {
    let shown: Vec<String> = row
        .iter()
        .map(|value| match value.as_f64() {
            Some(number) => format!("{number:.6}"),
            None => value.to_string(),
        })
        .collect();
    shown.join("|")
}

#[test]
fn random_queries_answer_as_postgres_does() {
    let dir = tempfile::tempdir().unwrap();
    let postgres =
        PostgresPeer::start(dir.path(), dir.path()).expect("Postgres 15 starts (scripts/peers install kafka-stack)");
    let seed: u64 = std::env::var("ONEHOP_QUERY_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    println!("ONEHOP_QUERY_SEED={seed}");
    let mut rng = Rng(seed);

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let data_dir = dir.path().join("onehop");
    let (log, _) = Log::open(&data_dir, LogOptions::default()).unwrap();
    let engine = runtime.block_on(async { Arc::new(Engine::open(Arc::new(log), EngineOptions::default()).unwrap()) });
    let run = |sql: &str| -> Result<Vec<onehop_sql::Output>, onehop_sql::SqlError> {
        runtime.block_on(async {
            let mut outputs = Vec::new();
            for statement in onehop_sql::parse(sql)? {
                outputs.push(onehop_sql::execute(&engine, &statement).await?);
            }
            Ok(outputs)
        })
    };
    run(SCHEMA).unwrap();
    postgres.query(SCHEMA).unwrap();
    let rows = data(&mut rng);
    let mut inserts = String::new();
    for (table, id, row) in &rows {
        let write = Write::Put(row.clone());
        runtime.block_on(engine.table(table).unwrap().write(&id.to_string(), write, Precondition::None, None)).unwrap();
        let columns: Vec<&str> = row.keys().map(String::as_str).collect();
        let values: Vec<String> = row.values().map(sql_literal).collect();
        inserts.push_str(&format!("INSERT INTO {table} ({}) VALUES ({});\n", columns.join(", "), values.join(", ")));
    }
    postgres.query(&inserts).unwrap();

    let queries = 150;
    for number in 0..queries {
        let (sql, ordered) = query(&mut rng);
        let expected: Vec<Map<String, Value>> =
            match postgres.query(&format!("SELECT coalesce(json_agg(to_json(q)), '[]') FROM ({sql}) q")) {
                Ok(text) => serde_json::from_str(text.trim()).unwrap(),
                Err(error) => panic!("query {number} ({sql}) fails on Postgres: {error}"),
            };
        let answer: Vec<Map<String, Value>> = match run(&sql) {
            Ok(mut outputs) => match outputs.pop() {
                Some(onehop_sql::Output::Rows { columns, rows, .. }) => {
                    rows.into_iter().map(|row| columns.iter().cloned().zip(row).collect()).collect()
                }
                other => panic!("{sql}: {other:?}"),
            },
            Err(error) => panic!("query {number} (seed {seed}): {sql}\nonehop refused it: {error}"),
        };
        let values = |rows: Vec<Map<String, Value>>| -> Vec<Vec<Value>> {
            rows.into_iter().map(|row| row.into_iter().map(|(_, value)| value).collect()).collect()
        };
        let names = |rows: &[Map<String, Value>]| rows.first().map(|row| row.keys().cloned().collect::<Vec<_>>());
        assert!(
            expected.is_empty() || answer.is_empty() || names(&expected) == names(&answer),
            "query {number}: {sql}: columns {:?} and {:?}",
            names(&expected),
            names(&answer)
        );
        let (mut expected, mut answer) = (values(expected), values(answer));
        if !ordered {
            expected.sort_by_key(|row| sort_text(row));
            answer.sort_by_key(|row| sort_text(row));
        }
        let equal = expected.len() == answer.len()
            && expected
                .iter()
                .zip(&answer)
                .all(|(l, r)| l.len() == r.len() && l.iter().zip(r).all(|(l, r)| same(l, r)));
        assert!(equal, "query {number} (seed {seed}): {sql}\nPostgres: {expected:?}\nonehop:   {answer:?}");
    }
    println!("{queries} queries answered alike");
}
