//! Blocking connections for the measured clients, over plain TCP or TLS, in two halves: one
//! thread writes (the scheduler, or a subscriber's acknowledgements), another reads (answers,
//! deliveries). Over plain TCP each half is a clone of the socket, as before TLS existed: no
//! lock, no copy. Over TLS both halves share the session, which numbers its records: sealing
//! and opening take turns on it, and a sealed record is written before the session is let go
//! of by anyone who could seal the next one.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ClientConnection;

use super::rxstamp;
use super::tls::{self, TlsClient};

/// How a measured client reaches the server: the address, and TLS when the target speaks it.
#[derive(Clone, Debug)]
pub struct Dial {
    /// `host:port`
    pub address: String,
    pub tls: Option<TlsClient>,
}

impl Dial {
    pub fn plain(address: &str) -> Dial {
        Dial { address: address.to_string(), tls: None }
    }

    /// Connects, and runs the TLS handshake when there is one: nothing measured waits for it.
    pub fn connect(&self) -> io::Result<(LinkWriter, LinkReader)> {
        let mut socket = TcpStream::connect(&self.address)?;
        socket.set_nodelay(true)?;
        let shared = match &self.tls {
            Some(client) => Some(Arc::new(Shared {
                session: Mutex::new(client.handshake(&mut socket)?),
                socket: Mutex::new(socket.try_clone()?),
            })),
            None => None,
        };
        let writer = LinkWriter { socket: socket.try_clone()?, shared: shared.clone(), sealed: Vec::new() };
        let reader = LinkReader {
            socket,
            tls: shared.map(|shared| TlsReading { shared, cipher: vec![0; 64 * 1024], plain: Vec::new(), at: 0 }),
            stamped: false,
            arrived: None,
        };
        Ok((writer, reader))
    }
}

/// A TLS session shared by a connection's two halves.
struct Shared {
    /// Records carry sequence numbers: one half at a time seals or opens.
    session: Mutex<ClientConnection>,
    /// Taken before the session is released and held until the sealed bytes are written, so
    /// records reach the socket in the order they were numbered. A writer blocked on a full
    /// socket holds only this, and the reader keeps opening what arrives.
    socket: Mutex<TcpStream>,
}

impl Shared {
    /// Seals what `session` has queued (plaintext written to it, or its own messages) and
    /// writes it out, in order.
    fn flush(&self, mut session: std::sync::MutexGuard<'_, ClientConnection>, sealed: &mut Vec<u8>) -> io::Result<()> {
        sealed.clear();
        while session.wants_write() {
            session.write_tls(sealed)?;
        }
        let mut socket = self.socket.lock().expect("the TLS socket");
        drop(session);
        socket.write_all(sealed)
    }
}

/// The writing half.
pub struct LinkWriter {
    socket: TcpStream,
    shared: Option<Arc<Shared>>,
    /// Sealed records on their way out, kept to reuse the allocation.
    sealed: Vec<u8>,
}

impl LinkWriter {
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(shared) = &self.shared else { return self.socket.write_all(bytes) };
        let mut session = shared.session.lock().expect("the TLS session");
        session.writer().write_all(bytes)?;
        shared.flush(session, &mut self.sealed)
    }

    /// Ends the connection both ways: the reading half sees it end.
    pub fn shutdown(&self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

struct TlsReading {
    shared: Arc<Shared>,
    /// Bytes as read off the socket.
    cipher: Vec<u8>,
    /// Opened bytes not yet handed out, from `at` on.
    plain: Vec<u8>,
    at: usize,
}

/// The reading half.
pub struct LinkReader {
    socket: TcpStream,
    tls: Option<TlsReading>,
    stamped: bool,
    /// The kernel's arrival stamp of the read that produced the plaintext being handed out.
    arrived: Option<u64>,
}

impl LinkReader {
    /// Asks the kernel to stamp arriving bytes; reads then return their arrival time.
    pub fn stamp_arrivals(&mut self) -> bool {
        self.stamped = rxstamp::enable(self.socket.as_raw_fd()).is_ok();
        self.stamped
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket.set_read_timeout(timeout)
    }

    /// Reads what has arrived into `buf`, waiting for something (or the read timeout): the
    /// bytes read (0 once the server has closed the connection) and, when stamping, when they
    /// reached the socket in wall-clock nanoseconds.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
        let (socket, stamped) = (&mut self.socket, self.stamped);
        let mut receive = |into: &mut [u8]| {
            if stamped {
                rxstamp::recv(socket.as_raw_fd(), into, false)
            } else {
                socket.read(into).map(|read| (read, None))
            }
        };
        let Some(tls) = &mut self.tls else { return receive(buf) };
        loop {
            if tls.at < tls.plain.len() {
                let count = buf.len().min(tls.plain.len() - tls.at);
                buf[..count].copy_from_slice(&tls.plain[tls.at..tls.at + count]);
                tls.at += count;
                if tls.at == tls.plain.len() {
                    tls.plain.clear();
                    tls.at = 0;
                }
                return Ok((count, self.arrived));
            }
            let (read, arrived) = receive(&mut tls.cipher)?;
            if read == 0 {
                return Ok((0, None));
            }
            self.arrived = arrived;
            let mut session = tls.shared.session.lock().expect("the TLS session");
            let closed = tls::decrypt(&mut session, &tls.cipher[..read], &mut tls.plain)?;
            if session.wants_write() {
                // An answer the protocol itself owes (a key update, an alert).
                tls.shared.flush(session, &mut Vec::new())?;
            } else {
                drop(session);
            }
            if closed && tls.plain.is_empty() {
                return Ok((0, None));
            }
        }
    }
}
