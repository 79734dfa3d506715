//! Just enough DER (X.690) to find two things in files people hand us: the key inside a PEM
//! `PUBLIC KEY` (SubjectPublicKeyInfo, RFC 5280 §4.1.2.7) for verifying JWTs, and the subject's
//! common name in a client certificate for mapping it to a user. Everything is bounds-checked;
//! hostile input gets an error, never a panic (`fuzz/fuzz_targets/credentials.rs` feeds it).

/// A DER tag as one byte: every tag read here is a low-number tag.
pub const SEQUENCE: u8 = 0x30;
pub const SET: u8 = 0x31;
pub const INTEGER: u8 = 0x02;
pub const BIT_STRING: u8 = 0x03;
pub const OBJECT_IDENTIFIER: u8 = 0x06;
pub const NULL: u8 = 0x05;
/// `[0]` constructed, context-specific: a certificate's version.
pub const CONTEXT_0: u8 = 0xa0;

/// Object identifiers as their DER content bytes.
pub const OID_RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
pub const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
pub const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
pub const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
pub const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];
pub const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// A cursor over DER bytes.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The tag of the next element, without reading it.
    pub fn peek_tag(&self) -> Option<u8> {
        self.bytes.first().copied()
    }

    /// The next element: its tag and its content.
    pub fn any(&mut self) -> Result<(u8, &'a [u8]), String> {
        let (&tag, rest) = self.bytes.split_first().ok_or("DER ends where an element was expected")?;
        if tag & 0x1f == 0x1f {
            return Err("a DER tag of more than one byte".into());
        }
        let (&first, mut rest) = rest.split_first().ok_or("DER ends inside a length")?;
        let length = if first < 0x80 {
            usize::from(first)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 {
                return Err("a DER length that is indefinite or longer than 4 bytes".into());
            }
            if rest.len() < count {
                return Err("DER ends inside a length".into());
            }
            let (length_bytes, after) = rest.split_at(count);
            rest = after;
            length_bytes.iter().fold(0usize, |length, byte| (length << 8) | usize::from(*byte))
        };
        if rest.len() < length {
            return Err(format!("a DER element of {length} bytes where {} remain", rest.len()));
        }
        let (content, after) = rest.split_at(length);
        self.bytes = after;
        Ok((tag, content))
    }

    /// The next element, which must have tag `tag`: its content.
    pub fn expect(&mut self, tag: u8, what: &str) -> Result<&'a [u8], String> {
        let (found, content) = self.any()?;
        if found != tag {
            return Err(format!("expected {what} (DER tag {tag:#04x}), found tag {found:#04x}"));
        }
        Ok(content)
    }

    /// The next element if it has tag `tag`.
    pub fn optional(&mut self, tag: u8) -> Result<Option<&'a [u8]>, String> {
        if self.peek_tag() == Some(tag) { self.any().map(|(_, content)| Some(content)) } else { Ok(None) }
    }
}

/// A public key as a SubjectPublicKeyInfo holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    /// RSA's modulus and exponent, big-endian without leading zeros.
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed point (`04 x y`) on P-256 (`p384` false) or P-384.
    Ec {
        p384: bool,
        point: Vec<u8>,
    },
    Ed25519(Vec<u8>),
}

/// The key in a DER SubjectPublicKeyInfo.
pub fn subject_public_key_info(der: &[u8]) -> Result<PublicKey, String> {
    let mut outer = Reader::new(der);
    let mut info = Reader::new(outer.expect(SEQUENCE, "SubjectPublicKeyInfo")?);
    let mut algorithm = Reader::new(info.expect(SEQUENCE, "an AlgorithmIdentifier")?);
    let oid = algorithm.expect(OBJECT_IDENTIFIER, "an algorithm")?;
    let key = info.expect(BIT_STRING, "the public key")?;
    let key = match key.split_first() {
        Some((0, key)) => key,
        _ => return Err("a public key that is not a whole number of bytes".into()),
    };
    match oid {
        OID_RSA_ENCRYPTION => {
            let mut outer = Reader::new(key);
            let mut rsa = Reader::new(outer.expect(SEQUENCE, "RSAPublicKey")?);
            let n = unsigned(rsa.expect(INTEGER, "the RSA modulus")?);
            let e = unsigned(rsa.expect(INTEGER, "the RSA exponent")?);
            if n.is_empty() || e.is_empty() {
                return Err("an RSA key with a zero modulus or exponent".into());
            }
            Ok(PublicKey::Rsa { n, e })
        }
        OID_EC_PUBLIC_KEY => {
            let curve = algorithm.expect(OBJECT_IDENTIFIER, "the named curve")?;
            let p384 = match curve {
                OID_P256 => false,
                OID_P384 => true,
                _ => return Err("an EC key on a curve other than P-256 and P-384".into()),
            };
            Ok(PublicKey::Ec { p384, point: key.to_vec() })
        }
        OID_ED25519 => Ok(PublicKey::Ed25519(key.to_vec())),
        _ => Err("a public key that is not RSA, EC (P-256, P-384) or Ed25519".into()),
    }
}

