//! [`Text`]: a UTF-8 string held in shared [`Bytes`].
//!
//! A record's subject and header names are strings. Decoding them as `String` allocated and
//! copied each one for every record read, while the record's key and value were already
//! slices of the batch they came from. A `Text` is such a slice too, checked once for UTF-8:
//! reading a record copies nothing, cloning it (into a subscriber's queue, say) is a reference
//! count, and names known at compile time ([`Text::from_static`]) are never allocated.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::str::Utf8Error;

use bytes::Bytes;

/// An immutable UTF-8 string in shared bytes; derefs to `str`.
///
/// Equality, ordering and hashing are those of the `str` it holds, so a `Text` can key a map
/// that is looked up with a `&str`.
#[derive(Clone, Default)]
pub struct Text(Bytes);

impl Text {
    /// A `Text` of a string known at compile time: no allocation.
    pub const fn from_static(text: &'static str) -> Text {
        Text(Bytes::from_static(text.as_bytes()))
    }

    /// `bytes` as text, if they are valid UTF-8; shares them, copies nothing.
    pub fn from_utf8(bytes: Bytes) -> Result<Text, Utf8Error> {
        std::str::from_utf8(&bytes)?;
        Ok(Text(bytes))
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        // SAFETY: every constructor checks or is given valid UTF-8 (`from_utf8` checks; the
        // others take a `str` or a `String`), and the bytes of a `Bytes` never change.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }

    /// The UTF-8 bytes, shared.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<[u8]> for Text {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    /// Takes the string's buffer over; copies nothing.
    fn from(text: String) -> Text {
        Text(Bytes::from(text.into_bytes()))
    }
}

impl From<&str> for Text {
    /// Copies the string.
    fn from(text: &str) -> Text {
        Text(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl From<&String> for Text {
    /// Copies the string.
    fn from(text: &String) -> Text {
        Text::from(text.as_str())
    }
}

impl From<Text> for String {
    fn from(text: Text) -> String {
        text.as_str().to_owned()
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.0 == other.0
    }
}

impl Eq for Text {}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Text> for str {
    fn eq(&self, other: &Text) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Text> for &str {
    fn eq(&self, other: &Text) -> bool {
        *self == other.as_str()
    }
}

impl PartialOrd for Text {
    fn partial_cmp(&self, other: &Text) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Text {
    fn cmp(&self, other: &Text) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Text {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `str` hashes, for `Borrow<str>`.
        self.as_str().hash(state);
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    #[test]
    fn shares_the_bytes_it_was_made_of() {
        let batch = Bytes::from_static(b"xxscores/team-42yy");
        let text = Text::from_utf8(batch.slice(2..16)).unwrap();
        assert_eq!(text, "scores/team-42");
        assert_eq!(text.as_ptr(), batch[2..].as_ptr(), "no copy");
        let clone = text.clone();
        assert_eq!(clone.as_ptr(), text.as_ptr(), "a clone shares too");
    }

    #[test]
    fn refuses_bytes_that_are_not_utf8() {
        assert!(Text::from_utf8(Bytes::from_static(b"ok\xff")).is_err());
        assert!(Text::from_utf8(Bytes::from_static(b"\xe2\x82")).is_err(), "a cut character");
        assert_eq!(Text::from_utf8(Bytes::from_static("é€".as_bytes())).unwrap(), "é€");
    }

    #[test]
    fn compares_hashes_and_orders_as_str() {
        let mut by_hash: HashMap<Text, u32> = HashMap::new();
        by_hash.insert(Text::from("b"), 2);
        by_hash.insert(Text::from_static("a"), 1);
        assert_eq!(by_hash.get("a"), Some(&1));
        assert_eq!(by_hash.get("b"), Some(&2));
        assert_eq!(by_hash.get("c"), None);
        let ordered: BTreeMap<Text, ()> = ["b", "ab", "a", "é", "z"].into_iter().map(|s| (Text::from(s), ())).collect();
        let keys: Vec<&str> = ordered.keys().map(Text::as_str).collect();
        assert_eq!(keys, ["a", "ab", "b", "z", "é"]);
        assert!(ordered.contains_key("ab"));
        assert_eq!(Text::from(String::from("x")), Text::from_static("x"));
        assert_ne!(Text::from("x"), Text::from("y"));
        assert_eq!(format!("{} {:?}", Text::from("a\"b"), Text::from("a\"b")), "a\"b \"a\\\"b\"");
        assert_eq!(String::from(Text::from("round")), "round");
    }
}
