//! Users, roles, grants and tokens, changed through the catalog like every definition: under
//! `ddl`, the records appended (fsync) before the change is in force.

use onehop_log::NewRecord;

use super::Engine;
use crate::access::model::{AccessDefs, Grant, ObjectPattern, PUBLIC, Privilege, TokenDef, UserDef, UserLimits};
use crate::access::{self, Access, UserCreated, records};
use crate::error::EngineError;

/// Longest password taken: PBKDF2 hashes it once per iteration's first block, so a megabyte
/// password would be a cheap way to burn CPU.
pub const PASSWORD_BYTES_MAX: usize = 1024;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

fn invalid(reason: String) -> EngineError {
    EngineError::InvalidDefinition(reason)
}

/// Checks a user or role name: a name as streams have, and not `public`.
pub fn validate_grantee_name(name: &str) -> Result<(), EngineError> {
    crate::catalog::validate_name(name)?;
    if name.eq_ignore_ascii_case(PUBLIC) {
        return Err(EngineError::InvalidName {
            name: name.to_string(),
            reason: "PUBLIC stands for everyone and cannot be a user or role".into(),
        });
    }
    Ok(())
}

/// The credentials of `password`, derived before any lock is taken and off the async threads
/// (the iterations take milliseconds).
async fn derive_credentials(password: &str) -> Result<Vec<crate::access::credential::ScramCredential>, EngineError> {
    let password = password.as_bytes().to_vec();
    tokio::task::spawn_blocking(move || access::credentials(&password))
        .await
        .map_err(|error| EngineError::Internal(format!("deriving credentials failed: {error}")))
}

fn validate_password(password: &str) -> Result<(), EngineError> {
    if password.is_empty() || password.len() > PASSWORD_BYTES_MAX {
        return Err(invalid(format!("a password must be 1 to {PASSWORD_BYTES_MAX} bytes long")));
    }
    Ok(())
}

impl Engine {
    /// Who may do what (see [`Access`]).
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Changes the access definitions: `change` edits a copy and says which records make the
    /// edit durable; they are appended, then the copy is put in force. A change that would leave
    /// users but no superuser is refused, so access can never lock everyone out.
    async fn change_access<T>(
        &self,
        change: impl FnOnce(&mut AccessDefs) -> Result<(Vec<NewRecord>, T), EngineError>,
    ) -> Result<T, EngineError> {
        self.local_only("a change to users, roles, grants or tokens")?;
        let _ddl = self.ddl.lock().await;
        let mut defs = (*self.access.defs()).clone();
        let had_superuser = !defs.superusers().is_empty();
        let (records, answer) = change(&mut defs)?;
        if had_superuser && defs.superusers().is_empty() {
            return Err(EngineError::InvalidDefinition(
                "this would leave no superuser (no user with ADMIN ON ALL) to manage access; grant it to another \
                 user first"
                    .into(),
            ));
        }
        if !records.is_empty() {
            self.catalog.append(&records).await?;
            self.access.replace(defs);
        }
        Ok(answer)
    }

    /// Creates the user `name` with `password` (kept as SCRAM credentials), or without one: a
    /// user that logs in only with a token or a client certificate.
    pub async fn create_user(
        &self,
        name: &str,
        password: Option<&str>,
        if_not_exists: bool,
    ) -> Result<UserCreated, EngineError> {
        validate_grantee_name(name)?;
        let credentials = match password {
            Some(password) => {
                validate_password(password)?;
                derive_credentials(password).await?
            }
            None => Vec::new(),
        };
        self.change_access(|defs| {
            if defs.users.contains_key(name) {
                if if_not_exists {
                    return Ok((Vec::new(), UserCreated::Existed));
                }
                return Err(EngineError::NameTaken { name: name.to_string(), kind: "user" });
            }
            if defs.roles.contains(name) {
                return Err(EngineError::NameTaken { name: name.to_string(), kind: "role" });
            }
            if defs.users.is_empty() && credentials.is_empty() {
                return Err(EngineError::InvalidDefinition(format!(
                    "the first user becomes the superuser and needs a password: CREATE USER {name} PASSWORD '…'"
                )));
            }
            let user =
                UserDef { name: name.to_string(), credentials, created_ms: now_ms(), limits: UserLimits::default() };
            let mut records = vec![records::user_record(&user)];
            let first = defs.users.is_empty();
            defs.users.insert(name.to_string(), user);
            if first {
                let grant = Grant {
                    grantee: name.to_string(),
                    privilege: Privilege::Admin,
                    object: ObjectPattern::everything(),
                };
                records.push(records::grant_record(&grant, true));
                defs.grants.insert(grant);
                return Ok((records, UserCreated::CreatedSuperuser));
            }
            Ok((records, UserCreated::Created))
        })
        .await
    }

    /// Sets a new password for `name`. Its connections stay open; its next logins need the
    /// new password.
    pub async fn alter_user_password(&self, name: &str, password: &str) -> Result<(), EngineError> {
        validate_password(password)?;
        let credentials = derive_credentials(password).await?;
        self.change_access(|defs| {
            let user = defs.users.get_mut(name).ok_or_else(|| unknown("user", name))?;
            user.credentials = credentials;
            Ok((vec![records::user_record(user)], ()))
        })
        .await
    }

