//! docs/getting-started.md, followed literally: every `sh` block is run in order, as a new
//! user would type it, against the binary on ports of the test's own (the page's 8080, 1883 and
//! 9092 are rewritten), in a directory of its own. A block after `<!-- not run by the docs
//! test: … -->` is skipped, and so are `cargo` commands (the test runs the binary it built).
//!
//! What a command's comment says it answers is checked:
//! - `# {json}` (on its line, or the next): the command's output is JSON holding at least those
//!   keys with those values (an array's first elements compared the same way);
//! - `# prints: a … b`: the output holds `a`, then `b`, in that order.
//!
//! Every foreground command exits 0 without an `"error"` in its output. A command ending in
//! `&`, or a `curl -N` subscription, runs in the background, its `prints:` checked once the
//! page is done. `onehop serve` (re)starts the server on the same data directory.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::{Server, Spawned, free_port, get, get_as, line_channel};

const PATIENCE: Duration = Duration::from_secs(30);

/// One command of the page, with the comment after it.
struct Step {
    command: String,
    comment: Option<String>,
    /// Where it is on the page, for a failure's message.
    line: usize,
}

/// The runnable commands of `page`, in order.
fn steps(page: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let (mut in_block, mut skip, mut previous) = (false, false, String::new());
    let mut pending = String::new();
    for (number, line) in page.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            if in_block {
                in_block = false;
            } else if trimmed == "```sh" {
                in_block = true;
                skip = previous.starts_with("<!-- not run by the docs test");
            }
            continue;
        }
        if !trimmed.is_empty() {
            previous = trimmed.to_string();
        }
        if !in_block || skip || trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            // A comment on a line of its own says what the command before it answers.
            if let Some(last) = steps.last_mut()
                && last.comment.is_none()
            {
                last.comment = Some(comment.trim().to_string());
            }
            continue;
        }
        pending.push_str(trimmed);
        if let Some(joined) = pending.strip_suffix('\\') {
            pending = format!("{joined} ");
            continue;
        }
        let (command, comment) = split_comment(&pending);
        pending.clear();
        if command.starts_with("cargo ") {
            continue;
        }
        steps.push(Step { command, comment, line: number + 1 });
    }
    steps
}

/// A command and the comment after it: a `#` that follows a space outside quotes.
fn split_comment(line: &str) -> (String, Option<String>) {
    let (mut single, mut double, mut last) = (false, false, ' ');
    for (at, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && last.is_whitespace() => {
                return (line[..at].trim().to_string(), Some(line[at + 1..].trim().to_string()));
            }
            _ => {}
        }
        last = c;
    }
    (line.trim().to_string(), None)
}

/// Whether `actual` holds `expected`: every key of an object with an equal value, an array's
/// first elements alike, anything else equal.
fn holds(actual: &serde_json::Value, expected: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => {
            expected.iter().all(|(key, value)| actual.get(key).is_some_and(|found| holds(found, value)))
        }
        (Value::Array(actual), Value::Array(expected)) => {
            expected.len() <= actual.len()
                && expected.iter().zip(actual).all(|(expected, actual)| holds(actual, expected))
        }
        (actual, expected) => actual == expected,
    }
}

