//! One Kafka connection: a size-prefixed frame, its request header, the request, its answer,
//! in order, one request at a time.

use std::net::SocketAddr;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use super::groups::api as groups;
use super::sasl::{self, Session};
use super::transactions::api as txns;
use super::{PROTOCOL_ERRORS, REQUESTS, Shared, configs, fetch, offsets, produce, topics, versions};

/// Why a connection ends.
#[derive(Debug)]
enum End {
    /// The client closed it, or went idle past the timeout.
    Closed,
    /// The client broke the protocol; said in the log, counted, and the connection closed.
    Protocol(String),
}

/// Serves one connection until it closes, breaks the protocol or the server stops.
/// A verified client certificate (`certificate_user`) logs the connection in as its user, as
/// Kafka's SSL listeners with client authentication do; SASL may still follow.
pub(super) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    shared: &Shared,
    endpoint: std::sync::Arc<super::KafkaListener>,
    certificate_user: crate::tls::CertificateUser,
) {
    let mut stop = shared.stop.clone();
    let mut session = Session::new(&shared.engine);
    if let Some(user) = certificate_user {
        session.log_in_with_certificate(&shared.engine, &user);
    }
    let login_deadline = tokio::time::Instant::now() + shared.config.authentication_timeout;
    let end = loop {
        // Once users exist, a connection must log in in time (SASL, or a client certificate),
        // unless anonymous clients are granted something.
        let must_log_in = !session.authenticated && !shared.engine.access().anonymous_welcome();
        // Reading a frame is not cancel-safe (a size read and then dropped would misalign the
        // stream); it is cancelled only here, when the server stops or the time to log in is
        // up, and the connection ends.
        let frame = tokio::select! {
            frame = read_frame(&mut stream, shared) => frame,
            _ = stop.wait_for(|stop| *stop) => break End::Closed,
            () = tokio::time::sleep_until(login_deadline), if must_log_in => {
                metrics::counter!(super::AUTHENTICATION_TIMEOUTS).increment(1);
                break End::Protocol(format!(
                    "no SASL login within kafka_authentication_timeout_s ({} s)",
                    shared.config.authentication_timeout.as_secs()
                ));
            }
        };
        // The permit holds the frame's bytes against the listener's budget until it is answered.
        let (frame, _permit) = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break End::Closed,
            Err(end) => break end,
        };
        let answer = match handle(frame, shared, &endpoint, peer, &mut session).await {
            Ok(answer) => answer,
            Err(reason) => break End::Protocol(reason),
        };
        if let Some(answer) = answer {
            // A client that stops reading its answers is let go, not waited for forever.
            match tokio::time::timeout(shared.config.idle_timeout, stream.write_all(&answer)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break End::Closed,
                Err(_) => break End::Protocol("the client did not read its answer within the idle timeout".into()),
            }
        }
        if let Some(reason) = session.close_after_answer.take() {
            break End::Protocol(reason);
        }
        // Over its user's publish rates: the answer said how long to wait (throttle_time_ms),
        // and the connection reads nothing more until then, as Kafka mutes a throttled
        // channel (KIP-219).
        if let Some(wait) = session.muted_for.take() {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|stop| *stop) => break End::Closed,
            }
        }
    };
    if let End::Protocol(reason) = end {
        metrics::counter!(PROTOCOL_ERRORS).increment(1);
        tracing::info!(%peer, %reason, "Kafka connection closed: protocol error");
    }
    let _ = stream.shutdown().await;
}

/// Reads the next request frame, with a permit for its bytes from the listener's memory budget
/// (a frame waits for room while other requests hold it): `Ok(None)` when the client closed
/// the connection or stayed idle past the timeout between requests. A frame that has begun
/// must keep arriving: a read that brings nothing for `frame_read_timeout` closes the
/// connection.
async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    shared: &Shared,
) -> Result<Option<(Bytes, OwnedSemaphorePermit)>, End> {
    let mut size = [0u8; 4];
    match tokio::time::timeout(shared.config.idle_timeout, stream.read_exact(&mut size)).await {
        Err(_) | Ok(Err(_)) => return Ok(None),
        Ok(Ok(_)) => {}
    }
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > shared.config.request_bytes_max {
        return Err(End::Protocol(format!(
            "a request frame of {size} bytes (request_bytes_max is {})",
            shared.config.request_bytes_max
        )));
    }
    let size = size as usize;
    let permits = size.min(shared.config.request_bytes_in_flight_max).max(1) as u32;
    let Ok(permit) = shared.request_bytes.clone().acquire_many_owned(permits).await else {
        return Ok(None);
    };
    let mut body = vec![0u8; size];
    let mut filled = 0;
    while filled < size {
        match tokio::time::timeout(shared.config.frame_read_timeout, stream.read(&mut body[filled..])).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(read)) => filled += read,
            Err(_) => return Err(End::Protocol("a request frame stopped arriving before its end".into())),
        }
    }
    Ok(Some((Bytes::from(body), permit)))
}

