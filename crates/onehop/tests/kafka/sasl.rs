use std::io::Write;
use std::net::SocketAddr;
use std::process::Stdio;

use crate::common::DataDir;

/// kcat's SASL settings for `mechanism` and a user.
fn sasl<'a>(mechanism: &'a str, user: &'a str, password: &'a str) -> Vec<String> {
    [
        "security.protocol=SASL_PLAINTEXT".to_string(),
        format!("sasl.mechanisms={mechanism}"),
        format!("sasl.username={user}"),
        format!("sasl.password={password}"),
    ]
    .into_iter()
    .flat_map(|setting| ["-X".to_string(), setting])
    .collect()
}

fn run(kafka: SocketAddr, settings: &[String], args: &[&str], input: &str) -> (bool, String, String) {
    let all: Vec<&str> = settings.iter().map(String::as_str).chain(args.iter().copied()).collect();
    let output = crate::librdkafka::kcat_output(kafka, &all, input);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success() && !stderr.contains("ERROR"), stdout, stderr)
}

/// Kafka clients log in with SASL once the server has users: librdkafka (kcat) with PLAIN,
/// SCRAM-SHA-256 and SCRAM-SHA-512, and the Java console producer and a consumer group with
/// SCRAM-SHA-512. A client without SASL, or with a wrong password, gets nothing; a user sees
/// in Metadata only the topics it has grants on, and a produce to a topic it may read but not
/// write is refused with TOPIC_AUTHORIZATION_FAILED and stores nothing. A view's change stream
/// is read with READ on the view, and never written.
#[test]
fn kafka_clients_log_in_with_sasl_plain_and_scram_and_keep_to_their_grants() {
    let dir = DataDir::new();
    let server = dir.start(&["--admin-user", "root"], &[("ONEHOP_ADMIN_PASSWORD", "root-pass")]);
    let kafka = server.kafka_address.unwrap();
    let answer = crate::common::sql_as(
        server.address,
        ("root", "root-pass"),
        "CREATE USER dev PASSWORD 'dev-pass'; CREATE STREAM orders; CREATE STREAM secrets; CREATE STREAM hidden; \
         GRANT READ, WRITE ON STREAM orders TO dev; GRANT READ ON STREAM secrets TO dev; \
         GRANT READ ON GROUP 'readers' TO dev; \
         CREATE VIEW per_line AS SELECT value AS line, COUNT(*) AS n FROM orders GROUP BY value",
    );
    assert!(answer.contains("created"), "{answer}");

    let (ok, _, stderr) = run(kafka, &[], &["-L", "-m", "5"], "");
    assert!(!ok, "no metadata without SASL: {stderr}");
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let (ok, _, stderr) =
            run(kafka, &sasl(mechanism, "dev", "dev-pass"), &["-P", "-t", "orders"], &format!("by {mechanism}\n"));
        assert!(ok, "{mechanism}: {stderr}");
        let (ok, _, stderr) = run(kafka, &sasl(mechanism, "dev", "wrong"), &["-P", "-t", "orders"], "never\n");
        assert!(!ok && stderr.contains("Authentication failure"), "{mechanism} with a wrong password: {stderr}");
    }
    let dev = sasl("SCRAM-SHA-256", "dev", "dev-pass");
    let (ok, stdout, stderr) = run(kafka, &dev, &["-C", "-t", "orders", "-e", "-f", "%s\n"], "");
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().collect::<Vec<_>>(), ["by PLAIN", "by SCRAM-SHA-256", "by SCRAM-SHA-512"]);
    let (ok, stdout, stderr) = run(kafka, &dev, &["-L"], "");
    assert!(ok, "{stderr}");
    assert!(stdout.contains("topic \"orders\"") && !stdout.contains("hidden"), "{stdout}");
    // dev may read secrets, not write it: Metadata describes it, and the produce is refused.
    let (ok, _, stderr) = run(kafka, &dev, &["-P", "-t", "secrets"], "stolen\n");
    assert!(!ok && stderr.contains("Topic authorization failed"), "{stderr}");
    let (ok, _, stderr) = run(kafka, &dev, &["-P", "-t", "hidden"], "stolen\n");
    assert!(!ok && stderr.contains("Topic authorization failed"), "{stderr}");

    // The view's changes: refused without READ on the view (READ on its stream is not enough),
    // read with it (plain-text values count as text), and never written, even by root.
    let changes = ["-C", "-t", "__view.per_line", "-p", "0", "-o", "beginning", "-e", "-f", "%k=%s\n"];
    let (ok, _, stderr) = run(kafka, &dev, &changes, "");
    assert!(!ok && stderr.contains("authorization failed"), "{stderr}");
    crate::common::sql_as(server.address, ("root", "root-pass"), "GRANT READ ON VIEW per_line TO dev");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (ok, stdout, stderr) = run(kafka, &dev, &changes, "");
        if ok && stdout.lines().count() == 3 {
            assert!(stdout.contains(r#"by PLAIN={"final":false,"line":"by PLAIN","n":1}"#), "{stdout}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the view's changes: {stdout} {stderr}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let root = sasl("PLAIN", "root", "root-pass");
    let (ok, _, stderr) = run(kafka, &root, &["-P", "-t", "__view.per_line"], "forged\n");
    assert!(!ok && stderr.contains("Invalid topic"), "{stderr}");

    // The Java client, SCRAM-SHA-512, its producer and a consumer group.
    let config = dir.path().join("client.properties");
    std::fs::write(
        &config,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"dev\" password=\"dev-pass\";\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let mut producer = crate::kafka_tool("org.apache.kafka.tools.ConsoleProducer", kafka)
        .args(["--topic", "orders", "--producer.config", config])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    producer.stdin.take().unwrap().write_all(b"by java\n").unwrap();
    let output = producer.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let said = crate::succeed(crate::kafka_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", kafka).args([
        "--topic",
        "orders",
        "--from-beginning",
        "--max-messages",
        "4",
        "--group",
        "readers",
        "--consumer.config",
        config,
    ]));
    assert_eq!(said.lines().last(), Some("by java"), "{said}");

    let described = crate::common::sql_as(server.address, ("root", "root-pass"), "DESCRIBE secrets");
    let described: serde_json::Value = serde_json::from_str(&described).unwrap();
    assert_eq!(described["results"][0]["rows"][0][5], serde_json::json!([0]), "nothing was stored: {described}");

    // Groups and transactional ids have grants of their own: dev may be a member of `readers`
    // only, and run transactions as no id until it is granted one.
    // kcat's balanced consumer keeps trying; the refusal is in what it prints meanwhile.
    let output = std::process::Command::new("timeout")
        .args(["8", "kcat", "-b", &kafka.to_string()])
        .args(&dev)
        .args(["-G", "others", "orders"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Group authorization failed"), "a group without a grant: {stderr}");
    let transactions = |id: &str| {
        let script = r#"
import sys
from confluent_kafka import Producer
kafka, id = sys.argv[1], sys.argv[2]
producer = Producer({"bootstrap.servers": kafka, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                     "sasl.username": "dev", "sasl.password": "dev-pass", "transactional.id": id})
try:
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce("orders", b"in a transaction")
    producer.commit_transaction(15)
    print("committed")
except Exception as error:
    print(error)
"#;
        let output =
            std::process::Command::new("python3").args(["-c", script, &kafka.to_string(), id]).output().unwrap();
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    };
    let refused = transactions("etl-1");
    assert!(refused.contains("TRANSACTIONAL_ID_AUTHORIZATION_FAILED"), "{refused}");
    crate::common::sql_as(server.address, ("root", "root-pass"), "GRANT WRITE ON TRANSACTIONAL ID 'etl-*' TO dev");
    assert_eq!(transactions("etl-1").trim(), "committed");
}

/// The HMAC secret of the test's JWT issuer, as hex: 32 bytes.
const JWT_SECRET_HEX: &str = "6b61666b61206f617574686265617265722074657374207365637265742121aa";

/// confluent-kafka logs in with SASL OAUTHBEARER, its token a JWT signed by Python's own HMAC
/// (`tests/kafka/confluent/oauth.py`), and keeps producing past several token lifetimes: the
/// server tells it how long each session lasts, it logs in again on the same connections
/// (KIP-368), and every record is acknowledged and consumed back. A token signed with another
/// secret gets an authentication error and stores nothing.
#[test]
fn kafka_clients_log_in_with_oauthbearer_jwts_and_again_before_they_expire() {
    use base64::Engine as _;
    let dir = DataDir::new();
    let secret: Vec<u8> = (0..JWT_SECRET_HEX.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&JWT_SECRET_HEX[at..at + 2], 16).unwrap())
        .collect();
    let keys = dir.path().join("jwks.json");
    let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    std::fs::write(&keys, format!(r#"{{"keys":[{{"kty":"oct","kid":"hmac1","alg":"HS256","k":"{k}"}}]}}"#)).unwrap();
    let server = dir.start(
        &["--admin-user", "root", "--jwt-keys", keys.to_str().unwrap()],
        &[("ONEHOP_ADMIN_PASSWORD", "root-pass")],
    );
    let kafka = server.kafka_address.unwrap().to_string();
    crate::common::sql_as(
        server.address,
        ("root", "root-pass"),
        "CREATE STREAM readings; CREATE ROLE devices; GRANT READ, WRITE ON STREAM readings TO devices; \
         GRANT READ ON GROUP 'oauth-*' TO devices",
    );
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/confluent/oauth.py");
    let run = |extra: &[&str]| {
        let output = std::process::Command::new("python3")
            .arg(&script)
            .args([kafka.as_str(), "readings", JWT_SECRET_HEX, "6", "14"])
            .args(extra)
            .output()
            .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "oauth.py: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_str::<serde_json::Value>(stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|_| panic!("oauth.py printed {stdout:?}"))
    };

    let report = run(&[]);
    assert_eq!(report["errors"], serde_json::json!([]), "tokens: {}", report["tokens"]);
    let sent = report["sent"].as_u64().unwrap();
    let acked = report["acked"].as_array().unwrap();
    assert!(sent > 50, "sent {sent}");
    assert_eq!(acked.len() as u64, sent, "every record acknowledged");
    let mut consumed = report["consumed"].as_array().unwrap().clone();
    let mut acked = acked.clone();
    consumed.sort_by_key(|value| value.to_string());
    acked.sort_by_key(|value| value.to_string());
    assert_eq!(consumed, acked, "every acknowledged record consumed back");
    assert!(
        report["tokens"].as_u64().unwrap() >= 3,
        "the client asked for new tokens as they aged: {}",
        report["tokens"]
    );
    let metrics = crate::common::get_as(server.address, "/metrics", ("root", "root-pass"));
    let reauthentications: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("kafka_reauthentications_total "))
        .expect("the metric is exported")
        .trim()
        .parse()
        .unwrap();
    assert!(reauthentications >= 2.0, "connections logged in again before their tokens expired: {reauthentications}");

    let report = run(&["forged"]);
    assert_eq!(report["acked"], serde_json::json!([]), "{report}");
    let errors = report["errors"].to_string();
    assert!(errors.contains("SASL authentication error") && errors.contains("signature does not verify"), "{report}");
    let described = crate::common::sql_as(server.address, ("root", "root-pass"), "DESCRIBE readings");
    let described: serde_json::Value = serde_json::from_str(&described).unwrap();
    assert_eq!(described["results"][0]["rows"][0][5], serde_json::json!([sent]), "nothing forged stored: {described}");
}
