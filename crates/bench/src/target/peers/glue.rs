//! The harness's side of a glue process (`bench/baselines/glue`): the producer and consumer an
//! application around a broker would run, reporting to the harness over two loopback
//! connections (the protocol is in the glue's `main.go`). The W2 stack's Node.js glue
//! (`bench/baselines/stack-node`) opens the producer's connection only, takes each event's
//! subject on its line, and notifies its subscribers at the harness's HTTP endpoint instead.
//!
//! The harness keeps every clock: an event is sent when its line is written to the glue, it is
//! acknowledged when the glue's answer reaches the harness, and it is received (or committed)
//! when the consumer's report does. Reports are stamped by the kernel on arrival, like a
//! subscriber's receipt from onehop, so the harness's own reading time is known per sample.
//! What the glue adds beyond the broker's client library is one loopback hop each way.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::PeerProcess;
use crate::client::rxstamp;
use crate::recorder::{Delivery, Receipts, Recorder};
use crate::schedule::Producer;
use crate::target::{Observers, Session};

/// How long a glue process may take to prepare the broker side (topic, consumer group) and
/// connect back: a new topic on a fresh three-broker cluster takes seconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(150);
/// A report line longer than this is a broken glue, not a record.
const LINE_BYTES_MAX: usize = 4096;

/// A glue process ready for a run: its connections open.
pub struct Glue {
    process: PeerProcess,
    produce: TcpStream,
    /// The consumer's reports; `None` for a glue whose consumer reports elsewhere (the W2
    /// stack notifies the harness's HTTP endpoint).
    observe: Option<TcpStream>,
    /// What each event's line carries after its intended time (its subject), if anything.
    subject_of: Option<SubjectOf>,
}

/// The subject of event `seq`, written on its line to the glue.
pub type SubjectOf = Box<dyn Fn(u64) -> String + Send>;

/// Reads a glue's report connection until the flag is set, recording what it reports.
pub type ReportReader = fn(TcpStream, Arc<Recorder>, Arc<AtomicBool>);

impl Glue {
    /// Starts the glue with `args` (and `--harness` pointing at a fresh loopback listener),
    /// and waits until it has connected back twice.
    pub fn start(program: &std::path::Path, args: &[String], log: std::path::PathBuf) -> anyhow::Result<Glue> {
        Glue::start_command(std::process::Command::new(program), args, log, true)
    }

    /// Starts `command` with `args` (and `--harness`), and waits for its `produce` connection,
    /// and its `observe` connection too when `observe`.
    pub fn start_command(
        mut command: std::process::Command,
        args: &[String],
        log: std::path::PathBuf,
        observe: bool,
    ) -> anyhow::Result<Glue> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the glue's port")?;
        listener.set_nonblocking(true)?;
        command.args(args).arg("--harness").arg(listener.local_addr()?.to_string());
        let mut process = PeerProcess::start("glue", command, log)?;
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let (mut produce, mut observer) = (None, None);
        while produce.is_none() || (observe && observer.is_none()) {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false)?;
                    stream.set_nodelay(true)?;
                    let mut stream = stream;
                    match read_role(&mut stream)?.as_str() {
                        "produce" => produce = Some(stream),
                        "observe" if observe => observer = Some(stream),
                        other => bail!("the glue named an unknown connection {other:?}"),
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    process.check_running()?;
                    if Instant::now() > deadline {
                        bail!(
                            "the glue did not connect within {CONNECT_TIMEOUT:?}; its log: {}",
                            process.log.display()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(error) => return Err(error).context("accepting the glue's connection"),
            }
        }
        Ok(Glue { process, produce: produce.expect("connected"), observe: observer, subject_of: None })
    }

    /// The glue process's PID, so a target can count its CPU and memory.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Writes each event's subject on its line (`P <seq> <intended_ns> <subject>`).
    pub fn with_subjects(self, subject_of: SubjectOf) -> Glue {
        Glue { subject_of: Some(subject_of), ..self }
    }