    /// Puts `limits` in force for the user `name` (all of them: a limit not given is lifted),
    /// from its connections' next publish, subscription or connection on.
    pub async fn alter_user_limits(&self, name: &str, limits: UserLimits) -> Result<(), EngineError> {
        let zero = [limits.connections, limits.subscriptions, limits.publishes_per_second].contains(&Some(0))
            || limits.publish_bytes_per_second == Some(0);
        if zero {
            return Err(invalid("a limit of 0 would refuse everything; leave the limit out to lift it".into()));
        }
        self.change_access(|defs| {
            let user = defs.users.get_mut(name).ok_or_else(|| unknown("user", name))?;
            user.limits = limits;
            Ok((vec![records::user_record(user)], ()))
        })
        .await
    }

    /// Drops the user `name` with its grants, role memberships and tokens. Its open connections
    /// are refused from their next request on.
    pub async fn drop_user(&self, name: &str, if_exists: bool) -> Result<bool, EngineError> {
        self.change_access(|defs| {
            if defs.users.remove(name).is_none() {
                return if if_exists { Ok((Vec::new(), false)) } else { Err(unknown("user", name)) };
            }
            let mut records = vec![records::drop_user_record(name)];
            records.extend(forget_grantee(defs, name));
            let tokens: Vec<String> =
                defs.tokens.values().filter(|token| token.user == name).map(|token| token.id.clone()).collect();
            for id in tokens {
                defs.tokens.remove(&id);
                records.push(records::drop_token_record(&id));
            }
            for (role, members) in defs.members.iter_mut() {
                if members.remove(name) {
                    records.push(records::member_record(role, name, false));
                }
            }
            defs.members.retain(|_, members| !members.is_empty());
            Ok((records, true))
        })
        .await
    }

    pub async fn create_role(&self, name: &str, if_not_exists: bool) -> Result<bool, EngineError> {
        validate_grantee_name(name)?;
        self.change_access(|defs| {
            if defs.roles.contains(name) {
                return if if_not_exists {
                    Ok((Vec::new(), false))
                } else {
                    Err(EngineError::NameTaken { name: name.to_string(), kind: "role" })
                };
            }
            if defs.users.contains_key(name) {
                return Err(EngineError::NameTaken { name: name.to_string(), kind: "user" });
            }
            defs.roles.insert(name.to_string());
            Ok((vec![records::role_record(name, true)], true))
        })
        .await
    }

    /// Drops the role `name`, its grants and its memberships.
    pub async fn drop_role(&self, name: &str, if_exists: bool) -> Result<bool, EngineError> {
        self.change_access(|defs| {
            if !defs.roles.remove(name) {
                return if if_exists { Ok((Vec::new(), false)) } else { Err(unknown("role", name)) };
            }
            let mut records = vec![records::role_record(name, false)];
            records.extend(forget_grantee(defs, name));
            for user in defs.members.remove(name).unwrap_or_default() {
                records.push(records::member_record(name, &user, false));
            }
            Ok((records, true))
        })
        .await
    }

    /// Grants `grant`; `false` when it was granted already.
    pub async fn grant(&self, grant: Grant) -> Result<bool, EngineError> {
        grant.object.validate().map_err(invalid)?;
        self.change_access(|defs| {
            if !defs.is_grantee(&grant.grantee) {
                return Err(unknown("user or role", &grant.grantee));
            }
            if defs.grants.contains(&grant) {
                return Ok((Vec::new(), false));
            }
            let record = records::grant_record(&grant, true);
            defs.grants.insert(grant);
            Ok((vec![record], true))
        })
        .await
    }

    /// Revokes exactly `grant` (a grant on `orders*` is not narrowed by revoking `orders`);
    /// `false` when it was not granted.
    pub async fn revoke(&self, grant: &Grant) -> Result<bool, EngineError> {
        self.change_access(|defs| {
            if !defs.grants.remove(grant) {
                return Ok((Vec::new(), false));
            }
            Ok((vec![records::grant_record(grant, false)], true))
        })
        .await
    }

    /// Makes `user` a member of `role` (`member`) or no longer one; `false` when nothing changed.
    pub async fn set_role_member(&self, role: &str, user: &str, member: bool) -> Result<bool, EngineError> {
        self.change_access(|defs| {
            if !defs.roles.contains(role) {
                return Err(unknown("role", role));
            }
            if !defs.users.contains_key(user) {
                return Err(unknown("user", user));
            }
            let members = defs.members.entry(role.to_string()).or_default();
            let changed = if member { members.insert(user.to_string()) } else { members.remove(user) };
            defs.members.retain(|_, members| !members.is_empty());
            Ok((if changed { vec![records::member_record(role, user, member)] } else { Vec::new() }, changed))
        })
        .await
    }

