//! Arbitrary bytes as a snapshot archive a node received from its leader: unpacked or refused
//! with a reason, never a panic, and never a file written outside the directory it unpacks
//! into.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

/// Every file under `dir`, as paths relative to `base`.
fn files(dir: &Path, base: &Path, into: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, base, into);
        } else {
            into.push(path.strip_prefix(base).expect("below base").display().to_string());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let archive = dir.path().join("archive");
    std::fs::write(&archive, data).expect("the archive is written");
    let into = dir.path().join("a").join("into");
    let _ = onehop_cluster::unpack_snapshot(&archive, &into);
    let mut written = Vec::new();
    files(dir.path(), dir.path(), &mut written);
    for path in written {
        assert!(path == "archive" || path.starts_with("a/into/"), "{path} was written outside the directory");
    }
});
