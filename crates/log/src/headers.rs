//! [`Headers`]: a read record's headers, left where the batch has them.
//!
//! Most readers of a record never look at its headers, or look one up by name. Decoding them
//! into a list cost an allocation for the list and, per header, two shared slices of the batch
//! (each a reference count taken on reading and dropped by whoever drops the record, often on
//! another thread). A read record keeps them as the one slice of its batch they were encoded
//! in, checked when decoded (every length, every name UTF-8), and reads them in place.
//!
//! A value may be null (a Kafka header with no value): on disk its length is `u32::MAX`, in a
//! batch marked [`crate::format::ATTR_NULL_HEADER_VALUES`].

use std::fmt;
use std::ops::Range;

use bytes::{Buf, Bytes};

use crate::error::DecodeError;
use crate::format::NULL_VALUE_LEN;
use crate::text::Text;

/// A read record's headers: name and value pairs, in order, names not necessarily distinct,
/// values possibly null.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// The encoded pairs (without the count): per pair a u16 name length, the name, a u32
    /// value length and the value (`u32::MAX` and no bytes: null), little-endian. Always well
    /// formed.
    raw: Bytes,
    count: u16,
}

impl Headers {
    /// Takes the header list at the front of `body` (a u16 count, then the pairs), checking
    /// every length and that every name is UTF-8; `body` moves past it. `null_values`: the
    /// batch allows null values (otherwise a `u32::MAX` length is one past the record's end).
    pub(crate) fn take(body: &mut Bytes, null_values: bool) -> Result<Headers, DecodeError> {
        let bytes: &[u8] = body;
        let Some((count, mut at)) = read_u16(bytes, 0) else { return Err(DecodeError::Truncated) };
        for _ in 0..count {
            let Some((name_len, next)) = read_u16(bytes, at) else { return Err(DecodeError::Truncated) };
            let name = bytes.get(next..next + name_len as usize).ok_or(DecodeError::Truncated)?;
            std::str::from_utf8(name).map_err(|_| DecodeError::BadUtf8)?;
            let Some((value_len, next)) = read_u32(bytes, next + name_len as usize) else {
                return Err(DecodeError::Truncated);
            };
            if value_len == NULL_VALUE_LEN && null_values {
                at = next;
                continue;
            }
            at =
                next.checked_add(value_len as usize).filter(|end| *end <= bytes.len()).ok_or(DecodeError::Truncated)?;
        }
        // No headers, no slice: a slice of shared bytes is a reference count taken and dropped.
        let raw = if count == 0 { Bytes::new() } else { body.slice(2..at) };
        body.advance(at);
        Ok(Headers { raw, count })
    }

    /// How many pairs.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The pairs in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter { raw: &self.raw, ranges: self.ranges() }
    }

    /// Where each pair's name and value lie in `raw`.
    fn ranges(&self) -> Ranges<'_> {
        Ranges { raw: &self.raw, at: 0, left: self.count }
    }

    /// The value of the first header named `name`; `None` when there is none or its value is
    /// null (for headers whose null means nothing, such as onehop's own).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(key, _)| *key == name).and_then(|(_, value)| value)
    }

    /// The value of the last header named `name`; `None` when there is none or its value is
    /// null.
    pub fn get_last(&self, name: &str) -> Option<&[u8]> {
        self.iter().filter(|(key, _)| *key == name).last().and_then(|(_, value)| value)
    }

    /// Whether a value is null.
    pub fn has_null(&self) -> bool {
        self.iter().any(|(_, value)| value.is_none())
    }

    /// The pairs as a list, sharing the record's bytes (for a record to be written again).
    pub fn to_vec(&self) -> Vec<(Text, Option<Bytes>)> {
        self.ranges()
            .map(|(name, value)| {
                // Checked when decoded; the fallback copies and cannot differ.
                let name = Text::from_utf8(self.raw.slice(name.clone()))
                    .unwrap_or_else(|_| Text::from(String::from_utf8_lossy(&self.raw[name]).into_owned()));
                (name, value.map(|value| self.raw.slice(value)))
            })
            .collect()
    }
}