    /// A new token for `user`, valid for `valid_ms` (or until dropped): its definition and the
    /// secret, which is shown once and kept nowhere.
    pub async fn create_token(&self, user: &str, valid_ms: Option<u64>) -> Result<(TokenDef, String), EngineError> {
        if valid_ms == Some(0) {
            return Err(invalid("a token valid for 0 would never work".into()));
        }
        self.change_access(|defs| {
            if !defs.users.contains_key(user) {
                return Err(unknown("user", user));
            }
            let (def, secret) = access::new_token(user, now_ms(), valid_ms);
            defs.tokens.insert(def.id.clone(), def.clone());
            Ok((vec![records::token_record(&def)], (def, secret)))
        })
        .await
    }

    /// Drops the token whose id is `id`; `false` when there is none.
    pub async fn drop_token(&self, id: &str) -> Result<bool, EngineError> {
        self.change_access(|defs| {
            if defs.tokens.remove(id).is_none() {
                return Ok((Vec::new(), false));
            }
            Ok((vec![records::drop_token_record(id)], true))
        })
        .await
    }

    /// The first superuser, from the operator's settings: creates `name` with `ADMIN ON ALL`
    /// unless a user of that name exists (its password then stays as it is: a restart with the
    /// setting still there must not undo a password change). `true` when it was created.
    pub async fn bootstrap_superuser(&self, name: &str, password: &str) -> Result<bool, EngineError> {
        if self.access.defs().users.contains_key(name) {
            return Ok(false);
        }
        let created = self.create_user(name, Some(password), true).await?;
        if created == UserCreated::Created {
            self.grant(Grant {
                grantee: name.to_string(),
                privilege: Privilege::Admin,
                object: ObjectPattern::everything(),
            })
            .await?;
        }
        Ok(created != UserCreated::Existed)
    }
}

fn unknown(kind: &str, name: &str) -> EngineError {
    EngineError::InvalidDefinition(format!("there is no {kind} {name:?}"))
}

/// Removes every grant to `grantee`, returning the records that make it durable.
fn forget_grantee(defs: &mut AccessDefs, grantee: &str) -> Vec<NewRecord> {
    let gone: Vec<Grant> = defs.grants.iter().filter(|grant| grant.grantee == grantee).cloned().collect();
    gone.iter()
        .map(|grant| {
            defs.grants.remove(grant);
            records::grant_record(grant, false)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::model::ObjectKind;
    use crate::engine::EngineOptions;

    #[tokio::test]
    async fn access_definitions_survive_a_restart_and_never_leave_no_superuser() {
        let dir = tempfile::tempdir().unwrap();
        let token;
        {
            let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
            assert!(!engine.access().enabled());
            assert_eq!(engine.create_user("root", Some("first"), false).await.unwrap(), UserCreated::CreatedSuperuser);
            assert!(engine.access().enabled());
            assert_eq!(engine.create_user("alice", Some("secret"), false).await.unwrap(), UserCreated::Created);
            assert_eq!(engine.create_user("alice", Some("other"), true).await.unwrap(), UserCreated::Existed);
            assert!(engine.create_user("alice", Some("other"), false).await.is_err());
            assert!(engine.create_user("public", Some("x"), false).await.is_err());
            assert_eq!(engine.create_user("device", None, false).await.unwrap(), UserCreated::Created);
            assert!(engine.access().login_password("device", b"").await.is_err(), "no password logs it in");
            engine.create_role("readers", false).await.unwrap();
            assert!(engine.set_role_member("readers", "alice", true).await.unwrap());
            let read_orders = Grant {
                grantee: "readers".into(),
                privilege: Privilege::Read,
                object: ObjectPattern { kind: Some(ObjectKind::Stream), name: "orders".into() },
            };
            assert!(engine.grant(read_orders.clone()).await.unwrap());
            assert!(!engine.grant(read_orders).await.unwrap());
            token = engine.create_token("alice", None).await.unwrap().1;
            // The only superuser cannot go, nor lose ADMIN ON ALL.
            assert!(engine.drop_user("root", false).await.is_err());
            let root_all =
                Grant { grantee: "root".into(), privilege: Privilege::Admin, object: ObjectPattern::everything() };
            assert!(engine.revoke(&root_all).await.is_err());
            engine.alter_user_password("alice", "changed").await.unwrap();
        }
        let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
        let access = engine.access();
        assert!(access.enabled());
        assert!(access.login_password("alice", b"secret").await.is_err());
        let alice = access.login_password("alice", b"changed").await.unwrap();
        access.authorize(&alice, Privilege::Read, ObjectKind::Stream, "orders").unwrap();
        assert!(access.authorize(&alice, Privilege::Write, ObjectKind::Stream, "orders").is_err());
        assert_eq!(access.login_token(&token, now_ms()).unwrap().user(), Some("alice"));
        let root = access.login_password("root", b"first").await.unwrap();
        access.authorize_superuser(&root, "manage users").unwrap();
        assert!(engine.drop_user("alice", false).await.unwrap());
        assert!(access.login_token(&token, now_ms()).is_err());
        assert!(engine.access().defs().members.is_empty());
        assert!(!engine.drop_role("nobody", true).await.unwrap());
    }
}
