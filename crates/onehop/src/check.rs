//! `onehop check`: reads every file of a data directory's log without changing any, and says
//! what is damaged and what the next start will do about the rest.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use onehop_log::{LogCheck, PartitionCheck};

use crate::cli::CheckArgs;

/// Exit status when damage was found; 2 when the check itself could not run.
const DAMAGE_FOUND: u8 = 1;
const CHECK_FAILED: u8 = 2;

pub fn run(args: CheckArgs) -> ExitCode {
    let log_dir = args.data_dir.join("log");
    if !log_dir.is_dir() {
        eprintln!("onehop check: {} holds no log (no {} directory)", args.data_dir.display(), log_dir.display());
        return ExitCode::from(CHECK_FAILED);
    }
    // Progress on a terminal; nothing on a pipe, where the report is what is read.
    let bar = indicatif::ProgressBar::new(0);
    if std::io::stderr().is_terminal() {
        bar.set_style(
            indicatif::ProgressStyle::with_template("checking {pos}/{len} partitions {wide_msg}")
                .expect("a valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let report = onehop_log::check_log(&log_dir, |partition, done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(format!("{}/{}", partition.topic, partition.partition));
    });
    bar.finish_and_clear();
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            eprintln!("onehop check: reading {}: {error}", log_dir.display());
            return ExitCode::from(CHECK_FAILED);
        }
    };
    if args.json {
        println!("{}", json(&report));
    } else {
        print!("{}", text(&report));
    }
    if report.damaged() > 0 { ExitCode::from(DAMAGE_FOUND) } else { ExitCode::SUCCESS }
}

fn totals(report: &LogCheck) -> (usize, u64, u64) {
    let segments = report.partitions.iter().map(|partition| partition.segments).sum();
    let batches = report.partitions.iter().map(|partition| partition.batches).sum();
    let bytes = report.partitions.iter().map(|partition| partition.bytes).sum();
    (segments, batches, bytes)
}

fn text(report: &LogCheck) -> String {
    let mut out = String::new();
    for partition in &report.partitions {
        if partition.damage.is_empty() && partition.notes.is_empty() {
            continue;
        }
        let verdict = if partition.damage.is_empty() { "ok" } else { "DAMAGED" };
        out.push_str(&format!(
            "{}/{} ({}): {verdict}\n",
            partition.topic,
            partition.partition,
            partition.dir.display()
        ));
        for damage in &partition.damage {
            out.push_str(&format!("  damage: {damage}\n"));
        }
        for note in &partition.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
    }
    let (segments, batches, bytes) = totals(report);
    out.push_str(&format!(
        "checked {} partitions, {segments} segments, {batches} batches, {bytes} bytes: ",
        report.partitions.len()
    ));
    match report.damaged() {
        0 => out.push_str("no damage\n"),
        damaged => out.push_str(&format!(
            "{damaged} damaged. A start refuses damage it reads, and reads fail where it was not read; restore \
             the data directory from a backup or a replica, or start once with --discard-damaged (for the \
             catalog, __catalog, --recover-catalog) to set it aside, keeping every valid batch\n"
        )),
    }
    out
}

fn json(report: &LogCheck) -> serde_json::Value {
    let partition = |partition: &PartitionCheck| {
        serde_json::json!({
            "topic": partition.topic,
            "partition": partition.partition,
            "dir": partition.dir.display().to_string(),
            "segments": partition.segments,
            "batches": partition.batches,
            "bytes": partition.bytes,
            "damage": partition.damage,
            "notes": partition.notes,
        })
    };
    let (segments, batches, bytes) = totals(report);
    serde_json::json!({
        "partitions": report.partitions.iter().map(partition).collect::<Vec<_>>(),
        "segments": segments,
        "batches": batches,
        "bytes": bytes,
        "damaged": report.damaged(),
    })
}