    /// The run's session: events go to the glue's producer; its consumer's receipts and commits
    /// come back as observer 0's deliveries and commits.
    pub fn session(self, recorder: &Arc<Recorder>) -> anyhow::Result<Session> {
        self.session_with(recorder, Observers::default())
    }

    /// The run's session, the glue's observers joining `observers` (ones the target started
    /// itself, such as the notify endpoint).
    pub fn session_with(self, recorder: &Arc<Recorder>, observers: Observers) -> anyhow::Result<Session> {
        self.session_reporting(recorder, observers, observe_reports)
    }

    /// The run's session, the glue's report connection read by `reports` (a glue that reports
    /// something other than receipts and commits: the W3 app's view rows).
    pub fn session_reporting(
        self,
        recorder: &Arc<Recorder>,
        mut observers: Observers,
        reports: ReportReader,
    ) -> anyhow::Result<Session> {
        let Glue { process, produce, observe, subject_of } = self;
        if let Some(observe) = observe {
            let (recorder, stop) = (recorder.clone(), observers.stop_flag());
            observers.add_thread(std::thread::Builder::new().name("bench-glue-observer".into()).spawn(move || {
                crate::priority::raise_this_thread();
                reports(observe, recorder, stop)
            })?);
        }
        let reader = {
            let (recorder, stream) = (recorder.clone(), produce.try_clone()?);
            std::thread::Builder::new().name("bench-glue-acks".into()).spawn(move || {
                crate::priority::raise_this_thread();
                read_answers(stream, recorder)
            })?
        };
        // The glue process lives until the observers have stopped, then is stopped by PID.
        observers.keep(Box::new(process));
        let producer = GlueProducer {
            writer: produce,
            recorder: recorder.clone(),
            reader: Some(reader),
            subject_of,
            out: Vec::new(),
        };
        Ok(Session { producer: Box::new(producer), querier: None, observers })
    }
}

/// The first line of a connection, read a byte at a time so nothing after it is consumed.
fn read_role(stream: &mut TcpStream) -> anyhow::Result<String> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 64 {
        stream.read_exact(&mut byte).context("reading the glue's greeting")?;
        if byte[0] == b'\n' {
            stream.set_read_timeout(None)?;
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
    }
    bail!("the glue's greeting is too long")
}

/// Splits complete lines off `buffer`, handing each to `line`; keeps a partial last line.
fn take_lines(buffer: &mut Vec<u8>, line: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
    let mut start = 0;
    while let Some(end) = buffer[start..].iter().position(|byte| *byte == b'\n') {
        line(std::str::from_utf8(&buffer[start..start + end]).unwrap_or_default());
        start += end + 1;
    }
    buffer.drain(..start);
    if buffer.len() > LINE_BYTES_MAX {
        bail!("the glue sent a line of more than {LINE_BYTES_MAX} bytes");
    }
    Ok(())
}

/// `R <seq>` / `C <seq>` / `A <seq>` / `F <seq> <reason>`: the kind and the sequence number.
fn parse(line: &str) -> Option<(char, u64, &str)> {
    let mut words = line.splitn(3, ' ');
    let kind = words.next()?.chars().next()?;
    let seq = words.next()?.parse().ok()?;
    Some((kind, seq, words.next().unwrap_or_default()))
}

/// Takes the glue's answers to the producer until the connection closes.
fn read_answers(mut stream: TcpStream, recorder: Arc<Recorder>) {
    let mut buffer = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let total = recorder.events.schedule.total();
    loop {
        let read = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let now_ns = recorder.clock.now_ns();
        buffer.extend_from_slice(&chunk[..read]);
        let result = take_lines(&mut buffer, &mut |line| match parse(line) {
            Some(('A', seq, _)) if seq < total => recorder.events.answered(seq, now_ns, true),
            Some(('F', seq, reason)) if seq < total => {
                recorder.events.answered(seq, now_ns, false);
                recorder.problem(format!("the producer failed event {seq}: {reason}"));
            }
            _ => recorder.problem(format!("the glue answered {line:?}")),
        });
        if let Err(error) = result {
            recorder.problem(format!("{error:#}"));
            return;
        }
    }
}