/// A request frame, decoded.
pub enum Decoded {
    Request {
        api: ApiKey,
        version: i16,
        header: RequestHeader,
        request: Box<RequestKind>,
    },
    /// An ApiVersions request of a version not served: answered in version 0 with the list.
    ApiVersionsTooNew {
        correlation_id: i32,
    },
}

/// Decodes one request frame (without its size): the request, or why the connection must close.
pub fn decode_request(mut frame: Bytes) -> Result<Decoded, String> {
    if frame.len() < 8 {
        return Err(format!("a request frame of {} bytes, shorter than any request header", frame.len()));
    }
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let api = ApiKey::try_from(key).map_err(|_| format!("unknown API key {key}"))?;
    let Some(served) = versions::served(api) else {
        return Err(format!("{api:?} is not served"));
    };
    if !served.contains(&version) {
        if api == ApiKey::ApiVersions {
            return Ok(Decoded::ApiVersionsTooNew { correlation_id });
        }
        return Err(format!("{api:?} version {version} is not served (versions {served:?})"));
    }
    let header_version = api.request_header_version(version);
    let header =
        RequestHeader::decode(&mut frame, header_version).map_err(|error| format!("request header: {error}"))?;
    let request =
        RequestKind::decode(api, &mut frame, version).map_err(|error| format!("{api:?} v{version}: {error}"))?;
    if frame.has_remaining() {
        return Err(format!("{api:?} v{version}: {} bytes after the request", frame.remaining()));
    }
    Ok(Decoded::Request { api, version, header, request: Box::new(request) })
}