/// The JSON object a comment begins with (prose may follow it).
fn leading_json(comment: &str) -> Option<serde_json::Value> {
    let mut depth = 0;
    let mut quoted = false;
    let mut escaped = false;
    for (at, c) in comment.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => {
                depth -= 1;
                if depth == 0 {
                    return serde_json::from_str(&comment[..=at]).ok();
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `text` holds each of `pieces`, in order.
fn in_order(text: &str, pieces: &[&str]) -> bool {
    let mut rest = text;
    for piece in pieces {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

fn printed(comment: &str) -> Option<Vec<&str>> {
    Some(comment.strip_prefix("prints:")?.split('…').map(str::trim).filter(|piece| !piece.is_empty()).collect())
}

struct Background {
    step: String,
    process: Spawned,
    output: Receiver<String>,
    seen: String,
    expected: Vec<String>,
}

struct Run {
    dir: tempfile::TempDir,
    bin: PathBuf,
    ports: (u16, u16, u16),
    server: Option<Server>,
    /// The superuser a `--admin-user` start made, to read the metrics with.
    admin: Option<(String, String)>,
    background: Vec<Background>,
}

impl Run {
    fn http(&self) -> SocketAddr {
        format!("127.0.0.1:{}", self.ports.0).parse().unwrap()
    }

    /// `command` with the page's ports replaced by the test's.
    fn local(&self, command: &str) -> String {
        let (http, mqtt, kafka) = self.ports;
        let mut command = command
            .replace("localhost:8080", &format!("127.0.0.1:{http}"))
            .replace("127.0.0.1:8080", &format!("127.0.0.1:{http}"))
            .replace("127.0.0.1:9092", &format!("127.0.0.1:{kafka}"));
        if command.starts_with("mosquitto_") {
            command = command.replacen("-h 127.0.0.1", &format!("-h 127.0.0.1 -p {mqtt}"), 1);
        }
        command
    }

    fn shell(&self, command: &str) -> Command {
        let mut shell = Command::new("bash");
        shell
            .args(["-c", command])
            .current_dir(self.dir.path())
            .env("PATH", format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default()))
            .env("ONEHOP_URL", format!("http://{}", self.http()));
        shell
    }

    /// Subscriptions the server holds now, of the hub and of MQTT.
    fn subscriptions(&self) -> f64 {
        let metrics = match &self.admin {
            Some((user, password)) => get_as(self.http(), "/metrics", (user, password)),
            None => get(self.http(), "/metrics").1,
        };
        ["hub_subscriptions ", "mqtt_subscriptions "]
            .iter()
            .filter_map(|name| metrics.lines().find_map(|line| line.strip_prefix(name)))
            .filter_map(|value| value.trim().parse::<f64>().ok())
            .sum()
    }

    /// `onehop serve …` (with environment variables before it): stops the server that runs and
    /// starts this one on the same data directory and the test's ports.
    fn serve(&mut self, step: &Step) {
        // What runs in the background has had its chance to print, from this server.
        self.check_background();
        if let Some(mut server) = self.server.take() {
            server.signal("TERM");
            server.wait_exit();
        }
        let words: Vec<String> = shell_words(&step.command);
        let serve_at = words.iter().position(|word| word == "onehop").expect("onehop serve");
        let envs: Vec<(String, String)> = words[..serve_at]
            .iter()
            .filter_map(|pair| pair.split_once('=').map(|(name, value)| (name.to_string(), value.to_string())))
            .collect();
        let mut args: Vec<String> = words[serve_at + 2..].to_vec();
        let (http, mqtt, kafka) = self.ports;
        args.extend(
            ["--http-addr", &format!("127.0.0.1:{http}"), "--mqtt-addr", &format!("127.0.0.1:{mqtt}")]
                .map(String::from),
        );
        args.extend(["--kafka-addr".to_string(), format!("127.0.0.1:{kafka}")]);
        if let Some(at) = args.iter().position(|arg| arg == "--admin-user") {
            let password =
                envs.iter().find(|(name, _)| name == "ONEHOP_ADMIN_PASSWORD").map(|(_, value)| value.clone());
            self.admin = Some((args[at + 1].clone(), password.expect("a password for the admin user")));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let envs: Vec<(&str, &str)> = envs.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
        self.server = Some(common::start(self.dir.path(), &args, &envs));
    }

    fn background(&mut self, step: &Step) {
        let before = self.subscriptions();
        let command = self.local(step.command.trim_end_matches('&').trim());
        // Line-buffered, as on a terminal (kcat holds a pipe's output otherwise).
        let mut process =
            Spawned(self.shell(&format!("exec stdbuf -oL {command} 2>&1")).stdout(Stdio::piped()).spawn().unwrap());
        let output = line_channel(process.0.stdout.take().unwrap());
        // A subscriber is in once the server counts it (a Kafka group reads from the start).
        if !command.starts_with("kcat") {
            let deadline = Instant::now() + PATIENCE;
            while self.subscriptions() < before + 1.0 {
                assert!(Instant::now() < deadline, "line {}: {} did not subscribe", step.line, step.command);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let expected = step.comment.as_deref().and_then(printed).unwrap_or_default();
        let expected = expected.into_iter().map(str::to_string).collect();
        self.background.push(Background { step: step.command.clone(), process, output, seen: String::new(), expected });
    }

    fn foreground(&self, step: &Step) {
        // A read (a plain `curl -s` GET) may look at state that follows a write asynchronously
        // (a view): it is asked again until it answers what the page says, or patience ends.
        let words = shell_words(&step.command);
        let read_only = words.first().is_some_and(|word| word == "curl")
            && !words.iter().any(|word| matches!(word.as_str(), "-X" | "-d" | "--data" | "-T"));
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.try_foreground(step) {
                Ok(()) => return,
                Err(_) if read_only && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Err(failure) => panic!("{failure}"),
            }
        }
    }

    /// Runs a foreground step once: what went wrong, if anything.
    fn try_foreground(&self, step: &Step) -> Result<(), String> {
        let output = self.shell(&self.local(&step.command)).output().unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        let complaint = String::from_utf8_lossy(&output.stderr);
        let at = format!("line {}: {}", step.line, step.command);
        if !output.status.success() {
            return Err(format!("{at}: exit {:?}\n{said}{complaint}", output.status.code()));
        }
        if said.contains("\"error\"") {
            return Err(format!("{at}: {said}"));
        }
        let Some(comment) = &step.comment else { return Ok(()) };
        if let Some(expected) = comment.starts_with('{').then(|| leading_json(comment)).flatten() {
            let actual: serde_json::Value =
                serde_json::from_str(said.trim()).map_err(|_| format!("{at}: not JSON: {said}"))?;
            if !holds(&actual, &expected) {
                return Err(format!("{at}: answered {actual}, the page says {expected}"));
            }
        } else if let Some(pieces) = printed(comment)
            && !in_order(&said, &pieces)
        {
            return Err(format!("{at}: printed {said:?}, the page says {pieces:?}"));
        }
        Ok(())
    }
}

/// `command` split into words as a shell would (quotes removed); no expansions.
fn shell_words(command: &str) -> Vec<String> {
    let (mut words, mut word, mut quote, mut started) = (Vec::new(), String::new(), None, false);
    for c in command.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (Some(open), c) if c == open => quote = None,
            (None, c) if c.is_whitespace() => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (_, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

#[test]
fn getting_started_runs_as_written() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/getting-started.md")).unwrap();
    let steps = steps(&page);
    assert!(steps.len() > 15, "the page's commands were found: {}", steps.len());
    let bin = Path::new(env!("CARGO_BIN_EXE_onehop")).parent().unwrap().to_path_buf();
    let mut run = Run {
        dir: tempfile::tempdir().unwrap(),
        bin,
        ports: (free_port(), free_port(), free_port()),
        server: None,
        admin: None,
        background: Vec::new(),
    };
    for step in &steps {
        let command = step.command.as_str();
        let serving = shell_words(command).windows(2).any(|pair| pair[0] == "onehop" && pair[1] == "serve");
        if serving {
            run.serve(step);
        } else if command.ends_with('&') || command.starts_with("curl -N") {
            run.background(step);
        } else {
            run.foreground(step);
        }
    }
    run.check_background();
}

impl Run {
    /// Waits until each background command has printed what the page says, then stops it.
    fn check_background(&mut self) {
        for mut background in self.background.drain(..) {
            let deadline = Instant::now() + PATIENCE;
            let pieces: Vec<&str> = background.expected.iter().map(String::as_str).collect();
            while !in_order(&background.seen, &pieces) {
                let left = deadline.saturating_duration_since(Instant::now());
                match background.output.recv_timeout(left) {
                    Ok(line) => {
                        background.seen.push_str(&line);
                        background.seen.push('\n');
                    }
                    Err(_) => panic!("{}: printed {:?}, the page says {pieces:?}", background.step, background.seen),
                }
            }
            let _ = background.process.0.kill();
        }
    }
}

#[test]
fn the_page_reader_splits_comments_outside_quotes_and_matches_json_loosely() {
    let (command, comment) = split_comment("mosquitto_sub -t 'scores/#' -v &   # prints: a … b");
    assert_eq!(command, "mosquitto_sub -t 'scores/#' -v &");
    assert_eq!(printed(comment.as_deref().unwrap()), Some(vec!["a", "b"]));
    let expected = leading_json(r#"{"offset":0,"stream":"s"}   ← prose"#).unwrap();
    assert!(holds(&serde_json::json!({"offset":0,"partition":3,"stream":"s"}), &expected));
    assert!(!holds(&serde_json::json!({"offset":1,"stream":"s"}), &expected));
    assert_eq!(shell_words("A='b c' onehop serve --x y"), ["A=b c", "onehop", "serve", "--x", "y"]);
}
