//! `onehop bench …`: thin front ends over the harness in `onehop-bench`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use onehop_bench::log::{LogBenchOptions, json_line, table};
use onehop_bench::target::TargetOptions;
use onehop_bench::workload::{BenchOptions, Workload};

use crate::cli::{
    BenchBankArgs, BenchBankLedgerArgs, BenchCommand, BenchLogArgs, BenchMqttArgs, BenchNotifyArgs, BenchRestoreArgs,
    BenchViewArgs, BenchWorkloadArgs,
};

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Log(args) => bench_log(args),
        BenchCommand::Notify(args) => bench_notify(args),
        BenchCommand::Mqtt(args) => bench_mqtt(args),
        BenchCommand::Restore(args) => bench_restore(args),
        BenchCommand::W1(args) => bench_workloads(vec![Workload::W1], args),
        BenchCommand::W2(args) => bench_workloads(vec![Workload::W2], args),
        BenchCommand::W3(args) => bench_workloads(vec![Workload::W3], args),
        BenchCommand::W4(args) => bench_workloads(vec![Workload::W4], args),
        BenchCommand::All(args) => {
            if args.rate.is_some() || !args.sweep.is_empty() {
                bail!(
                    "`bench all` runs each workload at its own rate: give --rate or --sweep to one workload at a time"
                );
            }
            bench_workloads(Workload::ALL.to_vec(), args)
        }
        BenchCommand::View(args) => bench_view(args),
        BenchCommand::Kafka(args) => onehop_bench::kafka_perf::run(&onehop_bench::kafka_perf::KafkaPerfOptions {
            exe: std::env::current_exe()?,
            dir: args.dir,
            kafka_brokers: args.kafka_brokers,
            records: args.records,
            sizes: args.sizes,
            latency_records: args.latency_records,
            rebalance_rounds: args.rebalance_rounds,
            kafka_fsync: args.kafka_fsync,
            out: args.out,
            json: args.json,
        }),
        BenchCommand::Query(args) => onehop_bench::query::run(&onehop_bench::query::QueryOptions {
            exe: std::env::current_exe()?,
            dir: args.dir,
            rate: args.rate,
            duration: seconds("--duration", args.duration, false)?,
            warmup: seconds("--warmup", args.warmup, true)?,
            orders: args.orders,
            join_runs: args.join_runs,
            out: args.out,
            json: args.json,
        }),
        BenchCommand::ViewJoin(args) => onehop_bench::view_join::run(&onehop_bench::view_join::ViewJoinOptions {
            exe: std::env::current_exe()?,
            dir: args.dir,
            rate: args.rate,
            duration: seconds("--duration", args.duration, false)?,
            warmup: seconds("--warmup", args.warmup, true)?,
            orders: args.orders,
            out: args.out,
            json: args.json,
        }),
        BenchCommand::Shop(args) => bench_shop(args),
        BenchCommand::Bank(args) => bench_bank(args),
        BenchCommand::BankLedger(args) => bench_bank_ledger(args),
        BenchCommand::Queue(args) => onehop_bench::queue::run(&onehop_bench::queue::QueueOptions {
            exe: std::env::current_exe()?,
            dir: args.dir,
            kafka_brokers: args.kafka_brokers,
            messages: args.messages,
            bytes: args.bytes,
            producers: args.producers,
            consumers: args.consumers,
            targets: args.target,
            out: args.out,
            json: args.json,
        }),
        BenchCommand::Streams(args) => onehop_bench::streams::run(&onehop_bench::streams::StreamsOptions {
            exe: std::env::current_exe()?,
            dir: args.dir,
            targets: args.target,
            scenarios: args.scenario,
            modes: args.mode,
            scales: args.scales,
            warmup: seconds("--warmup", args.warmup, true)?,
            measure: seconds("--duration", args.duration, false)?,
            kafka_brokers: args.kafka_brokers,
            ks_linger_ms: args.ks_linger_ms,
            kill: args.kill,
            out: args.out,
            json: args.json,
        }),
    }
}