/// Answers one request frame: the framed response, `None` when none is due (a Produce with
/// `acks = 0`), or why the connection must close.
async fn handle(
    frame: Bytes,
    shared: &Shared,
    endpoint: &super::KafkaListener,
    peer: SocketAddr,
    session: &mut Session,
) -> Result<Option<Bytes>, String> {
    let (api, version, header, request) = match decode_request(frame)? {
        // A client newer than this server: the answer, in version 0, lists what is served.
        Decoded::ApiVersionsTooNew { correlation_id } => {
            return Ok(Some(frame_response(correlation_id, 0, &versions::unsupported(), 0)?));
        }
        Decoded::Request { api, version, header, request } => (api, version, header, *request),
    };
    metrics::counter!(REQUESTS, "api" => api_name(api)).increment(1);
    // Once users exist, a client says who it is with SASL before anything else, as on a
    // Kafka listener with SASL: anything else first closes the connection.
    let sasl = matches!(api, ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate);
    if !sasl && !session.may_proceed(&shared.engine) {
        crate::access::login_failed("kafka", None, "a request before SASL authentication");
        return Err(format!("{} before SASL authentication, on a server that has users", api_name(api)));
    }
    if !sasl && session.expired() {
        return Err(format!(
            "{}: the token this connection logged in with has expired and the client did not log in again",
            api_name(api)
        ));
    }
    // Brought up to date once per change to access, so each check reads what the connection
    // holds; a user dropped since it logged in is let go.
    if let Err(error) = shared.engine.access().refresh(&mut session.principal) {
        return Err(format!("{}: {}", api_name(api), error.message()));
    }
    let who = &session.principal.clone();
    let response_header = api.response_header_version(version);
    let id = header.correlation_id;
    let framed = match request {
        RequestKind::ApiVersions(_) => frame_response(id, response_header, &versions::answer(), version)?,
        RequestKind::SaslHandshake(request) => {
            let mut answer = sasl::handshake(session, request);
            if version == 0 {
                answer.error_code = kafka_protocol::ResponseError::UnsupportedVersion.code();
                session.close_after_answer = Some("SaslHandshake version 0 (unframed SASL) is not served".into());
            }
            frame_response(id, response_header, &answer, version)?
        }
        RequestKind::SaslAuthenticate(request) => {
            let answer = sasl::authenticate(&shared.engine, session, request, version, peer.ip()).await;
            frame_response(id, response_header, &answer, version)?
        }
        RequestKind::Metadata(request) => {
            let answer = topics::metadata(shared, endpoint, who, request, version).await;
            frame_response(id, response_header, &answer, version)?
        }
        RequestKind::DescribeCluster(request) => {
            frame_response(id, response_header, &topics::describe_cluster(shared, endpoint, request), version)?
        }
        RequestKind::CreateTopics(request) => {
            frame_response(id, response_header, &topics::create(shared, who, request).await, version)?
        }
        RequestKind::DeleteTopics(request) => {
            frame_response(id, response_header, &topics::delete(shared, who, request).await, version)?
        }
        RequestKind::CreatePartitions(request) => {
            frame_response(id, response_header, &topics::create_partitions(shared, who, request).await, version)?
        }
        RequestKind::Produce(request) => {
            let (answer, wait) = produce::produce(shared, who, request).await;
            if !wait.is_zero() {
                crate::access::publish_throttled("kafka");
                session.muted_for = Some(wait);
            }
            match answer {
                Some(answer) => frame_response(id, response_header, &answer, version)?,
                None => return Ok(None),
            }
        }
        RequestKind::Fetch(request) => {
            frame_response(id, response_header, &fetch::fetch(shared, who, request).await, version)?
        }
        RequestKind::InitProducerId(request) => {
            let answer = produce::init_producer_id(shared, who, request, version).await;
            frame_response(id, response_header, &answer, version)?
        }
        RequestKind::AlterConfigs(request) => {
            frame_response(id, response_header, &configs::alter_configs(shared, who, request).await, version)?
        }
        RequestKind::IncrementalAlterConfigs(request) => frame_response(
            id,
            response_header,
            &configs::incremental_alter_configs(shared, who, request).await,
            version,
        )?,
        RequestKind::DescribeConfigs(request) => {
            frame_response(id, response_header, &configs::describe_configs(shared, who, request), version)?
        }
        RequestKind::OffsetForLeaderEpoch(request) => {
            frame_response(id, response_header, &offsets::offset_for_leader_epoch(shared, who, request), version)?
        }
        RequestKind::ListOffsets(request) => {
            frame_response(id, response_header, &offsets::list_offsets(shared, who, request, version), version)?
        }
        RequestKind::FindCoordinator(request) => {
            frame_response(id, response_header, &groups::find_coordinator(shared, endpoint, request, version), version)?
        }
        RequestKind::JoinGroup(request) => {
            let client = header.client_id.as_ref().map_or("", |client| client.as_str());
            let host = format!("/{}", peer.ip());
            let answer = groups::join_group(shared, who, request, version, client, &host).await;
            frame_response(id, response_header, &answer, version)?
        }
        RequestKind::SyncGroup(request) => {
            frame_response(id, response_header, &groups::sync_group(shared, who, request).await, version)?
        }
        RequestKind::Heartbeat(request) => {
            frame_response(id, response_header, &groups::heartbeat(shared, who, request), version)?
        }
        RequestKind::LeaveGroup(request) => {
            frame_response(id, response_header, &groups::leave_group(shared, who, request), version)?
        }
        RequestKind::OffsetCommit(request) => {
            frame_response(id, response_header, &groups::offset_commit(shared, who, request).await, version)?
        }
        RequestKind::OffsetFetch(request) => {
            frame_response(id, response_header, &groups::offset_fetch(shared, who, request), version)?
        }
        RequestKind::ListGroups(request) => {
            frame_response(id, response_header, &groups::list_groups(shared, who, request), version)?
        }
        RequestKind::DescribeGroups(request) => {
            frame_response(id, response_header, &groups::describe_groups(shared, who, request), version)?
        }
        RequestKind::OffsetDelete(request) => {
            frame_response(id, response_header, &groups::offset_delete(shared, who, request).await, version)?
        }
        RequestKind::DeleteRecords(request) => {
            frame_response(id, response_header, &super::admin::delete_records(shared, who, request), version)?
        }
        RequestKind::DescribeLogDirs(request) => {
            frame_response(id, response_header, &super::admin::describe_log_dirs(shared, who, request), version)?
        }
        RequestKind::DeleteGroups(request) => {
            frame_response(id, response_header, &groups::delete_groups(shared, who, request).await, version)?
        }
        RequestKind::AddPartitionsToTxn(request) => {
            let answer = txns::add_partitions_to_txn(shared, who, request, version).await;
            frame_response(id, response_header, &answer, version)?
        }
        RequestKind::AddOffsetsToTxn(request) => {
            let answer = txns::add_offsets_to_txn(shared, who, request, version).await;
            frame_response(id, response_header, &answer, version)?
        }
        RequestKind::TxnOffsetCommit(request) => {
            frame_response(id, response_header, &txns::txn_offset_commit(shared, who, request, version).await, version)?
        }
        RequestKind::EndTxn(request) => {
            frame_response(id, response_header, &txns::end_txn(shared, who, request, version).await, version)?
        }
        RequestKind::DescribeTransactions(request) => {
            frame_response(id, response_header, &txns::describe_transactions(shared, request), version)?
        }
        RequestKind::ListTransactions(request) => {
            frame_response(id, response_header, &txns::list_transactions(shared, request), version)?
        }
        _ => return Err(format!("{api:?} is not served")),
    };
    Ok(Some(framed))
}

