//! The benchmark harness end to end: `onehop bench w1|w2|w3|w4` and `onehop bench view` run
//! against a server they start (the real binary, a separate process) for a few seconds, and
//! must deliver everything, report no error, and leave well-formed raw.csv and meta.json
//! behind. No figure is checked against a threshold: speed is what the benchmarks report.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Runs `onehop bench {args}` writing into a fresh directory; returns the JSON lines printed
/// last and the directory.
fn bench(args: &[&str]) -> (Vec<Value>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _) = common::run_expecting_success(
        common::onehop()
            .arg("bench")
            .args(args)
            .args(["--json", "--no-progress", "--out"])
            .arg(dir.path().join("results"))
            .arg("--dir")
            .arg(dir.path()),
    );
    let lines = stdout.lines().filter(|line| line.starts_with('{')).map(|line| serde_json::from_str(line).unwrap());
    (lines.collect(), dir)
}

/// The run directories a workload left, each with raw.csv, meta.json and the timeline.
fn runs(results: &Path, workload: &str) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> =
        std::fs::read_dir(results.join(workload)).unwrap().map(|entry| entry.unwrap().path()).collect();
    runs.sort();
    runs
}

const META_KEYS: [&str; 21] = [
    "workload_id",
    "run_id",
    "stack",
    "target_rate_hz",
    "duration_secs",
    "warmup_secs",
    "latency_p50_ns",
    "latency_p95_ns",
    "latency_p99_ns",
    "latency_p999_ns",
    "max_ns",
    "producer_emitted",
    "observer_seen",
    "joined_count",
    "knobs",
    "host_info",
    "git_sha",
    "started_at",
    "ended_at",
    "durability",
    "errors",
];

/// Checks one run's files and returns its meta.json and raw rows (as fields).
fn check_run(run: &Path, workload: &str, stack: &str) -> (Value, Vec<Vec<String>>) {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(run.join("meta.json")).unwrap()).unwrap();
    for key in META_KEYS {
        assert!(meta.get(key).is_some_and(|value| !value.is_null()), "{key} missing from {meta}");
    }
    assert_eq!(meta["workload_id"], workload);
    assert_eq!(meta["stack"], stack);
    assert_eq!(meta["run_id"], run.file_name().unwrap().to_str().unwrap());
    assert_eq!(meta["errors"], 0, "{meta}");
    assert_eq!(meta["observer_seen"], meta["producer_emitted"], "{meta}");
    for time in ["started_at", "ended_at"] {
        let text = meta[time].as_str().unwrap();
        assert!(text.len() == 24 && text.ends_with('Z') && text.as_bytes()[10] == b'T', "{time}: {text}");
    }
    assert!(meta["host_info"]["cpus"].as_u64().unwrap() > 0);
    // The priority the harness's threads ran at is on record (raised, or the process's own).
    assert!(meta["knobs"]["harness_nice"].is_i64(), "{meta}");
    // The target's own fdatasyncs over the run: onehop's from its /metrics (every workload
    // here writes at fsync, with access and TLS on or off), none for the echo.
    let started = stack.starts_with("onehop");
    let fsyncs = &meta["target_fsyncs"];
    if started {
        let count = fsyncs["count"].as_u64().unwrap_or_else(|| panic!("no target_fsyncs in {meta}"));
        assert!(count > 0 && fsyncs["over_10ms"].as_u64().unwrap() <= count, "{meta}");
        let slowest = &fsyncs["slowest_at_most_s"];
        assert!(slowest.is_null() || slowest.as_f64().unwrap() > 0.0, "{meta}");
    } else {
        assert!(fsyncs.is_null(), "{meta}");
    }
    // What the machine did meanwhile: the harness's CPU always, the server's when the harness
    // started it (as here), none for the echo; the pressure shares are percentages.
    let host = &meta["host_usage"];
    assert!(host["seconds"].as_f64().unwrap() > 0.0 && host["harness_cores"].as_f64().unwrap() > 0.0, "{meta}");
    assert_eq!(host["target_cores"].is_f64(), started, "{meta}");
    for share in ["cpu_pressure_pct", "io_pressure_pct", "io_full_pct"] {
        assert!(host[share].is_null() || (0.0..=100.0).contains(&host[share].as_f64().unwrap()), "{meta}");
    }
    assert!(host["cpu_steal_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{meta}");
    // Whether the run kept up with its rate, judged from the medians of its first and last
    // quarters (both measured, since everything was delivered) and the in-flight cap (never
    // reached here).
    let saturation = &meta["saturation"];
    assert!(saturation["saturated"].is_boolean(), "{meta}");
    for quarter in ["first_quarter_p50_ns", "last_quarter_p50_ns"] {
        assert!(saturation[quarter].as_u64().unwrap() > 0, "{quarter} in {meta}");
    }
    assert_eq!(saturation["skipped_pct"], 0.0, "{meta}");
    // Every receipt came over SSE or MQTT with the kernel's arrival stamp, so the harness's
    // own time is known for every latency sample, and no sample's share exceeds its latency.
    assert_eq!(meta["harness_samples"], meta["joined_count"], "{meta}");
    let harness_p50 = meta["harness_p50_ns"].as_u64().unwrap();
    assert!(harness_p50 > 0 && harness_p50 <= meta["latency_p50_ns"].as_u64().unwrap(), "{meta}");
    let raw = std::fs::read_to_string(run.join("raw.csv")).unwrap();
    let mut lines = raw.lines();
    assert_eq!(lines.next(), Some("kind,event_id,observer_id,key,intended_ns,sent_ns,ack_ns,received_ns,arrived_ns"));
    let rows: Vec<Vec<String>> = lines.map(|line| line.split(',').map(str::to_string).collect()).collect();
    assert!(!rows.is_empty());
    for row in &rows {
        assert_eq!(row.len(), 9, "{row:?}");
        let intended: u64 = row[4].parse().unwrap();
        if row[0] != "close" {
            let sent: u64 = row[5].parse().unwrap();
            let ack: u64 = row[6].parse().unwrap();
            assert!(sent >= intended && ack >= sent, "{row:?}");
        }
        let received: u64 = row[7].parse().unwrap_or_else(|_| panic!("not received: {row:?}"));
        assert!(received >= intended || row[0] == "close", "{row:?}");
        // A receipt's bytes arrived before the harness read them; a query has no stamp.
        if row[0] == "query" {
            assert_eq!(row[8], "", "{row:?}");
        } else {
            let arrived: u64 = row[8].parse().unwrap_or_else(|_| panic!("no arrival stamp: {row:?}"));
            assert!(arrived > 0 && arrived <= received, "{row:?}");
        }
    }
    check_fanout(&meta, &rows);
    check_timeline(run, &meta, &rows);
    (meta, rows)
}

