//! The Postgres wire protocol with real clients: psql (the simple query protocol, several
//! statements in one query, errors with SQLSTATE), psycopg 3 (the extended protocol:
//! server-side binding, binary results, prepared statements, cancel, transactions) and
//! node-postgres (a pool, a named statement run ten times, RETURNING) and pgjdbc (server-side
//! prepared statements after five runs, a transaction with autocommit off), against a server
//! with users, over TLS on the server's certificate, logging in with SCRAM-SHA-256 and refused
//! with a wrong password; what they read and write is what HTTP reads and writes.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use common::{DataDir, certificates, curl};

const ROOT: (&str, &str) = ("root", "root-pass");

/// psql's connection string for `user` over TLS checked against the test's CA.
fn conninfo(address: SocketAddr, dir: &Path, user: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} dbname=onehop sslmode=verify-full sslrootcert={}",
        address.port(),
        dir.join("ca.pem").display()
    )
}

/// A server with users (root, the administrator) and TLS on the test's certificate.
fn tls_server(dir: &DataDir) -> common::Server {
    tls_server_with(dir, &[])
}

/// [`tls_server`] with more flags.
fn tls_server_with(dir: &DataDir, flags: &[&str]) -> common::Server {
    certificates(dir.path(), "");
    let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
    let mut args =
        vec!["--admin-user", ROOT.0, "--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
    args.extend(flags);
    dir.start(&args, &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)])
}

/// A server as `tls_server` starts it, its Postgres address, and root's connection string.
fn tls_server_as_root(dir: &DataDir) -> (common::Server, SocketAddr, String) {
    let server = tls_server(dir);
    let pg = server.pg_address.expect("the Postgres listener is on");
    let root = conninfo(pg, dir.path(), ROOT.0);
    (server, pg, root)
}

/// What a Python script (psycopg, SQLAlchemy: scripts/test installs them) printed, once it
/// ran to its end.
fn python(script: &str, args: &[&str]) -> String {
    let output = Command::new("python3").arg("-c").arg(script).args(args).output().expect("python3 runs");
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{said}{}", String::from_utf8_lossy(&output.stderr));
    said
}

