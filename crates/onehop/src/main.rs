//! The `onehop` binary: options → settings → run → wait for shutdown.
//!
//! # Layout
//!
//! - `cli`: the command line (clap), every flag documented with its environment variable.
//! - `settings`: flags > environment (`ONEHOP_*`) > `onehop.toml` > defaults, validated once.
//! - `serve`: `onehop serve` — lock the data directory, recover the log, serve HTTP, shut down
//!   cleanly on SIGINT/SIGTERM.
//! - `sql`: `onehop sql` — send statements to a running server and print the answers.
//! - `bench`: `onehop bench …` front ends to the harness in `onehop-bench`.

mod bench;
mod cli;
mod serve;
mod settings;
mod sql;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Serve(args) => serve::run(args),
        cli::Command::Sql(args) => sql::run(args),
        cli::Command::Bench(command) => bench::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("onehop: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
