//! Just enough HTTP/1.1 for the measured paths: requests written straight to a socket, and
//! responses (length-delimited or chunked) parsed from the bytes read. A general client would
//! put a connection task and a channel between the caller and the socket: on this 2-vCPU VM
//! every such hand-off is a thread wake-up of tens of microseconds, counted as latency.

/// A request's bytes: the head, then the body. `authorization` is the `Authorization`
/// header's value, sent with every request when given.
pub fn request(
    method: &str,
    host: &str,
    target: &str,
    content_type: Option<&str>,
    authorization: Option<&str>,
    body: &[u8],
) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(240 + body.len());
    bytes.extend_from_slice(method.as_bytes());
    bytes.push(b' ');
    bytes.extend_from_slice(target.as_bytes());
    bytes.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    bytes.extend_from_slice(host.as_bytes());
    if let Some(authorization) = authorization {
        bytes.extend_from_slice(b"\r\nAuthorization: ");
        bytes.extend_from_slice(authorization.as_bytes());
    }
    if let Some(content_type) = content_type {
        bytes.extend_from_slice(b"\r\nContent-Type: ");
        bytes.extend_from_slice(content_type.as_bytes());
    }
    if method != "GET" || !body.is_empty() {
        bytes.extend_from_slice(format!("\r\nContent-Length: {}", body.len()).as_bytes());
    }
    bytes.extend_from_slice(b"\r\n\r\n");
    bytes.extend_from_slice(body);
    bytes
}

/// A keep-alive connection sending one request at a time and reading its whole response,
/// blocking: what a benchmark's own control and point requests use.
pub struct KeepAlive {
    stream: std::net::TcpStream,
    host: String,
    buffer: Vec<u8>,
}

impl KeepAlive {
    pub fn connect(host: &str) -> std::io::Result<KeepAlive> {
        let stream = std::net::TcpStream::connect(host)?;
        stream.set_nodelay(true)?;
        Ok(KeepAlive { stream, host: host.to_string(), buffer: Vec::new() })
    }

    /// Reads and writes that take longer than `limit` fail (none do by default).
    pub fn set_timeout(&self, limit: std::time::Duration) -> std::io::Result<()> {
        self.stream.set_read_timeout(Some(limit))?;
        self.stream.set_write_timeout(Some(limit))
    }

    /// Sends a request (a JSON body when not empty); the response's status and body.
    pub fn send(&mut self, method: &str, target: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        self.send_as(method, target, None, body)
    }

    /// [`KeepAlive::send`] with an `Authorization` header's value.
    pub fn send_as(
        &mut self,
        method: &str,
        target: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        use std::io::{Read, Write};
        let content_type = (!body.is_empty()).then_some("application/json");
        self.stream.write_all(&request(method, &self.host, target, content_type, authorization, body))?;
        self.buffer.clear();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let read = self.stream.read(&mut chunk)?;
            if read == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed the connection"));
            }
            self.buffer.extend_from_slice(&chunk[..read]);
            if let Some((status, body, _)) = parse_response(&self.buffer).map_err(std::io::Error::other)? {
                return Ok((status, body));
            }
        }
    }
}

/// Percent-encodes a query value.
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// How a response's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Length(usize),
    Chunked,
    /// Until the connection closes.
    Close,
}

/// A response head.
#[derive(Clone, Debug)]
pub struct Head {
    pub status: u16,
    pub framing: Framing,
    /// Bytes of the head, the blank line included.
    pub length: usize,
}

/// Parses the head at the front of `bytes`; `None` while incomplete.
pub fn parse_head(bytes: &[u8]) -> Result<Option<Head>, String> {
    let Some(end) = bytes.windows(4).position(|window| window == b"\r\n\r\n") else {
        if bytes.len() > 64 * 1024 {
            return Err("a response head over 64 KiB".into());
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&bytes[..end]).map_err(|_| "a response head that is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {status_line:?}"))?;
    let mut framing = Framing::Close;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            framing = Framing::Length(value.parse().map_err(|_| format!("a bad content-length {value:?}"))?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
            framing = Framing::Chunked;
        }
    }
    Ok(Some(Head { status, framing, length: end + 4 }))
}

/// Decodes a chunked body as its bytes arrive.
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
    size_line: Vec<u8>,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(usize),
    /// The CRLF after a chunk's data: how many of its bytes are still to skip.
    DataEnd(usize),
    /// After the last (empty) chunk: the trailer's final CRLF.
    Trailer,
    Done,
}

