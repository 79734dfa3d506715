//! The side-by-side tables of an invocation, per workload (printed, and the body of summary.md),
//! and below each what its table hides: runs one by one, pauses made on purpose, W3's view
//! figures (final values and point queries too, each with its ratio to onehop's), the harness's own time, the fan-out, fsyncs and the machine, the echo floor, how far a
//! sweep went, the runs that did not keep up, subscriber resumes and the first problems seen.

use std::fmt::Write as _;

use super::run::{describe_pauses, latency_measures};
use crate::histogram::{Percentiles, ms};
use crate::target::onehop::Protection;
use crate::workload::{Summary, Workload};

/// The side-by-side tables, as Markdown (printed too: it reads as plain text).
pub fn tables(summaries: &[Summary]) -> String {
    let mut text = String::new();
    let mut workloads: Vec<Workload> = summaries.iter().map(|summary| summary.workload).collect();
    workloads.dedup();
    for workload in workloads {
        let rows: Vec<&Summary> = summaries.iter().filter(|summary| summary.workload == workload).collect();
        let first = rows[0];
        let _ = writeln!(text, "### {} — {}\n", workload.id(), workload.describe());
        let _ = writeln!(
            text,
            "{} s measured after {} s warm-up, {} run(s) per rate, histograms merged across runs. \
             Latency: {}.\n",
            first.duration.as_secs_f64(),
            first.warmup.as_secs_f64(),
            first.runs,
            latency_measures(workload)
        );
        let _ = writeln!(
            text,
            "| target | rate /s | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms | p50 / p99 ÷ onehop's | write ack p50 ms | send lag p50 / p99 ms | delivered | errors | durability |"
        );
        let _ = writeln!(text, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for summary in &rows {
            let latency = Percentiles::of(&summary.figures.latency);
            let ack = Percentiles::of(&summary.figures.ack);
            let lag = Percentiles::of(&summary.figures.send_lag);
            let _ = writeln!(
                text,
                "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {:.2} % ({} of {}) | {} | {} |",
                summary.target,
                summary.rate_hz,
                ms(latency.p50_ns),
                ms(latency.p95_ns),
                ms(latency.p99_ns),
                ms(latency.p999_ns),
                ms(latency.max_ns),
                ratio_to_onehop(summary, &rows),
                ms(ack.p50_ns),
                ms(lag.p50_ns),
                ms(lag.p99_ns),
                summary.figures.delivered_pct(),
                summary.figures.observer_seen,
                summary.figures.producer_emitted,
                summary.figures.errors.total(),
                summary.durability
            );
        }
        if let Some(line) = protection_costs(&rows) {
            let _ = writeln!(text, "\n{line}");
        }
        for summary in rows.iter().filter(|summary| summary.figures.target_refusals.is_some_and(|count| count > 0)) {
            let _ = writeln!(
                text,
                "\n**{} at {:.0}/s refused {} login(s) or TLS handshake(s)**: some clients did not get in.",
                summary.target,
                summary.rate_hz,
                summary.figures.target_refusals.unwrap_or_default()
            );
        }
        for summary in &rows {
            if let Some(pauses) = &summary.figures.pauses {
                let _ = writeln!(
                    text,
                    "\n{} at {:.0}/s was {} (SIGSTOP, then SIGCONT), from one interval after the warm-up; the latencies include catching up.",
                    summary.target,
                    summary.rate_hz,
                    describe_pauses(pauses)
                );
            }
        }
        // Run by run, where there were several: the merged figures above hide the spread.
        for summary in rows.iter().filter(|summary| summary.per_run.len() > 1) {
            let runs: Vec<String> =
                summary.per_run.iter().map(|&(p50, p99)| format!("{} / {}", ms(p50), ms(p99))).collect();
            let _ = writeln!(
                text,
                "\n{} at {:.0}/s, run by run (p50 / p99 ms): {}.",
                summary.target,
                summary.rate_hz,
                runs.join(", ")
            );
        }
        if workload == Workload::W3 {
            let _ = writeln!(text, "\n{}", view_table(&rows));
        }
        // A peer's consumer that commits in batches: when each event's batch was committed.
        for summary in rows.iter().filter(|summary| !summary.figures.commit.is_empty()) {
            let commit = Percentiles::of(&summary.figures.commit);
            let _ = writeln!(
                text,
                "\n{} at {:.0}/s, after its consumer committed the batch holding the event ({} events): p50 {} ms, \
                 p95 {} ms, p99 {} ms, max {} ms. The table's latency is the consumer's receipt.",
                summary.target,
                summary.rate_hz,
                commit.count,
                ms(commit.p50_ns),
                ms(commit.p95_ns),
                ms(commit.p99_ns),
                ms(commit.max_ns)
            );
        }
        // The harness's own time, measured per sample from the kernel's arrival stamps.
        for summary in rows.iter().filter(|summary| !summary.figures.harness.is_empty()) {
            let (own, latency) = (Percentiles::of(&summary.figures.harness), Percentiles::of(&summary.figures.latency));
            let _ = writeln!(
                text,
                "\nHarness's own time at {:.0}/s against {} (send lag + socket → recorded, per sample): p50 {:.0} µs, \
                 p99 {:.0} µs; {:.1} % of the p50 latency.",
                summary.rate_hz,
                summary.target,
                own.p50_ns as f64 / 1e3,
                own.p99_ns as f64 / 1e3,
                own.p50_ns as f64 * 100.0 / latency.p50_ns.max(1) as f64
            );
        }
        // The fan-out: when an event's first and last deliveries reached their sockets.
        for summary in rows.iter().filter(|summary| !summary.figures.first_arrival.is_empty()) {
            let (first, last) =
                (Percentiles::of(&summary.figures.first_arrival), Percentiles::of(&summary.figures.last_arrival));
            let _ = writeln!(
                text,
                "\nFan-out at {:.0}/s against {}, per event ({} events): its first delivery reached a subscriber's \
                 socket at p50 {} ms (p99 {} ms), its last at p50 {} ms (p99 {} ms).",
                summary.rate_hz,
                summary.target,
                first.count,
                ms(first.p50_ns),
                ms(first.p99_ns),
                ms(last.p50_ns),
                ms(last.p99_ns)
            );
        }
        // The target's own fdatasyncs, to read a long tail against the disk, and what else the
        // machine did meanwhile.
        for summary in rows.iter() {
            if let Some(fsyncs) = &summary.figures.target_fsyncs {
                let _ = writeln!(
                    text,
                    "\n{}'s own fdatasyncs at {:.0}/s over {} run(s), warm-up included: {}.",
                    summary.target,
                    summary.rate_hz,
                    summary.runs,
                    fsyncs.summary().describe()
                );
            }
            if let Some(host) = &summary.figures.host {
                let _ = writeln!(
                    text,
                    "\nThe machine at {:.0}/s against {} over {} run(s): {}.",
                    summary.rate_hz,
                    summary.target,
                    summary.runs,
                    host.summary().describe()
                );
            }
        }
        // The harness's floor beside what it measured, at each rate both ran.
        for echo in rows.iter().filter(|summary| summary.target == "echo") {
            for measured in rows.iter().filter(|summary| summary.target != "echo" && summary.rate_hz == echo.rate_hz) {
                let (floor, figure) =
                    (Percentiles::of(&echo.figures.latency), Percentiles::of(&measured.figures.latency));
                if figure.p50_ns > 0 {
                    let _ = writeln!(
                        text,
                        "\nEcho floor at {:.0}/s (echo ÷ {}): p50 {:.1} %, p99 {:.1} %. The echo is the harness \
                         against a server that only answers and forwards: the floor of any client and server \
                         pair on this machine, wake-ups included, not the harness's own time (above).",
                        echo.rate_hz,
                        measured.target,
                        floor.p50_ns as f64 * 100.0 / figure.p50_ns as f64,
                        floor.p99_ns as f64 * 100.0 / figure.p99_ns.max(1) as f64
                    );
                }
            }
        }
        // A sweep's answer to "how far does it go": per target, the highest rate every run of
        // which kept up and delivered everything without an error.
        let several_rates = rows.iter().any(|summary| summary.rate_hz != rows[0].rate_hz);
        let mut targets: Vec<&str> = rows.iter().map(|summary| summary.target.as_str()).collect();
        targets.dedup();
        for target in targets.into_iter().filter(|_| several_rates) {
            let highest = rows
                .iter()
                .filter(|summary| summary.target == target && kept_up(summary))
                .max_by(|a, b| a.rate_hz.total_cmp(&b.rate_hz));
            let _ = match highest {
                Some(summary) => writeln!(
                    text,
                    "\n{target} kept up with rates up to {:.0}/s in this sweep (p99 {} ms there, 100 % delivered, \
                     no errors, no run saturated).",
                    summary.rate_hz,
                    ms(Percentiles::of(&summary.figures.latency).p99_ns)
                ),
                None => writeln!(text, "\n{target} kept up with none of the rates in this sweep."),
            };
        }
        // Runs that could not keep up: their latency is the backlog's.
        for summary in rows.iter().filter(|summary| summary.figures.saturated_runs() > 0) {
            let figures = &summary.figures;
            let worst = figures
                .saturation
                .iter()
                .filter(|run| run.saturated)
                .max_by_key(|run| run.last_quarter_p50_ns)
                .expect("at least one saturated run");
            let _ = writeln!(
                text,
                "\n**{} at {:.0}/s did not keep up** in {} of {} run(s); the worst: {}.",
                summary.target,
                summary.rate_hz,
                figures.saturated_runs(),
                figures.saturation.len(),
                worst.describe()
            );
        }
        for summary in rows.iter().filter(|summary| summary.figures.observer_resumes > 0) {
            let _ = writeln!(
                text,
                "\n{} at {:.0}/s: subscribers were cut off for falling behind {} time(s) and resumed from \
                 the id the server gave (nothing missed; the time it took is in the latency).",
                summary.target, summary.rate_hz, summary.figures.observer_resumes
            );
        }
        let problems: Vec<&String> = rows.iter().flat_map(|summary| summary.figures.problems.iter()).take(5).collect();
        if !problems.is_empty() {
            let _ = writeln!(text, "\nFirst problems seen:");
            for problem in problems {
                let _ = writeln!(text, "- {problem}");
            }
        }
        text.push('\n');
    }
    text
}

/// W3's view figures side by side: freshness (the first row that includes an event), final
/// freshness (its window's closing row: what a reader of final values, such as Kafka Streams'
/// `suppress`, waits for), close lag and point queries, each with its ratio to onehop's.
fn view_table(rows: &[&Summary]) -> String {
    let mut text = String::from(
        "| target | rate /s | freshness p50 / p95 / p99 ms | ÷ onehop's p50 | final p50 / p95 / p99 ms | final ÷ onehop's freshness p50 | close lag p50 / p99 ms | windows | query p50 / p95 / p99 ms | query ÷ onehop's p50 | queries |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let three = |histogram: &hdrhistogram::Histogram<u64>| {
        let of = Percentiles::of(histogram);
        format!("{} / {} / {}", ms(of.p50_ns), ms(of.p95_ns), ms(of.p99_ns))
    };
    for summary in rows {
        let figures = &summary.figures;
        let onehop = rows.iter().find(|row| row.target == "onehop" && row.rate_hz == summary.rate_hz);
        let over_onehop =
            |mine: &hdrhistogram::Histogram<u64>, theirs: fn(&Summary) -> &hdrhistogram::Histogram<u64>| match onehop {
                Some(onehop) if summary.target != "onehop" => {
                    times(Percentiles::of(mine).p50_ns, Percentiles::of(theirs(onehop)).p50_ns)
                }
                _ => "–".into(),
            };
        let close = Percentiles::of(&figures.close_lag);
        let _ = writeln!(
            text,
            "| {} | {:.0} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |",
            summary.target,
            summary.rate_hz,
            three(&figures.latency),
            over_onehop(&figures.latency, |onehop| &onehop.figures.latency),
            three(&figures.final_fresh),
            over_onehop(&figures.final_fresh, |onehop| &onehop.figures.latency),
            ms(close.p50_ns),
            ms(close.p99_ns),
            close.count,
            three(&figures.query),
            over_onehop(&figures.query, |onehop| &onehop.figures.query),
            Percentiles::of(&figures.query).count
        );
    }
    text
}

/// `a` over `b` as "N×", or `–` when either is missing.
fn times(a: u64, b: u64) -> String {
    if a == 0 || b == 0 {
        return "–".into();
    }
    let ratio = a as f64 / b as f64;
    if ratio >= 10.0 { format!("{ratio:.0}×") } else { format!("{ratio:.2}×") }
}

/// A target's p50 and p99 over onehop's at the same rate, in this invocation (`–` for onehop
/// itself, or without a onehop row to compare with): how many times slower the target is.
fn ratio_to_onehop(summary: &Summary, rows: &[&Summary]) -> String {
    let onehop = rows.iter().find(|row| row.target == "onehop" && row.rate_hz == summary.rate_hz);
    let (Some(onehop), false) = (onehop, summary.target == "onehop") else { return "–".into() };
    let (mine, theirs) = (Percentiles::of(&summary.figures.latency), Percentiles::of(&onehop.figures.latency));
    if theirs.p50_ns == 0 || theirs.p99_ns == 0 || mine.count == 0 {
        return "–".into();
    }
    format!("{} / {}", times(mine.p50_ns, theirs.p50_ns), times(mine.p99_ns, theirs.p99_ns))
}

/// What access and TLS cost, per rate where plain onehop ran beside `onehop-auth`,
/// `onehop-tls` or `onehop-secure`: each one's p50 and p99 over onehop's, as a change in percent.
fn protection_costs(rows: &[&Summary]) -> Option<String> {
    let mut parts = Vec::new();
    for onehop in rows.iter().filter(|row| row.target == "onehop") {
        let plain = Percentiles::of(&onehop.figures.latency);
        if plain.p50_ns == 0 || plain.p99_ns == 0 {
            continue;
        }
        let change = |mine: u64, theirs: u64| format!("{:+.1} %", (mine as f64 / theirs as f64 - 1.0) * 100.0);
        let costs: Vec<String> = rows
            .iter()
            .filter(|row| row.rate_hz == onehop.rate_hz && row.target != "onehop")
            .filter(|row| Protection::of_target(&row.target).is_some())
            .filter_map(|row| {
                let latency = Percentiles::of(&row.figures.latency);
                let (p50, p99) = (change(latency.p50_ns, plain.p50_ns), change(latency.p99_ns, plain.p99_ns));
                (latency.count > 0).then(|| format!("{} {p50} ({p99})", row.target))
            })
            .collect();
        if !costs.is_empty() {
            parts.push(format!(
                "at {:.0}/s against onehop's {} ms ({} ms): {}",
                onehop.rate_hz,
                ms(plain.p50_ns),
                ms(plain.p99_ns),
                costs.join(", ")
            ));
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!("Access and TLS, p50 (p99) beside plain onehop in this invocation, {}.", parts.join("; ")))
}

/// Whether every run at this target and rate kept up: nothing saturated, lost or failed.
fn kept_up(summary: &Summary) -> bool {
    let figures = &summary.figures;
    figures.saturated_runs() == 0
        && figures.errors.total() == 0
        && figures.producer_emitted > 0
        && figures.observer_seen == figures.producer_emitted
}
