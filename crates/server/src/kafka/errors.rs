//! The engine's refusals as Kafka's error codes, by kind, so a new engine error lands in the
//! right family without a change here.

use kafka_protocol::ResponseError;
use onehop_engine::{EngineError, ErrorKind};

/// The Kafka error for `error`.
pub(super) fn code(error: &EngineError) -> i16 {
    let kafka = match (error, error.kind()) {
        (EngineError::InvalidName { .. }, _) => ResponseError::InvalidTopicException,
        (_, ErrorKind::Invalid) => ResponseError::InvalidRecord,
        (_, ErrorKind::NotFound) => ResponseError::UnknownTopicOrPartition,
        (_, ErrorKind::Conflict) => ResponseError::TopicAlreadyExists,
        (_, ErrorKind::TooLarge) => ResponseError::MessageTooLarge,
        (_, ErrorKind::OutOfRange) => ResponseError::OffsetOutOfRange,
        // Retriable: the client tries again, and finds the server back or another one.
        (_, ErrorKind::ShuttingDown) => ResponseError::LeaderNotAvailable,
        (_, ErrorKind::StorageFailed) => ResponseError::KafkaStorageError,
        // Retriable; like a timed-out produce, it may or may not have been written.
        (_, ErrorKind::Unavailable) => ResponseError::RequestTimedOut,
        (_, ErrorKind::PreconditionFailed | ErrorKind::Unprocessable | ErrorKind::Internal) => {
            ResponseError::UnknownServerError
        }
        (_, ErrorKind::Unauthenticated) => ResponseError::SaslAuthenticationFailed,
        (_, ErrorKind::Forbidden) => ResponseError::TopicAuthorizationFailed,
        (_, ErrorKind::LimitExceeded) => ResponseError::ThrottlingQuotaExceeded,
    };
    kafka.code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_by_kind() {
        let unknown = EngineError::UnknownStream { name: "x".into(), auto_create: false };
        assert_eq!(code(&unknown), ResponseError::UnknownTopicOrPartition.code());
        let bad_name = onehop_engine::validate_name("a b").unwrap_err();
        assert_eq!(code(&bad_name), ResponseError::InvalidTopicException.code());
        let exists = EngineError::StreamExists { name: "x".into(), existing: String::new() };
        assert_eq!(code(&exists), ResponseError::TopicAlreadyExists.code());
    }
}