impl Chunked {
    /// Feeds `input`, appending decoded bytes to `out`; returns how many input bytes it used
    /// (all of them, unless the body ended inside `input`).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, String> {
        let mut at = 0;
        while at < input.len() {
            match self.state {
                ChunkState::Size => {
                    let byte = input[at];
                    at += 1;
                    if byte == b'\n' {
                        let line = std::str::from_utf8(&self.size_line).map_err(|_| "a bad chunk size")?;
                        let hex = line.trim_end_matches('\r').split(';').next().unwrap_or_default().trim();
                        let size = usize::from_str_radix(hex, 16).map_err(|_| format!("a bad chunk size {hex:?}"))?;
                        self.size_line.clear();
                        self.state = if size == 0 { ChunkState::Trailer } else { ChunkState::Data(size) };
                    } else if self.size_line.len() > 64 {
                        return Err("a chunk size line over 64 bytes".into());
                    } else {
                        self.size_line.push(byte);
                    }
                }
                ChunkState::Data(remaining) => {
                    let take = remaining.min(input.len() - at);
                    out.extend_from_slice(&input[at..at + take]);
                    at += take;
                    self.state =
                        if take == remaining { ChunkState::DataEnd(2) } else { ChunkState::Data(remaining - take) };
                }
                ChunkState::DataEnd(left) => {
                    at += 1;
                    self.state = if left == 1 { ChunkState::Size } else { ChunkState::DataEnd(left - 1) };
                }
                ChunkState::Trailer => {
                    // No trailers are sent: the next line is the final, empty one.
                    let byte = input[at];
                    at += 1;
                    if byte == b'\n' {
                        self.state = ChunkState::Done;
                        return Ok(at);
                    }
                }
                ChunkState::Done => return Ok(at),
            }
        }
        Ok(at)
    }

    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

/// A complete response at the front of `bytes`: its status, body and length in bytes.
pub fn parse_response(bytes: &[u8]) -> Result<Option<(u16, Vec<u8>, usize)>, String> {
    let Some(head) = parse_head(bytes)? else { return Ok(None) };
    let rest = &bytes[head.length..];
    match head.framing {
        Framing::Length(length) => {
            if rest.len() < length {
                return Ok(None);
            }
            Ok(Some((head.status, rest[..length].to_vec(), head.length + length)))
        }
        Framing::Chunked => {
            let mut decoder = Chunked::default();
            let mut body = Vec::new();
            let used = decoder.feed(rest, &mut body)?;
            if !decoder.is_done() {
                return Ok(None);
            }
            Ok(Some((head.status, body, head.length + used)))
        }
        Framing::Close => Err("a response with neither content-length nor chunked framing".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_delimited_and_chunked_responses_parse_in_any_split() {
        let one = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello";
        let two = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let both: Vec<u8> = [&one[..], &two[..]].concat();
        for cut in 0..both.len() {
            let front = parse_response(&both[..cut]).unwrap();
            if cut < one.len() {
                assert!(front.is_none(), "complete at {cut}?");
            }
        }
        let (status, body, used) = parse_response(&both).unwrap().unwrap();
        assert_eq!((status, body.as_slice(), used), (200, &b"hello"[..], one.len()));
        let (status, body, used) = parse_response(&both[used..]).unwrap().unwrap();
        assert_eq!((status, body.as_slice(), used), (404, &b"abcde"[..], two.len()));
        assert!(parse_response(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn a_chunked_stream_decodes_byte_by_byte() {
        let body = b"7\r\nevent: \r\n8\r\nrecord\n\n\r\n0\r\n\r\n";
        let mut decoder = Chunked::default();
        let mut out = Vec::new();
        for byte in body {
            decoder.feed(std::slice::from_ref(byte), &mut out).unwrap();
        }
        assert_eq!(out, b"event: record\n\n");
        assert!(decoder.is_done());
    }

    #[test]
    fn requests_carry_their_length() {
        let bytes = request("POST", "h:1", "/streams/s?key=a", Some("application/x-ndjson"), None, b"{}\n");
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("POST /streams/s?key=a HTTP/1.1\r\nHost: h:1\r\n"));
        assert!(text.ends_with("Content-Length: 3\r\n\r\n{}\n"));
        assert!(!text.contains("Authorization"));
        let bytes = request("GET", "h:1", "/views/v/k1", None, Some("Bearer oht_x"), b"");
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(text, "GET /views/v/k1 HTTP/1.1\r\nHost: h:1\r\nAuthorization: Bearer oht_x\r\n\r\n");
        assert_eq!(encode("tags/t3"), "tags%2Ft3");
    }
}
