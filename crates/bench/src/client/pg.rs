//! Just enough of the Postgres protocol (3.0) for the query benchmark: a login without a
//! password (Postgres's `trust`, onehop without users), simple queries, and a statement
//! parsed once and run many times with text parameters (Bind, Execute, Sync per run). The same
//! client reads onehop and Postgres, so neither side gains from a driver the other lacks.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, bail};

/// A row: each column's text, or `None` for null.
pub type Row = Vec<Option<String>>;

pub struct PgClient {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(5 + body.len());
    bytes.push(tag);
    bytes.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn cstring(into: &mut Vec<u8>, text: &str) {
    into.extend_from_slice(text.as_bytes());
    into.push(0);
}

/// An ErrorResponse's fields as `SQLSTATE: message`.
fn error_text(body: &[u8]) -> String {
    let (mut code, mut text) = (String::new(), String::new());
    for field in body.split(|byte| *byte == 0) {
        match field.split_first() {
            Some((b'C', rest)) => code = String::from_utf8_lossy(rest).into_owned(),
            Some((b'M', rest)) => text = String::from_utf8_lossy(rest).into_owned(),
            _ => {}
        }
    }
    format!("{code}: {text}")
}

impl PgClient {
    /// Connects to `address` (`host:port`) as `user` on `database`.
    pub fn connect(address: &str, user: &str, database: &str) -> anyhow::Result<PgClient> {
        let stream = TcpStream::connect(address).with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut client = PgClient { reader: BufReader::new(stream.try_clone()?), writer: BufWriter::new(stream) };
        let mut body = 0x0003_0000u32.to_be_bytes().to_vec();
        for (name, value) in [("user", user), ("database", database), ("client_encoding", "UTF8")] {
            cstring(&mut body, name);
            cstring(&mut body, value);
        }
        body.push(0);
        client.writer.write_all(&((body.len() + 4) as u32).to_be_bytes())?;
        client.writer.write_all(&body)?;
        client.writer.flush()?;
        loop {
            let (tag, body) = client.read()?;
            match tag {
                b'R' if body.get(..4) == Some(&[0, 0, 0, 0]) => {}
                b'R' => bail!("{address} asks for a password; the benchmark logs in without one"),
                b'E' => bail!("login to {address}: {}", error_text(&body)),
                b'Z' => return Ok(client),
                _ => {}
            }
        }
    }

    fn read(&mut self) -> anyhow::Result<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        self.reader.read_exact(&mut head).context("reading from the server")?;
        let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if !(4..=1 << 30).contains(&length) {
            bail!("a message of length {length}");
        }
        let mut body = vec![0; length - 4];
        self.reader.read_exact(&mut body)?;
        Ok((head[0], body))
    }

    /// Reads to ReadyForQuery: the rows, or the first error.
    fn rows(&mut self) -> anyhow::Result<Vec<Row>> {
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let (tag, body) = self.read()?;
            match tag {
                b'D' => rows.push(data_row(&body)?),
                b'E' => error = Some(error_text(&body)),
                b'Z' => break,
                _ => {}
            }
        }
        match error {
            Some(error) => bail!("{error}"),
            None => Ok(rows),
        }
    }

    /// Runs `sql` (one or more statements) with the simple query protocol.
    pub fn simple(&mut self, sql: &str) -> anyhow::Result<Vec<Row>> {
        let mut body = Vec::with_capacity(sql.len() + 1);
        cstring(&mut body, sql);
        self.writer.write_all(&message(b'Q', &body))?;
        self.writer.flush()?;
        self.rows()
    }

    /// Parses `sql` as the statement `name`, its parameters' types left to the server.
    pub fn prepare(&mut self, name: &str, sql: &str) -> anyhow::Result<()> {
        let mut body = Vec::new();
        cstring(&mut body, name);
        cstring(&mut body, sql);
        body.extend_from_slice(&0u16.to_be_bytes());
        self.writer.write_all(&message(b'P', &body))?;
        self.writer.write_all(&message(b'S', &[]))?;
        self.writer.flush()?;
        self.rows().map(drop)
    }

    /// Runs the statement `name` with `parameters` as text: Bind, Execute, Sync in one write.
    pub fn execute(&mut self, name: &str, parameters: &[&str]) -> anyhow::Result<Vec<Row>> {
        let mut bind = Vec::new();
        cstring(&mut bind, "");
        cstring(&mut bind, name);
        bind.extend_from_slice(&0u16.to_be_bytes());
        bind.extend_from_slice(&(parameters.len() as u16).to_be_bytes());
        for parameter in parameters {
            bind.extend_from_slice(&(parameter.len() as i32).to_be_bytes());
            bind.extend_from_slice(parameter.as_bytes());
        }
        bind.extend_from_slice(&0u16.to_be_bytes());
        let mut execute = Vec::new();
        cstring(&mut execute, "");
        execute.extend_from_slice(&0i32.to_be_bytes());
        let mut bytes = message(b'B', &bind);
        bytes.extend_from_slice(&message(b'E', &execute));
        bytes.extend_from_slice(&message(b'S', &[]));
        self.writer.write_all(&bytes)?;
        self.writer.flush()?;
        self.rows()
    }
}

fn data_row(body: &[u8]) -> anyhow::Result<Row> {
    let count = u16::from_be_bytes(body.get(..2).context("a short DataRow")?.try_into()?) as usize;
    let mut at = 2;
    let mut row = Vec::with_capacity(count);
    for _ in 0..count {
        let length = i32::from_be_bytes(body.get(at..at + 4).context("a short DataRow")?.try_into()?);
        at += 4;
        if length < 0 {
            row.push(None);
            continue;
        }
        let end = at + length as usize;
        row.push(Some(String::from_utf8_lossy(body.get(at..end).context("a short DataRow")?).into_owned()));
        at = end;
    }
    Ok(row)
}