/// `onehop bench shop --load`: the shop written into a running server.
fn bench_shop(args: crate::cli::BenchShopArgs) -> anyhow::Result<()> {
    use base64::Engine as _;
    use onehop_bench::{shop, shop_run};
    if !args.load {
        let targets = args.target.iter().map(|name| shop_run::ShopTarget::parse(name)).collect::<Result<_, _>>()?;
        let pages = args.pages.iter().map(|name| shop_run::Page::parse(name)).collect::<Result<_, _>>()?;
        return shop_run::run(&shop_run::ShopOptions {
            exe: exe()?,
            dir: args.dir,
            targets,
            pages,
            vus: args.vus,
            rates: open_loop_rates(&args.rates)?,
            duration: seconds("--duration", args.duration, false)?,
            writes_per_s: args.writes_per_s,
            seed: args.seed,
            out: args.out,
            json: args.json,
        });
    }
    let Some(address) = args.server.url.strip_prefix("http://") else {
        bail!("--url {}: the loader speaks plain HTTP (http://host:port)", args.server.url);
    };
    let address = address.trim_end_matches('/');
    let authorization = match (&args.server.user, &args.server.token) {
        (Some(user), _) => {
            let password = std::env::var("ONEHOP_PASSWORD")
                .map_err(|_| anyhow::anyhow!("--user {user} needs its password in ONEHOP_PASSWORD"))?;
            let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            Some(format!("Basic {encoded}"))
        }
        (None, Some(token)) => Some(format!("Bearer {token}")),
        (None, None) => None,
    };
    if let Some(site) = &args.site {
        shop::write_site(site)?;
        eprintln!("home page written to {}", site.join("index.html").display());
    }
    let data = shop::Shop::generate(args.seed);
    let loaded = shop::load_onehop(address, authorization.as_deref(), &data, |said| eprintln!("{said}"))?;
    print!("{}", shop::report(&data, &loaded, args.json));
    Ok(())
}

/// The command as typed, for the reports.
fn command_line() -> String {
    let mut words = vec!["onehop".to_string()];
    words.extend(std::env::args().skip(1));
    words.join(" ")
}

/// `bench shop --rates`: page loads per second, each at least 1; `none` for no open-loop run.
fn open_loop_rates(values: &[String]) -> anyhow::Result<Vec<u32>> {
    if values == ["none"] {
        return Ok(Vec::new());
    }
    values
        .iter()
        .map(|value| match value.parse::<u32>() {
            Ok(rate) if rate > 0 => Ok(rate),
            _ => bail!("--rates {value}: a rate is a whole number of page loads per second, at least 1 (or none)"),
        })
        .collect()
}

/// Seconds from a flag: finite and positive (`allow_zero` for warm-ups).
fn seconds(flag: &str, value: f64, allow_zero: bool) -> anyhow::Result<Duration> {
    if !value.is_finite() || value < 0.0 || (value == 0.0 && !allow_zero) {
        bail!(
            "{flag} must be a {} number of seconds, not {value}",
            if allow_zero { "non-negative" } else { "positive" }
        );
    }
    Duration::try_from_secs_f64(value).with_context(|| format!("{flag} {value}"))
}

/// The runtime of a benchmark that drives a target: its workers run the observers, so they take
/// the harness's priority for the current run (`onehop_bench::priority`) when they start and
/// each time they wake.
fn harness_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(onehop_bench::priority::raise_this_thread)
        .on_thread_unpark(onehop_bench::priority::raise_this_thread)
        .build()
        .context("starting the runtime")
}

fn exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("finding the onehop executable")
}