/// timeline.csv holds every latency sample of raw.csv once, in the 100 ms slice of its
/// intended send, beside a reading of the machine for every slice; timeline.svg draws both.
fn check_timeline(run: &Path, meta: &Value, rows: &[Vec<String>]) {
    let csv = std::fs::read_to_string(run.join("timeline.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "start_s,samples,latency_p50_ns,latency_p99_ns,latency_max_ns,cpu_steal_ms,cpu_pressure_pct,\
             io_pressure_pct,target_cores,harness_cores,target_stopped_pct"
        )
    );
    let slices: Vec<Vec<&str>> = lines.map(|line| line.split(',').collect()).collect();
    // The schedule's warm-up and measured window, at least, in 100 ms slices.
    let scheduled = meta["warmup_secs"].as_f64().unwrap() + meta["duration_secs"].as_f64().unwrap();
    assert!(slices.len() as f64 >= scheduled * 10.0 - 1.0, "{} slices for {scheduled} s", slices.len());
    let mut samples: Vec<u64> = vec![0; slices.len()];
    let latencies: Vec<&Vec<String>> =
        rows.iter().filter(|row| matches!(row[0].as_str(), "delivery" | "fresh")).collect();
    // Slices count from the schedule's start; the first measured event is due at the end of
    // the warm-up (at these rates exactly), a slice boundary.
    let measured_ns = latencies.iter().map(|row| row[4].parse::<u64>().unwrap()).min().unwrap();
    let first = (meta["warmup_secs"].as_f64().unwrap() * 10.0).round() as usize;
    for row in latencies {
        samples[first + ((row[4].parse::<u64>().unwrap() - measured_ns) / 100_000_000) as usize] += 1;
    }
    for (index, slice) in slices.iter().enumerate() {
        assert_eq!(slice.len(), 11, "{slice:?}");
        assert_eq!(slice[0], format!("{:.1}", index as f64 / 10.0));
        assert_eq!(slice[1].parse::<u64>().unwrap(), samples[index], "slice {index}: {slice:?}");
        if samples[index] > 0 {
            let (p50, p99, max): (u64, u64, u64) =
                (slice[2].parse().unwrap(), slice[3].parse().unwrap(), slice[4].parse().unwrap());
            assert!(0 < p50 && p50 <= p99 && p99 <= max, "{slice:?}");
        } else {
            assert!(slice[2..5].iter().all(|field| field.is_empty()), "{slice:?}");
        }
        // The machine was read at every slice's start and once after the drain.
        assert!(slice[9].parse::<f64>().is_ok_and(|cores| cores >= 0.0), "{slice:?}");
    }
    let svg = std::fs::read_to_string(run.join("timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("latency of the events due in each 100 ms"), "{svg}");
    assert!(svg.contains("the machine in each 100 ms") && svg.contains("CPU pressure %"), "{svg}");
}

/// The fan-out figures in meta.json are those of raw.csv: per event delivered to several
/// observers, intended send → the first and the last of its deliveries' arrival stamps.
fn check_fanout(meta: &Value, rows: &[Vec<String>]) {
    // Per event: intended, first arrival, last arrival, deliveries.
    let mut events: std::collections::BTreeMap<&str, (u64, u64, u64, usize)> = Default::default();
    for row in rows.iter().filter(|row| row[0] == "delivery") {
        let (intended, arrived): (u64, u64) = (row[4].parse().unwrap(), row[8].parse().unwrap());
        let event = events.entry(&row[1]).or_insert((intended, u64::MAX, 0, 0));
        event.1 = event.1.min(arrived);
        event.2 = event.2.max(arrived);
        event.3 += 1;
    }
    let (mut firsts, mut lasts): (Vec<u64>, Vec<u64>) = events
        .values()
        .filter(|(_, _, _, deliveries)| *deliveries > 1)
        .map(|(intended, first, last, _)| (first - intended, last - intended))
        .unzip();
    assert_eq!(meta["fanout_events"], firsts.len(), "{meta}");
    let keys = ["first_arrival_p50_ns", "first_arrival_p99_ns", "last_arrival_p50_ns", "last_arrival_p99_ns"];
    if firsts.is_empty() {
        assert!(keys.iter().all(|key| meta[key].is_null()), "{meta}");
        return;
    }
    firsts.sort_unstable();
    lasts.sort_unstable();
    let rank = |sorted: &[u64], quantile: f64| sorted[((quantile * sorted.len() as f64).ceil() as usize).max(1) - 1];
    for (key, exact) in
        keys.iter().zip([rank(&firsts, 0.5), rank(&firsts, 0.99), rank(&lasts, 0.5), rank(&lasts, 0.99)])
    {
        // The histograms keep three significant digits.
        let reported = meta[key].as_u64().unwrap();
        assert!(reported.abs_diff(exact) <= exact / 100, "{key}: {reported} reported, {exact} in raw.csv");
    }
    assert!(meta["first_arrival_p50_ns"].as_u64() <= meta["last_arrival_p50_ns"].as_u64(), "{meta}");
}

/// The JSON line of a workload: everything delivered, no error, latencies present.
fn check_line(line: &Value, workload: &str, target: &str) {
    assert_eq!(line["workload"], workload);
    assert_eq!(line["target"], target);
    assert_eq!(line["delivered_pct"], 100.0, "{line}");
    assert_eq!(line["errors"], 0, "{line}");
    assert_eq!(line["observer_seen"], line["producer_emitted"]);
    assert!(line["saturated"].is_boolean(), "{line}");
    for key in ["p50_ns", "p95_ns", "p99_ns", "p999_ns", "max_ns", "producer_emitted"] {
        assert!(line[key].as_u64().unwrap() > 0, "{key} in {line}");
    }
}

#[test]
fn w1_notifies_every_subscriber_of_each_of_five_keys() {
    let (lines, dir) = bench(&["w1", "--duration", "3", "--warmup", "1"]);
    assert_eq!(lines.len(), 1);
    check_line(&lines[0], "W1", "onehop");
    assert_eq!(lines[0]["producer_emitted"], 150, "50 events/s for 3 s");
    let runs = runs(&dir.path().join("results"), "W1");
    assert_eq!(runs.len(), 1);
    let (meta, rows) = check_run(&runs[0], "W1", "onehop");
    assert_eq!(meta["durability"], "fsync");
    assert_eq!(meta["knobs"]["lookup_keys"], 1000);
    // Every event has five deliveries, so every event measures the fan-out.
    assert_eq!(meta["fanout_events"], 150, "{meta}");
    // One row per delivery: five per event, to five distinct subscribers, each named by its key.
    assert_eq!(rows.len(), 150 * 5);
    for event in rows.chunks(5) {
        let keys: Vec<&str> = event[0][3].split(' ').collect();
        assert_eq!(keys.len(), 5);
        let mut observers: Vec<String> = event.iter().map(|row| format!("k{}", row[2])).collect();
        observers.sort();
        let mut keys: Vec<String> = keys.iter().map(|key| key.to_string()).collect();
        keys.sort();
        assert_eq!(observers, keys);
    }
    // The server it started is gone, its data too: only the results are left.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(left, ["results"]);
}

#[test]
fn w2_runs_side_by_side_with_the_echo_floor() {
    let (lines, dir) = bench(&["w2", "--target", "onehop,echo", "--duration", "3", "--warmup", "1"]);
    assert_eq!(lines.len(), 2);
    check_line(&lines[0], "W2", "onehop");
    check_line(&lines[1], "W2", "echo");
    let results = dir.path().join("results");
    let runs = runs(&results, "W2");
    assert_eq!(runs.len(), 2);
    let stacks: Vec<String> = runs
        .iter()
        .map(|run| {
            check_run(run, "W2", if run.to_str().unwrap().contains("echo") { "echo" } else { "onehop" }).0["stack"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(stacks.contains(&"onehop".to_string()) && stacks.contains(&"echo".to_string()));
    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    assert!(summary.contains("| onehop | 10 |") && summary.contains("| echo | 10 |"), "{summary}");
    assert!(summary.contains("Echo floor at 10/s (echo ÷ onehop): p50 "), "{summary}");
    // Each event reaches about thirty subscribers: when the first and the last got it.
    for target in ["onehop", "echo"] {
        assert!(summary.contains(&format!("Fan-out at 10/s against {target}, per event (")), "{summary}");
    }
    // onehop's own fdatasyncs are summed over the run; the echo has none to show.
    assert!(summary.contains("onehop's own fdatasyncs at 10/s over 1 run(s)"), "{summary}");
    assert!(!summary.contains("echo's own fdatasyncs"), "{summary}");
    assert!(summary.contains("The machine at 10/s against onehop over 1 run(s): target "), "{summary}");
    assert!(summary.contains("The machine at 10/s against echo over 1 run(s): harness "), "{summary}");
    let svg = std::fs::read_to_string(results.join("W2-cdf.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("onehop") && svg.contains("echo"));
}

#[test]
fn w2_and_w4_against_a_three_node_cluster_beside_one_node() {
    // W2 over HTTP and SSE, W4 over MQTT: publishers on every node in turn, subscribers on a
    // follower, every write committed on a majority before it is delivered. At 200/s: W4's
    // default 1 000/s saturates three debug-build nodes on two cores (p50 near 2 s when the
    // machine is idle), and a busier machine then starves the Raft heartbeats until the
    // leader steps down and the writes are refused. This checks what the harness reports, not
    // how fast the cluster is (`onehop bench w4 --target onehop-cluster` measures that).
    for (workload, name) in [("w2", "W2"), ("w4", "W4")] {
        let (lines, dir) = bench(&[
            workload,
            "--target",
            "onehop,onehop-cluster",
            "--rate",
            "200",
            "--duration",
            "2",
            "--warmup",
            "1",
        ]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        check_line(&lines[0], name, "onehop");
        check_line(&lines[1], name, "onehop-cluster");
        let results = dir.path().join("results");
        let run = runs(&results, name).into_iter().find(|run| run.to_str().unwrap().contains("cluster")).unwrap();
        let meta: Value = serde_json::from_str(&std::fs::read_to_string(run.join("meta.json")).unwrap()).unwrap();
        assert_eq!(meta["target_settings"]["nodes"], 3, "{meta}");
        assert!(meta["target_settings"]["clients"].as_str().unwrap().starts_with("publishers on every node"), "{meta}");
        assert!(meta["durability"].as_str().unwrap().contains("majority"), "{meta}");
        let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
        assert!(summary.contains("| onehop-cluster |"), "{summary}");
        // The three nodes are stopped and their data gone: only the results are left.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(left, ["results"]);
    }
    // Views are not replicated yet: W3 is refused with the reason.
    let dir = tempfile::tempdir().unwrap();
    let output = common::onehop()
        .args(["bench", "w3", "--target", "onehop-cluster", "--duration", "2", "--no-progress", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("onehop-cluster"), "{stderr}");
}

#[test]
fn w3_measures_freshness_window_close_and_point_queries() {
    let (lines, dir) = bench(&["w3", "--duration", "3", "--warmup", "1"]);
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    check_line(line, "W3", "onehop");
    for key in ["freshness_p50_ns", "freshness_p99_ns", "query_p50_ns", "query_p99_ns"] {
        assert!(line[key].as_u64().unwrap() > 0, "{key} in {line}");
    }
    assert!(line["close_lag_p99_ns"].is_u64(), "{line}");
    let runs = runs(&dir.path().join("results"), "W3");
    let (meta, rows) = check_run(&runs[0], "W3", "onehop");
    let count = |kind: &str| rows.iter().filter(|row| row[0] == kind).count();
    assert_eq!(count("fresh"), 300, "100 events/s for 3 s");
    assert_eq!(count("query"), 60, "20 queries/s for 3 s");
    // Every window that got a measured event closed, with the count that was sent to it.
    assert!(count("close") > 0);
    assert_eq!(meta["windows_expected"].as_u64().unwrap(), count("close") as u64);
    assert_eq!(meta["error_detail"]["window_count_wrong"], 0);
}

#[test]
fn w4_ingests_over_mqtt_and_sweeps_merge_runs_per_rate() {
    let (lines, dir) = bench(&["w4", "--duration", "3", "--warmup", "1"]);
    assert_eq!(lines.len(), 1);
    check_line(&lines[0], "W4", "onehop");
    assert_eq!(lines[0]["producer_emitted"], 3000);
    let runs = runs(&dir.path().join("results"), "W4");
    let (meta, rows) = check_run(&runs[0], "W4", "onehop");
    assert_eq!(rows.len(), 3000);
    assert_eq!(meta["knobs"]["qos"], 1);
    assert_eq!(meta["knobs"]["payload_bytes"], 256);

    // Two rates, two runs each, on the echo (quick): one line per rate, runs merged into it.
    let (lines, dir) =
        bench(&["w4", "--target", "echo", "--sweep", "200,400", "--runs", "2", "--duration", "1", "--warmup", "0.5"]);
    assert_eq!(lines.len(), 2);
    for (line, rate) in lines.iter().zip([200, 400]) {
        check_line(line, "W4", "echo");
        assert_eq!(line["rate_hz"], rate as f64);
        assert_eq!(line["runs"], 2);
        assert_eq!(line["producer_emitted"], 2 * rate, "two runs of 1 s merged");
    }
    let results = dir.path().join("results");
    assert_eq!(self::runs(&results, "W4").len(), 4);
    assert!(std::fs::read_to_string(results.join("W4-rate.svg")).unwrap().contains("echo p99"));
    // The summary shows each run beside the merged figures: two p50 / p99 pairs per rate.
    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    for rate in [200, 400] {
        let prefix = format!("echo at {rate}/s, run by run (p50 / p99 ms): ");
        let line = summary.lines().find(|line| line.starts_with(&prefix)).unwrap_or_else(|| panic!("{summary}"));
        assert_eq!(line.trim_start_matches(&prefix).matches(" / ").count(), 2, "{line}");
    }
    // And how far it went: the echo keeps up with both rates.
    assert!(summary.contains("echo kept up with rates up to 400/s in this sweep"), "{summary}");
}

/// `--pause-ms` stops the started server for a while every second of the measured window: the
/// run still delivers everything, says how often and how long it stopped the server, and the
/// events due while it was stopped waited for it.
#[test]
fn a_server_stopped_on_purpose_catches_up_and_the_run_says_so() {
    let (lines, dir) = bench(&["w4", "--duration", "3", "--warmup", "1", "--pause-ms", "50"]);
    check_line(&lines[0], "W4", "onehop");
    let results = dir.path().join("results");
    let runs = runs(&results, "W4");
    let (meta, _) = check_run(&runs[0], "W4", "onehop");
    // At 2 s and 3 s of the schedule; one at 4 s would end after the window.
    assert_eq!(meta["pauses"]["made"], 2, "{}", meta["pauses"]);
    assert_eq!(meta["pauses"]["length_ms"], 50.0);
    assert_eq!(meta["pauses"]["every_s"], 1.0);
    assert!(meta["pauses"]["stopped_ms"].as_f64().unwrap() >= 100.0, "{}", meta["pauses"]);
    // An event due as a pause began was delivered only after it ended.
    let raw = std::fs::read_to_string(runs[0].join("raw.csv")).unwrap();
    let mut rows = raw.lines();
    let header: Vec<&str> = rows.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|field| *field == name).unwrap();
    let (intended, received) = (column("intended_ns"), column("received_ns"));
    let waited_ns = rows
        .map(|row| row.split(',').collect::<Vec<_>>())
        .filter(|row| !row[received].is_empty())
        .map(|row| row[received].parse::<u64>().unwrap() - row[intended].parse::<u64>().unwrap())
        .max()
        .unwrap();
    assert!(waited_ns >= 40_000_000, "the longest wait was {waited_ns} ns, shorter than a pause");
    // The timeline shows when: only the slices at 2.0 and 3.0 s (and, if a pause began late,
    // the next), adding up to the time stopped.
    let timeline = std::fs::read_to_string(runs[0].join("timeline.csv")).unwrap();
    let mut stopped_ms = 0.0;
    for line in timeline.lines().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let (start_s, pct): (f64, f64) = (fields[0].parse().unwrap(), fields[10].parse().unwrap());
        if pct > 0.0 {
            assert!([2.0, 2.1, 3.0, 3.1].iter().any(|at| (start_s - at).abs() < 1e-6), "{line}");
        }
        stopped_ms += pct;
    }
    let recorded_ms = meta["pauses"]["stopped_ms"].as_f64().unwrap();
    assert!((stopped_ms - recorded_ms).abs() < 1.0, "{stopped_ms} ms in timeline.csv, {recorded_ms} in meta.json");
    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    assert!(summary.contains("was stopped on purpose 2 time(s) for 50 ms every 1 s"), "{summary}");
    // Only a server the harness started can be stopped.
    let output = common::onehop()
        .args(["bench", "w4", "--url", "http://127.0.0.1:9", "--pause-ms", "50", "--no-progress"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot be used with"), "{output:?}");
}

/// Interrupted in the middle of a pause, the harness continues the server before it dies of
/// the signal: a Ctrl-C never leaves a stopped server behind.
#[test]
fn an_interrupted_run_does_not_leave_its_server_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut harness = common::onehop()
        .args(["bench", "w4", "--rate", "200", "--duration", "3", "--warmup", "0"])
        .args(["--pause-ms", "900", "--pause-every", "1", "--no-progress", "--out"])
        .arg(dir.path().join("results"))
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let state = |pid: u32| -> Option<(char, u32)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut fields = stat.rsplit(") ").next()?.split(' ');
        let state = fields.next()?.chars().next()?;
        Some((state, fields.next()?.parse().ok()?))
    };
    // The server the harness started: its child, found by parent pid, while it is stopped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let server = loop {
        assert!(std::time::Instant::now() < deadline, "the server was never seen stopped");
        let stopped = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| state(pid).is_some_and(|(state, parent)| parent == harness.id() && state == 'T'));
        if let Some(pid) = stopped {
            break pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let interrupted = std::process::Command::new("kill").args(["-INT", &harness.id().to_string()]).status().unwrap();
    assert!(interrupted.success());
    let status = harness.wait().unwrap();
    assert!(!status.success(), "the harness dies of the interrupt: {status:?}");
    // Continued: running, or already gone; never left stopped.
    let after = state(server);
    // It was a child of the harness, which is gone: stop it here, continued first whatever
    // the outcome, so a failing test leaves nothing behind either.
    for signal in ["-CONT", "-TERM"] {
        let _ = std::process::Command::new("kill").args([signal, &server.to_string()]).status();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while state(server).is_some_and(|(state, _)| state != 'Z') && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(after.is_none_or(|(state, _)| state != 'T'), "the server was left stopped: {after:?}");
    assert!(state(server).is_none_or(|(state, _)| state == 'Z'), "the server did not stop on TERM");
}

/// A rate far past what the target can take is called what it is: saturation. The run is
/// marked in meta.json, the JSON line, its stderr line, summary.md and the CDF's legend, so
/// nobody reads its latencies (the backlog's depth) as the target's speed.
#[test]
fn a_rate_the_target_cannot_sustain_is_reported_as_saturation() {
    // Durable MQTT ingestion takes about a core per 100 000 events/s here, with the harness on
    // the same cores: four times that cannot be kept up with on a CI machine; 2 000/s can.
    let (lines, stderr, dir) =
        common::bench_lines(&["w4", "--sweep", "2000,400000", "--duration", "2", "--warmup", "0.5", "--json"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    check_line(&lines[0], "W4", "onehop");
    assert_eq!(lines[0]["saturated"], false, "{}", lines[0]);
    assert_eq!(lines[1]["saturated"], true, "{}", lines[1]);
    let results = dir.path().join("results");
    let run = runs(&results, "W4").into_iter().find(|run| run.to_string_lossy().contains("400000hz")).unwrap();
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(run.join("meta.json")).unwrap()).unwrap();
    let saturation = &meta["saturation"];
    assert_eq!(saturation["saturated"], true, "{meta}");
    // Held at the in-flight cap, or latency growing through the run: at least one of the two.
    let (first, last) =
        (saturation["first_quarter_p50_ns"].as_u64().unwrap(), saturation["last_quarter_p50_ns"].as_u64().unwrap());
    assert!(saturation["skipped_pct"].as_f64().unwrap() >= 1.0 || last >= 2 * first, "{meta}");
    assert!(stderr.contains("queue depth, not service time"), "{stderr}");
    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    assert!(summary.contains("**onehop at 400000/s did not keep up** in 1 of 1 run(s)"), "{summary}");
    assert!(summary.contains("onehop kept up with rates up to 2000/s in this sweep"), "{summary}");
    assert!(std::fs::read_to_string(results.join("W4-cdf.svg")).unwrap().contains("onehop 400000/s (saturated)"));
    assert!(std::fs::read_to_string(results.join("W4-rate.svg")).unwrap().contains("400k saturated"));
}

#[test]
fn bench_view_is_w3_with_its_own_flags_and_line() {
    let (line, dir) =
        common::bench_report(&["view", "--rate", "200", "--keys", "20", "--duration", "3", "--warmup", "1"]);
    assert_eq!(line["bench"], "view");
    assert_eq!(line["delivered_pct"], 100.0, "{line}");
    assert_eq!(line["errors"], 0, "{line}");
    assert_eq!(line["keys"], 20);
    assert_eq!(line["events"], 600);
    for key in ["freshness_p50_us", "freshness_p99_us", "query_p50_us", "query_p99_us"] {
        assert!(line[key].as_f64().unwrap() > 0.0, "{key} in {line}");
    }
    assert!(line["close_lag_p99_ms"].as_f64().unwrap() >= 0.0);
    assert!(line["windows"].as_u64().unwrap() >= 20, "every key's window closed: {line}");
    assert!(line["resumes"].is_u64(), "{line}");
    assert!(line["saturated"].is_boolean(), "{line}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the server's data was removed");
}

#[test]
fn a_view_subscriber_that_falls_behind_reads_on_from_the_log_without_a_gap() {
    // A running server (--url) whose subscribers may fall only 8 events behind: the view's
    // batches of changes overflow the subscriber's live queue again and again, and every time
    // the server reads on from the log for it, on the same response. Nothing may be missed.
    let dir = common::DataDir::new();
    let server = dir.start(&["--subscriber-queue", "8"], &[]);
    let url = format!("http://{}", server.address);
    let (stdout, _) = common::run_expecting_success(
        common::onehop()
            .args(["bench", "view", "--url", &url, "--rate", "3000", "--keys", "300", "--duration", "1.5"])
            .args(["--warmup", "0.5", "--json", "--no-progress"]),
    );
    let line = common::last_json_line(&stdout);
    assert_eq!(line["resumes"], 0, "the subscription was never ended: {line}");
    assert_eq!(line["delivered_pct"], 100.0, "{line}");
    assert_eq!(line["errors"], 0, "{line}");
    let (_, metrics) = common::get(server.address, "/metrics");
    let carried_on = metrics
        .lines()
        .find_map(|line| line.strip_prefix("hub_subscribers_carried_on_from_log_total "))
        .and_then(|count| count.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(carried_on > 0.0, "the queue of 8 never overflowed:\n{metrics}");
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    let refusal = |args: &[&str]| {
        let output = common::onehop().arg("bench").args(args).output().unwrap();
        assert!(!output.status.success(), "{args:?} ran");
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    assert!(refusal(&["w1", "--target", "rabbitmq"]).contains("unknown target \"rabbitmq\""));
    assert!(refusal(&["w1", "--target", "kafka"]).contains("kafka runs none of W1"));
    assert!(refusal(&["w1", "--runs", "0"]).contains("--runs must be at least 1"));
    assert!(refusal(&["w2", "--duration=-1"]).contains("--duration must be a positive number"));
    assert!(refusal(&["w2", "--rate", "0"]).contains("rates must be positive"));
    assert!(refusal(&["w3", "--sweep", "10,x"]).contains("invalid value"));
    assert!(refusal(&["all", "--rate", "5"]).contains("each workload at its own rate"));
    assert!(refusal(&["view", "--keys", "0"]).contains("--keys must be positive"));
    assert!(refusal(&["w4", "--target", "onehop,onehop"]).contains("twice"));
    assert!(
        refusal(&["w1", "--target", "onehop-auth", "--url", "http://127.0.0.1:9"])
            .contains("cannot be used with --url")
    );
}

/// `onehop-secure`: onehop started with access and TLS on. Every client of the harness logs in
/// as a user that is not a superuser (a bearer token over HTTP and SSE, a user name and password
/// over MQTT) on the TLS listeners, and gets everything through; the server refused nobody,
/// and would have refused a client that presented nothing.
#[test]
fn the_secure_target_logs_every_client_in_over_tls() {
    for (workload, id) in [("w2", "W2"), ("w4", "W4")] {
        let (lines, dir) = bench(&[workload, "--target", "onehop-secure", "--duration", "2", "--warmup", "0.5"]);
        assert_eq!(lines.len(), 1);
        check_line(&lines[0], id, "onehop-secure");
        assert_eq!(lines[0]["target_refusals"], 0, "{}", lines[0]);
        let runs = runs(&dir.path().join("results"), id);
        let (meta, _) = check_run(&runs[0], id, "onehop-secure");
        let settings = &meta["target_settings"];
        assert_eq!((&settings["access"], &settings["tls"]), (&"on".into(), &"on".into()), "{settings}");
        assert!(settings["credentials"].as_str().unwrap().contains("Authorization: Bearer"), "{settings}");
        assert!(settings["user"].as_str().unwrap().contains("not a superuser"), "{settings}");
        // Checked by the harness as it started the server: anonymous clients were refused.
        assert_eq!(settings["anonymous_refused"]["http"], 401, "{settings}");
        assert!(settings["tls_session"].as_str().unwrap().starts_with("TLSv1_"), "{settings}");
        assert_eq!(meta["target_refusals"], 0, "no client was refused: {meta}");
        // The certificate made for the invocation went with the server.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(left, ["results"]);
    }
}

/// WebSocket subscribers (`onehop bench notify --protocol ws`'s) log in and speak TLS the same
/// way: driven as a library against `onehop-secure`, every record reaches every subscriber.
#[test]
fn websocket_subscribers_log_in_over_tls() {
    use onehop_bench::plan::{Fanout, Plan, Protocol, Routing};
    use onehop_bench::run::{RunSpec, run_once};
    use onehop_bench::schedule::{DriveLimits, Schedule};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let options = onehop_bench::target::TargetOptions {
        url: None,
        mqtt_address: None,
        exe: PathBuf::from(env!("CARGO_BIN_EXE_onehop")),
        dir: dir.path().to_path_buf(),
        kafka_brokers: 1,
        kafka_fsync: false,
        logs: None,
    };
    let plan = Plan::Fanout(Fanout {
        routing: Routing::Subjects { subscribers: 4, subjects: 2 },
        protocol: Protocol::Ws,
        durability: "fsync".into(),
    });
    let target = onehop_bench::target::start("onehop-secure", &options, &plan).unwrap();
    assert_eq!(target.settings()["access"], "on");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let spec = RunSpec {
        schedule: Schedule { rate_hz: 50.0, warmup: Duration::from_millis(200), duration: Duration::from_secs(1) },
        query_rate_hz: None,
        limits: DriveLimits::default(),
        label: "ws".into(),
        progress: false,
        pauses: None,
    };
    let data = run_once(target.as_ref(), &plan, &spec, runtime.handle()).unwrap();
    assert_eq!(data.target_refusals, Some(0));
    let figures = onehop_bench::analysis::analyze(&plan, &data.recorder, &mut |_| {});
    assert_eq!(figures.errors.total(), 0, "{:?}", figures.problems);
    assert_eq!(figures.producer_emitted, 50);
    // Each event to the two subscribers of its subject.
    assert_eq!((figures.deliveries_expected, figures.deliveries_seen), (100, 100), "{:?}", figures.problems);
}

/// `onehop bench view-join`, small: a five-input joined view and a single-source view followed
/// over SSE while the joined view's inputs are written; every measured write that changes a
/// joined row is seen by the subscriber, and the report has both views.
#[test]
fn bench_view_join_measures_a_joined_view_beside_a_single_source_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let output = common::onehop()
        .args(["bench", "view-join", "--rate", "100", "--duration", "2", "--warmup", "0.5", "--orders", "2000"])
        .args(["--json", "--dir"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let line: serde_json::Value = stdout
        .lines()
        .find(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap())
        .unwrap_or_else(|| panic!("no JSON line in {stdout}"));
    for view in ["joined", "single"] {
        let (seen, writes) = (line[view]["seen"].as_u64().unwrap(), line[view]["writes"].as_u64().unwrap());
        assert!(writes > 0 && seen <= writes, "{line}");
        // A customer or product with no order changes no joined row: with 2 000 orders over
        // 1 000 of each, e^-2 (13.5 %) of them, so about 5 % of the writes.
        assert!(seen * 100 >= writes * 85, "{view}: {seen} of {writes} writes seen: {line}");
        assert!(line[view]["p99_ms"].as_f64().unwrap() >= line[view]["p50_ms"].as_f64().unwrap(), "{line}");
    }
    assert_eq!(line["single"]["seen"], line["single"]["writes"], "every order write changes its row: {line}");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| joined (5 inputs) |") && summary.contains("goal ≤ 2×"), "{summary}");
    assert!(std::fs::read_to_string(out.join("view-join-latency.svg")).unwrap().contains("single source"));
}
