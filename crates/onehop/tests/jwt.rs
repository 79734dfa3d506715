//! JWTs from an outside issuer, signed by openssl with keys the test makes (RSA, P-256,
//! Ed25519, an HMAC secret): curl with a Bearer header and an `access_token`, mosquitto's
//! clients and paho with the JWT as the MQTT password. Every algorithm onehop takes is signed
//! by openssl and checked by the server; every refusal comes in the client's own protocol with
//! nothing written; the key file read again on SIGHUP rotates the keys.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::json;

use common::{DataDir, curl};

const ROOT: (&str, &str) = ("root", "root-pass");
const ISSUER: &str = "https://id.onehop.test";
/// The HMAC secret of the `oct` key, as hex (openssl's `hexkey`): 32 bytes.
const HMAC_HEX: &str = "6f6e65686f702074657374207365637265742c2033322062797465732c206f6b";

fn openssl(dir: &Path, args: &[&str]) -> Vec<u8> {
    let output = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl is installed");
    assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// An identity provider of the test's own: keys made by openssl, tokens signed by it.
struct Issuer {
    dir: PathBuf,
}

impl Issuer {
    fn new(dir: &Path) -> Issuer {
        for (name, args) in [
            ("rsa", &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"][..]),
            ("other", &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]),
            ("ec", &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]),
            ("ed", &["-algorithm", "ED25519"]),
        ] {
            let key = format!("{name}.key");
            openssl(dir, &[&["genpkey"][..], args, &["-out", &key]].concat());
            openssl(dir, &["pkey", "-in", &key, "-pubout", "-out", &format!("{name}.pub")]);
        }
        Issuer { dir: dir.to_path_buf() }
    }

    /// A JWKS with the RSA key (kid `rsa1`, its modulus as openssl prints it) and the HMAC
    /// secret (kid `hmac1`).
    fn jwks(&self) -> String {
        let modulus =
            String::from_utf8(openssl(&self.dir, &["rsa", "-pubin", "-in", "rsa.pub", "-noout", "-modulus"])).unwrap();
        let modulus = hex(modulus.trim().strip_prefix("Modulus=").unwrap());
        json!({"keys": [
            {"kty": "RSA", "kid": "rsa1", "use": "sig", "n": URL_SAFE_NO_PAD.encode(modulus), "e": "AQAB"},
            {"kty": "oct", "kid": "hmac1", "k": URL_SAFE_NO_PAD.encode(hex(HMAC_HEX))},
        ]})
        .to_string()
    }

    /// The P-256 and Ed25519 public keys as PEM, one after the other.
    fn pem(&self) -> String {
        ["ec.pub", "ed.pub"].iter().map(|name| std::fs::read_to_string(self.dir.join(name)).unwrap()).collect()
    }

    /// `claims` signed with `alg` (by the key `key` for RSA), with `kid` in the header if given.
    fn sign(&self, alg: &str, key: &str, kid: Option<&str>, claims: serde_json::Value) -> String {
        let mut header = json!({"alg": alg, "typ": "JWT"});
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        let input =
            format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
        let file = self.dir.join("signing-input");
        std::fs::write(&file, &input).unwrap();
        let file = file.to_str().unwrap();
        let key = format!("{key}.key");
        let signature = match alg {
            "HS256" => openssl(
                &self.dir,
                &["dgst", "-sha256", "-mac", "HMAC", "-macopt", &format!("hexkey:{HMAC_HEX}"), "-binary", file],
            ),
            "RS256" => openssl(&self.dir, &["dgst", "-sha256", "-sign", &key, "-binary", file]),
            "PS256" => openssl(
                &self.dir,
                &[
                    "dgst",
                    "-sha256",
                    "-sign",
                    &key,
                    "-sigopt",
                    "rsa_padding_mode:pss",
                    "-sigopt",
                    "rsa_pss_saltlen:-1",
                    "-binary",
                    file,
                ],
            ),
            "ES256" => raw_ecdsa(&openssl(&self.dir, &["dgst", "-sha256", "-sign", "ec.key", "-binary", file])),
            "EdDSA" => openssl(&self.dir, &["pkeyutl", "-sign", "-inkey", "ed.key", "-rawin", "-in", file]),
            other => panic!("no signer for {other}"),
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

/// A token with `alg: none` and no signature, as an attacker would send.
fn unsigned(claims: serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    format!("{header}.{}.", URL_SAFE_NO_PAD.encode(claims.to_string()))
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap()).collect()
}

/// openssl's ECDSA signature (DER: SEQUENCE of INTEGER r, INTEGER s) as JWS has it: r and s
/// as 32 bytes each.
fn raw_ecdsa(der: &[u8]) -> Vec<u8> {
    assert_eq!(der[0], 0x30, "an ECDSA signature is a DER SEQUENCE");
    let mut at = 2;
    let mut raw = Vec::new();
    for _ in 0..2 {
        assert_eq!(der[at], 0x02);
        let length = usize::from(der[at + 1]);
        let integer = &der[at + 2..at + 2 + length];
        let integer = &integer[integer.len().saturating_sub(32)..];
        raw.extend(std::iter::repeat_n(0u8, 32 - integer.len()));
        raw.extend(integer);
        at += 2 + length;
    }
    raw
}

/// Claims for `user` with `roles`, issued by [`ISSUER`], expiring in ten minutes.
fn claims(user: &str, roles: &[&str]) -> serde_json::Value {
    json!({"sub": user, "roles": roles, "iss": ISSUER, "iat": now_s(), "exp": now_s() + 600})
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

/// `POST /streams/{stream}` of `value` with `token`: the status and body.
fn publish(address: SocketAddr, stream: &str, token: &str, value: &str) -> (u16, String) {
    curl(address, &format!("/streams/{stream}"), &["-H", &bearer(token), "--data-binary", value])
}

/// The values stored in `stream`, read as root.
fn stored(address: SocketAddr, stream: &str) -> Vec<serde_json::Value> {
    common::stored_as(address, stream, ROOT)
}

/// A paho client (v5) that connects with `user` and `password`, and publishes `payload` at
/// QoS 1 to `topic` if let in; prints the CONNACK's and PUBACK's reason codes as JSON.
const PAHO: &str = r#"
import json, sys, threading
import paho.mqtt.client as mqtt
port, user, password, topic, payload = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
done = threading.Event()
found = {}
def on_connect(client, userdata, flags, reason, properties):
    found["connack"] = reason.value
    if reason.is_failure:
        done.set()
    else:
        client.publish(topic, payload, qos=1)
def on_publish(client, userdata, mid, reason, properties):
    found["puback"] = reason.value
    done.set()
client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-jwt", protocol=mqtt.MQTTv5)
client.username_pw_set(user, password)
client.on_connect, client.on_publish = on_connect, on_publish
client.connect("127.0.0.1", int(port))
client.loop_start()
done.wait(10)
client.loop_stop()
print(json.dumps(found))
"#;

fn paho(port: u16, user: &str, password: &str, topic: &str, payload: &str) -> serde_json::Value {
    let output = Command::new("python3")
        .args(["-c", PAHO, &port.to_string(), user, password, topic, payload])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "paho: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("paho printed {stdout:?}"))
}

/// A JWKS with an RSA and an HMAC key: tokens signed RS256, PS256 and HS256 log in over curl
/// (Bearer and `access_token`), mosquitto and paho, and reach what their roles are granted;
/// expired, foreign-issuer, forged, unsigned and wrongly keyed tokens are refused with the
/// reason, in HTTP's and MQTT's own forms, and write nothing. The file is then replaced by PEM
/// P-256 and Ed25519 keys and SIGHUP makes those the keys: ES256 and EdDSA tokens log in, the
/// RSA one no longer does.
#[test]
fn jwts_from_an_outside_issuer_log_in_over_http_and_mqtt_and_their_keys_rotate_on_sighup() {
    let dir = DataDir::new();
    let issuer = Issuer::new(dir.path());
    let keys = dir.path().join("jwt-keys");
    std::fs::write(&keys, issuer.jwks()).unwrap();
    let server = dir.start(
        &["--admin-user", ROOT.0, "--jwt-keys", keys.to_str().unwrap(), "--jwt-issuer", ISSUER],
        &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)],
    );
    let (address, mqtt) = (server.address, server.mqtt_address.port());
    common::sql_as(
        address,
        ROOT,
        "CREATE STREAM sensors; CREATE STREAM alerts; CREATE ROLE devices; \
         GRANT READ, WRITE ON STREAM sensors TO devices",
    );

    // Every algorithm of the JWKS's keys, signed by openssl, logs in and may write sensors.
    let rs256 = issuer.sign("RS256", "rsa", Some("rsa1"), claims("device-7", &["devices"]));
    for (alg, key, kid) in [("RS256", "rsa", Some("rsa1")), ("PS256", "rsa", None), ("HS256", "", Some("hmac1"))] {
        let token = issuer.sign(alg, key, kid, claims("device-7", &["devices"]));
        let (status, body) = publish(address, "sensors", &token, &format!("{{\"alg\":\"{alg}\"}}"));
        assert_eq!(status, 200, "{alg}: {body}");
    }
    let (status, body) = publish(address, "alerts", &rs256, "{\"n\":1}");
    assert_eq!(status, 403, "the roles grant sensors, not alerts: {body}");
    let (status, body) = curl(address, &format!("/streams/sensors?from=earliest&access_token={rs256}"), &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("PS256"), "a read with the token in the URL, as a browser's EventSource: {body}");

    let refused = [
        (
            issuer.sign("RS256", "rsa", Some("rsa1"), json!({"sub": "d", "iss": ISSUER, "exp": now_s() - 120})),
            "expired",
        ),
        (issuer.sign("RS256", "rsa", Some("rsa1"), json!({"sub": "d", "iss": "https://evil.test"})), "issuer"),
        (issuer.sign("RS256", "other", Some("rsa1"), claims("device-7", &["devices"])), "does not verify"),
        (issuer.sign("RS256", "rsa", Some("rsa9"), claims("device-7", &["devices"])), "key id"),
        (issuer.sign("ES256", "", None, claims("device-7", &["devices"])), "algorithm"),
        (unsigned(claims("device-7", &["devices"])), "none"),
    ];
    for (token, reason) in &refused {
        let (status, body) = publish(address, "sensors", token, "\"forged\"");
        assert_eq!(status, 401, "{reason}: {body}");
        assert!(body.contains(reason), "the refusal says why ({reason}): {body}");
    }
    let (status, body) = publish(address, "sensors", &issuer.sign("HS256", "", None, claims("nobody", &[])), "\"x\"");
    assert_eq!(status, 403, "a token without roles has what PUBLIC has: nothing here: {body}");
    // A provider's user named like the local superuser gets none of its rights (without
    // --jwt-user-grants): not the superuser's metrics, nor its streams.
    let root_named = issuer.sign("HS256", "", None, claims(ROOT.0, &[]));
    let (status, body) = curl(address, "/metrics", &["-H", &format!("Authorization: Bearer {root_named}")]);
    assert_eq!(status, 403, "{body}");
    let (status, body) = publish(address, "alerts", &root_named, "\"x\"");
    assert_eq!(status, 403, "{body}");

    // MQTT: the JWT as the password, the user name empty or the token's user.
    let hs256 = issuer.sign("HS256", "", Some("hmac1"), claims("device-7", &["devices"]));
    let mosquitto_pub = |user: &str, password: &str, version: &str, message: &str| {
        let output = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &mqtt.to_string(), "-V", version, "-q", "1", "-t", "sensors/d7"])
            .args(["-u", user, "-P", password, "-m", message])
            .output()
            .unwrap();
        (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    assert_eq!(mosquitto_pub("device-7", &hs256, "mqttv5", "mosquitto-v5"), (0, String::new()));
    assert_eq!(mosquitto_pub("", &rs256, "mqttv311", "mosquitto-v311").0, 0);
    assert_eq!(mosquitto_pub("someone-else", &hs256, "mqttv5", "stolen").0, 0x86, "another user's token");
    assert_eq!(mosquitto_pub("device-7", &refused[0].0, "mqttv5", "expired").0, 0x86, "bad user name or password");
    assert_eq!(mosquitto_pub("device-7", &refused[2].0, "mqttv311", "forged").0, 4, "3.1.1's bad user or password");
    let paho_in = paho(mqtt, "device-7", &rs256, "sensors/paho", "paho");
    assert_eq!(paho_in, json!({"connack": 0, "puback": 0}), "paho logs in with a JWT and its publish is acknowledged");
    let paho_out = paho(mqtt, "device-7", &refused[2].0, "sensors/paho", "paho-forged");
    assert_eq!(paho_out, json!({"connack": 0x86}), "a forged JWT: CONNACK 0x86");
    let paho_alerts = paho(mqtt, "device-7", &rs256, "alerts/paho", "paho-alert");
    assert_eq!(paho_alerts, json!({"connack": 0, "puback": 0x87}), "a publish its roles do not allow: PUBACK 0x87");

    // Rotation: the file now holds the P-256 and Ed25519 keys, read on SIGHUP.
    std::fs::write(&keys, issuer.pem()).unwrap();
    let mut server = server;
    let rotated = || {
        let es256 = issuer.sign("ES256", "", None, claims("device-7", &["devices"]));
        publish(address, "sensors", &es256, "\"es256\"").0 == 200
    };
    Command::new("kill").args(["-HUP", &server.child.id().to_string()]).status().unwrap();
    server.wait_for_line("SIGHUP: JWT keys read again");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !rotated() {
        assert!(Instant::now() < deadline, "an ES256 token is taken after the rotation");
        std::thread::sleep(Duration::from_millis(100));
    }
    let eddsa = issuer.sign("EdDSA", "", None, claims("device-7", &["devices"]));
    assert_eq!(publish(address, "sensors", &eddsa, "\"eddsa\"").0, 200);
    let (status, body) = publish(address, "sensors", &rs256, "\"rsa-after-rotation\"");
    assert_eq!(status, 401, "the RSA key is gone: {body}");

    let mut values = stored(address, "sensors");
    values.sort_by_key(|value| value.to_string());
    let mut expected = vec![
        json!({"alg": "RS256"}),
        json!({"alg": "PS256"}),
        json!({"alg": "HS256"}),
        json!("mosquitto-v5"),
        json!("mosquitto-v311"),
        json!("paho"),
        json!("es256"),
        json!("eddsa"),
    ];
    expected.sort_by_key(|value| value.to_string());
    assert_eq!(values, expected, "every accepted write is stored once, no refused one is");
    assert!(stored(address, "alerts").is_empty());
}

/// A key file that cannot be used stops the start with the reason, and so do JWT keys on a
/// server where access is off (the tokens would not be checked).
#[test]
fn unusable_jwt_settings_stop_the_start_with_the_reason() {
    let dir = DataDir::new();
    let issuer = Issuer::new(dir.path());
    let cases = [
        ("private.pem", std::fs::read_to_string(dir.path().join("rsa.key")).unwrap(), true, "public key only"),
        ("short.json", r#"{"kty":"oct","k":"c2hvcnQ"}"#.to_string(), true, "shorter than 32 bytes"),
        ("good.json", issuer.jwks(), false, "no user is defined"),
    ];
    for (name, text, with_admin, reason) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let mut command = common::onehop();
        command.args(["serve", "--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0", "--kafka-addr", "off"]);
        command.arg("--data-dir").arg(dir.path().join(format!("data-{name}")));
        command.arg("--jwt-keys").arg(&path);
        if with_admin {
            command.args(["--admin-user", "root"]).env("ONEHOP_ADMIN_PASSWORD", "x");
        }
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}: the start goes on: {stderr}");
        assert!(stderr.contains(reason), "{name}: says {reason:?}: {stderr}");
    }
}
