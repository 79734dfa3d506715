//! The MQTT 5 packet at the front of a read buffer, looked at before the codec decodes it: how
//! much of it has arrived, so the codec is given whole packets only, and what in it the codec
//! would call malformed where MQTT names the fault more precisely. A topic alias of 0 is one:
//! the codec reads the alias as a non-zero integer and fails the packet (0x81), where MQTT says
//! Topic Alias invalid (0x94).
//!
//! Whole packets only, because the codec keeps state between calls: once it has read a fixed
//! header whose body has not all arrived, the buffer starts with the body, and nothing before
//! the codec could tell a packet's start any more.

/// How much of the packet at the start of a buffer has arrived.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Arrived {
    /// All of it: this many bytes, fixed header included.
    Whole(usize),
    /// Its fixed header says it is this many bytes; fewer are here.
    Part(usize),
    /// Too little to tell, or a fixed header the codec refuses (a bad length, one over the
    /// limit): the codec has the say.
    Unknown,
}

/// How much of the packet at the start of `buf` has arrived, for a codec that takes a
/// remaining length of at most `remaining_max` (0: any).
pub(super) fn arrived(buf: &[u8], remaining_max: u32) -> Arrived {
    let Some((remaining, header)) = buf.get(1..).and_then(variable_integer) else { return Arrived::Unknown };
    if remaining_max != 0 && remaining > remaining_max {
        return Arrived::Unknown;
    }
    let length = 1 + header + remaining as usize;
    if buf.len() >= length { Arrived::Whole(length) } else { Arrived::Part(length) }
}

/// The topic alias a whole 5.0 PUBLISH packet carries, as sent (0 included), if it is a
/// PUBLISH with one whose properties can be read.
pub(super) fn publish_topic_alias(packet: &[u8]) -> Option<u16> {
    let first = *packet.first()?;
    if first >> 4 != 3 {
        return None;
    }
    let (_, header) = variable_integer(&packet[1..])?;
    let mut at = 1 + header;
    at += 2 + usize::from(two_bytes(packet, at)?);
    if (first >> 1) & 0b11 != 0 {
        // The packet id.
        at += 2;
    }
    let (length, size) = variable_integer(packet.get(at..)?)?;
    at += size;
    let end = at.checked_add(length as usize)?;
    let properties = packet.get(..end)?;
    while at < end {
        let id = properties[at];
        at += 1;
        at += match id {
            // Payload format indicator.
            0x01 => 1,
            // Message expiry interval.
            0x02 => 4,
            // Content type, response topic, correlation data: a length and that many bytes.
            0x03 | 0x08 | 0x09 => 2 + usize::from(two_bytes(properties, at)?),
            0x0b => variable_integer(properties.get(at..)?)?.1,
            0x23 => return two_bytes(properties, at),
            // A user property: two strings.
            0x26 => {
                let name = 2 + usize::from(two_bytes(properties, at)?);
                name + 2 + usize::from(two_bytes(properties, at + name)?)
            }
            // Not a PUBLISH property: the codec refuses the packet.
            _ => return None,
        };
    }
    None
}

fn two_bytes(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

/// A variable byte integer (1 to 4 bytes) at the start of `bytes`, and its size.
fn variable_integer(bytes: &[u8]) -> Option<(u32, usize)> {
    let mut value = 0u32;
    for (i, &byte) in bytes.iter().take(4).enumerate() {
        value |= u32::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QoS 1 PUBLISH to `a` with packet id 1, these properties and payload `m`.
    fn publish(properties: &[u8]) -> Vec<u8> {
        let mut body = vec![0x00, 0x01, b'a', 0x00, 0x01, properties.len() as u8];
        body.extend_from_slice(properties);
        body.push(b'm');
        let mut packet = vec![0x32, body.len() as u8];
        packet.extend_from_slice(&body);
        packet
    }

    #[test]
    fn a_packet_is_whole_once_its_fixed_header_says_so() {
        let packet = publish(&[]);
        assert_eq!(arrived(&packet, 0), Arrived::Whole(packet.len()));
        assert_eq!(arrived(&packet[..4], 0), Arrived::Part(packet.len()));
        assert_eq!(arrived(&[0x30], 0), Arrived::Unknown);
        // A length still going on, a length over five bytes, and one over the limit.
        assert_eq!(arrived(&[0x30, 0x80], 0), Arrived::Unknown);
        assert_eq!(arrived(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x01], 0), Arrived::Unknown);
        assert_eq!(arrived(&[0x30, 0x80, 0x01], 100), Arrived::Unknown);
        assert_eq!(arrived(&[0x30, 0x80, 0x01], 0), Arrived::Part(131));
        assert_eq!(arrived(&[0xc0, 0x00, 0xc0], 0), Arrived::Whole(2));
    }

    #[test]
    fn the_topic_alias_is_found_among_the_other_properties() {
        assert_eq!(publish_topic_alias(&publish(&[0x23, 0x00, 0x00])), Some(0));
        let before = [0x01, 0x01, 0x02, 0, 0, 0, 60, 0x03, 0x00, 0x01, b't', 0x26, 0x00, 0x01, b'k', 0x00, 0x00];
        let mut properties = before.to_vec();
        properties.extend_from_slice(&[0x0b, 0x81, 0x01, 0x23, 0x00, 0x07]);
        assert_eq!(publish_topic_alias(&publish(&properties)), Some(7));
        assert_eq!(publish_topic_alias(&publish(&before)), None, "none set");
        assert_eq!(publish_topic_alias(&publish(&[0x23, 0x00])), None, "cut short");
        assert_eq!(publish_topic_alias(&publish(&[0x7f, 0x23, 0x00, 0x00])), None, "not a property");
        assert_eq!(publish_topic_alias(&[0xc0, 0x00]), None, "not a PUBLISH");
    }
}
