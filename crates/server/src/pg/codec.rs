//! The Postgres wire protocol's messages (version 3.0), our own codec: what clients send,
//! decoded from one message's bytes, and what the server answers, encoded.
//!
//! Every message but the first is a type byte, a 4-byte big-endian length that counts itself,
//! and a body; the first (startup, SSL request, cancel request) has no type byte. Decoding is a
//! pure function of the body, so it is fuzzed as one (fuzz/fuzz_targets/pg_message.rs); a
//! malformed message is an error naming what is wrong, never a panic.

use bytes::{BufMut, BytesMut};

/// The longest message a client may send (a query of 16 MiB): a longer one is refused and the
/// connection closed, before its body is read.
pub const MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// The protocol version of a startup message: 3.0.
pub const PROTOCOL_3: u32 = 196_608;
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
/// Parameters a startup message may carry.
const STARTUP_PARAMETERS_MAX: usize = 64;
/// Parameters one Bind may carry (Postgres's own limit).
const BIND_PARAMETERS_MAX: usize = 65_535;

/// The first message of a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Startup {
    Ssl,
    Gss,
    Cancel { process: i32, secret: i32 },
    Start { version: u32, parameters: Vec<(String, String)> },
}

/// A message from the client after the startup.
#[derive(Debug, PartialEq, Eq)]
pub enum Frontend {
    Query(String),
    Parse {
        name: String,
        query: String,
        types: Vec<u32>,
    },
    Bind {
        portal: String,
        statement: String,
        formats: Vec<i16>,
        parameters: Vec<Option<Vec<u8>>>,
        results: Vec<i16>,
    },
    /// `kind` is `S` (a statement) or `P` (a portal).
    Describe {
        kind: u8,
        name: String,
    },
    Execute {
        portal: String,
        max_rows: i32,
    },
    Close {
        kind: u8,
        name: String,
    },
    Sync,
    Flush,
    Terminate,
    /// A password message: a SASL initial response or response (read by what the server asked).
    Password(Vec<u8>),
    /// Rows of a COPY FROM STDIN, its end, and the client giving it up (with why).
    CopyData(Vec<u8>),
    CopyDone,
    CopyFail(String),
    /// Any other message type, refused.
    Other(u8),
}

/// Reads a body front to back.
struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(body: &'a [u8]) -> Reader<'a> {
        Reader { body, at: 0 }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.body.len());
        let Some(end) = end else { return Err(format!("the message ends inside {what}")) };
        let bytes = &self.body[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_be_bytes(bytes.try_into().expect("four bytes")))
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(self.u32(what)? as i32)
    }

    fn i16(&mut self, what: &str) -> Result<i16, String> {
        let bytes = self.take(2, what)?;
        Ok(i16::from_be_bytes(bytes.try_into().expect("two bytes")))
    }

    /// A count (Int16) that cannot be negative.
    fn count(&mut self, what: &str) -> Result<usize, String> {
        let count = self.i16(what)?;
        usize::try_from(count).map_err(|_| format!("{what} is negative"))
    }

    /// A NUL-terminated UTF-8 string.
    fn cstring(&mut self, what: &str) -> Result<String, String> {
        let rest = &self.body[self.at..];
        let Some(end) = rest.iter().position(|byte| *byte == 0) else {
            return Err(format!("{what} is not terminated"));
        };
        let text = std::str::from_utf8(&rest[..end]).map_err(|_| format!("{what} is not UTF-8"))?;
        self.at += end + 1;
        Ok(text.to_string())
    }

    fn done(&self, what: &str) -> Result<(), String> {
        if self.at == self.body.len() { Ok(()) } else { Err(format!("{what} has bytes after its end")) }
    }
}

