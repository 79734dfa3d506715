//! Request bodies: read whole before the handler runs, within three limits.
//!
//! - Size: a body over `body_bytes_max` is refused `413 body_too_large`, from its
//!   `Content-Length` before any of it is read, or as soon as a chunked one passes the limit.
//! - Memory: all bodies being read or handled at once hold at most `BodyBudget`'s bytes. A body
//!   with a `Content-Length` reserves all of it before its first byte is read, so a reader never
//!   holds half a body while waiting for room for the rest (thirty uploads each holding half
//!   could wait on each other for ever); a chunked one reserves as its chunks come. A body that
//!   finds no room within the read timeout is refused `503 server_busy`, unread.
//! - Progress: a body that sends nothing for the read timeout is refused `408 body_timeout`.
//!
//! Each refusal closes the connection (`Connection: close`): the rest of the body is unread.
//!
//! A body with a length is read into one buffer of exactly that size: no doubling as it grows,
//! no second copy to join the pieces. Once large bodies have come and gone, the budget can tell
//! the allocator to give their memory back (`BodyBudget::releasing_with`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// A body at least this large takes memory of its own from the allocator rather than reusing
/// its pages, and leaves it free behind when it goes: worth giving back after a burst.
const RELEASE_AFTER_KIB: u32 = 1024;

/// The bytes of request bodies that may be in memory at once, counted in KiB: a semaphore's
/// permits are taken 2^32 at a time at most, and KiB reach 4 TiB.
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    kib_max: usize,
    bytes_max: u64,
    /// Gives memory the allocator holds free back to the OS.
    release: Option<fn()>,
    /// A large body ended since the last release.
    release_due: AtomicBool,
}

impl BodyBudget {
    pub fn new(bytes_max: u64) -> Self {
        let kib_max = usize::try_from(bytes_max.div_ceil(1024)).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS);
        BodyBudget {
            permits: Arc::new(Semaphore::new(kib_max)),
            kib_max,
            bytes_max,
            release: None,
            release_due: AtomicBool::new(false),
        }
    }

    /// Calls `release` (on a blocking thread) when no body is in memory any more and a large one
    /// has ended since the last call. An allocator such as mimalloc returns freed memory to the
    /// OS only when it next allocates, so a server left idle after a burst of uploads would
    /// otherwise keep what they held.
    pub fn releasing_with(mut self, release: fn()) -> Self {
        self.release = Some(release);
        self
    }

    /// A reservation of `kib` was given back.
    fn returned(&self, kib: u32) {
        if kib >= RELEASE_AFTER_KIB {
            self.release_due.store(true, Ordering::Release);
        }
        if let Some(release) = self.release
            && self.permits.available_permits() == self.kib_max
            && self.release_due.swap(false, Ordering::AcqRel)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn_blocking(release);
        }
    }
}

/// What the middleware enforces: `AppState`'s body settings, in one piece (a request clones
/// one `Arc`, not the whole state).
pub struct Limits {
    pub bytes_max: usize,
    pub budget: Arc<BodyBudget>,
    pub read_timeout: Duration,
}

/// What one request holds of the budget, given back when dropped.
struct Reservation {
    budget: Arc<BodyBudget>,
    permits: Option<OwnedSemaphorePermit>,
    kib: u32,
}

impl Reservation {
    fn new(budget: &Arc<BodyBudget>) -> Self {
        Reservation { budget: budget.clone(), permits: None, kib: 0 }
    }

    fn bytes(&self) -> u64 {
        u64::from(self.kib) * 1024
    }

    /// Makes room for `bytes` in all, waiting at most `within` for others to give theirs back.
    async fn grow_to(&mut self, bytes: u64, within: Duration) -> Result<(), ApiError> {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        if kib <= self.kib {
            return Ok(());
        }
        let more = kib - self.kib;
        let budget = &self.budget;
        let acquired = tokio::time::timeout(within, budget.permits.clone().acquire_many_owned(more)).await;
        let Ok(Ok(permits)) = acquired else {
            return Err(ApiError {
                retry_after_s: None,
                hint: None,
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "server_busy",
                message: format!(
                    "request bodies being read already hold {} bytes (setting http_body_bytes_in_flight_max), and \
                     none finished within {} s; retry later",
                    budget.bytes_max,
                    within.as_secs()
                ),
            });
        };
        metrics::gauge!("http_body_in_flight_bytes").increment(f64::from(more) * 1024.0);
        match &mut self.permits {
            Some(held) => held.merge(permits),
            None => self.permits = Some(permits),
        }
        self.kib = kib;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.kib > 0 {
            metrics::gauge!("http_body_in_flight_bytes").decrement(self.bytes() as f64);
            // The room first, then the look at what is left.
            drop(self.permits.take());
            self.budget.returned(self.kib);
        }
    }
}

/// The middleware: reads the body whole within the limits, then runs the handler on it and
/// keeps the body's share of the budget until the handler has answered.
pub async fn read_body(State(limits): State<Arc<Limits>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let announced = match announced_length(&parts.headers) {
        Ok(announced) => announced,
        Err(refusal) => return closing(refusal),
    };
    let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
    if announced.unwrap_or(0) == 0 && !chunked {
        return next.run(Request::from_parts(parts, body)).await;
    }
    match collect(&limits, body, announced).await {
        Ok((bytes, reservation)) => {
            let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
            drop(reservation);
            response
        }
        Err(refusal) => closing(refusal),
    }
}

