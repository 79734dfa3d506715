//! The MQTT broker with real, independent clients: mosquitto_pub / mosquitto_sub (Debian's
//! mosquitto-clients) and paho-mqtt (PyPI), both installed by scripts/test. QoS 0/1/2 each
//! way in 3.1.1 and 5, wildcards, v5 properties, wills, takeover, keep-alive, MQTT ↔ HTTP,
//! bad input, and acknowledged publishes surviving kill -9.

#[path = "../common/mod.rs"]
mod common;

mod clients;
mod durability;
mod protocol;
mod raw;
mod routing;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use common::{DataDir, RawSse, Server, get, post, sql};
use serde_json::{Value, json};

fn tool(name: &str) -> Command {
    let found = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().unwrap();
    assert!(found.status.success(), "{name} is missing: run scripts/test, which installs the MQTT test clients");
    Command::new(name)
}

fn server() -> (Server, DataDir) {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    (server, dir)
}

fn port(address: SocketAddr) -> String {
    address.port().to_string()
}

fn mosquitto_pub(address: SocketAddr, args: &[&str]) {
    let (status, said) = mosquitto_pub_unchecked(address, args);
    assert!(status.success(), "mosquitto_pub {args:?}: {said}");
}

/// `mosquitto_pub` where a refusal is what the test expects: its exit status, and what it
/// printed (stdout, then stderr).
fn mosquitto_pub_unchecked(address: SocketAddr, args: &[&str]) -> (ExitStatus, String) {
    let output = tool("mosquitto_pub").args(["-h", "127.0.0.1", "-p", &port(address)]).args(args).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status, said)
}

/// A running `mosquitto_sub`, subscribed (its SUBACK seen), and its output lines.
struct Sub {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

/// `mosquitto_sub` waiting for `count` messages, printing each as `-F format` (which must start
/// with `MSG ` to tell messages from the `-d` debug lines). Returns once it is subscribed.
fn mosquitto_sub(address: SocketAddr, args: &[&str], count: usize) -> Sub {
    tool("mosquitto_sub");
    // Line-buffered: piped stdio would otherwise hold the SUBACK line until exit.
    let mut child = Command::new("stdbuf")
        .args(["-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", &port(address), "-C", &count.to_string(), "-W", "20"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        match lines.recv_timeout(Duration::from_secs(10)) {
            Ok(line) if line.contains("SUBACK") => return Sub { child, lines },
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mosquitto_sub did not subscribe within 10 s");
            }
        }
    }
}

/// The message lines a `mosquitto_sub` printed (without the `MSG ` mark), once it exits.
fn sub_output(mut sub: Sub) -> Vec<String> {
    let status = sub.child.wait().unwrap();
    let mut stderr = String::new();
    sub.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(status.success(), "mosquitto_sub failed: {stderr}");
    sub.lines.iter().filter_map(|line| line.strip_prefix("MSG ").map(str::to_string)).collect()
}

fn paho(address: SocketAddr, args: &[&str]) -> Output {
    tool("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mqtt/paho_client.py"))
        .arg(port(address))
        .args(args)
        .output()
        .unwrap()
}

/// The JSON facts a paho scenario printed, by their "check" name.
fn paho_checks(address: SocketAddr, scenario: &str) -> Vec<Value> {
    paho_checks_with(address, &[scenario])
}

fn paho_checks_with(address: SocketAddr, args: &[&str]) -> Vec<Value> {
    let scenario = args[0];
    let output = paho(address, args);
    assert!(
        output.status.success(),
        "paho scenario {scenario} failed: {}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stdout).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn check<'a>(checks: &'a [Value], name: &str) -> Vec<&'a Value> {
    checks.iter().filter(|check| check["check"] == name).collect()
}
