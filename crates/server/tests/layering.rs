//! The protocol front ends reach storage only through the engine's API: the server crate does
//! not depend on the log crate, and its code calls none of the engine's ways down to the log.
//! Kafka and replication plug in the same way, so a rule broken here would be broken for them.

use std::path::Path;
use std::process::Command;

#[test]
fn the_server_crate_does_not_depend_on_the_log() {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let server = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|package| package["name"] == "onehop-server")
        .expect("the server package");
    let dependencies: Vec<&str> = server["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dependency| dependency["name"].as_str().unwrap())
        .collect();
    assert!(dependencies.contains(&"onehop-engine"), "{dependencies:?}");
    // Normal, dev and build dependencies alike: the tests build engines through the engine too.
    assert!(!dependencies.contains(&"onehop-log"), "the server depends on the log: {dependencies:?}");
}

#[test]
fn the_servers_code_takes_no_way_down_to_the_log() {
    let mut offenders = Vec::new();
    let mut pending = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (number, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if code.contains("onehop_log") || code.contains("engine.log()") || code.contains(".log().") {
                    offenders.push(format!("{}:{}: {}", path.display(), number + 1, line.trim()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "the server reaches the log around the engine:\n{}", offenders.join("\n"));
}
