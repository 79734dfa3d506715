//! MQTT over TLS with mosquitto's clients, the certificates made by the test with openssl: a
//! client that trusts the server's CA gets in, one that does not, or that speaks plain MQTT,
//! does not; a new certificate read on SIGHUP serves new connections while a subscriber
//! connected under the old one keeps receiving.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{DataDir, Spawned, certificates, line_channel, openssl};

/// kcat against `address` with `security.protocol` `protocol`, trusting `ca`, logged in as root
/// with SCRAM-SHA-256, `input` on its stdin: whether it succeeded (and printed no error), its
/// stdout and its stderr.
fn kcat_as_root(address: &str, protocol: &str, ca: &Path, args: &[&str], input: &str) -> (bool, String, String) {
    let protocol = format!("security.protocol={protocol}");
    let ca = format!("ssl.ca.location={}", ca.display());
    let mut all = vec!["-b", address, "-X", &protocol, "-X", &ca];
    all.extend(["-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=root", "-X", "sasl.password=root-pass"]);
    all.extend_from_slice(args);
    kcat_with(&all, input)
}

/// kcat with `args` (given 20 s) and `input` on its stdin: whether it succeeded and printed no
/// error, its stdout and its stderr.
fn kcat_with(args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new("timeout")
        .args(["20", "kcat"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let ok = output.status.success() && !stderr.contains("ERROR");
    (ok, String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
}

/// Makes CAs A and B with their certificates in `dir`, and starts a server with `listener_flag`
/// on a free port and A's certificate in force as `server.pem` and `server.key`, which it
/// returns to be replaced.
fn start_with_tls(dir: &DataDir, listener_flag: &str) -> (common::Server, std::path::PathBuf, std::path::PathBuf) {
    let path = dir.path();
    certificates(path, "A");
    certificates(path, "B");
    let (cert, key) = (path.join("server.pem"), path.join("server.key"));
    std::fs::copy(path.join("serverA.pem"), &cert).unwrap();
    std::fs::copy(path.join("serverA.key"), &key).unwrap();
    let server = dir.start(
        &[listener_flag, "127.0.0.1:0", "--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()],
        &[],
    );
    (server, cert, key)
}

/// The address the server logged for its `scheme` listener (`listening on mqtts://…`).
fn logged_address(server: &common::Server, scheme: &str) -> String {
    let needle = format!("listening on {scheme}://");
    let line = server.seen.iter().find(|line| line.contains(&needle)).expect("the listener's line");
    let address = line.split(&needle).nth(1).unwrap();
    address.split(|c: char| c.is_whitespace() || c == '"').next().unwrap().to_string()
}

#[test]
fn mqtt_over_tls_takes_trusting_clients_and_a_new_certificate_on_sighup() {
    let dir = DataDir::new();
    let path = dir.path();
    let (server, cert, key) = start_with_tls(&dir, "--mqtt-tls-addr");
    let port = logged_address(&server, "mqtts").rsplit(':').next().unwrap().to_string();
    let ca = |name: &str| path.join(format!("ca{name}.pem")).to_str().unwrap().to_string();
    let publish = |cafile: Option<&str>, message: &str| {
        let mut command = Command::new("mosquitto_pub");
        command.args(["-h", "127.0.0.1", "-p", &port, "-q", "1", "-t", "tls/a", "-m", message]);
        if let Some(cafile) = cafile {
            command.args(["--cafile", cafile]);
        }
        let output = command.output().unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };

    let mut subscriber = Spawned(
        Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "--cafile", &ca("A"), "-t", "tls/#", "-v"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let received = line_channel(subscriber.0.stdout.take().unwrap());
    common::wait_for_mqtt_subscriptions(server.address, 1, None);
    let (ok, said) = publish(Some(&ca("A")), "one");
    assert!(ok, "{said}");
    assert_eq!(received.recv_timeout(Duration::from_secs(10)).unwrap(), "tls/a one");
    let (ok, _) = publish(Some(&ca("B")), "never");
    assert!(!ok, "a client that does not trust the certificate is not let in");
    let (ok, _) = publish(None, "plain");
    assert!(!ok, "plain MQTT on the TLS port is not let in");

    // A new certificate, signed by another CA, read on SIGHUP.
    std::fs::copy(path.join("serverB.pem"), &cert).unwrap();
    std::fs::copy(path.join("serverB.key"), &key).unwrap();
    server.signal("HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (ok, said) = publish(Some(&ca("B")), "two");
        if ok {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the new certificate was not taken: {said}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!publish(Some(&ca("A")), "stale").0, "new connections get the new certificate");
    assert_eq!(
        received.recv_timeout(Duration::from_secs(10)).unwrap(),
        "tls/a two",
        "the subscriber connected under the old certificate keeps its connection"
    );

    // Files that cannot be used leave the certificate in force.
    std::fs::write(&key, "not a key").unwrap();
    server.signal("HUP");
    std::thread::sleep(Duration::from_millis(300));
    let (ok, said) = publish(Some(&ca("B")), "three");
    assert!(ok, "{said}");
    assert_eq!(received.recv_timeout(Duration::from_secs(10)).unwrap(), "tls/a three");
    drop(subscriber);
    assert_handshakes_failed(&server, "mqtt");
}

/// That the server counted failed TLS handshakes over `protocol`.
fn assert_handshakes_failed(server: &common::Server, protocol: &str) {
    let (_, metrics) = common::get(server.address, "/metrics");
    let name = format!("tls_handshake_failures_total{{protocol=\"{protocol}\"}}");
    let failures = metrics.lines().find(|line| line.starts_with(&name)).unwrap_or_else(|| panic!("no {name}"));
    assert!(!failures.ends_with(" 0"), "{failures}");
}

/// Start-up refuses TLS settings that cannot work, naming the file.
#[test]
fn unusable_tls_settings_stop_the_start_with_the_reason() {
    let dir = DataDir::new();
    let path = dir.path();
    certificates(path, "A");
    let cert = path.join("serverA.pem");
    let missing = path.join("missing.key");
    let output = common::onehop()
        .args(["serve", "--data-dir", dir.data_arg(), "--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0"])
        .args(["--kafka-addr", "off", "--mqtt-tls-addr", "127.0.0.1:0", "--tls-cert", cert.to_str().unwrap()])
        .args(["--tls-key", missing.to_str().unwrap()])
        .current_dir(path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("reading the private key") && stderr.contains("missing.key"), "{stderr}");
    let output = common::onehop()
        .args(["serve", "--data-dir", dir.data_arg(), "--mqtt-tls-addr", "127.0.0.1:0"])
        .current_dir(path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("mqtt_tls_addr needs tls_cert and tls_key"), "{stderr}");
}

/// HTTPS beside HTTP with curl: HTTP/1.1 and HTTP/2 (by ALPN) for a client that trusts the
/// CA, an SSE subscription over TLS, an untrusting client and plain HTTP refused, and the
/// certificate read again on SIGHUP for HTTPS as for MQTT.
#[test]
fn https_serves_http_1_and_2_and_takes_a_new_certificate_on_sighup() {
    let dir = DataDir::new();
    let path = dir.path();
    let (server, cert, key) = start_with_tls(&dir, "--https-addr");
    let address = logged_address(&server, "https");
    let ca = |name: &str| path.join(format!("ca{name}.pem")).to_str().unwrap().to_string();
    let curl = |args: &[&str], url: &str| {
        let output = Command::new("curl")
            .args(["-s", "--max-time", "10", "-w", "\n%{http_version} %{http_code}"])
            .args(args)
            .arg(url)
            .output()
            .unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let https = |path: &str| format!("https://{address}{path}");

    let (status, said) =
        curl(&["--cacert", &ca("A"), "--http1.1", "-X", "POST", "--data-binary", "{\"n\":1}"], &https("/streams/s"));
    assert_eq!(status, Some(0), "{said}");
    assert!(said.ends_with("1.1 200"), "{said}");
    let (_, said) = curl(&["--cacert", &ca("A"), "--http2"], &https("/streams/s?from=earliest"));
    assert!(said.contains("\"n\":1") && said.ends_with("2 200"), "HTTP/2 by ALPN: {said}");
    let (status, _) = curl(&["--cacert", &ca("B")], &https("/healthz"));
    assert_eq!(status, Some(60), "curl's 'peer certificate cannot be authenticated'");
    let (status, _) = curl(&[], &format!("http://{address}/healthz"));
    assert_ne!(status, Some(0), "plain HTTP on the HTTPS port is not served");

    let mut sse = Spawned(
        Command::new("curl")
            .args(["-s", "-N", "--max-time", "20", "--cacert", &ca("A"), "-H", "Accept: text/event-stream"])
            .arg(https("/streams/s?from=earliest"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let events = line_channel(sse.0.stdout.take().unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let line =
            events.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).expect("an event");
        if line.starts_with("data:") {
            assert!(line.contains("\"n\":1"), "{line}");
            break;
        }
    }
    drop(sse);

    std::fs::copy(path.join("serverB.pem"), &cert).unwrap();
    std::fs::copy(path.join("serverB.key"), &key).unwrap();
    server.signal("HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while curl(&["--cacert", &ca("B")], &https("/healthz")).0 != Some(0) {
        assert!(std::time::Instant::now() < deadline, "the new certificate was not taken");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(curl(&["--cacert", &ca("A")], &https("/healthz")).0, Some(60));
    assert_handshakes_failed(&server, "http");
}

/// Kafka over TLS with SASL (`SASL_SSL`) through kcat: a client trusting the CA logs in with
/// SCRAM-SHA-256, produces and reads back; a client without TLS, or trusting another CA, gets
/// nothing.
#[test]
fn kafka_over_tls_with_sasl_serves_trusting_clients_only() {
    let dir = DataDir::new();
    let path = dir.path();
    certificates(path, "A");
    certificates(path, "B");
    let (cert, key) = (path.join("serverA.pem"), path.join("serverA.key"));
    let server = dir.start(
        &[
            "--kafka-tls",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--admin-user",
            "root",
        ],
        &[("ONEHOP_ADMIN_PASSWORD", "root-pass")],
    );
    let kafka = server.kafka_address.unwrap().to_string();
    let kcat = |protocol: &str, ca: &str, args: &[&str], input: &str| {
        kcat_as_root(&kafka, protocol, &path.join(format!("ca{ca}.pem")), args, input)
    };
    let (ok, _, stderr) = kcat("SASL_SSL", "A", &["-P", "-t", "secure"], "over tls\n");
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = kcat("SASL_SSL", "A", &["-C", "-t", "secure", "-e", "-f", "%s\n"], "");
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), "over tls");
    let (ok, _, _) = kcat("SASL_PLAINTEXT", "A", &["-P", "-t", "secure"], "in clear\n");
    assert!(!ok, "a client without TLS gets nothing");
    let (ok, _, _) = kcat("SASL_SSL", "B", &["-P", "-t", "secure"], "untrusting\n");
    assert!(!ok, "a client that does not trust the certificate gets nothing");
    let (ok, stdout, _) = kcat("SASL_SSL", "A", &["-C", "-t", "secure", "-e", "-f", "%s\n"], "");
    assert!(ok && stdout.trim() == "over tls", "only the TLS client's record is stored: {stdout}");
}

/// A client certificate for `common_name`, signed by the CA `ca{ca}.pem` (made by
/// [`certificates`]): `client-{name}.pem` and its key `client-{name}.key`, for client
/// authentication only.
fn client_certificate(dir: &Path, ca: &str, common_name: &str, name: &str) {
    let (cert, key, request) =
        (format!("client-{name}.pem"), format!("client-{name}.key"), format!("client-{name}.csr"));
    let curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let subject = format!("/O=onehop tests/CN={common_name}");
    openssl(dir, &[&["req"][..], &curve, &["-keyout", &key, "-out", &request, "-subj", &subject]].concat());
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n").unwrap();
    let (ca_cert, ca_key) = (format!("ca{ca}.pem"), format!("ca{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &request,
            "-CA",
            &ca_cert,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "1",
            "-extfile",
            "client.ext",
        ],
    );
}

/// mTLS: with `--tls-client-ca`, a client certificate that CA signed logs in as the user its
/// common name is, over HTTPS (curl), MQTT over TLS (mosquitto_pub) and Kafka over TLS (kcat,
/// `SSL` without SASL), and reaches what that user is granted. A certificate whose name is no
/// user, and one signed by another CA, get nothing; without a certificate a client logs in as
/// before, until `--tls-client-auth required` makes the handshake itself refuse it.
#[test]
fn client_certificates_log_in_as_the_user_their_common_name_is() {
    let dir = DataDir::new();
    let path = dir.path();
    certificates(path, "A");
    certificates(path, "Clients");
    certificates(path, "Rogue");
    client_certificate(path, "Clients", "device1", "device1");
    client_certificate(path, "Clients", "stranger", "stranger");
    client_certificate(path, "Rogue", "device1", "rogue");
    let (cert, key, client_ca) = (path.join("serverA.pem"), path.join("serverA.key"), path.join("caClients.pem"));
    let start = |extra: &[&str]| {
        let mut args = vec![
            "--https-addr",
            "127.0.0.1:0",
            "--mqtt-tls-addr",
            "127.0.0.1:0",
            "--kafka-tls",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            client_ca.to_str().unwrap(),
            "--admin-user",
            "root",
        ];
        args.extend_from_slice(extra);
        dir.start(&args, &[("ONEHOP_ADMIN_PASSWORD", "root-pass")])
    };
    let server = start(&[]);
    common::sql_as(
        server.address,
        ("root", "root-pass"),
        "CREATE USER device1; CREATE STREAM telemetry; CREATE STREAM secrets; \
         GRANT READ, WRITE ON STREAM telemetry TO device1",
    );
    let https = logged_address(&server, "https");
    let mqtts = logged_address(&server, "mqtts");
    let mqtts_port = mqtts.rsplit_once(':').unwrap().1.to_string();
    let kafka = server.kafka_address.unwrap().to_string();
    let ca = path.join("caA.pem");
    let identity = |name: &str| {
        (
            path.join(format!("client-{name}.pem")).display().to_string(),
            path.join(format!("client-{name}.key")).display().to_string(),
        )
    };
    let curl = |client: Option<&str>, method: &str, url_path: &str, body: &str| {
        let mut command = Command::new("curl");
        command.args(["-s", "-S", "--max-time", "10", "-w", "\n%{http_code}", "--cacert", ca.to_str().unwrap()]);
        if let Some(client) = client {
            let (cert, key) = identity(client);
            command.args(["--cert", &cert, "--key", &key]);
        }
        if method == "POST" {
            command.args(["--data-binary", body]);
        }
        let output = command.arg(format!("https://{https}{url_path}")).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", "000"));
        (status.to_string(), format!("{body}{}", String::from_utf8_lossy(&output.stderr)))
    };
    let (status, body) = curl(Some("device1"), "POST", "/streams/telemetry", "\"by https\"");
    assert_eq!(status, "200", "{body}");
    let (status, body) = curl(Some("device1"), "POST", "/streams/secrets", "\"stolen\"");
    assert_eq!(status, "403", "the certificate's user has no grant on secrets: {body}");
    let (status, body) = curl(Some("stranger"), "POST", "/streams/telemetry", "\"stranger\"");
    assert_eq!(status, "401", "{body}");
    assert!(body.contains("common name (CN) is not a user"), "{body}");
    let (status, _) = curl(Some("rogue"), "POST", "/streams/telemetry", "\"rogue\"");
    assert_eq!(status, "000", "a certificate from another CA fails the handshake");
    let (status, body) = curl(None, "POST", "/streams/telemetry", "\"anonymous\"");
    assert_eq!(status, "401", "without a certificate, credentials are asked for as before: {body}");

    let mosquitto_pub = |client: Option<&str>, credentials: &[&str], message: &str| {
        let mut command = Command::new("mosquitto_pub");
        command.args([
            "-h",
            "127.0.0.1",
            "-p",
            &mqtts_port,
            "--cafile",
            ca.to_str().unwrap(),
            "-V",
            "mqttv5",
            "-q",
            "1",
        ]);
        if let Some(client) = client {
            let (cert, key) = identity(client);
            command.args(["--cert", &cert, "--key", &key]);
        }
        let output = command.args(credentials).args(["-t", "telemetry/d1", "-m", message]).output().unwrap();
        (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    assert_eq!(mosquitto_pub(Some("device1"), &[], "by mqtt"), (0, String::new()));
    assert_eq!(mosquitto_pub(Some("stranger"), &[], "stranger").0, 0x86, "bad user name or password");
    assert_eq!(mosquitto_pub(Some("device1"), &["-u", "root"], "as root").0, 0x86, "a user name not the certificate's");
    assert_ne!(mosquitto_pub(Some("rogue"), &[], "rogue").0, 0, "another CA's certificate");
    assert_eq!(mosquitto_pub(None, &[], "anonymous").0, 0x87, "no certificate, no credentials: not authorized");
    assert_eq!(mosquitto_pub(None, &["-u", "root", "-P", "root-pass"], "by password").0, 0, "a password still works");

    let kcat = |client: &str, input: &str| {
        let (cert, key) = identity(client);
        let (ca, cert, key) = (
            format!("ssl.ca.location={}", ca.display()),
            format!("ssl.certificate.location={cert}"),
            format!("ssl.key.location={key}"),
        );
        let args =
            ["-b", &kafka, "-X", "security.protocol=SSL", "-X", &ca, "-X", &cert, "-X", &key, "-P", "-t", "telemetry"];
        let (ok, _, stderr) = kcat_with(&args, input);
        (ok, stderr)
    };
    let (ok, stderr) = kcat("device1", "by kafka\n");
    assert!(ok, "{stderr}");
    let (ok, _) = kcat("stranger", "stranger\n");
    assert!(!ok, "a certificate naming no user does not log in");

    let described = common::get_as(server.address, "/streams/telemetry?from=earliest", ("root", "root-pass"));
    for value in ["by https", "by mqtt", "by kafka", "by password"] {
        assert!(described.contains(value), "{value} is stored: {described}");
    }
    for value in ["stolen", "stranger", "rogue", "anonymous", "as root"] {
        assert!(!described.contains(value), "{value} is not stored: {described}");
    }
    drop(server);

    // Required: the handshake refuses a client without a certificate, whatever it sends after.
    let server = start(&["--tls-client-auth", "required"]);
    let mqtts = logged_address(&server, "mqtts");
    let port = mqtts.rsplit_once(':').unwrap().1;
    let without = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", port, "--cafile", ca.to_str().unwrap(), "-u", "root", "-P", "root-pass"])
        .args(["-t", "telemetry/d1", "-m", "no certificate", "-q", "1"])
        .output()
        .unwrap();
    assert!(!without.status.success(), "a client without a certificate is refused in the handshake");
    let (cert, key) = identity("device1");
    let with = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", port, "--cafile", ca.to_str().unwrap(), "--cert", &cert, "--key", &key])
        .args(["-t", "telemetry/d1", "-m", "with certificate", "-q", "1"])
        .output()
        .unwrap();
    assert!(with.status.success(), "{}", String::from_utf8_lossy(&with.stderr));
}

/// Two Kafka listeners, as Kafka's `listeners=SASL_PLAINTEXT://…,SASL_SSL://…`: kcat over each
/// is told the broker is at the address it came in by, a record produced over TLS is read over
/// the plain one, and the TLS one refuses a client that does not speak TLS.
#[test]
fn kafka_serves_a_plain_and_a_tls_listener_side_by_side() {
    let dir = DataDir::new();
    let path = dir.path();
    certificates(path, "A");
    let (cert, key) = (path.join("serverA.pem"), path.join("serverA.key"));
    let server = dir.start(
        &[
            "--kafka-tls-addr",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--admin-user",
            "root",
        ],
        &[("ONEHOP_ADMIN_PASSWORD", "root-pass")],
    );
    let mut server = server;
    let plain = server.kafka_address.unwrap().to_string();
    let line = server.wait_for_line("listening on kafkas://");
    let secure = line.split("listening on kafkas://").nth(1).unwrap();
    let secure = secure.split(|c: char| c.is_whitespace() || c == '"').next().unwrap().to_string();
    let ca = path.join("caA.pem");
    let kcat =
        |address: &str, protocol: &str, args: &[&str], input: &str| kcat_as_root(address, protocol, &ca, args, input);
    for (address, protocol) in [(&plain, "SASL_PLAINTEXT"), (&secure, "SASL_SSL")] {
        let (ok, stdout, stderr) = kcat(address, protocol, &["-L"], "");
        assert!(ok, "{protocol}: {stderr}");
        assert!(stdout.contains(&format!("broker 0 at {address}")), "{protocol} is told its own listener: {stdout}");
    }
    let (ok, _, stderr) = kcat(&secure, "SASL_SSL", &["-P", "-t", "both"], "over tls\n");
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = kcat(&plain, "SASL_PLAINTEXT", &["-C", "-t", "both", "-e", "-f", "%s\n"], "");
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), "over tls", "one server behind both listeners");
    let (ok, _, _) = kcat(&secure, "SASL_PLAINTEXT", &["-L", "-m", "5"], "");
    assert!(!ok, "the TLS listener speaks only TLS");
}