fn bench_workloads(workloads: Vec<Workload>, args: BenchWorkloadArgs) -> anyhow::Result<()> {
    let options = BenchOptions {
        workloads,
        targets: args.target,
        target_options: TargetOptions {
            url: args.url,
            mqtt_address: args.mqtt_address,
            exe: exe()?,
            dir: args.dir,
            kafka_brokers: args.kafka_brokers,
            kafka_fsync: false,
            logs: None,
        },
        rate_hz: args.rate,
        sweep: args.sweep,
        duration: args.duration.map(|value| seconds("--duration", value, false)).transpose()?,
        warmup: args.warmup.map(|value| seconds("--warmup", value, true)).transpose()?,
        runs: args.runs,
        out: Some(args.out.clone()),
        progress: !args.no_progress,
        view_keys: None,
        seed: args.seed,
        pauses: match args.pause_ms {
            Some(ms) if !ms.is_finite() || ms <= 0.0 || ms > 10_000.0 => {
                bail!("--pause-ms must be a number of milliseconds above 0 and at most 10000, not {ms}")
            }
            Some(ms) => Some(onehop_bench::pause::Pauses {
                length: Duration::from_secs_f64(ms / 1e3),
                every: seconds("--pause-every", args.pause_every, false)?,
            }),
            None => None,
        },
        command: command_line(),
    };
    options.validate()?;
    let runtime = harness_runtime()?;
    let summaries = onehop_bench::workload::run(&options, runtime.handle())?;
    println!("{}", onehop_bench::report::tables(&summaries));
    println!("results: {} (summary.md, <workload>/<run_id>/raw.csv and meta.json)", args.out.display());
    println!("command: {}", options.command);
    if args.json {
        for summary in &summaries {
            println!("{}", onehop_bench::report::json_line(summary));
        }
    }
    Ok(())
}

fn bench_view(args: BenchViewArgs) -> anyhow::Result<()> {
    let options = BenchOptions {
        workloads: vec![Workload::W3],
        targets: vec!["onehop".into()],
        target_options: TargetOptions {
            url: args.url,
            mqtt_address: None,
            exe: exe()?,
            dir: args.dir,
            kafka_brokers: 3,
            kafka_fsync: false,
            logs: None,
        },
        rate_hz: Some(args.rate),
        sweep: Vec::new(),
        duration: Some(seconds("--duration", args.duration, false)?),
        warmup: Some(seconds("--warmup", args.warmup, true)?),
        runs: 1,
        out: None,
        progress: !args.no_progress,
        view_keys: Some(args.keys),
        seed: onehop_bench::workload::SEED_DEFAULT,
        pauses: None,
        command: command_line(),
    };
    options.validate()?;
    let runtime = harness_runtime()?;
    let summaries = onehop_bench::workload::run(&options, runtime.handle())?;
    let line = onehop_bench::report::view_line(&summaries[0], args.keys);
    println!("{}", onehop_bench::report::view_table(&line));
    let figures = &summaries[0].figures;
    if figures.errors.total() > 0 {
        println!("errors: {}", serde_json::to_string(&figures.errors)?);
        for problem in figures.problems.iter().take(5) {
            println!("- {problem}");
        }
    }
    println!("command: {}", options.command);
    if args.json {
        println!("{}", serde_json::to_string(&line)?);
    }
    Ok(())
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
    let options = MqttBenchOptions {
        address: args.address,
        exe: exe()?,
        dir: args.dir,
        publishers: args.publishers,
        subscribers: args.subscribers,
        rate: args.rate,
        duration: seconds("--duration", args.duration, false)?,
        warmup: seconds("--warmup", args.warmup, true)?,
        payload_bytes: args.payload_bytes,
        qos: args.qos,
        sweep: args.sweep,
        idle_clients: args.idle_clients,
        progress: !args.no_progress,
    };
    let runtime = harness_runtime()?;
    let report = run(&options, runtime.handle())?;
    println!("{}", table(&report));
    println!("command: {}", command_line());
    if args.json {
        println!("{}", json_line(&report));
    }
    Ok(())
}

fn bench_log(args: BenchLogArgs) -> anyhow::Result<()> {
    if args.writers.is_empty() || args.writers.contains(&0) {
        bail!("--writers needs one or more positive counts");
    }
    let options = LogBenchOptions {
        dir: args.dir,
        record_bytes: args.record_bytes,
        writers: args.writers,
        modes: args.modes,
        duration: seconds("--duration", args.duration, false)?,
        warmup: seconds("--warmup", args.warmup, true)?,
        out: args.out,
        progress: !args.no_progress,
        floor_idle: match args.floor_idle_ms {
            Some(ms) if !ms.is_finite() || ms <= 0.0 || ms > 60_000.0 => {
                bail!("--floor-idle-ms must be a number of milliseconds above 0 and at most 60000, not {ms}")
            }
            ms => ms.map(|ms| Duration::from_secs_f64(ms / 1e3)),
        },
        read_records: match args.read_records {
            n if n > 10_000_000 => bail!("--read-records must be at most 10000000, not {n}"),
            n => n,
        },
    };
    // The log runs in this process: it is the target, at the process's own priority.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let report = runtime.block_on(onehop_bench::log::run(&options))?;
    println!("{}", table(&report));
    println!("command: {}", command_line());
    if args.json {
        println!("{}", json_line(&report));
    }
    Ok(())
}

