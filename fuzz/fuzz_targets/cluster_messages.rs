//! Arbitrary bytes where a cluster node reads what others wrote: a frame of the Raft log on
//! disk, a message from another node, and a request a follower forwards to the leader's
//! engine. Each is taken or refused with a reason, never a panic; a frame that decodes encodes
//! back to the same entry, and a forwarded request is prepared into a command or refused.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use onehop_cluster::net::{Reply, Request};
use onehop_cluster::raftlog::{decode_frame, encode_frame};
use onehop_engine::{Engine, EngineOptions};

/// One engine for every input (opening one per input would leave the fuzzer measuring that).
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<(tempfile::TempDir, Engine)> = OnceLock::new();
    let (_, engine) = ENGINE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let engine = Engine::open_in(dir.path(), EngineOptions::default()).expect("an engine");
        (dir, engine)
    });
    engine
}

fuzz_target!(|data: &[u8]| {
    if let Ok((entry, len)) = decode_frame(data) {
        assert!(len <= data.len());
        let again = encode_frame(&entry);
        let (decoded, _) = decode_frame(&again).expect("an encoded entry decodes");
        assert_eq!(decoded.log_id, entry.log_id);
    }
    let _ = postcard::from_bytes::<Request>(data);
    let _ = postcard::from_bytes::<Reply>(data);
    let _ = engine().prepare_replicated(data);
});