/// The first message, from its body (what follows its length).
pub fn decode_startup(body: &[u8]) -> Result<Startup, String> {
    let mut reader = Reader::new(body);
    let code = reader.u32("the protocol version")?;
    match code {
        SSL_REQUEST => {
            reader.done("the SSL request")?;
            Ok(Startup::Ssl)
        }
        GSS_REQUEST => {
            reader.done("the GSS request")?;
            Ok(Startup::Gss)
        }
        CANCEL_REQUEST => {
            let process = reader.i32("the process id")?;
            let secret = reader.i32("the secret key")?;
            reader.done("the cancel request")?;
            Ok(Startup::Cancel { process, secret })
        }
        // Another version's layout is not ours to read: it is refused by its number.
        version if version != PROTOCOL_3 => Ok(Startup::Start { version, parameters: Vec::new() }),
        version => {
            let mut parameters = Vec::new();
            loop {
                let name = reader.cstring("a startup parameter's name")?;
                if name.is_empty() {
                    break;
                }
                let value = reader.cstring("a startup parameter's value")?;
                if parameters.len() == STARTUP_PARAMETERS_MAX {
                    return Err(format!("more than {STARTUP_PARAMETERS_MAX} startup parameters"));
                }
                parameters.push((name, value));
            }
            reader.done("the startup message")?;
            Ok(Startup::Start { version, parameters })
        }
    }
}

/// A message after the startup, from its type byte and body.
pub fn decode(tag: u8, body: &[u8]) -> Result<Frontend, String> {
    let mut reader = Reader::new(body);
    let message = match tag {
        b'Q' => {
            let query = reader.cstring("the query")?;
            Frontend::Query(query)
        }
        b'P' => {
            let name = reader.cstring("the statement name")?;
            let query = reader.cstring("the query")?;
            let count = reader.count("the parameter type count")?;
            let mut types = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                types.push(reader.u32("a parameter type")?);
            }
            Frontend::Parse { name, query, types }
        }
        b'B' => {
            let portal = reader.cstring("the portal name")?;
            let statement = reader.cstring("the statement name")?;
            let count = reader.count("the parameter format count")?;
            let mut formats = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                formats.push(reader.i16("a parameter format")?);
            }
            let count = reader.count("the parameter count")?;
            if count > BIND_PARAMETERS_MAX {
                return Err(format!("more than {BIND_PARAMETERS_MAX} parameters"));
            }
            let mut parameters = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                let length = reader.i32("a parameter's length")?;
                parameters.push(match length {
                    -1 => None,
                    length if length < 0 => return Err("a parameter's length is negative".into()),
                    length => Some(reader.take(length as usize, "a parameter")?.to_vec()),
                });
            }
            let count = reader.count("the result format count")?;
            let mut results = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                results.push(reader.i16("a result format")?);
            }
            for format in formats.iter().chain(&results) {
                if *format != 0 && *format != 1 {
                    return Err(format!("format {format} is neither text (0) nor binary (1)"));
                }
            }
            Frontend::Bind { portal, statement, formats, parameters, results }
        }
        b'D' | b'C' => {
            let kind = reader.take(1, "the kind")?[0];
            if kind != b'S' && kind != b'P' {
                return Err(format!("kind {:?} is neither S nor P", kind as char));
            }
            let name = reader.cstring("the name")?;
            if tag == b'D' { Frontend::Describe { kind, name } } else { Frontend::Close { kind, name } }
        }
        b'E' => {
            let portal = reader.cstring("the portal name")?;
            let max_rows = reader.i32("the row limit")?;
            Frontend::Execute { portal, max_rows }
        }
        b'S' => Frontend::Sync,
        b'H' => Frontend::Flush,
        b'X' => Frontend::Terminate,
        b'p' => return Ok(Frontend::Password(body.to_vec())),
        b'd' => return Ok(Frontend::CopyData(body.to_vec())),
        b'c' => Frontend::CopyDone,
        b'f' => Frontend::CopyFail(reader.cstring("the reason")?),
        other => return Ok(Frontend::Other(other)),
    };
    reader.done("the message")?;
    Ok(message)
}

