//! Arbitrary bytes as a Kafka request frame (after its size), through the listener's decoding
//! path: the request header, the request of its API and version, and for a Produce each
//! partition's record batch with its decompression. Every input ends in a request or a
//! refusal, never a panic.
//!
//! kafka-protocol 0.18 reserves an array's capacity from the count on the wire before reading
//! its elements (upstream pull requests #152, #161 and #200 bound it; none is released yet): a
//! 14-byte request can ask for tens of gigabytes. onehop's binary survives that because its
//! allocator, mimalloc, reserves such a block as address space that is never touched and is
//! freed when the decode fails (tests/kafka/protocol.rs sends such requests to the server).
//! This target uses the same allocator, so it checks what ships; run it without a sanitizer
//! (`cargo +nightly fuzz run -s none kafka_request`), whose allocator would refuse the
//! reservation instead.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use onehop_server::kafka::{Decoded, decode_request, records};

fuzz_target!(|data: &[u8]| {
    let Ok(Decoded::Request { request, .. }) = decode_request(Bytes::copy_from_slice(data)) else { return };
    if let kafka_protocol::messages::RequestKind::Produce(produce) = *request {
        for topic in produce.topic_data {
            for partition in topic.partition_data {
                let _ = records::decode(partition.records.unwrap_or_default(), 1 << 20);
            }
        }
    }
});