/// The `Content-Length`, if any. hyper has checked it is one number before the request got here.
fn announced_length(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get(header::CONTENT_LENGTH) else { return Ok(None) };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| ApiError::bad_request("bad_request", "Content-Length is not a number"))
}

/// A body over `max`: of `announced` bytes, or found larger as it was read.
fn too_large(announced: Option<u64>, max: usize) -> ApiError {
    let size = announced.map_or_else(|| "over the limit".to_string(), |bytes| format!("{bytes} bytes"));
    ApiError {
        retry_after_s: None,
        hint: None,
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "body_too_large",
        message: format!(
            "the body is {size}; the limit is {max} bytes (twice batch_bytes_max: one append at most, with room for \
             its JSON escaping)"
        ),
    }
}

/// Reads `body` into one buffer within the limits; its reservation is the caller's to drop.
async fn collect(limits: &Limits, body: Body, announced: Option<u64>) -> Result<(Bytes, Reservation), ApiError> {
    let max = limits.bytes_max;
    let within = limits.read_timeout;
    if let Some(length) = announced
        && length > max as u64
    {
        return Err(too_large(Some(length), max));
    }
    let mut reservation = Reservation::new(&limits.budget);
    if let Some(length) = announced {
        reservation.grow_to(length, within).await?;
    }
    let mut buffer = BytesMut::with_capacity(announced.unwrap_or(0) as usize);
    let mut chunks = body.into_data_stream();
    loop {
        let chunk = match tokio::time::timeout(within, chunks.next()).await {
            Err(_) => {
                metrics::counter!("http_connections_timed_out_total", "timeout" => "body").increment(1);
                return Err(ApiError {
                    retry_after_s: None,
                    hint: None,
                    status: StatusCode::REQUEST_TIMEOUT,
                    code: "body_timeout",
                    message: format!(
                        "no part of the body arrived for {} s (setting http_body_read_timeout_s); {} of {} bytes came",
                        within.as_secs(),
                        buffer.len(),
                        announced.map_or_else(|| "?".to_string(), |length| length.to_string())
                    ),
                });
            }
            Ok(None) => break,
            Ok(Some(Err(error))) => {
                return Err(ApiError::bad_request("bad_body", format!("the body could not be read: {error}")));
            }
            Ok(Some(Ok(chunk))) => chunk,
        };
        let total = buffer.len() + chunk.len();
        if total > max {
            return Err(too_large(None, max));
        }
        if total as u64 > reservation.bytes() {
            reservation.grow_to(total as u64, within).await?;
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok((buffer.freeze(), reservation))
}

/// A refusal that leaves the body unread: the connection cannot carry another request.
fn closing(refusal: ApiError) -> Response {
    let retry = refusal.status == StatusCode::SERVICE_UNAVAILABLE;
    let mut response = refusal.into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    if retry {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Room is taken in KiB, given back on drop, and waited for no longer than asked.
    #[tokio::test(start_paused = true)]
    async fn reservations_take_and_give_back_room() {
        let budget = Arc::new(BodyBudget::new(10 * 1024));
        let mut first = Reservation::new(&budget);
        first.grow_to(6 * 1024 - 1, Duration::from_secs(1)).await.unwrap();
        assert_eq!(first.kib, 6);
        first.grow_to(8 * 1024, Duration::from_secs(1)).await.unwrap();
        assert_eq!(budget.permits.available_permits(), 2);
        let mut second = Reservation::new(&budget);
        let refused = second.grow_to(4 * 1024, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(refused.code, "server_busy");
        drop(first);
        assert_eq!(budget.permits.available_permits(), 10);
        second.grow_to(4 * 1024, Duration::from_secs(1)).await.unwrap();
        assert_eq!(budget.permits.available_permits(), 6);
    }

    static RELEASES: AtomicUsize = AtomicUsize::new(0);

    fn count_release() {
        RELEASES.fetch_add(1, Ordering::SeqCst);
    }

    /// Memory is released once large bodies have gone and none is left, not for small ones,
    /// and not while another body is still in memory.
    #[tokio::test]
    async fn memory_is_released_after_large_bodies_once_none_is_left() {
        let budget = Arc::new(BodyBudget::new(64 << 20).releasing_with(count_release));
        let within = Duration::from_secs(1);
        let released = || async {
            // The release runs on a blocking thread: give it a moment.
            for _ in 0..100 {
                if RELEASES.load(Ordering::SeqCst) > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            RELEASES.swap(0, Ordering::SeqCst)
        };
        let mut small = Reservation::new(&budget);
        small.grow_to(4096, within).await.unwrap();
        drop(small);
        assert_eq!(released().await, 0, "small bodies reuse the allocator's pages");
        let (mut large, mut other) = (Reservation::new(&budget), Reservation::new(&budget));
        large.grow_to(8 << 20, within).await.unwrap();
        other.grow_to(4096, within).await.unwrap();
        drop(large);
        assert_eq!(released().await, 0, "another body is still in memory");
        drop(other);
        assert_eq!(released().await, 1, "the burst is over");
    }
}