/// A SASL initial response: the mechanism and the client's first message.
pub fn decode_sasl_initial(body: &[u8]) -> Result<(String, Vec<u8>), String> {
    let mut reader = Reader::new(body);
    let mechanism = reader.cstring("the SASL mechanism")?;
    let length = reader.i32("the SASL data length")?;
    let data = if length < 0 { Vec::new() } else { reader.take(length as usize, "the SASL data")?.to_vec() };
    reader.done("the SASL initial response")?;
    Ok((mechanism, data))
}

/// What the server writes, appended to one buffer and sent with one write.
#[derive(Default)]
pub struct Out {
    pub buffer: BytesMut,
}

/// A column of a row description: its name and type.
pub struct Field<'a> {
    pub name: &'a str,
    pub type_oid: u32,
    /// 0 text, 1 binary.
    pub format: i16,
}

impl Out {
    /// A message: its type, then the body `write` puts, then its length set.
    fn message(&mut self, tag: u8, write: impl FnOnce(&mut BytesMut)) {
        self.buffer.put_u8(tag);
        let at = self.buffer.len();
        self.buffer.put_u32(0);
        write(&mut self.buffer);
        let length = (self.buffer.len() - at) as u32;
        self.buffer[at..at + 4].copy_from_slice(&length.to_be_bytes());
    }

    fn cstring(buffer: &mut BytesMut, text: &str) {
        // A NUL inside would end the string early: such names are never sent.
        buffer.put_slice(text.replace('\0', "").as_bytes());
        buffer.put_u8(0);
    }

    pub fn authentication(&mut self, code: u32, data: &[u8]) {
        self.message(b'R', |buffer| {
            buffer.put_u32(code);
            buffer.put_slice(data);
        });
    }

    pub fn authentication_ok(&mut self) {
        self.authentication(0, &[]);
    }

    /// AuthenticationSASL with the mechanisms offered.
    pub fn authentication_sasl(&mut self, mechanisms: &[&str]) {
        let mut data = Vec::new();
        for mechanism in mechanisms {
            data.extend_from_slice(mechanism.as_bytes());
            data.push(0);
        }
        data.push(0);
        self.authentication(10, &data);
    }

    pub fn parameter_status(&mut self, name: &str, value: &str) {
        self.message(b'S', |buffer| {
            Self::cstring(buffer, name);
            Self::cstring(buffer, value);
        });
    }

    pub fn backend_key(&mut self, process: i32, secret: i32) {
        self.message(b'K', |buffer| {
            buffer.put_i32(process);
            buffer.put_i32(secret);
        });
    }

    /// ReadyForQuery: `I` idle, `T` in a transaction, `E` in a failed one.
    pub fn ready(&mut self, status: u8) {
        self.message(b'Z', |buffer| buffer.put_u8(status));
    }

    pub fn row_description(&mut self, fields: &[Field]) {
        self.message(b'T', |buffer| {
            buffer.put_i16(fields.len() as i16);
            for field in fields {
                Self::cstring(buffer, field.name);
                buffer.put_u32(0); // no table
                buffer.put_i16(0); // no column number
                buffer.put_u32(field.type_oid);
                buffer.put_i16(type_size(field.type_oid));
                buffer.put_i32(-1); // no type modifier
                buffer.put_i16(field.format);
            }
        });
    }

    pub fn data_row(&mut self, values: &[Option<Vec<u8>>]) {
        self.message(b'D', |buffer| {
            buffer.put_i16(values.len() as i16);
            for value in values {
                match value {
                    None => buffer.put_i32(-1),
                    Some(bytes) => {
                        buffer.put_i32(bytes.len() as i32);
                        buffer.put_slice(bytes);
                    }
                }
            }
        });
    }

    pub fn command_complete(&mut self, tag: &str) {
        self.message(b'C', |buffer| Self::cstring(buffer, tag));
    }

    pub fn empty_query(&mut self) {
        self.message(b'I', |_| {});
    }

    pub fn parse_complete(&mut self) {
        self.message(b'1', |_| {});
    }

    pub fn bind_complete(&mut self) {
        self.message(b'2', |_| {});
    }

