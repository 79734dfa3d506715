//! Access definitions as records of the catalog, beside streams, tables and views, so they are
//! durable, replayed at start and (with a cluster) replicated like every definition.
//!
//! | key | value |
//! |---|---|
//! | `user/{name}` | `{version, name, credentials, created_ms, limits?}` |
//! | `role/{name}` | `{version, name}` |
//! | `member/{role}/{user}` | `{version}` |
//! | `grant/{grantee}/{privilege}/{kind or any}/{pattern}` | `{version}` |
//! | `token/{id}` | `{version, id, user, secret_sha256, created_ms, expires_ms}` |
//!
//! Names hold no `/`, so each key splits back into its parts. A tombstone on a key removes it.

use bytes::Bytes;
use onehop_log::{NewRecord, Record};
use serde::{Deserialize, Serialize};

use super::credential::{ScramCredential, hex, unhex};
use super::model::{AccessDefs, Grant, ObjectKind, ObjectPattern, Privilege, TokenDef, UserDef, UserLimits};
use crate::error::EngineError;

const VERSION: u32 = 1;
pub(crate) const KEY_PREFIXES: [&str; 5] = ["user/", "role/", "member/", "grant/", "token/"];

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserRecord {
    version: u32,
    name: String,
    credentials: Vec<ScramCredential>,
    created_ms: u64,
    /// Absent in records written before limits existed, and for a user without any.
    #[serde(default, skip_serializing_if = "UserLimits::is_none")]
    limits: UserLimits,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MarkRecord {
    version: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRecord {
    version: u32,
    id: String,
    user: String,
    secret_sha256: String,
    created_ms: u64,
    expires_ms: Option<u64>,
}

fn keyed(key: String, value: Option<Vec<u8>>) -> NewRecord {
    NewRecord { key: Some(Bytes::from(key)), value: value.map(Bytes::from), ..NewRecord::default() }
}

fn mark() -> Option<Vec<u8>> {
    Some(serde_json::to_vec(&MarkRecord { version: VERSION }).expect("a mark serializes"))
}

pub(crate) fn user_record(user: &UserDef) -> NewRecord {
    let value = UserRecord {
        version: VERSION,
        name: user.name.clone(),
        credentials: user.credentials.clone(),
        created_ms: user.created_ms,
        limits: user.limits,
    };
    keyed(format!("user/{}", user.name), Some(serde_json::to_vec(&value).expect("a user serializes")))
}

pub(crate) fn drop_user_record(name: &str) -> NewRecord {
    keyed(format!("user/{name}"), None)
}

pub(crate) fn role_record(name: &str, exists: bool) -> NewRecord {
    keyed(format!("role/{name}"), exists.then(mark).flatten())
}

pub(crate) fn member_record(role: &str, user: &str, member: bool) -> NewRecord {
    keyed(format!("member/{role}/{user}"), member.then(mark).flatten())
}

fn grant_key(grant: &Grant) -> String {
    let kind = grant.object.kind.map_or("any", ObjectKind::as_str);
    format!("grant/{}/{}/{kind}/{}", grant.grantee, grant.privilege.as_str(), grant.object.name)
}

pub(crate) fn grant_record(grant: &Grant, granted: bool) -> NewRecord {
    keyed(grant_key(grant), granted.then(mark).flatten())
}

pub(crate) fn token_record(token: &TokenDef) -> NewRecord {
    let value = TokenRecord {
        version: VERSION,
        id: token.id.clone(),
        user: token.user.clone(),
        secret_sha256: hex(&token.secret_sha256),
        created_ms: token.created_ms,
        expires_ms: token.expires_ms,
    };
    keyed(format!("token/{}", token.id), Some(serde_json::to_vec(&value).expect("a token serializes")))
}

pub(crate) fn drop_token_record(id: &str) -> NewRecord {
    keyed(format!("token/{id}"), None)
}

/// Whether a catalog key is one of access's.
pub(crate) fn is_access_key(key: &str) -> bool {
    KEY_PREFIXES.iter().any(|prefix| key.starts_with(prefix))
}

/// Applies one catalog record of access (see [`is_access_key`]) to `defs`.
pub(crate) fn apply(defs: &mut AccessDefs, key: &str, record: &Record) -> Result<(), EngineError> {
    let bad = |reason: String| EngineError::Catalog { offset: record.offset, reason: format!("{key}: {reason}") };
    let value = record.value.as_deref();
    let (kind, rest) = key.split_once('/').ok_or_else(|| bad("no kind".into()))?;
    let check_version = |version: u32| {
        if version == VERSION {
            Ok(())
        } else {
            Err(bad(format!("record version {version} is newer than this onehop understands")))
        }
    };
    match kind {
        "user" => match value {
            None => {
                defs.users.remove(rest);
            }
            Some(value) => {
                let parsed: UserRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
                check_version(parsed.version)?;
                // No credentials: a user that logs in by token or client certificate only.
                if parsed.name != rest {
                    return Err(bad("the name or the credentials do not fit the key".into()));
                }
                for credential in &parsed.credentials {
                    credential.validate().map_err(bad)?;
                }
                let user = UserDef {
                    name: parsed.name,
                    credentials: parsed.credentials,
                    created_ms: parsed.created_ms,
                    limits: parsed.limits,
                };
                defs.users.insert(user.name.clone(), user);
            }
        },
        "role" => match value {
            None => {
                defs.roles.remove(rest);
            }
            Some(value) => {
                let parsed: MarkRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
                check_version(parsed.version)?;
                defs.roles.insert(rest.to_string());
            }
        },
        "member" => {
            let (role, user) = rest.split_once('/').ok_or_else(|| bad("expected member/{role}/{user}".into()))?;
            match value {
                None => {
                    if let Some(members) = defs.members.get_mut(role) {
                        members.remove(user);
                        if members.is_empty() {
                            defs.members.remove(role);
                        }
                    }
                }
                Some(value) => {
                    let parsed: MarkRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
                    check_version(parsed.version)?;
                    defs.members.entry(role.to_string()).or_default().insert(user.to_string());
                }
            }
        }
        "grant" => {
            let grant = parse_grant_key(rest)
                .ok_or_else(|| bad("expected grant/{grantee}/{privilege}/{kind}/{name}".into()))?;
            match value {
                None => {
                    defs.grants.remove(&grant);
                }
                Some(value) => {
                    let parsed: MarkRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
                    check_version(parsed.version)?;
                    defs.grants.insert(grant);
                }
            }
        }
        "token" => match value {
            None => {
                defs.tokens.remove(rest);
            }
            Some(value) => {
                let parsed: TokenRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
                check_version(parsed.version)?;
                let secret_sha256 = unhex(&parsed.secret_sha256)
                    .filter(|hash| hash.len() == 32)
                    .ok_or_else(|| bad("the secret's hash is not 32 bytes of hex".into()))?;
                if parsed.id != rest {
                    return Err(bad("the id does not fit the key".into()));
                }
                let token = TokenDef {
                    id: parsed.id,
                    user: parsed.user,
                    secret_sha256,
                    created_ms: parsed.created_ms,
                    expires_ms: parsed.expires_ms,
                };
                defs.tokens.insert(token.id.clone(), token);
            }
        },
        _ => return Err(bad("not an access record".into())),
    }
    Ok(())
}

fn parse_grant_key(rest: &str) -> Option<Grant> {
    let mut parts = rest.splitn(4, '/');
    let grantee = parts.next()?.to_string();
    let privilege = match parts.next()? {
        "read" => Privilege::Read,
        "write" => Privilege::Write,
        "admin" => Privilege::Admin,
        _ => return None,
    };
    let kind = match parts.next()? {
        "any" => None,
        "stream" => Some(ObjectKind::Stream),
        "table" => Some(ObjectKind::Table),
        "view" => Some(ObjectKind::View),
        "topic" => Some(ObjectKind::Topic),
        "group" => Some(ObjectKind::Group),
        "transactional_id" => Some(ObjectKind::TransactionalId),
        _ => return None,
    };
    let name = parts.next()?.to_string();
    if grantee.is_empty() || name.is_empty() {
        return None;
    }
    Some(Grant { grantee, privilege, object: ObjectPattern { kind, name } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::credential::{ITERATIONS_MIN, ScramHash};

    fn record(offset: u64, key: Option<Bytes>, value: Option<Bytes>) -> Record {
        Record { offset, timestamp_ms: 0, key, subject: None, headers: Default::default(), value }
    }

    fn replayed(records: &[NewRecord]) -> AccessDefs {
        let mut defs = AccessDefs::default();
        for (offset, new) in records.iter().enumerate() {
            let record = record(offset as u64, new.key.clone(), new.value.clone());
            let key = std::str::from_utf8(record.key.as_deref().unwrap()).unwrap().to_string();
            assert!(is_access_key(&key));
            apply(&mut defs, &key, &record).unwrap();
        }
        defs
    }

    #[test]
    fn every_kind_of_access_record_replays_and_a_tombstone_removes_it() {
        let user = UserDef {
            name: "alice".into(),
            credentials: vec![ScramCredential::new(ScramHash::Sha256, b"secret", ITERATIONS_MIN)],
            created_ms: 5,
            limits: UserLimits {
                connections: Some(3),
                publish_bytes_per_second: Some(1 << 20),
                ..UserLimits::default()
            },
        };
        let grant = Grant {
            grantee: "readers".into(),
            privilege: Privilege::Read,
            object: ObjectPattern { kind: Some(ObjectKind::Stream), name: "sensor_*".into() },
        };
        let token = TokenDef {
            id: "abcd1234".into(),
            user: "alice".into(),
            secret_sha256: vec![7; 32],
            created_ms: 6,
            expires_ms: Some(99),
        };
        let mut records = vec![
            user_record(&user),
            role_record("readers", true),
            member_record("readers", "alice", true),
            grant_record(&grant, true),
            token_record(&token),
        ];
        let defs = replayed(&records);
        assert_eq!(defs.users["alice"], user);
        assert!(defs.roles.contains("readers"));
        assert!(defs.members["readers"].contains("alice"));
        assert!(defs.grants.contains(&grant));
        assert_eq!(defs.tokens["abcd1234"], token);
        records.extend([
            drop_token_record("abcd1234"),
            grant_record(&grant, false),
            member_record("readers", "alice", false),
            role_record("readers", false),
            drop_user_record("alice"),
        ]);
        let defs = replayed(&records);
        assert!(defs.users.is_empty() && defs.roles.is_empty() && defs.members.is_empty());
        assert!(defs.grants.is_empty() && defs.tokens.is_empty());
    }

    #[test]
    fn a_damaged_access_record_is_an_error_not_a_guess() {
        let record = record(
            3,
            Some(Bytes::from("user/alice")),
            Some(Bytes::from(r#"{"version":1,"name":"bob","credentials":[],"created_ms":0}"#)),
        );
        let error = apply(&mut AccessDefs::default(), "user/alice", &record).unwrap_err();
        assert!(error.to_string().contains("offset 3"), "{error}");
        assert!(parse_grant_key("bob/fly/any/x").is_none());
    }
}