impl From<&[(Text, Option<Bytes>)]> for Headers {
    /// Encodes `pairs` (at most `u16::MAX` of them, each name at most `u16::MAX` bytes, as the
    /// log allows; more is cut off, as the log's append would have refused it).
    fn from(pairs: &[(Text, Option<Bytes>)]) -> Headers {
        let pairs = &pairs[..pairs.len().min(u16::MAX as usize)];
        let value_len = |value: &Option<Bytes>| value.as_ref().map_or(0, Bytes::len);
        let mut raw = Vec::with_capacity(pairs.iter().map(|(name, value)| 6 + name.len() + value_len(value)).sum());
        for (name, value) in pairs {
            let name = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
            raw.extend_from_slice(&(name.len() as u16).to_le_bytes());
            raw.extend_from_slice(name);
            match value {
                Some(value) => {
                    raw.extend_from_slice(&(value.len() as u32).to_le_bytes());
                    raw.extend_from_slice(value);
                }
                None => raw.extend_from_slice(&NULL_VALUE_LEN.to_le_bytes()),
            }
        }
        Headers { raw: Bytes::from(raw), count: pairs.len() as u16 }
    }
}

impl From<&[(Text, Bytes)]> for Headers {
    /// Encodes `pairs`, no value null.
    fn from(pairs: &[(Text, Bytes)]) -> Headers {
        pairs.iter().map(|(name, value)| (name.clone(), Some(value.clone()))).collect()
    }
}

impl FromIterator<(Text, Option<Bytes>)> for Headers {
    fn from_iter<I: IntoIterator<Item = (Text, Option<Bytes>)>>(pairs: I) -> Headers {
        Headers::from(&pairs.into_iter().collect::<Vec<_>>()[..])
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|(name, value)| (name, value.map(Bytes::copy_from_slice)))).finish()
    }
}

/// The pairs of [`Headers`], in order: `(name, value)`, a null value `None`.
pub struct Iter<'a> {
    raw: &'a [u8],
    ranges: Ranges<'a>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        let (name, value) = self.ranges.next()?;
        Some((std::str::from_utf8(&self.raw[name]).ok()?, value.map(|value| &self.raw[value])))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.ranges.size_hint()
    }
}

/// Where the names and values of [`Headers`] lie in its bytes, pair by pair.
struct Ranges<'a> {
    raw: &'a [u8],
    at: usize,
    left: u16,
}

impl Iterator for Ranges<'_> {
    /// The name's bytes, and the value's (`None`: null).
    type Item = (Range<usize>, Option<Range<usize>>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // `Headers` holds only well-formed lists (checked by `take`, built by `from`), so
        // these reads stay in bounds; were that ever broken, the iteration ends rather than
        // panics.
        let (name_len, from) = read_u16(self.raw, self.at)?;
        let name = from..from + name_len as usize;
        let (value_len, from) = read_u32(self.raw, name.end)?;
        if value_len == NULL_VALUE_LEN {
            self.at = from;
            return Some((name, None));
        }
        let value = from..from + value_len as usize;
        if value.end > self.raw.len() {
            return None;
        }
        self.at = value.end;
        Some((name, Some(value)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left as usize))
    }
}

