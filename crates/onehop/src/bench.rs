//! `onehop bench …`: thin front ends over the harness in `onehop-bench`.

use std::time::Duration;

use anyhow::Context;
use onehop_bench::log::{LogBenchOptions, json_line, table};

use crate::cli::{BenchCommand, BenchLogArgs, BenchMqttArgs, BenchNotifyArgs, BenchRestoreArgs};

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Log(args) => bench_log(args),
        BenchCommand::Notify(args) => bench_notify(args),
        BenchCommand::Mqtt(args) => bench_mqtt(args),
        BenchCommand::Restore(args) => bench_restore(args),
    }
}

fn bench_restore(args: BenchRestoreArgs) -> anyhow::Result<()> {
    use onehop_bench::restore::{RestoreOptions, json_line, run, table};
    let options = RestoreOptions { dir: args.dir, records: args.records, keys: args.keys, progress: !args.no_progress };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let report = runtime.block_on(run(&options))?;
    println!("{}", table(&report));
    println!("command: onehop bench restore {}", std::env::args().skip(3).collect::<Vec<_>>().join(" "));
    if args.json {
        println!("{}", json_line(&report));
    }
    Ok(())
}

fn bench_mqtt(args: BenchMqttArgs) -> anyhow::Result<()> {
    use onehop_bench::mqtt::{MqttBenchOptions, json_line, run, table};
    if !(args.duration > 0.0 && args.warmup >= 0.0) {
        anyhow::bail!("--duration must be positive and --warmup not negative");
    }
    let options = MqttBenchOptions {
        address: args.address,
        exe: std::env::current_exe().context("finding the onehop executable")?,
        dir: args.dir,
        publishers: args.publishers,
        subscribers: args.subscribers,
        rate: args.rate,
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup),
        payload_bytes: args.payload_bytes,
        qos: args.qos,
        sweep: args.sweep,
        idle_clients: args.idle_clients,
        progress: !args.no_progress,
    };
    let report = run(&options)?;
    println!("{}", table(&report));
    println!("command: onehop bench mqtt {}", std::env::args().skip(3).collect::<Vec<_>>().join(" "));
    if args.json {
        println!("{}", json_line(&report));
    }
    Ok(())
}

fn bench_log(args: BenchLogArgs) -> anyhow::Result<()> {
    if args.writers.is_empty() || args.writers.contains(&0) {
        anyhow::bail!("--writers needs one or more positive counts");
    }
    if !(args.duration > 0.0 && args.warmup >= 0.0) {
        anyhow::bail!("--duration must be positive and --warmup not negative");
    }
    let options = LogBenchOptions {
        dir: args.dir,
        record_bytes: args.record_bytes,
        writers: args.writers,
        modes: args.modes,
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup),
        out: args.out,
        progress: !args.no_progress,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let report = runtime.block_on(onehop_bench::log::run(&options))?;
    println!("{}", table(&report));
    println!("command: onehop bench log {}", std::env::args().skip(3).collect::<Vec<_>>().join(" "));
    if args.json {
        println!("{}", json_line(&report));
    }
    Ok(())
}

fn bench_notify(args: BenchNotifyArgs) -> anyhow::Result<()> {
    use onehop_bench::notify::{NotifyOptions, json_line, run, table};
    if !(args.duration > 0.0 && args.warmup >= 0.0) {
        anyhow::bail!("--duration must be positive and --warmup not negative");
    }
    let options = NotifyOptions {
        url: args.url,
        exe: std::env::current_exe().context("finding the onehop executable")?,
        dir: args.dir,
        subscribers: args.subscribers,
        subjects: args.subjects,
        rate: args.rate,
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup),
        durability: args.durability.to_string(),
        in_flight_max: 10_000,
        protocol: args.protocol,
        progress: !args.no_progress,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let report = runtime.block_on(run(&options))?;
    println!("{}", table(&report));
    println!("command: onehop bench notify {}", std::env::args().skip(3).collect::<Vec<_>>().join(" "));
    if args.json {
        println!("{}", json_line(&report));
    }
    Ok(())
}
