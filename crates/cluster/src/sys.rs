//! What the cluster takes from the operating system: files, TCP, and blocking work. With the
//! `sim` feature each comes from turmoil's simulation instead (a simulated network, and a file
//! system that loses what was not synced when a host crashes), so a whole cluster runs on one
//! thread, deterministically from a seed (tests/sim.rs).

use std::io;
use std::path::Path;

#[cfg(not(feature = "sim"))]
pub(crate) use std::fs;
#[cfg(not(feature = "sim"))]
pub(crate) use tokio::net::{TcpListener, TcpStream};
#[cfg(feature = "sim")]
pub(crate) use turmoil::fs::shim::std::fs;
#[cfg(feature = "sim")]
pub(crate) use turmoil::net::{TcpListener, TcpStream};

/// Makes a directory's entries (a file created, renamed or removed in it) durable.
#[cfg(not(feature = "sim"))]
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(feature = "sim")]
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::sync_dir(dir)
}

/// Creates `dir` and the directories above it that are missing, each made durable in its
/// parent: a file's own fsync keeps its bytes, but only its directory's fsync keeps the file,
/// and so on up (a crash could otherwise lose a new Raft log directory whole).
pub(crate) fn create_dir_durably(dir: &Path) -> io::Result<()> {
    if fs::metadata(dir).is_ok() {
        return Ok(());
    }
    let parent = dir.parent().filter(|parent| !parent.as_os_str().is_empty());
    if let Some(parent) = parent {
        create_dir_durably(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    sync_dir(parent.unwrap_or(Path::new(".")))
}

/// Runs `work`, which blocks on the disk, off the async threads. In the simulation it runs in
/// place: the simulated file system answers at once, and a thread would make the order of
/// events depend on the host's scheduler.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    #[cfg(not(feature = "sim"))]
    {
        tokio::task::spawn_blocking(work).await.map_err(io::Error::other)?
    }
    #[cfg(feature = "sim")]
    {
        work()
    }
}