/// psql in unaligned mode, `-c` for each statement: (success, stdout, stderr).
fn psql(conninfo: &str, password: &str, statements: &[&str]) -> (bool, String, String) {
    let mut command = Command::new("psql");
    command.args(["-X", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=1", "-d", conninfo]);
    for statement in statements {
        command.args(["-c", statement]);
    }
    let output = command.env("PGPASSWORD", password).env("PGCONNECT_TIMEOUT", "10").output().expect("psql runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn psql_and_psycopg_log_in_over_tls_query_and_are_refused_with_a_wrong_password() {
    let dir = DataDir::new();
    let (server, pg, root) = tls_server_as_root(&dir);

    // Definitions and queries in one psql run, several statements in one query string.
    let (ok, out, err) = psql(
        &root,
        ROOT.1,
        &[
            "CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT, price DOUBLE PRECISION); CREATE STREAM orders",
            "CREATE USER alice PASSWORD 'alice-pass'; GRANT READ ON TABLE products TO alice",
            "SHOW server_version",
            "INSERT INTO products (id, title, price) VALUES ('p9', 'ink', 7.5)",
            "DELETE FROM products WHERE id = 'p9'",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("15.0 (onehop)"), "{out}");
    assert!(out.contains("INSERT 0 1\nDELETE 1"), "Postgres's command tags: {out}");
    // Rows written over HTTP are what psql reads.
    let credentials = format!("{}:{}", ROOT.0, ROOT.1);
    for (id, title, price) in [("p1", "lamp", 20.0), ("p2", "desk", 150.5), ("p3", "pen", 2.0)] {
        let row = format!("{{\"title\":\"{title}\",\"price\":{price}}}");
        let (status, body) = curl(
            server.address,
            &format!("/tables/products/{id}"),
            &["-X", "PUT", "-u", &credentials, "--data-binary", &row],
        );
        assert!(status == 200 || status == 201, "{body}");
    }
    let orders: String =
        ["p1", "p1", "p2"].iter().map(|product| format!("{{\"value\":{{\"product\":\"{product}\"}}}}\n")).collect();
    let (status, body) = curl(
        server.address,
        "/streams/orders",
        &["-X", "POST", "-u", &credentials, "-H", "content-type: application/x-ndjson", "--data-binary", &orders],
    );
    assert_eq!(status, 200, "{body}");
    let (ok, out, err) = psql(
        &root,
        ROOT.1,
        &[
            "SELECT p.title, COUNT(*) AS n FROM orders o JOIN products p ON p.id = o.product GROUP BY p.title ORDER BY n DESC, p.title",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "lamp|2\ndesk|1\n");

    // alice reads what she may, and is refused the rest with the SQLSTATE of a privilege.
    let alice = conninfo(pg, dir.path(), "alice");
    let (ok, out, err) = psql(&alice, "alice-pass", &["SELECT title FROM products WHERE price > 10 ORDER BY price"]);
    assert!(ok, "{err}");
    assert_eq!(out, "lamp\ndesk\n");
    let (ok, _, err) = psql(&alice, "alice-pass", &["\\set VERBOSITY verbose", "SELECT * FROM orders"]);
    assert!(!ok && err.contains("42501") && err.contains("orders"), "{err}");
    let (ok, _, err) = psql(&alice, "wrong", &["SELECT 1"]);
    assert!(!ok && err.contains("password authentication failed for user \"alice\""), "{err}");
    // Guesses are counted, and past five from this address for her the next are refused
    // without a check for a while, as over HTTP.
    // (Each checked failure past five doubles the wait, so however slow this machine, one of
    // these lands inside it.)
    let mut refusals = Vec::new();
    let throttled = (0..20).any(|_| {
        let (ok, _, err) = psql(&alice, "wrong again", &["SELECT 1"]);
        assert!(!ok);
        refusals.push(err.clone());
        err.contains("too many failed logins")
    });
    assert!(throttled, "{refusals:?}");
    let (status, scrape) = curl(server.address, "/metrics", &["-u", &credentials]);
    assert_eq!(status, 200);
    let value = |series: &str| -> f64 {
        let line =
            scrape.lines().find(|line| line.starts_with(series)).unwrap_or_else(|| panic!("{series} in {scrape}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("auth_failures_total{protocol=\"postgres\"}"), 1.0 + refusals.len() as f64);
    assert!(value("auth_logins_throttled_total") >= 1.0, "{scrape}");
    let (ok, _, err) = psql(&root, ROOT.1, &["SELECT * FROM nowhere"]);
    assert!(!ok && err.contains("nowhere is not a table, view or stream"), "{err}");

    // psycopg 3: server-side binding of typed parameters, binary results, a statement
    // prepared once and run again, a transaction of queries, a definition refused inside one.
    let script = r#"
import sys, psycopg
dsn, password = sys.argv[1], sys.argv[2]
with psycopg.connect(dsn, password=password, autocommit=True) as conn:
    rows = conn.execute("SELECT title, price FROM products WHERE price > %s ORDER BY price", (10,)).fetchall()
    print("bound", rows)
    cursor = conn.cursor(binary=True)
    cursor.execute("SELECT id, price FROM products WHERE title = %s", ("desk",))
    print("binary", cursor.fetchall())
    print("prepared", [conn.execute("SELECT COUNT(*) FROM products WHERE price >= %s", (limit,), prepare=True).fetchone()[0] for limit in (0, 10, 100, 1000, 1, 2)])
    # A query of 3^18 rows, canceled from another connection while it runs.
    import threading
    timer = threading.Timer(0.5, conn.cancel)
    timer.start()
    try:
        conn.execute("SELECT COUNT(*) FROM " + ", ".join(f"products p{i}" for i in range(18))).fetchone()
        print("not canceled")
    except psycopg.errors.QueryCanceled as error:
        print("canceled", error.sqlstate, str(error).strip())
    timer.join()
    print("after cancel", conn.execute("SELECT COUNT(*) FROM products").fetchone()[0])
    # A write with RETURNING ends with its own tag, so the row count is the write's.
    cursor = conn.execute("INSERT INTO products (id, title, price) VALUES ('p8', 'mat', 3), ('p9', 'rug', 4) RETURNING id")
    print("insert returning", cursor.statusmessage, cursor.rowcount, cursor.fetchall())
    for step in (1, 2):
        cursor = conn.execute("UPDATE products SET price = price + %s WHERE id IN ('p8', 'p9') RETURNING price", (step,), prepare=True)
        print("update returning", cursor.statusmessage, sorted(cursor.fetchall()))
    cursor = conn.execute("DELETE FROM products WHERE id IN ('p8', 'p9') RETURNING id, title")
    print("delete returning", cursor.statusmessage, cursor.rowcount, sorted(cursor.fetchall()))
with psycopg.connect(dsn, password=password) as conn:
    notices = []
    conn.add_notice_handler(lambda notice: notices.append(notice.message_primary))
    print("transaction", conn.execute("SELECT id FROM products ORDER BY id").fetchall())
    # Before any write, a definition runs at once and says so; after one, it is refused.
    conn.execute("CREATE STREAM inside")
    print("notice", notices)
    conn.execute("UPDATE products SET price = 21 WHERE id = 'p1'")
    try:
        conn.execute("CREATE STREAM inside_after_a_write")
    except psycopg.Error as error:
        print("refused", error.sqlstate)
"#;
    let said = python(script, &[&root, ROOT.1]);
    assert!(said.contains("bound [('lamp', 20.0), ('desk', 150.5)]"), "{said}");
    assert!(said.contains("binary [('p2', 150.5)]"), "{said}");
    assert!(said.contains("prepared [3, 2, 1, 0, 3, 3]"), "{said}");
    assert!(said.contains("transaction [('p1',), ('p2',), ('p3',)]"), "{said}");
    assert!(said.contains("refused 25001"), "{said}");
    assert!(said.contains("notice ['CREATE STREAM inside took effect at once"), "{said}");
    assert!(said.contains("canceled 57014 canceling statement due to user request"), "{said}");
    assert!(said.contains("after cancel 3"), "{said}");
    assert!(said.contains("insert returning INSERT 0 2 2 [('p8',), ('p9',)]"), "{said}");
    assert!(said.contains("update returning UPDATE 2 [(4,), (5,)]"), "{said}");
    assert!(said.contains("update returning UPDATE 2 [(6,), (7,)]"), "{said}");
    assert!(said.contains("delete returning DELETE 2 2 [('p8', 'mat'), ('p9', 'rug')]"), "{said}");
    // psql's \gdesc describes a statement without running it: a write's RETURNING columns.
    let script = dir.path().join("gdesc.sql");
    std::fs::write(&script, "DELETE FROM products WHERE id = 'p1' RETURNING id, price AS cost \\gdesc\n").unwrap();
    let output = Command::new("psql")
        .args(["-X", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=1", "-d", &root, "-f"])
        .arg(&script)
        .env("PGPASSWORD", ROOT.1)
        .output()
        .expect("psql runs");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{out}{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(out, "id|text\ncost|text\n");
    let (ok, out, err) = psql(&root, ROOT.1, &["SELECT COUNT(*) FROM products"]);
    assert!(ok && out == "3\n", "{out}{err}");

    // node-postgres: a pool over TLS, a named statement parsed once and run ten times, text
    // parameters, a write with RETURNING read back, a refusal's SQLSTATE.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pg_node/client.js");
    let output = Command::new("node")
        .arg(&script)
        .args([&pg.port().to_string(), ROOT.0, ROOT.1, dir.path().join("ca.pem").to_str().unwrap()])
        .output()
        .expect("node runs (scripts/test installs node-postgres)");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{said}{}", String::from_utf8_lossy(&output.stderr));
    assert!(said.contains("prepared [1,2,2,2,2,2,2,2,3,3]"), "{said}");
    assert!(said.contains(r#"returning [{"id":"n1","title":"node lamp"}]"#), "{said}");
    assert!(said.contains(r#"read [{"title":"node lamp","price":12.5}]"#), "{said}");
    assert!(said.contains("refused 42P01"), "{said}");

    // pgjdbc: a prepared statement run ten times (named and server-side after five), a
    // transaction with autocommit off and RETURNING, a refusal's SQLSTATE.
    let classes = tempfile::tempdir().unwrap();
    let jars = pgjdbc_jars();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pg_jdbc/JdbcClient.java");
    let output = Command::new("javac")
        .args(["-d", classes.path().to_str().unwrap(), "-cp", &jars])
        .arg(&source)
        .output()
        .expect("javac runs");
    assert!(output.status.success(), "javac: {}", String::from_utf8_lossy(&output.stderr));
    let output = Command::new("java")
        .args(["-cp", &format!("{}:{jars}", classes.path().display()), "JdbcClient"])
        .args([&pg.port().to_string(), ROOT.0, ROOT.1, dir.path().join("ca.pem").to_str().unwrap()])
        .output()
        .expect("java runs");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{said}{}", String::from_utf8_lossy(&output.stderr));
    assert!(said.contains("prepared [0, 0, 0, 0, 0, 1, 2, 3, 4, 5]"), "{said}");
    assert!(said.contains("returning i1 1010\nreturning i2 1020"), "{said}");
    assert!(said.contains("described 2 id qty"), "{said}");
    assert!(said.contains("read [i1:item 1:1010, i2:item 2:1020]"), "{said}");
    assert!(said.contains("refused 42P01"), "{said}");
}

/// The classpath of pgjdbc's jars, as scripts/test leaves them in the peers' cache.
fn pgjdbc_jars() -> String {
    let peers = std::env::var_os("ONEHOP_PEERS_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/onehop-peers")
    });
    let dir = peers.join("pgjdbc");
    let jars: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("pgjdbc is not in {} ({error}): scripts/test copies it there", dir.display()))
        .map(|entry| entry.unwrap().path().display().to_string())
        .filter(|path| path.ends_with(".jar"))
        .collect();
    assert!(jars.iter().any(|jar| jar.contains("postgresql-")), "no pgjdbc jar in {}", dir.display());
    jars.join(":")
}

/// COPY as psql's `\copy` and psycopg's `cursor.copy` use it: rows in from a CSV file and
/// from Python, out in text and CSV, all or none, with the grants of every other write.
#[test]
fn psql_and_psycopg_copy_rows_in_and_out_all_or_none() {
    let dir = DataDir::new();
    let (server, pg, root) = tls_server_as_root(&dir);
    let (ok, out, err) = psql(
        &root,
        ROOT.1,
        &[
            "CREATE TABLE items (id TEXT PRIMARY KEY, name TEXT, qty BIGINT, price DOUBLE PRECISION, ok BOOLEAN)",
            "CREATE USER bob PASSWORD 'bob-pass'; GRANT READ ON TABLE items TO bob",
        ],
    );
    assert!(ok, "{out}{err}");

    // A CSV file with a header, quotes, a delimiter and a newline inside fields, and a null.
    let csv = dir.path().join("items.csv");
    std::fs::write(&csv, "id,name,qty,price,ok\ni1,lamp,2,20.5,t\ni2,\"desk, \"\"oak\"\"\nlarge\",1,150,f\ni3,,,,\n")
        .unwrap();
    let load = format!("\\copy items from '{}' with (format csv, header)", csv.display());
    let (ok, out, err) = psql(&root, ROOT.1, &[&load]);
    assert!(ok, "{out}{err}");
    assert_eq!(out, "COPY 3\n");
    // What COPY wrote is what HTTP reads: typed by the columns, the null left out or null.
    let credentials = format!("{}:{}", ROOT.0, ROOT.1);
    let (status, body) = curl(server.address, "/tables/items/i2", &["-u", &credentials]);
    assert_eq!(status, 200, "{body}");
    let row: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(row["name"], "desk, \"oak\"\nlarge");
    assert_eq!((row["qty"].as_i64(), row["price"].as_f64(), row["ok"].as_bool()), (Some(1), Some(150.0), Some(false)));

    // Out in the text format (escapes, \N for null) and in CSV with a header, as bob may read.
    let bob = conninfo(pg, dir.path(), "bob");
    let (ok, out, err) = psql(&bob, "bob-pass", &["\\copy (SELECT id, name, qty FROM items ORDER BY id) to stdout"]);
    assert!(ok, "{err}");
    assert_eq!(out, "i1\tlamp\t2\ni2\tdesk, \"oak\"\\nlarge\t1\ni3\t\\N\t\\N\n");
    let (ok, out, err) = psql(
        &bob,
        "bob-pass",
        &[
            "\\copy (SELECT id, name, ok FROM items WHERE qty IS NOT NULL ORDER BY id) to stdout with (format csv, header)",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "id,name,ok\ni1,lamp,t\ni2,\"desk, \"\"oak\"\"\nlarge\",f\n");

    // A bad field in the third row: the COPY is refused, with where, and writes none of its rows.
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "i4,chair,1,5,t\ni5,stool,2,6,f\ni6,sofa,lots,7,t\n").unwrap();
    let load = format!("\\copy items from '{}' with (format csv)", bad.display());
    let (ok, _, err) = psql(&root, ROOT.1, &["\\set VERBOSITY verbose", &load]);
    assert!(!ok && err.contains("22P02") && err.contains("row 3, column qty"), "{err}");
    let (ok, out, err) = psql(&root, ROOT.1, &["SELECT COUNT(*) FROM items"]);
    assert!(ok && out == "3\n", "{out}{err}");
    // bob may read but not write; files on the server are never read or written.
    let (ok, _, err) = psql(&bob, "bob-pass", &["\\set VERBOSITY verbose", &load]);
    assert!(!ok && err.contains("42501"), "{err}");
    let (ok, _, err) = psql(&root, ROOT.1, &["\\set VERBOSITY verbose", "COPY items TO '/tmp/onehop-copy-test'"]);
    assert!(!ok && err.contains("42501") && err.contains("STDOUT"), "{err}");
    assert!(!Path::new("/tmp/onehop-copy-test").exists());

    // psycopg 3: rows written with write_row (tabs and backslashes escaped by the driver), read
    // back with rows(); a COPY inside a transaction that is rolled back leaves nothing.
    let script = r#"
import sys, psycopg
dsn, password = sys.argv[1], sys.argv[2]
with psycopg.connect(dsn, password=password, autocommit=True) as conn:
    with conn.cursor() as cursor:
        with cursor.copy("COPY items (id, name, qty) FROM STDIN") as copy:
            copy.write_row(("p1", "tab\there \\ back", 9))
            copy.write_row(("p2", None, 10))
        print("copied", cursor.rowcount)
        with cursor.copy("COPY (SELECT id, name, qty FROM items WHERE id LIKE 'p%' ORDER BY id) TO STDOUT") as copy:
            print("rows", list(copy.rows()))
with psycopg.connect(dsn, password=password) as conn:
    with conn.cursor() as cursor:
        with cursor.copy("COPY items (id, name) FROM STDIN") as copy:
            copy.write_row(("t1", "in a transaction"))
    print("inside", conn.execute("SELECT name FROM items WHERE id = 't1'").fetchall())
    conn.rollback()
    print("after rollback", conn.execute("SELECT COUNT(*) FROM items WHERE id = 't1'").fetchone()[0])
"#;
    let said = python(script, &[&root, ROOT.1]);
    assert!(said.contains("copied 2"), "{said}");
    assert!(said.contains(r"rows [('p1', 'tab\there \\ back', '9'), ('p2', None, '10')]"), "{said}");
    assert!(said.contains("inside [('in a transaction',)]"), "{said}");
    assert!(said.contains("after rollback 0"), "{said}");
}

/// SUBSCRIBE as psycopg streams it (the extended protocol, row by row) and as psql shows it
/// (`COPY (SUBSCRIBE …) TO STDOUT`, line by line): a table's matching rows, then each row
/// entering, changing in and leaving the set, until a cancel request ends it and the session
/// goes on.
#[test]
fn psycopg_and_psql_follow_a_subscribe_until_they_cancel_it() {
    use std::io::BufRead;

    let dir = DataDir::new();
    let (_server, _, root) = tls_server_as_root(&dir);
    let (ok, out, err) = psql(
        &root,
        ROOT.1,
        &[
            "CREATE TABLE items (id TEXT PRIMARY KEY, colour TEXT, qty BIGINT)",
            "INSERT INTO items (id, colour, qty) VALUES ('a', 'red', 1), ('b', 'blue', 2)",
            "CREATE USER eve PASSWORD 'eve-pass'",
        ],
    );
    assert!(ok, "{out}{err}");

    let script = r#"
import sys, threading, time, psycopg
dsn, password = sys.argv[1], sys.argv[2]
with psycopg.connect(dsn, password=password, autocommit=True) as conn, \
        psycopg.connect(dsn, password=password, autocommit=True) as writer:
    seen = []
    watchdog = threading.Timer(60, conn.cancel)
    watchdog.start()
    try:
        for row in conn.cursor().stream("SUBSCRIBE (SELECT id, qty FROM items WHERE colour = 'red')"):
            seen.append((row[0], row[1], row[3], row[4]))
            if len(seen) == 1:
                writer.execute("UPDATE items SET qty = 5 WHERE id = 'a'")
                writer.execute("INSERT INTO items (id, colour, qty) VALUES ('c', 'red', 3), ('d', 'blue', 4)")
                writer.execute("UPDATE items SET colour = 'blue' WHERE id = 'c'")
                writer.execute("DELETE FROM items WHERE id = 'a'")
            if len(seen) == 5:
                conn.cancel()
        print("ended without a cancel")
    except psycopg.errors.QueryCanceled as error:
        print("canceled", error.sqlstate)
    watchdog.cancel()
    print("seen", seen)
    print("after", conn.execute("SELECT COUNT(*) FROM items").fetchone()[0])
    # A view: its rows, then each replaced row as an update and each removed one as a delete.
    conn.execute("CREATE VIEW per_colour AS SELECT colour, SUM(qty) AS total FROM items GROUP BY colour")
    for _ in range(600):
        if conn.execute("SELECT total FROM per_colour WHERE colour = 'blue'").fetchall() == [(9,)]:
            break
        time.sleep(0.05)
    view = []
    # However this goes, it ends: a cancel in a minute at the latest.
    watchdog = threading.Timer(60, conn.cancel)
    watchdog.start()
    try:
        for row in conn.cursor().stream("SUBSCRIBE (SELECT colour, total FROM per_colour)"):
            view.append((row[0], row[3], row[4]))
            if len(view) == 1:
                writer.execute("INSERT INTO items (id, colour, qty) VALUES ('g', 'green', 6)")
                writer.execute("UPDATE items SET qty = 10 WHERE id = 'g'")
                writer.execute("DELETE FROM items WHERE id = 'g'")
            if len(view) == 4:
                conn.cancel()
    except psycopg.errors.QueryCanceled:
        print("view", view)
    watchdog.cancel()
    try:
        conn.execute("SUBSCRIBE (SELECT id FROM items WHERE qty > 1)")
    except psycopg.Error as error:
        print("refused", error.sqlstate)
    # WITH (SNAPSHOT = false): only what changes from now on. The writer keeps writing until
    # the subscriber has seen two changes, so none is missed before the subscription opens.
    stop = threading.Event()
    writer.execute("INSERT INTO items (id, colour, qty) VALUES ('w', 'white', 100)")
    def keep_writing():
        qty = 100
        while not stop.is_set():
            qty += 1
            writer.execute("UPDATE items SET qty = %s WHERE id = 'w'", (qty,))
            time.sleep(0.1)
    changes = []
    watchdog = threading.Timer(60, conn.cancel)
    watchdog.start()
    thread = threading.Thread(target=keep_writing)
    thread.start()
    try:
        for row in conn.cursor().stream("SUBSCRIBE items WITH (SNAPSHOT = false)"):
            changes.append((row[0], row[1]))
            if len(changes) == 2:
                conn.cancel()
    except psycopg.errors.QueryCanceled:
        pass
    stop.set()
    thread.join()
    watchdog.cancel()
    writer.execute("DELETE FROM items WHERE id = 'w'")
    print("no snapshot", sorted(set(changes)), len(changes) >= 2)
    # A stream WITH (SNAPSHOT = true): the records it holds, then what comes.
    conn.execute("CREATE STREAM events WITH (partitions = 1)")
    conn.execute("INSERT INTO events (_key, kind) VALUES ('k1', 'a'), ('k2', 'b')")
    records = []
    watchdog = threading.Timer(60, conn.cancel)
    watchdog.start()
    try:
        for row in conn.cursor().stream("SUBSCRIBE events WITH (SNAPSHOT = true)"):
            records.append((row[0], row[1], row[2]))
            if len(records) == 2:
                conn.cancel()
    except psycopg.errors.QueryCanceled:
        pass
    watchdog.cancel()
    print("held records", records)
with psycopg.connect(dsn.replace("user=root", "user=eve"), password="eve-pass") as conn:
    try:
        conn.execute("SUBSCRIBE items")
    except psycopg.Error as error:
        print("not granted", error.sqlstate)
"#;
    let said = python(script, &[&root, ROOT.1]);
    assert!(said.contains("canceled 57014"), "{said}");
    assert!(
        said.contains(
            "seen [('snapshot', 'a', 'a', 1), ('update', 'a', 'a', 5), ('insert', 'c', 'c', 3), \
             ('delete', 'c', 'c', 3), ('delete', 'a', 'a', 5)]"
        ),
        "{said}"
    );
    assert!(said.contains("after 3"), "{said}");
    assert!(
        said.contains(
            "view [('snapshot', 'blue', '9'), ('insert', 'green', '6'), ('update', 'green', '10'), \
             ('delete', 'green', None)]"
        ),
        "{said}"
    );
    assert!(said.contains("refused 0A000"), "{said}");
    assert!(said.contains("no snapshot [('update', 'w')] True"), "{said}");
    assert!(said.contains("held records [('record', 'k1', 0), ('record', 'k2', 1)]"), "{said}");
    assert!(said.contains("not granted 42501"), "{said}");

    // psql prints each change as it comes; Ctrl-C (SIGINT: psql sends a cancel request) ends it.
    // (A terminal's stdout is line-buffered; stdbuf makes the test's pipe so.)
    let mut child = Command::new("stdbuf")
        .args([
            "-oL",
            "psql",
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &root,
            "-c",
            "COPY (SUBSCRIBE items) TO STDOUT WITH (FORMAT csv)",
        ])
        .env("PGPASSWORD", ROOT.1)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("psql runs");
    let (lines, received) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| {
        received.recv_timeout(std::time::Duration::from_secs(30)).unwrap_or_else(|_| panic!("psql printed {what}"))
    };
    let mut first: Vec<String> = (0..3).map(|_| next("the snapshot")).collect();
    first.sort();
    for (line, (id, qty)) in first.iter().zip([("b", 2), ("c", 3), ("d", 4)]) {
        assert!(
            line.starts_with(&format!("snapshot,{id},")) && line.ends_with(&format!(",{id},blue,{qty}")),
            "{first:?}"
        );
    }
    let (ok, out, err) = psql(&root, ROOT.1, &["INSERT INTO items (id, colour, qty) VALUES ('e', 'green', 7)"]);
    assert!(ok, "{out}{err}");
    let change = next("the insert");
    assert!(change.starts_with("insert,e,") && change.ends_with(",e,green,7"), "{change}");
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    let output = child.wait_with_output().expect("psql ends");
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && err.contains("canceling statement due to user request"), "{err}");
}

#[test]
fn malformed_messages_and_oversized_ones_end_the_connection_with_an_error() {
    use std::io::{Read, Write};
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let pg = server.pg_address.expect("the Postgres listener is on");
    let exchange = |bytes: &[u8]| -> Vec<u8> {
        let mut stream = std::net::TcpStream::connect(pg).unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        stream.write_all(bytes).unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer
    };
    // A startup message of a 1 GiB length: refused before anything is read or held.
    let answer = exchange(&(1u32 << 30).to_be_bytes());
    assert!(answer.starts_with(b"E") && String::from_utf8_lossy(&answer).contains("longer than"), "{answer:?}");
    // A protocol version onehop does not speak.
    let mut startup = 8u32.to_be_bytes().to_vec();
    startup.extend_from_slice(&0x0002_0000u32.to_be_bytes());
    let answer = exchange(&startup);
    assert!(String::from_utf8_lossy(&answer).contains("onehop speaks 3.0"), "{answer:?}");
    // After a good startup, a Parse whose counts run past its end.
    let mut startup = Vec::new();
    let body = b"\0\x03\0\0user\0me\0\0";
    startup.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    startup.extend_from_slice(body);
    startup.extend_from_slice(b"P\0\0\0\x0as\0q\0\x7f\xff");
    let answer = exchange(&startup);
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("08P01") && text.contains("ends inside"), "{text}");
    // The server goes on answering.
    let (status, _) = common::get(server.address, "/healthz");
    assert_eq!(status, 200);
}

#[test]
fn an_idle_session_is_closed_with_the_reason() {
    let dir = DataDir::new();
    let server = dir.start(&["--pg-idle-timeout-s", "1"], &[]);
    let pg = server.pg_address.expect("the Postgres listener is on");
    // psycopg keeps the connection open and, once the server has closed it, says why on the
    // next query; the script polls until then (never the other way round: a query keeps it
    // from idling).
    let script = r#"
import sys, time, psycopg
conn = psycopg.connect(f"host=127.0.0.1 port={sys.argv[1]} user=me dbname=onehop", autocommit=True)
print("first", conn.execute("SELECT 1").fetchone()[0])
deadline = time.time() + 60
while time.time() < deadline:
    time.sleep(2)
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError as error:
        print("closed", str(error).strip().splitlines()[0])
        break
"#;
    let output = Command::new("python3").args(["-c", script, &pg.port().to_string()]).output().expect("python3 runs");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(said.contains("first 1"), "{said}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        said.contains("closed") && said.contains("idle-session timeout"),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// psycopg's default: every statement in a transaction until `commit()`. The writes of one
/// are applied all or none at COMMIT; inside it, its queries read its own writes (by key, by
/// index, by a scan), others see nothing until COMMIT; ROLLBACK, an error, a savepoint rolled
/// back to, or a row another writer changed first leave nothing of it written; a second table
/// and a definition after a write are refused.
#[test]
fn a_transaction_of_writes_is_applied_all_or_none() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let pg = server.pg_address.expect("the Postgres listener is on");
    let script = r#"
import sys, psycopg
dsn = f"host=127.0.0.1 port={sys.argv[1]} user=me dbname=onehop"
with psycopg.connect(dsn, autocommit=True) as setup:
    setup.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, owner TEXT, balance BIGINT)")
    setup.execute("CREATE INDEX ON accounts (owner)")
    setup.execute("CREATE TABLE audit (id TEXT PRIMARY KEY)")
    setup.execute("INSERT INTO accounts (id, owner, balance) VALUES ('a', 'ann', 100), ('b', 'bob', 50)")
watcher = psycopg.connect(dsn, autocommit=True)
def seen(sql):
    return watcher.execute(sql).fetchall()

with psycopg.connect(dsn) as conn:
    conn.execute("UPDATE accounts SET balance = balance - 30 WHERE id = 'a'")
    conn.execute("UPDATE accounts SET balance = balance + 30 WHERE id = %s", ("b",))
    conn.execute("INSERT INTO accounts (id, owner, balance) VALUES ('c', 'ann', 5)")
    print("inside", conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall())
    print("by key inside", conn.execute("SELECT balance FROM accounts WHERE id = 'c'").fetchall())
    print("by index inside", conn.execute("SELECT id FROM accounts WHERE owner = 'ann' ORDER BY id").fetchall())
    print("outside before", seen("SELECT id, balance FROM accounts ORDER BY id"))
print("outside after", seen("SELECT id, balance FROM accounts ORDER BY id"))

with psycopg.connect(dsn) as conn:
    conn.execute("DELETE FROM accounts WHERE owner = 'ann'")
    print("deleted inside", conn.execute("SELECT COUNT(*) FROM accounts").fetchone()[0])
    conn.rollback()
print("after rollback", seen("SELECT COUNT(*) FROM accounts"))

conn = psycopg.connect(dsn)
conn.execute("UPDATE accounts SET balance = 0 WHERE id = 'a'")
try:
    conn.execute("INSERT INTO accounts (id, balance) VALUES ('b', 1)")
except psycopg.Error as error:
    print("duplicate", error.sqlstate)
conn.rollback()
print("after error", seen("SELECT balance FROM accounts WHERE id = 'a'"))

with psycopg.connect(dsn) as conn:
    with conn.transaction():
        conn.execute("UPDATE accounts SET balance = 1 WHERE id = 'c'")
        try:
            with conn.transaction():
                conn.execute("UPDATE accounts SET balance = 2 WHERE id = 'c'")
                conn.execute("INSERT INTO accounts (id, balance) VALUES ('d', 4)")
                raise RuntimeError("undo the inner block")
        except RuntimeError:
            pass
        print("savepoint inside", conn.execute("SELECT id, balance FROM accounts WHERE id IN ('c', 'd')").fetchall())
print("savepoint after", seen("SELECT id, balance FROM accounts WHERE id >= 'c' ORDER BY id"))

conn = psycopg.connect(dsn)
conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 'a'")
conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 'b'")
watcher.execute("UPDATE accounts SET balance = 999 WHERE id = 'b'")
try:
    conn.commit()
    print("committed over another writer")
except psycopg.errors.SerializationFailure as error:
    print("conflict", error.sqlstate)
print("after conflict", seen("SELECT id, balance FROM accounts WHERE id IN ('a', 'b') ORDER BY id"))

conn = psycopg.connect(dsn)
# A statement that writes nothing leaves the transaction free to write another table.
conn.execute("DELETE FROM audit WHERE id = 'none'")
conn.execute("UPDATE accounts SET balance = 7 WHERE id = 'a'")
try:
    conn.execute("INSERT INTO audit (id) VALUES ('x')")
except psycopg.Error as error:
    print("second table", error.sqlstate)
conn.rollback()
conn.execute("UPDATE accounts SET balance = 8 WHERE id = 'a'")
try:
    conn.execute("CREATE STREAM inside")
except psycopg.Error as error:
    print("definition", error.sqlstate)
conn.rollback()
print("end", seen("SELECT id, balance FROM accounts ORDER BY id"), seen("SELECT COUNT(*) FROM audit"))
"#;
    let said = python(script, &[&pg.port().to_string()]);
    for expected in [
        "inside [('a', 70), ('b', 80), ('c', 5)]",
        "by key inside [(5,)]",
        "by index inside [('a',), ('c',)]",
        "outside before [('a', 100), ('b', 50)]",
        "outside after [('a', 70), ('b', 80), ('c', 5)]",
        "deleted inside 1",
        "after rollback [(3,)]",
        "duplicate 23505",
        "after error [(70,)]",
        "savepoint inside [('c', 1)]",
        "savepoint after [('c', 1)]",
        "conflict 40001",
        "after conflict [('a', 70), ('b', 999)]",
        "second table 0A000",
        "definition 25001",
        "end [('a', 70), ('b', 999), ('c', 1)] [(0,)]",
    ] {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
    // What the transactions committed is what HTTP reads.
    let (status, body) = common::get(server.address, "/tables/accounts/c");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"balance\":1"), "{body}");
}

/// What psql's `\d` commands and SQLAlchemy's reflection read (pg_catalog and
/// information_schema) lists onehop's tables, streams and views, with their columns, types,
/// keys and indexes, as a Postgres with the same tables would; a user sees only what she has
/// grants on; SQLAlchemy Core creates, reflects, writes and reads; over TLS, with users, and
/// refused with a wrong password.
#[test]
fn psql_describes_and_sqlalchemy_reflects_what_onehop_holds() {
    let dir = DataDir::new();
    let (server, pg, root) = tls_server_as_root(&dir);
    let (ok, out, err) = psql(
        &root,
        ROOT.1,
        &[
            "CREATE TABLE categories (id TEXT PRIMARY KEY, label TEXT)",
            "CREATE TABLE products (id TEXT PRIMARY KEY, name TEXT NOT NULL, price DOUBLE PRECISION, tags TEXT[], \
             category TEXT REFERENCES categories)",
            "CREATE INDEX ON products (name)",
            "CREATE STREAM orders",
            "CREATE VIEW per_product AS SELECT product, COUNT(*) AS n FROM orders GROUP BY product",
            "CREATE USER alice PASSWORD 'alice-pass'; GRANT READ ON TABLE products TO alice",
        ],
    );
    assert!(ok, "{out}{err}");

    // psql's own describe commands, aligned as a user reads them.
    let describe = |user: &str, password: &str, command: &str| -> String {
        let output = Command::new("psql")
            .args(["-X", "-v", "ON_ERROR_STOP=1", "-d", &conninfo(pg, dir.path(), user), "-c", command])
            .env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("psql runs");
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "{command}: {said}{}", String::from_utf8_lossy(&output.stderr));
        said
    };
    let listed = describe(ROOT.0, ROOT.1, "\\d");
    for line in [
        " public | orders      | table             | onehop",
        " public | per_product | materialized view | onehop",
        " public | products    | table             | onehop",
    ] {
        assert!(listed.contains(line), "{line:?} in {listed}");
    }
    let products = describe(ROOT.0, ROOT.1, "\\d products");
    for line in [
        "Table \"public.products\"",
        " id       | text             |           | not null | ",
        " name     | text             |           | not null | ",
        " price    | double precision |           |          | ",
        " tags     | text[]           |           |          | ",
        "\"products_pkey\" PRIMARY KEY, btree (id)",
        "\"products_name_idx\" btree (name)",
        " category | text             |           |          | ",
        "Foreign-key constraints:\n    \"products_category_fkey\" FOREIGN KEY (category) REFERENCES categories(id)",
    ] {
        assert!(products.contains(line), "{line:?} in {products}");
    }
    let categories = describe(ROOT.0, ROOT.1, "\\d categories");
    assert!(
        categories.contains(
            "Referenced by:\n    TABLE \"products\" CONSTRAINT \"products_category_fkey\" FOREIGN KEY (category) \
             REFERENCES categories(id)"
        ),
        "{categories}"
    );
    let orders = describe(ROOT.0, ROOT.1, "\\d orders");
    assert!(orders.contains(" _offset    | bigint  |           | not null |"), "{orders}");
    let view = describe(ROOT.0, ROOT.1, "\\d per_product");
    assert!(view.contains("Materialized view \"public.per_product\"") && view.contains(" n       | bigint"), "{view}");
    let roles = describe(ROOT.0, ROOT.1, "\\du");
    assert!(roles.contains(" alice ") && roles.contains(" root "), "{roles}");
    assert!(describe(ROOT.0, ROOT.1, "\\l").contains(" onehop | onehop | UTF8"));
    // alice sees the one table she may read, and only herself among the users.
    let hers = describe("alice", "alice-pass", "\\d");
    assert!(hers.contains(" products ") && !hers.contains("orders") && !hers.contains("per_product"), "{hers}");
    let roles = describe("alice", "alice-pass", "\\du");
    assert!(roles.contains(" alice ") && !roles.contains(" root "), "{roles}");
    let (ok, out, err) = psql(
        &conninfo(pg, dir.path(), "alice"),
        "alice-pass",
        &[
            "SELECT table_name, column_name, data_type FROM information_schema.columns ORDER BY table_name, ordinal_position",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "products|id|text\nproducts|name|text\nproducts|price|double precision\nproducts|tags|ARRAY\n\
         products|category|text\n"
    );

    // SQLAlchemy Core over psycopg: create_all (twice: the second finds the table), the
    // inspector's names, a reflection of the tables, an insert, a select, a rollback.
    let script = r#"
import sys, sqlalchemy as sa
url, wrong = sys.argv[1], sys.argv[2]
engine = sa.create_engine(url)
metadata = sa.MetaData()
items = sa.Table("sa_items", metadata, sa.Column("id", sa.Text, primary_key=True),
                 sa.Column("name", sa.Text, nullable=False), sa.Column("qty", sa.BigInteger))
metadata.create_all(engine)
metadata.create_all(engine)
inspector = sa.inspect(engine)
print("tables", sorted(inspector.get_table_names()))
print("has", inspector.has_table("sa_items"), inspector.has_table("nowhere"))
reflected = sa.MetaData()
reflected.reflect(engine, only=["categories", "products", "sa_items"])
print("foreign keys", sorted(key.target_fullname for key in reflected.tables["products"].foreign_keys))
for name in ("products", "sa_items"):
    table = reflected.tables[name]
    print("reflected", name, [(c.name, str(c.type), c.nullable, c.primary_key) for c in table.columns],
          sorted(index.name for index in table.indexes))
with engine.begin() as conn:
    conn.execute(items.insert(), [{"id": "a", "name": "apple", "qty": 3}, {"id": "b", "name": "bean", "qty": 7}])
with engine.connect() as conn:
    print("select", conn.execute(sa.select(items.c.id, items.c.qty).where(items.c.qty > 2).order_by(items.c.id)).all())
    conn.execute(items.update().where(items.c.id == "a").values(qty=items.c.qty + 10))
    conn.rollback()
    print("rolled back", conn.execute(sa.select(items.c.qty).where(items.c.id == "a")).scalar_one())
    try:
        conn.execute(items.insert().values(id="a", name="again"))
    except sa.exc.IntegrityError as error:
        print("integrity", error.orig.sqlstate)
try:
    sa.create_engine(wrong).connect()
except sa.exc.OperationalError as error:
    print("wrong password", "password authentication failed" in str(error))
"#;
    let url = |password: &str| {
        format!(
            "postgresql+psycopg://{}:{password}@127.0.0.1:{}/onehop?sslmode=verify-full&sslrootcert={}",
            ROOT.0,
            pg.port(),
            dir.path().join("ca.pem").display()
        )
    };
    let said = python(script, &[&url(ROOT.1), &url("wrong")]);
    for expected in [
        "tables ['categories', 'orders', 'products', 'sa_items']",
        "foreign keys ['categories.id']",
        "has True False",
        "reflected products [('id', 'TEXT', False, True), ('name', 'TEXT', False, False), ('price', 'DOUBLE PRECISION', True, False), ('tags', 'ARRAY', True, False), ('category', 'TEXT', True, False)] ['products_name_idx']",
        "reflected sa_items [('id', 'TEXT', False, True), ('name', 'TEXT', False, False), ('qty', 'BIGINT', True, False)] []",
        "select [('a', 3), ('b', 7)]",
        "rolled back 3",
        "integrity 23505",
        "wrong password True",
    ] {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
    // What SQLAlchemy wrote is a table like any other.
    let credentials = format!("{}:{}", ROOT.0, ROOT.1);
    let (status, body) = curl(server.address, "/tables/sa_items/b", &["-u", &credentials]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"qty\":7"), "{body}");
}

/// A simple query's rows go out as they are found: psql, and psycopg without parameters (the
/// simple protocol), read 3 000 rows of 200 bytes from a server whose query_memory_max (256
/// KiB) could not hold them as one answer, as the extended protocol (psycopg with a parameter,
/// whose answer is built at Bind) is refused; a grouped query is answered whole, and a short
/// answer's types are its rows' as before.
#[test]
fn a_simple_query_streams_rows_past_what_one_answer_may_hold() {
    let dir = DataDir::new();
    let server = tls_server_with(&dir, &["--query-memory-max", "256KiB"]);
    let root = conninfo(server.pg_address.expect("the Postgres listener is on"), dir.path(), ROOT.0);
    let (ok, out, err) = psql(&root, ROOT.1, &["CREATE TABLE big (id TEXT PRIMARY KEY, n BIGINT, pad TEXT)"]);
    assert!(ok, "{out}{err}");
    let pad = "x".repeat(200);
    for chunk in 0..10 {
        let values: Vec<String> =
            (0..300).map(|i| chunk * 300 + i).map(|n| format!("('r{n:04}', {n}, '{pad}')")).collect();
        let (ok, out, err) =
            psql(&root, ROOT.1, &[&format!("INSERT INTO big (id, n, pad) VALUES {}", values.join(", "))]);
        assert!(ok, "{out}{err}");
    }
    let (ok, out, err) = psql(&root, ROOT.1, &["SELECT id, n, pad FROM big"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3000);
    assert!(lines.iter().all(|line| line.starts_with('r') && line.ends_with(&pad)), "{}", lines[0]);
    let (ok, out, err) = psql(&root, ROOT.1, &["SELECT n % 3 AS m, COUNT(*) FROM big GROUP BY n % 3 ORDER BY m"]);
    assert!(ok, "{err}");
    assert_eq!(out, "0|1000\n1|1000\n2|1000\n");
    let script = r#"
import sys, psycopg
dsn, password = sys.argv[1], sys.argv[2]
with psycopg.connect(dsn, password=password, autocommit=True) as conn:
    print("typed", conn.execute("SELECT n, id FROM big WHERE n < 3 ORDER BY n").fetchall())
    print("simple", len(conn.cursor().execute("SELECT id, pad FROM big", prepare=False).fetchall()))
    try:
        conn.execute("SELECT id, pad FROM big WHERE n >= %s", (0,)).fetchall()
        print("not refused")
    except psycopg.Error as error:
        print("refused", error.sqlstate)
"#;
    let said = python(script, &[&root, ROOT.1]);
    assert!(said.contains("typed [(0, 'r0000'), (1, 'r0001'), (2, 'r0002')]"), "{said}");
    assert!(said.contains("simple 3000"), "{said}");
    assert!(said.contains("refused 54000"), "{said}");
}
