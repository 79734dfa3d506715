//! Arbitrary bytes as what an MQTT client sends, through the broker's decoding path: version
//! detection, then the 3.1.1 or 5.0 codec, packet after packet, with the broker's size limit.
//! Every input ends in packets or an error, never a panic, and the buffer never grows past
//! the limit plus one read.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use onehop_server::mqtt::proto::{Codec, Version};
use rmqtt_codec::version::{ProtocolVersion, VersionCodec};
use tokio_util::codec::Decoder;

const MAX_PACKET: u32 = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    // Feed the bytes in two reads, as a socket might deliver them.
    let split = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    let mut buf = BytesMut::from(&data[..split]);
    let version = match VersionCodec.decode(&mut buf) {
        Ok(Some(ProtocolVersion::MQTT3)) => Version::V3,
        Ok(Some(ProtocolVersion::MQTT5)) => Version::V5,
        Ok(None) => {
            buf.extend_from_slice(&data[split..]);
            match VersionCodec.decode(&mut buf) {
                Ok(Some(ProtocolVersion::MQTT3)) => Version::V3,
                Ok(Some(ProtocolVersion::MQTT5)) => Version::V5,
                _ => return,
            }
        }
        Err(_) => return,
    };
    let mut codec = Codec::new(version, MAX_PACKET);
    let mut rest_fed = buf.len() == data.len();
    loop {
        match codec.decode(&mut buf) {
            Ok(Some(_)) => {}
            Ok(None) if !rest_fed => {
                buf.extend_from_slice(&data[split.min(data.len())..]);
                rest_fed = true;
            }
            Ok(None) | Err(_) => break,
        }
    }
});
