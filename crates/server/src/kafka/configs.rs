//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: a topic's settings under Kafka's
//! names. `retention.ms` and `retention.bytes` are the stream's own and can be changed; the
//! rest say how every stream behaves here (read-only).

use kafka_protocol::ResponseError;
use kafka_protocol::messages::alter_configs_request::AlterConfigsRequest;
use kafka_protocol::messages::alter_configs_response::{AlterConfigsResourceResponse, AlterConfigsResponse};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult,
};
use kafka_protocol::messages::incremental_alter_configs_request::IncrementalAlterConfigsRequest;
use kafka_protocol::messages::incremental_alter_configs_response::{
    AlterConfigsResourceResponse as IncrementalAlterConfigsResourceResponse, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use onehop_engine::{Principal, Privilege, Stream};

use super::{Shared, errors, topics};

/// Kafka's resource types.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;
/// Where a value comes from (Kafka's ConfigSource).
const FROM_TOPIC: i8 = 1;
const FROM_BROKER: i8 = 4;
const FROM_DEFAULT: i8 = 5;
/// Kafka's ConfigType.
const STRING: i8 = 2;
const INT: i8 = 3;
const LONG: i8 = 5;
const LIST: i8 = 7;

/// One setting: name, value, source, read-only, type.
type Setting = (&'static str, String, i8, bool, i8);

pub(super) fn describe_configs(
    shared: &Shared,
    who: &Principal,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let mut response = DescribeConfigsResponse::default();
    for resource in request.resources {
        let mut result = DescribeConfigsResult::default();
        result.resource_type = resource.resource_type;
        result.resource_name = resource.resource_name.clone();
        let settings = match resource.resource_type {
            TOPIC if !super::may_describe(shared, who, resource.resource_name.as_str()) => Err((
                ResponseError::TopicAuthorizationFailed.code(),
                format!("topic {:?} is not this user's to describe", resource.resource_name.as_str()),
            )),
            TOPIC => match shared.engine.stream(resource.resource_name.as_str()) {
                Ok(stream) => Ok(topic_settings(&stream)),
                Err(error) => Err((errors::code(&error), error.to_string())),
            },
            // The broker's settings are onehop's own (docs/getting-started.md); none under
            // Kafka's names.
            BROKER => Ok(Vec::new()),
            other => Err((ResponseError::InvalidRequest.code(), format!("resource type {other} is not served"))),
        };
        match settings {
            Ok(settings) => {
                let wanted = resource.configuration_keys.as_ref();
                result.configs = settings
                    .into_iter()
                    .filter(|(name, ..)| wanted.is_none_or(|keys| keys.iter().any(|key| key.as_str() == *name)))
                    .map(|(name, value, source, read_only, kind)| {
                        let mut config = DescribeConfigsResourceResult::default();
                        config.name = StrBytes::from_static_str(name);
                        config.value = Some(StrBytes::from_string(value));
                        config.config_source = source;
                        config.read_only = read_only;
                        config.config_type = kind;
                        config
                    })
                    .collect();
            }
            Err((code, message)) => {
                result.error_code = code;
                result.error_message = Some(StrBytes::from_string(message));
            }
        }
        response.results.push(result);
    }
    response
}

fn topic_settings(stream: &Stream) -> Vec<Setting> {
    let def = stream.def();
    let limit = |value: Option<u64>| match value {
        Some(value) => (value.to_string(), FROM_TOPIC),
        None => ("-1".to_string(), FROM_DEFAULT),
    };
    let (retention_ms, retention_ms_source) = limit(def.retention_ms);
    let (retention_bytes, retention_bytes_source) = limit(def.retention_bytes);
    let config = stream.partition_config(0).ok();
    let record_bytes_max = config.as_ref().map_or(0, |config| config.record_bytes_max);
    let segment_bytes_max = config.as_ref().map_or(0, |config| config.segment_bytes_max);
    vec![
        (
            "cleanup.policy",
            cleanup_policy(def).into(),
            if def.compacted { FROM_TOPIC } else { FROM_DEFAULT },
            false,
            LIST,
        ),
        ("retention.ms", retention_ms, retention_ms_source, false, LONG),
        ("retention.bytes", retention_bytes, retention_bytes_source, false, LONG),
        ("max.message.bytes", record_bytes_max.to_string(), FROM_BROKER, true, INT),
        ("segment.bytes", segment_bytes_max.to_string(), FROM_BROKER, true, INT),
        ("min.insync.replicas", "1".into(), FROM_DEFAULT, true, INT),
        ("message.timestamp.type", "CreateTime".into(), FROM_DEFAULT, true, STRING),
    ]
}

/// A stream's `cleanup.policy`, as Kafka names it.
fn cleanup_policy(def: &onehop_engine::StreamDef) -> &'static str {
    match (def.compacted, def.retention_ms.is_some() || def.retention_bytes.is_some()) {
        (false, _) => "delete",
        (true, false) => "compact",
        (true, true) => "compact,delete",
    }
}

/// One resource's settings to change: `(name, value)`, a `None` value back to its default.
type Changes = Vec<(String, Option<String>)>;

/// Applies `changes` to topic `name` (all or none), unless `validate_only`: `Ok` or the refusal.
/// `replace` (AlterConfigs) puts every setting not named back to its default first.
async fn alter_topic(
    shared: &Shared,
    who: &Principal,
    name: &str,
    changes: Changes,
    replace: bool,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    let stream = super::stream_for(shared, who, Privilege::Admin, name)
        .map_err(|error| (errors::code(&error), error.to_string()))?;
    let mut def = stream.def().clone();
    if replace {
        (def.retention_ms, def.retention_bytes, def.compacted) = (None, None, false);
    }
    for (setting, value) in &changes {
        topics::set_config(&mut def, setting, value.as_deref())?;
    }
    if def.compacted != stream.def().compacted {
        return Err((
            ResponseError::InvalidConfig.code(),
            format!(
                "cleanup.policy of {name:?} is {}: it is chosen when a topic is created and does not change",
                cleanup_policy(stream.def())
            ),
        ));
    }
    if validate_only {
        return Ok(());
    }
    shared
        .engine
        .alter_stream_retention(name, def.retention_ms, def.retention_bytes)
        .await
        .map(drop)
        .map_err(|error| (errors::code(&error), error.to_string()))
}

/// The answer for one resource of an alter request.
async fn alter_resource(
    shared: &Shared,
    who: &Principal,
    resource_type: i8,
    name: &str,
    changes: Result<Changes, (i16, String)>,
    replace: bool,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    match resource_type {
        TOPIC => alter_topic(shared, who, name, changes?, replace, validate_only).await,
        BROKER => Err((
            ResponseError::InvalidRequest.code(),
            "the broker's settings are onehop's own (its flags and onehop.toml), not Kafka's".into(),
        )),
        other => Err((ResponseError::InvalidRequest.code(), format!("resource type {other} is not served"))),
    }
}

/// An alter outcome as a response's error code and message.
fn error_fields(outcome: Result<(), (i16, String)>) -> (i16, Option<StrBytes>) {
    match outcome {
        Ok(()) => (0, None),
        Err((code, message)) => (code, Some(StrBytes::from_string(message))),
    }
}

/// AlterConfigs: a topic's whole set of mapped settings.
pub(super) async fn alter_configs(
    shared: &Shared,
    who: &Principal,
    request: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let mut response = AlterConfigsResponse::default();
    for resource in request.resources {
        let changes = resource
            .configs
            .iter()
            .map(|config| {
                (config.name.as_str().to_string(), config.value.as_ref().map(|value| value.as_str().to_string()))
            })
            .collect();
        let outcome = alter_resource(
            shared,
            who,
            resource.resource_type,
            resource.resource_name.as_str(),
            Ok(changes),
            true,
            request.validate_only,
        )
        .await;
        let mut answer = AlterConfigsResourceResponse::default();
        answer.resource_type = resource.resource_type;
        answer.resource_name = resource.resource_name;
        (answer.error_code, answer.error_message) = error_fields(outcome);
        response.responses.push(answer);
    }
    response
}

/// IncrementalAlterConfigs: SET (0) and DELETE (1) of single settings; APPEND and SUBTRACT
/// are for list settings, which none of the mapped ones is.
pub(super) async fn incremental_alter_configs(
    shared: &Shared,
    who: &Principal,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut response = IncrementalAlterConfigsResponse::default();
    for resource in request.resources {
        let changes: Result<Changes, (i16, String)> = resource
            .configs
            .iter()
            .map(|config| {
                let name = config.name.as_str().to_string();
                match config.config_operation {
                    0 => Ok((name, config.value.as_ref().map(|value| value.as_str().to_string()))),
                    1 => Ok((name, None)),
                    operation => Err((
                        ResponseError::InvalidConfig.code(),
                        format!("{name}: operation {operation} (APPEND or SUBTRACT) is for list settings"),
                    )),
                }
            })
            .collect();
        let outcome = alter_resource(
            shared,
            who,
            resource.resource_type,
            resource.resource_name.as_str(),
            changes,
            false,
            request.validate_only,
        )
        .await;
        let mut answer = IncrementalAlterConfigsResourceResponse::default();
        answer.resource_type = resource.resource_type;
        answer.resource_name = resource.resource_name;
        (answer.error_code, answer.error_message) = error_fields(outcome);
        response.responses.push(answer);
    }
    response
}
