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

/// Transparent huge pages off for this process. mimalloc commits its arenas at once and asks
/// the kernel for huge pages in them; with a writer thread and a sync thread per partition, each
/// touching a little of its own part of the heap, every 4 KiB page touched then held 2 MiB.
/// Study 5's routing (nine streams of 12 partitions, 2–30 KB records at 1 750/s) kept 418 MB
/// resident with them and 108 MB without, at the same CPU (2 072 clock ticks for 35 000 records
/// either way, three runs each, alternated) and latency. Linux reads the flag at every fault,
/// so it holds for the arena mimalloc reserved before `main` too (telling mimalloc not to
/// commit its arenas at once, from `main`, comes too late for that one: 410–447 MB).
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integers only and sets a flag of this process; it
    // touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
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