fn read_u16(bytes: &[u8], at: usize) -> Option<(u16, usize)> {
    let field = bytes.get(at..at + 2)?;
    Some((u16::from_le_bytes([field[0], field[1]]), at + 2))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<(u32, usize)> {
    let field = bytes.get(at..at + 4)?;
    Some((u32::from_le_bytes([field[0], field[1], field[2], field[3]]), at + 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&'static str, Option<&'static [u8]>)]) -> Vec<(Text, Option<Bytes>)> {
        list.iter().map(|(name, value)| (Text::from_static(name), value.map(Bytes::from_static))).collect()
    }

    /// `pairs` encoded as a record body has them (count first), followed by `after`.
    fn encoded(pairs: &[(Text, Option<Bytes>)], after: &[u8]) -> Bytes {
        let mut out = (pairs.len() as u16).to_le_bytes().to_vec();
        for (name, value) in pairs {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            match value {
                Some(value) => {
                    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                    out.extend_from_slice(value);
                }
                None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
            }
        }
        out.extend_from_slice(after);
        Bytes::from(out)
    }

    #[test]
    fn reads_pairs_in_place_and_leaves_the_rest() {
        let list = pairs(&[("a", Some(b"1")), ("", Some(b"")), ("é", Some(b"\xff\x00")), ("a", Some(b"2"))]);
        let mut body = encoded(&list, b"rest");
        let headers = Headers::take(&mut body, false).unwrap();
        assert_eq!(&body[..], b"rest");
        assert_eq!(headers.len(), 4);
        let read: Vec<(&str, Option<&[u8]>)> = headers.iter().collect();
        assert_eq!(read, [("a", Some(&b"1"[..])), ("", Some(b"")), ("é", Some(b"\xff\x00")), ("a", Some(b"2"))]);
        assert_eq!(headers.get("a"), Some(&b"1"[..]));
        assert_eq!(headers.get_last("a"), Some(&b"2"[..]));
        assert_eq!(headers.get("b"), None);
        assert!(!headers.has_null());
        assert_eq!(headers.to_vec(), list);
        assert_eq!(Headers::from(&list[..]), headers, "built and decoded agree");
        assert_eq!(
            format!("{headers:?}"),
            "[(\"a\", Some(b\"1\")), (\"\", Some(b\"\")), (\"é\", Some(b\"\\xff\\0\")), (\"a\", Some(b\"2\"))]"
        );
    }

    #[test]
    fn null_values_are_kept_where_the_batch_allows_them_in_order_among_repeats() {
        let list = pairs(&[("trace", Some(b"a")), ("trace", None), ("trace", Some(b"")), ("n", None)]);
        let whole = encoded(&list, b"rest");
        let mut body = whole.clone();
        let headers = Headers::take(&mut body, true).unwrap();
        assert_eq!(&body[..], b"rest");
        let read: Vec<(&str, Option<&[u8]>)> = headers.iter().collect();
        assert_eq!(read, [("trace", Some(&b"a"[..])), ("trace", None), ("trace", Some(b"")), ("n", None)]);
        assert!(headers.has_null());
        assert_eq!(headers.to_vec(), list, "a null stays null, an empty value stays empty");
        assert_eq!(Headers::from(&list[..]), headers);
        assert_eq!(headers.get("n"), None, "a null value counts as none for a lookup");
        // In a batch that does not allow null values, the length is one past the record's end.
        assert_eq!(Headers::take(&mut whole.clone(), false), Err(DecodeError::Truncated));
    }

    #[test]
    fn no_headers_is_empty() {
        let mut body = encoded(&[], b"x");
        let headers = Headers::take(&mut body, false).unwrap();
        assert!(headers.is_empty());
        assert_eq!(headers.iter().count(), 0);
        assert_eq!(headers, Headers::default());
        assert_eq!(&body[..], b"x");
    }

    #[test]
    fn refuses_every_cut_and_a_name_that_is_not_utf8() {
        let list = pairs(&[("name", Some(b"value")), ("n2", None), ("n3", Some(b"v3"))]);
        let whole = encoded(&list, b"");
        for len in 0..whole.len() {
            let mut cut = whole.slice(..len);
            assert_eq!(Headers::take(&mut cut, true), Err(DecodeError::Truncated), "cut at {len}");
        }
        let mut bad = whole.to_vec();
        bad[4] = 0xff; // the first name's first byte
        assert_eq!(Headers::take(&mut Bytes::from(bad), true), Err(DecodeError::BadUtf8));
        let mut huge = whole.to_vec();
        huge[2 + 2 + 4..2 + 2 + 4 + 4].copy_from_slice(&(u32::MAX - 1).to_le_bytes()); // a value length
        assert_eq!(Headers::take(&mut Bytes::from(huge), true), Err(DecodeError::Truncated));
    }

    #[test]
    fn a_decoded_list_shares_the_batch() {
        let mut body = encoded(&pairs(&[("name", Some(b"value"))]), b"");
        let start = body.as_ptr() as usize;
        let headers = Headers::take(&mut body, false).unwrap();
        let (name, value) = headers.to_vec().remove(0);
        let within = |part: &[u8]| (start..start + 15).contains(&(part.as_ptr() as usize));
        assert!(within(name.as_bytes()) && within(&value.unwrap()));
    }
}
