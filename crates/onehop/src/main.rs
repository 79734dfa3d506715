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
//! - `check`: `onehop check` — a read-only check of a data directory's files.

mod bench;
mod check;
mod cli;
mod cluster;
mod members;
mod serve;
mod settings;
mod sql;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc, not the system allocator: views, subscriptions and HTTP allocate many small
/// objects per event, and glibc's malloc spent more time consolidating its free lists than
/// the view spent folding events (a 10 000-window close took 30 ms with it, 8 ms without).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

unsafe extern "C" {
    /// mimalloc's own: frees what it holds unused, and with `force` returns it to the OS now
    /// rather than when it next allocates.
    fn mi_collect(force: bool);
}

/// Returns the memory the allocator holds free to the OS. mimalloc does so on its own only as
/// it allocates, so a server that falls idle after a burst of large uploads would keep their
/// memory; HTTP calls this once such a burst is over.
pub(crate) fn release_free_memory() {
    // SAFETY: mi_collect is mimalloc's public API, callable from any thread at any time; it
    // frees only memory no allocation holds.
    unsafe { mi_collect(true) }
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Serve(args) => serve::run(*args),
        cli::Command::Sql(args) => sql::run(args),
        cli::Command::Cluster(command) => members::run(command),
        cli::Command::Bench(command) => bench::run(command),
        cli::Command::Check(args) => return check::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("onehop: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
