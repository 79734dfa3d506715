//! Users, grants and tokens with real clients: curl (Basic, Bearer, an SSE subscription with
//! `access_token`), a WebSocket, mosquitto_pub and mosquitto_sub (3.1.1 and 5.0); every refusal
//! in the client's own protocol, and nothing written by a refused client.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{DataDir, Server, Spawned, curl, line_channel};

const ROOT: (&str, &str) = ("root", "root-pass");

fn start(dir: &DataDir) -> Server {
    dir.start(&["--admin-user", ROOT.0], &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)])
}

fn as_user(user: (&str, &str)) -> String {
    format!("{}:{}", user.0, user.1)
}

/// Runs SQL as `user` over curl, failing the test unless it succeeds.
fn sql(address: SocketAddr, user: (&str, &str), statements: &str) -> serde_json::Value {
    let (status, body) = curl(address, "/sql", &["-u", &as_user(user), "--data-binary", statements]);
    assert_eq!(status, 200, "{statements}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn code(body: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    value["error"]["code"].as_str().unwrap_or_default().to_string()
}

/// The values stored in `stream`, read as root.
fn stored(address: SocketAddr, stream: &str) -> Vec<serde_json::Value> {
    common::stored_as(address, stream, ROOT)
}

/// curl: a request without credentials or with a wrong password gets 401 with a challenge; a
/// user reads and writes what it is granted and gets 403 for the rest, nothing written; a
/// token works as a Bearer header and, for an SSE subscription, as `access_token`; a
/// WebSocket opened with a token may not add a subscription to a stream it may not read; SQL
/// and `GET /streams`, `/tables` and `/views` list only what a user has grants on (and ask a
/// client without credentials for them); only superusers manage users; a user changes its own
/// password; `/metrics` is a superuser's, `/healthz` anyone's; access, tokens included,
/// survives a restart; a dropped user's token stops working.
#[test]
fn http_clients_log_in_and_reach_only_what_they_are_granted() {
    let dir = DataDir::new();
    let mut server = start(&dir);
    let address = server.address;

    let output = Command::new("curl")
        .args(["-s", "-i", "-X", "POST", "--data-binary", "{\"n\":0}"])
        .arg(format!("http://{address}/streams/orders"))
        .output()
        .unwrap();
    let response = String::from_utf8_lossy(&output.stdout).to_lowercase();
    assert!(response.starts_with("http/1.1 401"), "{response}");
    assert!(response.contains("www-authenticate: basic realm=\"onehop\", bearer realm=\"onehop\""), "{response}");
    let (status, body) = curl(address, "/streams/orders", &["-u", "root:wrong"]);
    assert_eq!((status, code(&body)), (401, "unauthenticated".into()), "{body}");
    assert_eq!(curl(address, "/healthz", &[]).0, 200);

    let answer = sql(
        address,
        ROOT,
        "CREATE USER alice PASSWORD 'alice-pass'; CREATE USER dev PASSWORD 'dev-pass'; \
         CREATE STREAM orders; CREATE STREAM secrets; \
         GRANT READ ON STREAM orders TO alice; GRANT WRITE ON STREAM orders TO dev; \
         CREATE TOKEN FOR alice VALID FOR '1h'",
    );
    let token = answer["results"][6]["rows"][0][2].as_str().unwrap().to_string();
    assert!(token.starts_with("oht_"), "{answer}");
    let (alice, dev) = (("alice", "alice-pass"), ("dev", "dev-pass"));

    // A subscription as alice, by token in the URL (as a browser's EventSource would).
    let mut sse = Spawned(
        Command::new("curl")
            .args(["-s", "-N", "--max-time", "30", "-H", "Accept: text/event-stream"])
            .arg(format!("http://{address}/streams/orders?from=earliest&access_token={token}"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let events = line_channel(sse.0.stdout.take().unwrap());
    std::thread::sleep(Duration::from_millis(300));

    let (status, body) = curl(address, "/streams/orders", &["-u", &as_user(dev), "--data-binary", "{\"n\":1}"]);
    assert_eq!(status, 200, "{body}");
    let (status, body) = curl(address, "/streams/orders", &["-u", &as_user(dev)]);
    assert_eq!((status, code(&body)), (403, "forbidden".into()), "dev may write orders, not read it: {body}");
    let (status, body) = curl(address, "/streams/secrets", &["-u", &as_user(dev), "--data-binary", "{\"n\":2}"]);
    assert_eq!((status, code(&body)), (403, "forbidden".into()), "{body}");
    assert!(body.contains("GRANT WRITE ON STREAM secrets TO dev"), "the refusal says what would allow it: {body}");
    let (status, body) = curl(address, "/streams/orders", &["-H", &format!("Authorization: Bearer {token}")]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"n\":1"), "{body}");
    let (status, _) = curl(address, "/streams/orders", &["-u", &as_user(alice), "--data-binary", "{\"n\":3}"]);
    assert_eq!(status, 403, "alice may read orders, not write it");
    let (status, _) = curl(address, "/streams/secrets", &["-H", &format!("Authorization: Bearer {token}x")]);
    assert_eq!(status, 401, "a forged token");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let line = events.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("an SSE event");
        if line.starts_with("data:") {
            assert!(line.contains("\"n\":1"), "{line}");
            break;
        }
    }
    drop(sse);
    let (status, _) =
        curl(address, &format!("/streams/secrets?access_token={token}"), &["-H", "Accept: text/event-stream"]);
    assert_eq!(status, 403, "no subscription to what alice may not read");

    // A WebSocket opened as alice may not add a subscription to a stream she may not read.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let url = format!("ws://{address}/streams/orders?access_token={token}");
        let (mut socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let first = socket.next().await.unwrap().unwrap().into_text().unwrap();
        assert!(first.contains("\"subscribed\""), "{first}");
        let command = r#"{"op":"subscribe","subscription":"s","stream":"secrets"}"#;
        socket.send(Message::Text(command.into())).await.unwrap();
        let answer = socket.next().await.unwrap().unwrap().into_text().unwrap();
        assert!(answer.contains("\"error\"") && answer.contains("forbidden"), "{answer}");
        let refused = tokio_tungstenite::connect_async(format!("ws://{address}/streams/orders")).await;
        assert!(refused.is_err(), "no WebSocket without credentials");
    });

    let answer = sql(address, alice, "SHOW STREAMS");
    let listed: Vec<&str> =
        answer["results"][0]["rows"].as_array().unwrap().iter().map(|row| row[0].as_str().unwrap()).collect();
    assert_eq!(listed, ["orders"], "alice sees only what she has grants on");
    // The REST listings are the same listings, as objects.
    for (user, wanted) in [(alice, vec!["orders"]), (ROOT, vec!["orders", "secrets"])] {
        let (status, body) = curl(address, "/streams", &["-u", &as_user(user)]);
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        let listed: Vec<&str> =
            answer["streams"].as_array().unwrap().iter().map(|stream| stream["name"].as_str().unwrap()).collect();
        assert_eq!(listed, wanted, "{body}");
    }
    for listing in ["/tables", "/views"] {
        let (status, body) = curl(address, listing, &["-u", &as_user(alice)]);
        assert_eq!((status, body.as_str()), (200, format!("{{\"{}\":[]}}", &listing[1..]).as_str()));
        let (status, body) = curl(address, listing, &[]);
        assert_eq!((status, code(&body)), (401, "unauthenticated".into()), "{listing}: {body}");
    }
    let (status, body) =
        curl(address, "/sql", &["-u", &as_user(alice), "--data-binary", "CREATE USER eve PASSWORD 'x'"]);
    assert_eq!((status, code(&body)), (403, "forbidden".into()), "{body}");
    let (status, _) = curl(address, "/sql", &["-u", &as_user(alice), "--data-binary", "DROP STREAM orders"]);
    assert_eq!(status, 403);
    sql(address, alice, "ALTER USER alice PASSWORD 'alice-new'");
    assert_eq!(curl(address, "/streams/orders", &["-u", &as_user(alice)]).0, 401, "the old password");
    let alice = ("alice", "alice-new");
    assert_eq!(curl(address, "/streams/orders", &["-u", &as_user(alice)]).0, 200);
    assert_eq!(curl(address, "/metrics", &["-u", &as_user(alice)]).0, 403);
    let (status, metrics) = curl(address, "/metrics", &["-u", &as_user(ROOT)]);
    assert_eq!(status, 200);
    let failures = metrics.lines().find(|line| line.starts_with("auth_failures_total{protocol=\"http\"}")).unwrap();
    assert!(!failures.ends_with(" 0"), "{failures}");

    // Nothing a refused request carried was written.
    assert_eq!(stored(address, "orders"), [serde_json::json!({"n": 1})]);
    assert!(stored(address, "secrets").is_empty());

    server.signal("TERM");
    server.wait_exit();
    server = dir.start(&[], &[]);
    let address = server.address;
    assert_eq!(curl(address, "/streams/orders", &["-u", &as_user(alice)]).0, 200, "users survive a restart");
    assert_eq!(curl(address, "/streams/orders", &["-H", &format!("Authorization: Bearer {token}")]).0, 200);
    assert_eq!(curl(address, "/streams/orders", &[]).0, 401, "access stays on");
    sql(address, ROOT, "DROP USER alice");
    assert_eq!(curl(address, "/streams/orders", &["-H", &format!("Authorization: Bearer {token}")]).0, 401);
}

/// mosquitto_pub and mosquitto_sub: without credentials or with a wrong password the CONNECT
/// is refused with 3.1.1's return codes (5, 4) and 5.0's reason codes (0x87, 0x86); a device
/// publishes where it may write, and a publish elsewhere is refused (a PUBACK 0x87 in 5.0, the
/// connection closed in 3.1.1) with nothing stored; a `#` subscription receives only from
/// streams its user may read; a subscription to a forbidden stream is denied in its SUBACK; a
/// token works as the MQTT password.
/// `DELETE /streams/{s}`, `/tables/{t}` and `/views/{v}` drop what `DROP` drops, for a user
/// with ADMIN on it: a reader is refused (403, nothing dropped), a client without credentials
/// asked for them, a name that does not exist answered 404, and what is dropped leaves the
/// listings.
#[test]
fn rest_drops_take_admin_on_what_they_drop() {
    let dir = DataDir::new();
    let server = start(&dir);
    let address = server.address;
    sql(
        address,
        ROOT,
        "CREATE USER bob PASSWORD 'bob-pass'; CREATE USER ops PASSWORD 'ops-pass'; \
         CREATE STREAM clicks; CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT); \
         CREATE VIEW clicks_by_page AS SELECT page, COUNT(*) AS n FROM clicks GROUP BY page; \
         GRANT READ ON STREAM clicks TO bob; GRANT READ ON TABLE users TO bob; GRANT READ ON VIEW clicks_by_page TO bob; \
         GRANT ADMIN ON STREAM clicks TO ops",
    );
    let (bob, ops) = (("bob", "bob-pass"), ("ops", "ops-pass"));
    let delete = |path: &str, user: Option<(&str, &str)>| {
        let credentials = user.map(as_user);
        let mut args = vec!["-X", "DELETE"];
        if let Some(credentials) = &credentials {
            args.extend(["-u", credentials.as_str()]);
        }
        let (status, body) = curl(address, path, &args);
        (status, body)
    };
    let listed = |listing: &str| -> Vec<String> {
        let (status, body) = curl(address, listing, &["-u", &as_user(ROOT)]);
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        answer[&listing[1..]].as_array().unwrap().iter().map(|row| row["name"].as_str().unwrap().to_string()).collect()
    };
    for path in ["/streams/clicks", "/tables/users", "/views/clicks_by_page"] {
        let (status, body) = delete(path, Some(bob));
        assert_eq!((status, code(&body)), (403, "forbidden".into()), "{path}: {body}");
        let (status, body) = delete(path, None);
        assert_eq!((status, code(&body)), (401, "unauthenticated".into()), "{path}: {body}");
    }
    assert_eq!(listed("/streams"), ["clicks"]);
    assert_eq!(listed("/tables"), ["users"]);
    assert_eq!(listed("/views"), ["clicks_by_page"]);
    // ADMIN on the stream is not ADMIN on the table.
    let (status, body) = delete("/tables/users", Some(ops));
    assert_eq!((status, code(&body)), (403, "forbidden".into()), "{body}");
    let (status, body) = delete("/views/clicks_by_page", Some(ROOT));
    assert_eq!((status, body.as_str()), (200, r#"{"dropped":"view","name":"clicks_by_page"}"#));
    let (status, body) = delete("/streams/clicks", Some(ops));
    assert_eq!((status, body.as_str()), (200, r#"{"dropped":"stream","name":"clicks"}"#));
    let (status, body) = delete("/tables/users", Some(ROOT));
    assert_eq!((status, body.as_str()), (200, r#"{"dropped":"table","name":"users"}"#));
    for listing in ["/streams", "/tables", "/views"] {
        assert!(listed(listing).is_empty(), "{listing}");
    }
    let (status, body) = delete("/streams/clicks", Some(ROOT));
    assert_eq!(status, 404, "{body}");
}

#[test]
fn mqtt_clients_log_in_and_wildcards_reach_only_readable_streams() {
    let dir = DataDir::new();
    let server = start(&dir);
    let (address, mqtt) = (server.address, server.mqtt_address);
    let answer = sql(
        address,
        ROOT,
        "CREATE USER device PASSWORD 'device-pass'; CREATE USER viewer PASSWORD 'viewer-pass'; \
         CREATE STREAM telemetry; CREATE STREAM secrets; \
         GRANT WRITE ON STREAM telemetry TO device; GRANT READ ON STREAM telemetry TO viewer; \
         CREATE TOKEN FOR viewer",
    );
    let token = answer["results"][6]["rows"][0][2].as_str().unwrap().to_string();
    let port = mqtt.port().to_string();
    let mosquitto = |program: &str, args: &[&str]| {
        let output = Command::new(program).args(["-h", "127.0.0.1", "-p", &port]).args(args).output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.code().unwrap_or(-1), said)
    };
    let publish = ["-q", "1", "-t", "telemetry/d1", "-m", "x"];
    let (status, said) = mosquitto("mosquitto_pub", &publish);
    assert_eq!(status, 5, "3.1.1 not authorised: {said}");
    let (status, said) = mosquitto("mosquitto_pub", &[&["-V", "mqttv5"][..], &publish].concat());
    assert_eq!(status, 0x87, "5.0 not authorized: {said}");
    let (status, said) = mosquitto("mosquitto_pub", &[&["-u", "device", "-P", "wrong"][..], &publish].concat());
    assert_eq!(status, 4, "3.1.1 bad user name or password: {said}");
    let (status, said) =
        mosquitto("mosquitto_pub", &[&["-V", "mqttv5", "-u", "device", "-P", "wrong"][..], &publish].concat());
    assert_eq!(status, 0x86, "5.0 bad user name or password: {said}");

    // The viewer follows everything it can: `#`, with its token as the password.
    let mut subscriber = Spawned(
        Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-V", "mqttv5", "-u", "viewer", "-P", &token, "-t", "#", "-v"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let received = line_channel(subscriber.0.stdout.take().unwrap());
    common::wait_for_mqtt_subscriptions(address, 1, Some(ROOT));

    let device = ["-V", "mqttv5", "-u", "device", "-P", "device-pass", "-q", "1"];
    let (status, said) = mosquitto("mosquitto_pub", &[&device[..], &["-t", "secrets/d1", "-m", "stolen"]].concat());
    assert!(said.contains("Not authorized"), "a PUBACK 0x87 ({status}): {said}");
    let (status, said) = mosquitto(
        "mosquitto_pub",
        &["-u", "device", "-P", "device-pass", "-q", "1", "-t", "secrets/d1", "-m", "stolen-3"],
    );
    assert_ne!(status, 0, "3.1.1 has no refusal in PUBACK: the connection is closed: {said}");
    // Published with a subject, as MQTT's `#` would match it if it were readable.
    let (status, body) =
        curl(address, "/streams/secrets?subject=secrets/x", &["-u", &as_user(ROOT), "--data-binary", "\"classified\""]);
    assert_eq!(status, 200, "{body}");
    let (status, said) = mosquitto("mosquitto_pub", &[&device[..], &["-t", "telemetry/d1", "-m", "reading"]].concat());
    assert_eq!(status, 0, "{said}");

    let line = received.recv_timeout(Duration::from_secs(10)).expect("the viewer receives telemetry");
    assert_eq!(line, "telemetry/d1 reading");
    assert!(received.recv_timeout(Duration::from_millis(700)).is_err(), "nothing from secrets reached the viewer");
    drop(subscriber);

    let (status, said) = mosquitto(
        "mosquitto_sub",
        &["-V", "mqttv5", "-u", "viewer", "-P", "viewer-pass", "-t", "secrets/#", "-W", "3"],
    );
    assert!(said.contains("All subscription requests were denied"), "SUBACK 0x87 ({status}): {said}");
    assert_eq!(stored(address, "secrets"), [serde_json::json!("classified")], "no refused publish was stored");
    assert_eq!(stored(address, "telemetry"), [serde_json::json!("reading")]);
}

/// A server with no user refuses to listen beyond loopback unless told `--insecure-listen`;
/// the first superuser can come from a password file.
#[test]
fn listening_beyond_loopback_needs_a_user_or_insecure_listen() {
    let dir = DataDir::new();
    let mut command = common::onehop();
    let output = command
        .args(["serve", "--data-dir", dir.data_arg(), "--http-addr", "0.0.0.0:0", "--mqtt-addr", "127.0.0.1:0"])
        .args(["--kafka-addr", "off"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0 with no user defined"), "{stderr}");
    assert!(stderr.contains("--insecure-listen"), "{stderr}");

    let password_file = dir.path().join("admin-password");
    std::fs::write(&password_file, "from-a-file\n").unwrap();
    let server = dir.start(&["--admin-user", "ops", "--admin-password-file", password_file.to_str().unwrap()], &[]);
    assert_eq!(curl(server.address, "/metrics", &["-u", "ops:from-a-file"]).0, 200);
    assert_eq!(curl(server.address, "/metrics", &[]).0, 401);
}

/// The permission matrix: users holding READ, WRITE or ADMIN on a stream, a table and a view
/// (or nothing) against reads, writes, administration and subscriptions over HTTP, SSE,
/// WebSocket and MQTT. Every cell is tried with the real client and compared with what the
/// grants say; the test prints the cells that differ.
#[test]
fn every_privilege_on_every_kind_of_object_holds_over_every_protocol() {
    let dir = DataDir::new();
    let server = start(&dir);
    let (address, mqtt) = (server.address, server.mqtt_address);
    sql(
        address,
        ROOT,
        "CREATE STREAM s; CREATE TABLE t (id TEXT PRIMARY KEY); \
         CREATE VIEW v AS SELECT team, COUNT(*) AS n FROM s GROUP BY team; \
         CREATE USER reader PASSWORD 'p'; CREATE USER writer PASSWORD 'p'; CREATE USER admin PASSWORD 'p'; \
         CREATE USER nobody PASSWORD 'p'; \
         GRANT READ ON STREAM s, TABLE t, VIEW v TO reader; GRANT WRITE ON STREAM s, TABLE t TO writer; \
         GRANT ADMIN ON STREAM s, TABLE t, VIEW v TO admin",
    );
    let (status, body) =
        curl(address, "/tables/t/x", &["-u", &as_user(ROOT), "-X", "PUT", "--data-binary", "{\"id\":\"x\"}"]);
    assert_eq!(status, 201, "{body}");
    let (status, body) = curl(address, "/streams/s", &["-u", &as_user(ROOT), "--data-binary", "{\"team\":\"red\"}"]);
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while curl(address, "/views/v/red", &["-u", &as_user(ROOT)]).0 != 200 {
        assert!(Instant::now() < deadline, "the view never counted the record");
        std::thread::sleep(Duration::from_millis(50));
    }

    let port = mqtt.port().to_string();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Each cell: what it does, and whether a user with READ, WRITE, ADMIN may do it.
    type Cell<'a> = (&'a str, [bool; 3], Box<dyn Fn(&str) -> bool + 'a>);
    let http = |method: &'static str, path: &'static str, body: &'static str| {
        move |user: &str| {
            let credentials = format!("{user}:p");
            let mut args = vec!["-u", credentials.as_str(), "-X", method];
            if !body.is_empty() {
                args.extend(["--data-binary", body]);
            }
            let (status, _) = curl(address, path, &args);
            assert!(matches!(status, 200 | 201 | 403), "{method} {path} as {user}: {status}");
            status != 403
        }
    };
    let sse = |path: &'static str| {
        move |user: &str| {
            let credentials = format!("{user}:p");
            let output = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "1", "-u", &credentials])
                .args(["-H", "Accept: text/event-stream"])
                .arg(format!("http://{address}{path}"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&output.stdout) == "200"
        }
    };
    let websocket = |path: &'static str| {
        let runtime = &runtime;
        move |user: &str| {
            use base64::Engine as _;
            use tokio_tungstenite::tungstenite::client::IntoClientRequest;
            let mut request = format!("ws://{address}{path}").into_client_request().unwrap();
            let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:p"));
            request.headers_mut().insert("authorization", format!("Basic {credentials}").parse().unwrap());
            runtime.block_on(tokio_tungstenite::connect_async(request)).is_ok()
        }
    };
    let mqtt_subscribe = |filter: &'static str| {
        let port = port.clone();
        move |user: &str| {
            let output = Command::new("mosquitto_sub")
                .args(["-h", "127.0.0.1", "-p", &port, "-V", "mqttv5", "-u", user, "-P", "p", "-t", filter, "-W", "1"])
                .output()
                .unwrap();
            !String::from_utf8_lossy(&output.stderr).contains("denied")
        }
    };
    let mqtt_publish = |topic: &'static str, payload: &'static str| {
        let port = port.clone();
        move |user: &str| {
            let output = Command::new("mosquitto_pub")
                .args(["-h", "127.0.0.1", "-p", &port, "-V", "mqttv5", "-q", "1", "-u", user, "-P", "p"])
                .args(["-t", topic, "-m", payload])
                .output()
                .unwrap();
            output.status.success() && !String::from_utf8_lossy(&output.stderr).contains("Not authorized")
        }
    };
    let admin = |statement: &'static str| {
        move |user: &str| {
            let credentials = format!("{user}:p");
            let (status, _) = curl(address, "/sql", &["-u", &credentials, "--data-binary", statement]);
            status == 200
        }
    };
    let cells: Vec<Cell> = vec![
        ("HTTP read stream", [true, false, true], Box::new(http("GET", "/streams/s", ""))),
        ("HTTP write stream", [false, true, true], Box::new(http("POST", "/streams/s", "{\"team\":\"blue\"}"))),
        ("HTTP read table row", [true, false, true], Box::new(http("GET", "/tables/t/x", ""))),
        ("HTTP write table row", [false, true, true], Box::new(http("PUT", "/tables/t/y", "{\"id\":\"y\"}"))),
        ("HTTP read view", [true, false, true], Box::new(http("GET", "/views/v/red", ""))),
        ("SSE stream", [true, false, true], Box::new(sse("/streams/s"))),
        ("SSE table", [true, false, true], Box::new(sse("/tables/t?snapshot=true"))),
        ("SSE view", [true, false, true], Box::new(sse("/views/v"))),
        ("WebSocket stream", [true, false, true], Box::new(websocket("/streams/s"))),
        ("WebSocket table", [true, false, true], Box::new(websocket("/tables/t"))),
        ("WebSocket view", [true, false, true], Box::new(websocket("/views/v"))),
        ("MQTT subscribe stream", [true, false, true], Box::new(mqtt_subscribe("s/#"))),
        ("MQTT subscribe table", [true, false, true], Box::new(mqtt_subscribe("t/#"))),
        ("MQTT subscribe view", [true, false, true], Box::new(mqtt_subscribe("views/v/#"))),
        ("MQTT publish stream", [false, true, true], Box::new(mqtt_publish("s/x", "{\"team\":\"green\"}"))),
        ("MQTT retained row", [false, true, true], Box::new(mqtt_retained("t/z", &port))),
        ("SQL alter stream", [false, false, true], Box::new(admin("ALTER STREAM s SET (retention = '30d')"))),
        ("SQL index table", [false, false, true], Box::new(admin("CREATE INDEX ON t (team)"))),
        // Last: it drops the view the cells above read.
        ("SQL drop view", [false, false, true], Box::new(admin("DROP VIEW v"))),
    ];
    let users = ["reader", "writer", "admin"];
    let mut wrong = Vec::new();
    for (what, expected, attempt) in &cells {
        for (user, allowed) in users.iter().zip(expected) {
            if attempt(user) != *allowed {
                wrong.push(format!("{what} as {user}: expected {}", if *allowed { "allowed" } else { "refused" }));
            }
        }
        if attempt("nobody") {
            wrong.push(format!("{what} as nobody: expected refused"));
        }
    }
    assert!(wrong.is_empty(), "cells that differ from the grants:\n{}", wrong.join("\n"));

    // A transform that joins a table reads it: creating one needs READ on the table too.
    sql(
        address,
        ROOT,
        "CREATE USER maker PASSWORD 'p'; GRANT ADMIN ON STREAM enriched TO maker; GRANT READ ON STREAM s TO maker",
    );
    let enrich = "CREATE STREAM enriched AS SELECT s.team, t.id AS row_id FROM s LEFT JOIN t ON t.id = s.team";
    let (status, body) = curl(address, "/sql", &["-u", "maker:p", "--data-binary", enrich]);
    assert_eq!((status, code(&body)), (403, "forbidden".to_string()), "{body}");
    sql(address, ROOT, "GRANT READ ON TABLE t TO maker");
    let (status, body) = curl(address, "/sql", &["-u", "maker:p", "--data-binary", enrich]);
    assert_eq!(status, 200, "{body}");
}

/// A retained MQTT publish to `{table}/{id}`: a row write.
fn mqtt_retained<'a>(topic: &'static str, port: &'a str) -> impl Fn(&str) -> bool + 'a {
    move |user: &str| {
        let output = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", port, "-V", "mqttv5", "-q", "1", "-r", "-u", user, "-P", "p"])
            .args(["-t", topic, "-m", "{\"id\":\"z\"}"])
            .output()
            .unwrap();
        output.status.success() && !String::from_utf8_lossy(&output.stderr).contains("Not authorized")
    }
}

/// Topic grants, finer than a stream: every user may publish under `devices/<its name>/` only
/// (`%u`), and `ops` may read the `devices/+/status` topics only. mosquitto_pub and
/// mosquitto_sub (5.0), and curl with `subject=`: a subscription inside the grant is granted and
/// receives only those topics, one wider is denied; a publish outside the user's own topics is
/// refused (PUBACK 0x87, HTTP 403) and never stored.
#[test]
fn topic_grants_reach_only_their_topics_over_mqtt_and_http() {
    let dir = DataDir::new();
    let server = start(&dir);
    let (address, port) = (server.address, server.mqtt_address.port().to_string());
    sql(
        address,
        ROOT,
        "CREATE USER alice PASSWORD 'alice-pass'; CREATE USER bob PASSWORD 'bob-pass'; CREATE USER ops PASSWORD 'ops-pass'; \
         CREATE STREAM devices; GRANT WRITE ON TOPIC 'devices/%u/#' TO PUBLIC; \
         GRANT READ ON TOPIC 'devices/+/status' TO ops",
    );
    let mosquitto = |program: &str, user: &str, args: &[&str]| {
        let output = Command::new(program)
            .args(["-h", "127.0.0.1", "-p", &port, "-V", "mqttv5", "-u", user, "-P", &format!("{user}-pass")])
            .args(args)
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.code().unwrap_or(-1), said)
    };
    let mut subscriber = Spawned(
        Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-V", "mqttv5", "-u", "ops", "-P", "ops-pass"])
            .args(["-t", "devices/+/status", "-v"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let received = line_channel(subscriber.0.stdout.take().unwrap());
    let (_, said) = mosquitto("mosquitto_sub", "ops", &["-t", "devices/#", "-W", "2"]);
    assert!(said.contains("All subscription requests were denied"), "a filter wider than the grant: {said}");
    let (_, said) = mosquitto("mosquitto_sub", "ops", &["-t", "$share/g/devices/+/status", "-W", "1"]);
    assert!(!said.contains("denied"), "a shared subscription inside the grant: {said}");
    // The first subscriber is in once the gauge counts it (the two above have left, or go).
    common::wait_for_mqtt_subscriptions(address, 1, Some(ROOT));

    let publish = |user: &str, topic: &str, message: &str| {
        mosquitto("mosquitto_pub", user, &["-q", "1", "-t", topic, "-m", message])
    };
    assert_eq!(publish("alice", "devices/alice/status", "alice up").0, 0);
    let (status, said) = publish("alice", "devices/bob/status", "spoofed");
    assert!(said.contains("Not authorized"), "another user's topic: PUBACK 0x87 ({status}): {said}");
    assert_eq!(publish("bob", "devices/bob/temp", "21").0, 0, "bob's own topic");
    assert_eq!(publish("bob", "devices/bob/status", "bob up").0, 0);
    assert_eq!(received.recv_timeout(Duration::from_secs(10)).unwrap(), "devices/alice/status alice up");
    assert_eq!(received.recv_timeout(Duration::from_secs(10)).unwrap(), "devices/bob/status bob up");
    assert!(received.recv_timeout(Duration::from_millis(500)).is_err(), "nothing outside the grant");
    drop(subscriber);

    // HTTP: the subject in the query stands in for the stream.
    let ops = ("ops", "ops-pass");
    let (status, body) =
        curl(address, "/streams/devices?from=earliest&subject=devices/%2B/status", &["-u", &as_user(ops)]);
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let values: Vec<&str> =
        body["records"].as_array().unwrap().iter().map(|record| record["value_text"].as_str().unwrap()).collect();
    assert_eq!(values, ["alice up", "bob up"], "only the granted topics: {body}");
    let (status, _) = curl(address, "/streams/devices?from=earliest", &["-u", &as_user(ops)]);
    assert_eq!(status, 403, "the whole stream is not granted");
    let (status, _) = curl(address, "/streams/devices?from=earliest&subject=devices/%23", &["-u", &as_user(ops)]);
    assert_eq!(status, 403, "a filter wider than the grant");
    let alice = ("alice", "alice-pass");
    let write = |query: &str| {
        curl(address, &format!("/streams/devices{query}"), &["-u", &as_user(alice), "--data-binary", "\"http\""]).0
    };
    assert_eq!(write("?subject=devices/alice/http"), 200);
    assert_eq!(write("?subject=devices/bob/http"), 403);
    assert_eq!(write(""), 403, "a record without a subject needs the stream");
    let mut stored = stored(address, "devices");
    stored.sort_by_key(|value| value.to_string());
    let json = serde_json::json!(["alice up", "bob up", "http", 21]);
    assert_eq!(stored, json.as_array().unwrap()[..], "nothing refused was stored; an MQTT payload `21` reads as JSON");
}