/// A response's frame: its size, the response header, the body.
fn frame_response(
    correlation_id: i32,
    header_version: i16,
    body: &impl Encodable,
    version: i16,
) -> Result<Bytes, String> {
    let mut buffer = BytesMut::with_capacity(64);
    buffer.put_i32(0);
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    header.encode(&mut buffer, header_version).map_err(|error| format!("encoding a response header: {error}"))?;
    body.encode(&mut buffer, version).map_err(|error| format!("encoding a response: {error}"))?;
    let size = (buffer.len() - 4) as i32;
    buffer[..4].copy_from_slice(&size.to_be_bytes());
    Ok(buffer.freeze())
}

/// The API's name, as a metric label.
fn api_name(api: ApiKey) -> &'static str {
    match api {
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::Metadata => "Metadata",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::DeleteTopics => "DeleteTopics",
        ApiKey::CreatePartitions => "CreatePartitions",
        ApiKey::Produce => "Produce",
        ApiKey::Fetch => "Fetch",
        ApiKey::ListOffsets => "ListOffsets",
        ApiKey::OffsetForLeaderEpoch => "OffsetForLeaderEpoch",
        ApiKey::InitProducerId => "InitProducerId",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::AlterConfigs => "AlterConfigs",
        ApiKey::IncrementalAlterConfigs => "IncrementalAlterConfigs",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::ListGroups => "ListGroups",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::DeleteGroups => "DeleteGroups",
        ApiKey::DescribeCluster => "DescribeCluster",
        ApiKey::AddPartitionsToTxn => "AddPartitionsToTxn",
        ApiKey::AddOffsetsToTxn => "AddOffsetsToTxn",
        ApiKey::TxnOffsetCommit => "TxnOffsetCommit",
        ApiKey::EndTxn => "EndTxn",
        ApiKey::DescribeTransactions => "DescribeTransactions",
        ApiKey::ListTransactions => "ListTransactions",
        ApiKey::SaslHandshake => "SaslHandshake",
        ApiKey::SaslAuthenticate => "SaslAuthenticate",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{Semaphore, watch};

    use super::*;
    use crate::kafka::{KafkaConfig, groups, producers, transactions};

    async fn shared(dir: &std::path::Path, budget: usize) -> Shared {
        let engine = Arc::new(onehop_engine::Engine::open_in(dir, onehop_engine::EngineOptions::default()).unwrap());
        let mut config = KafkaConfig::new();
        config.request_bytes_in_flight_max = budget;
        config.frame_read_timeout = Duration::from_millis(200);
        let producers = Arc::new(producers::Producers::open(&engine).unwrap());
        let groups = Arc::new(groups::Coordinator::new(groups::committed::CommittedOffsets::open(&engine).unwrap()));
        let transactions =
            Arc::new(transactions::Transactions::open(&engine, producers.clone(), groups.clone()).unwrap());
        let (_stop, stop) = watch::channel(false);
        let request_bytes = Arc::new(Semaphore::new(budget));
        Shared { engine, config, producers, groups, transactions, request_bytes, stop, cluster: Default::default() }
    }

    /// A connected pair: the client's end and the server's.
    async fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn a_stalled_frame_closes_and_frames_wait_for_room_in_the_memory_budget() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path(), 1000).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();

        // A frame that stops arriving: closed once a read brings nothing for the timeout.
        let (mut client, mut server) = pair(&listener).await;
        client.write_all(&500i32.to_be_bytes()).await.unwrap();
        client.write_all(&[0u8; 10]).await.unwrap();
        let stalled = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut server, &shared)).await.unwrap();
        assert!(matches!(stalled, Err(End::Protocol(_))));

        // Two frames of 800 bytes against a budget of 1 000: the second waits for the first.
        let (mut first_client, mut first_server) = pair(&listener).await;
        let (mut second_client, mut second_server) = pair(&listener).await;
        for client in [&mut first_client, &mut second_client] {
            client.write_all(&800i32.to_be_bytes()).await.unwrap();
            client.write_all(&[7u8; 800]).await.unwrap();
        }
        let (first, permit) = read_frame(&mut first_server, &shared).await.unwrap().unwrap();
        assert_eq!(first.len(), 800);
        let shared = Arc::new(shared);
        let reader = shared.clone();
        let mut second = tokio::spawn(async move {
            let (frame, _permit) = read_frame(&mut second_server, &reader).await.unwrap().unwrap();
            frame
        });
        let waiting = tokio::time::timeout(Duration::from_millis(300), &mut second).await;
        assert!(waiting.is_err(), "the second frame waits while the first holds the budget");
        drop(permit);
        let second = tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap();
        assert_eq!(&second[..], &[7u8; 800][..]);
    }
}