    pub fn close_complete(&mut self) {
        self.message(b'3', |_| {});
    }

    pub fn no_data(&mut self) {
        self.message(b'n', |_| {});
    }

    pub fn portal_suspended(&mut self) {
        self.message(b's', |_| {});
    }

    /// CopyOutResponse (`H`) or CopyInResponse (`G`): `columns` columns, all in text.
    pub fn copy_response(&mut self, out: bool, columns: usize) {
        self.message(if out { b'H' } else { b'G' }, |buffer| {
            buffer.put_u8(0);
            buffer.put_i16(columns as i16);
            for _ in 0..columns {
                buffer.put_i16(0);
            }
        });
    }

    pub fn copy_data(&mut self, data: &[u8]) {
        self.message(b'd', |buffer| buffer.put_slice(data));
    }

    pub fn copy_done(&mut self) {
        self.message(b'c', |_| {});
    }

    pub fn parameter_description(&mut self, types: &[u32]) {
        self.message(b't', |buffer| {
            buffer.put_i16(types.len() as i16);
            for oid in types {
                buffer.put_u32(*oid);
            }
        });
    }

    /// ErrorResponse (or, with `notice`, NoticeResponse): severity, SQLSTATE, message, and the
    /// detail and hint when there are.
    pub fn error(&mut self, notice: bool, code: &str, message: &str, detail: Option<&str>, hint: Option<&str>) {
        let severity = if notice { "NOTICE" } else { "ERROR" };
        self.message(if notice { b'N' } else { b'E' }, |buffer| {
            for (field, value) in [
                (b'S', Some(severity)),
                (b'V', Some(severity)),
                (b'C', Some(code)),
                (b'M', Some(message)),
                (b'D', detail),
                (b'H', hint),
            ] {
                if let Some(value) = value {
                    buffer.put_u8(field);
                    Self::cstring(buffer, value);
                }
            }
            buffer.put_u8(0);
        });
    }
}