/// Reads a report connection until `stop` or its end, handing each complete line to `line` with
/// the time the harness read it and the kernel's arrival stamp (0 without one); `line` returns
/// how many receipts the line was, for the live count. Returns why it ended early, if it did.
pub fn read_reports(
    mut stream: TcpStream,
    recorder: &Recorder,
    stop: &AtomicBool,
    line: &mut dyn FnMut(&str, u64, u64) -> u64,
) -> Option<String> {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let stamped = rxstamp::enable(stream.as_raw_fd()).is_ok();
    let mut buffer = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 256 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let read = if stamped {
            rxstamp::recv(stream.as_raw_fd(), &mut chunk, false)
        } else {
            stream.read(&mut chunk).map(|read| (read, None))
        };
        let (read, arrived) = match read {
            Ok((0, _)) => return Some("the glue closed its report connection".into()),
            Ok(read) => read,
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                continue;
            }
            Err(error) => return Some(format!("the glue's report connection: {error}")),
        };
        let received_ns = recorder.clock.now_ns();
        let arrived_ns = rxstamp::arrival_on_clock(received_ns, arrived);
        buffer.extend_from_slice(&chunk[..read]);
        let mut count = 0;
        let result = take_lines(&mut buffer, &mut |text| count += line(text, received_ns, arrived_ns));
        recorder.count_received(count);
        if let Err(error) = result {
            return Some(format!("{error:#}"));
        }
    }
    None
}

/// Records the consumer's receipts (`R`) as deliveries to observer 0, and its commits (`C`),
/// until `stop`.
fn observe_reports(stream: TcpStream, recorder: Arc<Recorder>, stop: Arc<AtomicBool>) {
    let mut deliveries = Receipts::new();
    let mut commits = Receipts::new();
    let total = recorder.events.schedule.total();
    let ended = read_reports(stream, &recorder, &stop, &mut |line, received_ns, arrived_ns| match parse(line) {
        Some(('R', seq, _)) if seq < total => {
            deliveries.push(Delivery { seq, observer: 0, received_ns, arrived_ns });
            1
        }
        Some(('C', seq, _)) if seq < total => {
            commits.push(Delivery { seq, observer: 0, received_ns, arrived_ns });
            0
        }
        _ => {
            recorder.problem(format!("the glue reported {line:?}"));
            0
        }
    });
    if let Some(why) = ended {
        recorder.observer_failed(why);
    }
    recorder.add_deliveries(deliveries);
    recorder.add_commits(commits);
}

/// Writes each due event to the glue as one line, all due ones in one write.
struct GlueProducer {
    writer: TcpStream,
    recorder: Arc<Recorder>,
    reader: Option<std::thread::JoinHandle<()>>,
    subject_of: Option<SubjectOf>,
    out: Vec<u8>,
}

impl Producer for GlueProducer {
    fn send(&mut self, seqs: Range<u64>) {
        let events = &self.recorder.events;
        self.out.clear();
        for seq in seqs.clone() {
            let _ = match &self.subject_of {
                Some(subject_of) => writeln!(self.out, "P {seq} {} {}", events.intended_ns(seq), subject_of(seq)),
                None => writeln!(self.out, "P {seq} {}", events.intended_ns(seq)),
            };
        }
        let sent_ns = events.clock.now_ns();
        for seq in seqs.clone() {
            events.sent(seq, sent_ns);
        }
        if let Err(error) = self.writer.write_all(&self.out) {
            let failed_ns = events.clock.now_ns();
            for seq in seqs {
                events.answered(seq, failed_ns, false);
            }
            self.recorder.problem(format!("writing to the glue: {error}"));
        }
    }
}

impl Drop for GlueProducer {
    fn drop(&mut self) {
        // Closing the socket ends the glue's producer and the answer reader's read.
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}
