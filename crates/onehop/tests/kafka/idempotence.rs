use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::common::{DataDir, get, line_channel};
use crate::group_of_three::{assert_stored_once_where_acknowledged, collect_acknowledgements};

/// A TCP proxy in front of `target` that, on demand, loses the server's answers: after
/// [`CuttingProxy::cut`], each connection open at the time drops the next bytes the server
/// sends and closes both ways. The requests before them were served, and their answers
/// never arrive: what a network cut in the middle of a produce looks like to a client.
struct CuttingProxy {
    address: SocketAddr,
    cuts: Arc<AtomicU64>,
}

impl CuttingProxy {
    fn start(target: SocketAddr) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let cuts = Arc::new(AtomicU64::new(0));
        let shared = cuts.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(target) else { continue };
                let seen = shared.load(Ordering::SeqCst);
                let (client_in, server_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pump(client_in, server_out, None));
                let cuts = shared.clone();
                std::thread::spawn(move || pump(server, client, Some((cuts, seen))));
            }
        });
        CuttingProxy { address, cuts }
    }

    /// Loses the next answer on every connection open now.
    fn cut(&self) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes; with `cut`, drops the first bytes read after a
/// cut newer than the connection's and closes both.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: Option<(Arc<AtomicU64>, u64)>) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if let Some((cuts, seen)) = &cut
            && cuts.load(Ordering::SeqCst) > *seen
        {
            break;
        }
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// An idempotent librdkafka producer (confluent-kafka, acks=all, lz4) reaches the server
/// through a proxy (`--kafka-advertised-addr` tells clients to come through it) that three
/// times loses the answers in flight: the batches were stored, the producer never heard, and
/// it sends them again on a new connection. The server recognises each retried batch
/// (`kafka_duplicate_batches_total` counts them) and answers with the offsets it gave them:
/// every record is acknowledged at the offset it is stored at, and none is stored twice.
#[test]
fn a_batch_retried_after_its_answer_was_lost_is_stored_once() {
    let dir = DataDir::new();
    let kafka: SocketAddr = format!("127.0.0.1:{}", crate::free_port()).parse().unwrap();
    let proxy = CuttingProxy::start(kafka);
    let advertised = proxy.address.to_string();
    let server = dir.start(&["--kafka-addr", &kafka.to_string(), "--kafka-advertised-addr", &advertised], &[]);
    let mut producer = crate::librdkafka::confluent(&["produce", &advertised, "ledger", "0", "4000"]);
    let acks = line_channel(producer.stdout.take().unwrap());
    let mut cuts_at = vec![2500, 1500, 500];
    let acked = collect_acknowledgements(&acks, |acknowledged| {
        if cuts_at.last().is_some_and(|at| acknowledged >= *at) {
            cuts_at.pop();
            proxy.cut();
        }
    });
    assert!(producer.wait().unwrap().success());
    assert!(cuts_at.is_empty());

    let (_, metrics) = get(server.address, "/metrics");
    let duplicates = metrics
        .lines()
        .find_map(|line| line.strip_prefix("kafka_duplicate_batches_total "))
        .map(|value| value.trim().parse::<f64>().unwrap())
        .unwrap();
    assert!(duplicates >= 1.0, "no retried batch reached the server: the cuts lost no answer");
    assert_stored_once_where_acknowledged(server.address, "ledger", &acked, 4000);
}