/// The size a type's values have, or -1 for varying.
fn type_size(oid: u32) -> i16 {
    match oid {
        16 => 1,
        20 | 701 => 8,
        23 => 4,
        _ => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup(parameters: &[(&str, &str)]) -> Vec<u8> {
        let mut body = PROTOCOL_3.to_be_bytes().to_vec();
        for (name, value) in parameters {
            body.extend_from_slice(name.as_bytes());
            body.push(0);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        body
    }

    #[test]
    fn startup_ssl_and_cancel_requests_decode() {
        let decoded = decode_startup(&startup(&[("user", "alice"), ("database", "shop")])).unwrap();
        let parameters = vec![("user".to_string(), "alice".to_string()), ("database".to_string(), "shop".to_string())];
        assert_eq!(decoded, Startup::Start { version: PROTOCOL_3, parameters });
        assert_eq!(decode_startup(&SSL_REQUEST.to_be_bytes()).unwrap(), Startup::Ssl);
        let mut cancel = CANCEL_REQUEST.to_be_bytes().to_vec();
        cancel.extend_from_slice(&7i32.to_be_bytes());
        cancel.extend_from_slice(&(-9i32).to_be_bytes());
        assert_eq!(decode_startup(&cancel).unwrap(), Startup::Cancel { process: 7, secret: -9 });
        assert!(decode_startup(&[0, 3]).unwrap_err().contains("protocol version"));
        let mut unterminated = startup(&[("user", "alice")]);
        unterminated.truncate(unterminated.len() - 2);
        assert!(decode_startup(&unterminated).is_err());
    }

    #[test]
    fn extended_query_messages_decode_and_bad_ones_are_refused() {
        let mut parse = b"s1\0SELECT $1\0".to_vec();
        parse.extend_from_slice(&1i16.to_be_bytes());
        parse.extend_from_slice(&23u32.to_be_bytes());
        assert_eq!(
            decode(b'P', &parse).unwrap(),
            Frontend::Parse { name: "s1".into(), query: "SELECT $1".into(), types: vec![23] }
        );
        let mut bind = b"\0s1\0".to_vec();
        bind.extend_from_slice(&0i16.to_be_bytes());
        bind.extend_from_slice(&2i16.to_be_bytes());
        bind.extend_from_slice(&2i32.to_be_bytes());
        bind.extend_from_slice(b"42");
        bind.extend_from_slice(&(-1i32).to_be_bytes());
        bind.extend_from_slice(&1i16.to_be_bytes());
        bind.extend_from_slice(&1i16.to_be_bytes());
        assert_eq!(
            decode(b'B', &bind).unwrap(),
            Frontend::Bind {
                portal: String::new(),
                statement: "s1".into(),
                formats: vec![],
                parameters: vec![Some(b"42".to_vec()), None],
                results: vec![1]
            }
        );
        // A parameter longer than the message, a negative count, a bad format, trailing bytes.
        let mut long = b"\0s1\0\0\0\0\x01".to_vec();
        long.extend_from_slice(&1000i32.to_be_bytes());
        assert!(decode(b'B', &long).unwrap_err().contains("ends inside a parameter"));
        assert!(decode(b'P', b"s\0q\0\xff\xff").unwrap_err().contains("negative"));
        let mut format = b"\0s1\0".to_vec();
        format.extend_from_slice(&1i16.to_be_bytes());
        format.extend_from_slice(&7i16.to_be_bytes());
        format.extend_from_slice(&0i16.to_be_bytes());
        format.extend_from_slice(&0i16.to_be_bytes());
        assert!(decode(b'B', &format).unwrap_err().contains("neither text"));
        assert!(decode(b'Q', b"SELECT 1\0junk").unwrap_err().contains("after its end"));
        assert!(decode(b'D', b"Xname\0").unwrap_err().contains("neither S nor P"));
        assert_eq!(decode(b'd', b"a\tb\n").unwrap(), Frontend::CopyData(b"a\tb\n".to_vec()));
        assert_eq!(decode(b'c', b"").unwrap(), Frontend::CopyDone);
        assert_eq!(decode(b'f', b"gave up\0").unwrap(), Frontend::CopyFail("gave up".into()));
        assert!(decode(b'c', b"x").is_err());
        assert_eq!(decode(b'z', b"").unwrap(), Frontend::Other(b'z'));
    }

    /// Random bytes through every decoder, as the fuzz target feeds them (which needs
    /// cargo-fuzz and nightly): an error or a message, never a panic.
    #[test]
    fn random_bytes_decode_or_are_refused() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let tags = [b'Q', b'P', b'B', b'D', b'C', b'E', b'S', b'H', b'X', b'p', b'd'];
        for case in 0..20_000 {
            let length = (next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..length).map(|_| next() as u8).collect();
            // Half the cases start as real messages do, so the decoders get past their first field.
            if case % 2 == 0 && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&PROTOCOL_3.to_be_bytes());
            }
            let _ = decode_startup(&bytes);
            let _ = decode_sasl_initial(&bytes);
            let tag = tags[(next() % tags.len() as u64) as usize];
            if let Ok(Frontend::Bind { parameters, .. }) = decode(tag, &bytes) {
                for parameter in parameters.iter().flatten() {
                    for oid in [16, 20, 21, 23, 25, 700, 701, 0] {
                        let _ = super::super::types::decode_parameter(parameter, oid, true);
                        let _ = super::super::types::decode_parameter(parameter, oid, false);
                    }
                }
            }
        }
    }

    #[test]
    fn answers_have_their_lengths() {
        let mut out = Out::default();
        out.command_complete("SELECT 1");
        assert_eq!(&out.buffer[..], b"C\0\0\0\x0dSELECT 1\0");
        let mut out = Out::default();
        out.data_row(&[Some(b"ab".to_vec()), None]);
        assert_eq!(&out.buffer[..], b"D\0\0\0\x10\0\x02\0\0\0\x02ab\xff\xff\xff\xff");
    }
}