fn bench_notify(args: BenchNotifyArgs) -> anyhow::Result<()> {
    use onehop_bench::notify::{NotifyOptions, json_line, run, table};
    let options = NotifyOptions {
        url: args.url,
        exe: exe()?,
        dir: args.dir,
        subscribers: args.subscribers,
        subjects: args.subjects,
        rate: args.rate,
        duration: seconds("--duration", args.duration, false)?,
        warmup: seconds("--warmup", args.warmup, true)?,
        durability: args.durability.to_string(),
        in_flight_max: 10_000,
        protocol: args.protocol,
        progress: !args.no_progress,
    };
    let runtime = harness_runtime()?;
    let report = run(&options, runtime.handle())?;
    println!("{}", table(&report));
    println!("command: {}", command_line());
    if args.json {
        println!("{}", json_line(&report));
    }
    Ok(())
}

fn bench_bank(args: BenchBankArgs) -> anyhow::Result<()> {
    use onehop_bench::bank::{BankOptions, Kill};
    let options = BankOptions {
        exe: exe()?,
        dir: args.dir,
        rates: args.rates,
        duration: seconds("--duration", args.duration, false)?,
        warmup: seconds("--warmup", args.warmup, true)?,
        accounts: args.accounts,
        initial_balance: args.initial_balance,
        amount_max: args.amount_max,
        kill: Kill::parse(&args.kill)?,
        batch_max: args.batch_max,
        per_record: args.per_record,
        floor: args.floor,
        seed: args.seed,
        progress: !args.no_progress,
        command: command_line(),
    };
    let reports = onehop_bench::bank::run(&options)?;
    let summaries = onehop_bench::bank::summaries(&options, &reports);
    onehop_bench::bank::write_out(&args.out, &reports, &summaries)?;
    println!("{}", onehop_bench::bank::report::table(&reports));
    for summary in &summaries {
        println!(
            "{} node(s), kill {}: highest rate passing p95 < 7 ms, p99 < 10 ms and the gate: {}",
            summary.nodes,
            summary.kill,
            summary.highest_passing_tx_per_s.map_or("none".to_string(), |rate| format!("{rate} tx/s"))
        );
    }
    for report in &reports {
        for problem in &report.problems {
            println!("- {} node(s) at {} tx/s: {problem}", report.nodes, report.target_tx_per_s);
        }
    }
    println!("results: {} (results.json, summary.md, bank-latency.svg)", args.out.display());
    println!("command: {}", options.command);
    if args.json {
        for report in &reports {
            println!("{}", serde_json::to_string(report)?);
        }
        for summary in &summaries {
            println!("{}", serde_json::to_string(summary)?);
        }
    }
    Ok(())
}

fn bench_bank_ledger(args: BenchBankLedgerArgs) -> anyhow::Result<()> {
    use onehop_bench::bank::process::{LedgerOptions, Role};
    let role = match args.role.as_str() {
        "leader" => Role::Leader,
        "standby" => Role::Standby,
        other => bail!("--role takes leader or standby, not {other:?}"),
    };
    if args.node >= args.nodes.len() {
        bail!("--node {} is not one of the {} --nodes", args.node, args.nodes.len());
    }
    onehop_bench::bank::process::run(LedgerOptions {
        role,
        nodes: args.nodes,
        publish_node: args.node,
        follow_node: args.node,
        stream: args.stream,
        accounts: args.accounts,
        initial_balance: args.initial_balance,
        epoch: args.epoch,
        batch_max: args.batch_max,
        per_record: args.per_record,
    })
}