/// An INTEGER's content as an unsigned big-endian number without leading zeros.
fn unsigned(content: &[u8]) -> Vec<u8> {
    let start = content.iter().position(|byte| *byte != 0).unwrap_or(content.len());
    content[start..].to_vec()
}

/// The subject's common name (CN) of a DER X.509 certificate: the last one if there are
/// several, as in the distinguished name's most specific part.
pub fn certificate_common_name(der: &[u8]) -> Result<Option<String>, String> {
    let mut outer = Reader::new(der);
    let mut certificate = Reader::new(outer.expect(SEQUENCE, "a Certificate")?);
    let mut tbs = Reader::new(certificate.expect(SEQUENCE, "a TBSCertificate")?);
    tbs.optional(CONTEXT_0)?;
    tbs.expect(INTEGER, "the serial number")?;
    tbs.expect(SEQUENCE, "the signature algorithm")?;
    tbs.expect(SEQUENCE, "the issuer")?;
    tbs.expect(SEQUENCE, "the validity")?;
    let mut subject = Reader::new(tbs.expect(SEQUENCE, "the subject")?);
    let mut common_name = None;
    while !subject.is_empty() {
        let mut set = Reader::new(subject.expect(SET, "a RelativeDistinguishedName")?);
        while !set.is_empty() {
            let mut attribute = Reader::new(set.expect(SEQUENCE, "an AttributeTypeAndValue")?);
            let oid = attribute.expect(OBJECT_IDENTIFIER, "an attribute type")?;
            let (tag, value) = attribute.any()?;
            if oid != OID_COMMON_NAME {
                continue;
            }
            // UTF8String, PrintableString, IA5String, TeletexString (read as Latin-1 would
            // mislead: refused), BMPString (refused).
            let text = match tag {
                0x0c | 0x13 | 0x16 => std::str::from_utf8(value).map_err(|_| "a common name that is not UTF-8")?,
                _ => return Err(format!("a common name of DER string type {tag:#04x}, not UTF-8 or ASCII")),
            };
            common_name = Some(text.to_string());
        }
    }
    Ok(common_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_bounded_and_short_input_is_an_error() {
        assert_eq!(Reader::new(&[0x04, 0x02, 1, 2]).any().unwrap(), (0x04, &[1u8, 2][..]));
        assert_eq!(Reader::new(&[0x04, 0x81, 0x01, 9]).any().unwrap(), (0x04, &[9u8][..]));
        for bad in [&[][..], &[0x04], &[0x04, 0x03, 1], &[0x04, 0x80], &[0x04, 0x85, 1, 1, 1, 1, 1], &[0x1f, 0x01]] {
            assert!(Reader::new(bad).any().is_err(), "{bad:?}");
        }
        assert!(subject_public_key_info(&[0x30, 0x00]).is_err());
        assert!(certificate_common_name(&[0x30, 0x02, 0x30, 0x00]).is_err());
    }

    #[test]
    fn an_ed25519_key_is_found() {
        // SubjectPublicKeyInfo of an Ed25519 key: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING }.
        let mut der = vec![0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
        der.extend([7u8; 32]);
        assert_eq!(subject_public_key_info(&der).unwrap(), PublicKey::Ed25519(vec![7; 32]));
    }
}
