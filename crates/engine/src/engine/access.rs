//! Users, roles, grants and tokens, changed through the catalog like every definition: under
//! `ddl`, the records appended (fsync) before the change is in force.

use onehop_log::NewRecord;
use serde::{Deserialize, Serialize};

use super::Engine;
use crate::access::credential::ScramCredential;
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

/// A change to users, roles, grants or tokens, as the node that was asked decided it: salts,
/// token secrets and times are drawn there, so applying it gives the same definitions on every
/// node of a cluster (it travels as JSON inside the cluster's command).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum AccessChange {
    CreateUser {
        name: String,
        credentials: Vec<ScramCredential>,
        created_ms: u64,
        if_not_exists: bool,
    },
    AlterPassword {
        name: String,
        credentials: Vec<ScramCredential>,
    },
    AlterLimits {
        name: String,
        limits: UserLimits,
    },
    DropUser {
        name: String,
        if_exists: bool,
    },
    CreateRole {
        name: String,
        if_not_exists: bool,
    },
    DropRole {
        name: String,
        if_exists: bool,
    },
    Grant(Grant),
    Revoke(Grant),
    SetRoleMember {
        role: String,
        user: String,
        member: bool,
    },
    CreateToken {
        id: String,
        user: String,
        secret_sha256: Vec<u8>,
        created_ms: u64,
        expires_ms: Option<u64>,
    },
    DropToken(String),
    /// The operator's first superuser: created with `ADMIN ON ALL` unless a user of that name
    /// exists.
    Bootstrap {
        name: String,
        credentials: Vec<ScramCredential>,
        created_ms: u64,
    },
}

/// What an access change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum AccessAnswer {
    User(UserCreated),
    /// Whether anything changed (`false`: granted already, `IF EXISTS` of nothing, …).
    Changed(bool),
}

impl AccessAnswer {
    fn changed(self) -> bool {
        match self {
            AccessAnswer::Changed(changed) => changed,
            AccessAnswer::User(created) => created != UserCreated::Existed,
        }
    }
}

/// Applies `change` to `defs`: the records that make it durable, and what it did.
fn edit(defs: &mut AccessDefs, change: AccessChange) -> Result<(Vec<NewRecord>, AccessAnswer), EngineError> {
    match change {
        AccessChange::CreateUser { name, credentials, created_ms, if_not_exists } => {
            create_user(defs, name, credentials, created_ms, if_not_exists)
        }
        AccessChange::Bootstrap { name, credentials, created_ms } => {
            let (mut records, answer) = create_user(defs, name.clone(), credentials, created_ms, true)?;
            if answer == AccessAnswer::User(UserCreated::Created) {
                let grant = Grant { grantee: name, privilege: Privilege::Admin, object: ObjectPattern::everything() };
                records.push(records::grant_record(&grant, true));
                defs.grants.insert(grant);
            }
            Ok((records, answer))
        }
        AccessChange::AlterPassword { name, credentials } => {
            let user = defs.users.get_mut(&name).ok_or_else(|| unknown("user", &name))?;
            user.credentials = credentials;
            Ok((vec![records::user_record(user)], AccessAnswer::Changed(true)))
        }
        AccessChange::AlterLimits { name, limits } => {
            let user = defs.users.get_mut(&name).ok_or_else(|| unknown("user", &name))?;
            user.limits = limits;
            Ok((vec![records::user_record(user)], AccessAnswer::Changed(true)))
        }
        AccessChange::DropUser { name, if_exists } => {
            if defs.users.remove(&name).is_none() {
                return if if_exists {
                    Ok((Vec::new(), AccessAnswer::Changed(false)))
                } else {
                    Err(unknown("user", &name))
                };
            }
            let mut records = vec![records::drop_user_record(&name)];
            records.extend(forget_grantee(defs, &name));
            let tokens: Vec<String> =
                defs.tokens.values().filter(|token| token.user == name).map(|token| token.id.clone()).collect();
            for id in tokens {
                defs.tokens.remove(&id);
                records.push(records::drop_token_record(&id));
            }
            for (role, members) in defs.members.iter_mut() {
                if members.remove(&name) {
                    records.push(records::member_record(role, &name, false));
                }
            }
            defs.members.retain(|_, members| !members.is_empty());
            Ok((records, AccessAnswer::Changed(true)))
        }
        AccessChange::CreateRole { name, if_not_exists } => {
            if defs.roles.contains(&name) {
                return if if_not_exists {
                    Ok((Vec::new(), AccessAnswer::Changed(false)))
                } else {
                    Err(EngineError::NameTaken { name, kind: "role" })
                };
            }
            if defs.users.contains_key(&name) {
                return Err(EngineError::NameTaken { name, kind: "user" });
            }
            let record = records::role_record(&name, true);
            defs.roles.insert(name);
            Ok((vec![record], AccessAnswer::Changed(true)))
        }
        AccessChange::DropRole { name, if_exists } => {
            if !defs.roles.remove(&name) {
                return if if_exists {
                    Ok((Vec::new(), AccessAnswer::Changed(false)))
                } else {
                    Err(unknown("role", &name))
                };
            }
            let mut records = vec![records::role_record(&name, false)];
            records.extend(forget_grantee(defs, &name));
            for user in defs.members.remove(&name).unwrap_or_default() {
                records.push(records::member_record(&name, &user, false));
            }
            Ok((records, AccessAnswer::Changed(true)))
        }
        AccessChange::Grant(grant) => {
            if !defs.is_grantee(&grant.grantee) {
                return Err(unknown("user or role", &grant.grantee));
            }
            if defs.grants.contains(&grant) {
                return Ok((Vec::new(), AccessAnswer::Changed(false)));
            }
            let record = records::grant_record(&grant, true);
            defs.grants.insert(grant);
            Ok((vec![record], AccessAnswer::Changed(true)))
        }
        AccessChange::Revoke(grant) => {
            if !defs.grants.remove(&grant) {
                return Ok((Vec::new(), AccessAnswer::Changed(false)));
            }
            Ok((vec![records::grant_record(&grant, false)], AccessAnswer::Changed(true)))
        }
        AccessChange::SetRoleMember { role, user, member } => {
            if !defs.roles.contains(&role) {
                return Err(unknown("role", &role));
            }
            if !defs.users.contains_key(&user) {
                return Err(unknown("user", &user));
            }
            let members = defs.members.entry(role.clone()).or_default();
            let changed = if member { members.insert(user.clone()) } else { members.remove(&user) };
            defs.members.retain(|_, members| !members.is_empty());
            let records = if changed { vec![records::member_record(&role, &user, member)] } else { Vec::new() };
            Ok((records, AccessAnswer::Changed(changed)))
        }
        AccessChange::CreateToken { id, user, secret_sha256, created_ms, expires_ms } => {
            if !defs.users.contains_key(&user) {
                return Err(unknown("user", &user));
            }
            let def = TokenDef { id, user, secret_sha256, created_ms, expires_ms };
            let record = records::token_record(&def);
            defs.tokens.insert(def.id.clone(), def);
            Ok((vec![record], AccessAnswer::Changed(true)))
        }
        AccessChange::DropToken(id) => {
            if defs.tokens.remove(&id).is_none() {
                return Ok((Vec::new(), AccessAnswer::Changed(false)));
            }
            Ok((vec![records::drop_token_record(&id)], AccessAnswer::Changed(true)))
        }
    }
}

fn create_user(
    defs: &mut AccessDefs,
    name: String,
    credentials: Vec<ScramCredential>,
    created_ms: u64,
    if_not_exists: bool,
) -> Result<(Vec<NewRecord>, AccessAnswer), EngineError> {
    if defs.users.contains_key(&name) {
        if if_not_exists {
            return Ok((Vec::new(), AccessAnswer::User(UserCreated::Existed)));
        }
        return Err(EngineError::NameTaken { name, kind: "user" });
    }
    if defs.roles.contains(&name) {
        return Err(EngineError::NameTaken { name, kind: "role" });
    }
    if defs.users.is_empty() && credentials.is_empty() {
        return Err(EngineError::InvalidDefinition(format!(
            "the first user becomes the superuser and needs a password: CREATE USER {name} PASSWORD '…'"
        )));
    }
    let user = UserDef { name: name.clone(), credentials, created_ms, limits: UserLimits::default() };
    let mut records = vec![records::user_record(&user)];
    let first = defs.users.is_empty();
    defs.users.insert(name.clone(), user);
    if first {
        let grant = Grant { grantee: name, privilege: Privilege::Admin, object: ObjectPattern::everything() };
        records.push(records::grant_record(&grant, true));
        defs.grants.insert(grant);
        return Ok((records, AccessAnswer::User(UserCreated::CreatedSuperuser)));
    }
    Ok((records, AccessAnswer::User(UserCreated::Created)))
}

impl Engine {
    /// Who may do what (see [`Access`]).
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// The access in force, for what outlives a call (an open subscription's checks).
    pub(crate) fn shared_access(&self) -> std::sync::Arc<Access> {
        self.access.clone()
    }

    /// Makes `change`: on this node, or on a cluster node through the cluster, on every node.
    async fn change_access(&self, change: AccessChange) -> Result<AccessAnswer, EngineError> {
        if self.is_replicated() {
            return self.change_access_replicated(change).await;
        }
        self.change_access_here(change).await
    }

    /// Changes the access definitions on this node: `change` edits a copy, the records that
    /// make the edit durable are appended, then the copy is put in force. A change that would
    /// leave users but no superuser is refused, so access can never lock everyone out.
    pub(super) async fn change_access_here(&self, change: AccessChange) -> Result<AccessAnswer, EngineError> {
        let _ddl = self.ddl.lock().await;
        let mut defs = (*self.access.defs()).clone();
        let had_superuser = !defs.superusers().is_empty();
        let (records, answer) = edit(&mut defs, change)?;
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
        let change =
            AccessChange::CreateUser { name: name.to_string(), credentials, created_ms: now_ms(), if_not_exists };
        match self.change_access(change).await? {
            AccessAnswer::User(created) => Ok(created),
            AccessAnswer::Changed(_) => Err(EngineError::Internal("creating a user answered something else".into())),
        }
    }

    /// Sets a new password for `name`. Its connections stay open; its next logins need the
    /// new password.
    pub async fn alter_user_password(&self, name: &str, password: &str) -> Result<(), EngineError> {
        validate_password(password)?;
        let credentials = derive_credentials(password).await?;
        self.change_access(AccessChange::AlterPassword { name: name.to_string(), credentials }).await?;
        Ok(())
    }

    /// Puts `limits` in force for the user `name` (all of them: a limit not given is lifted),
    /// from its connections' next publish, subscription or connection on.
    pub async fn alter_user_limits(&self, name: &str, limits: UserLimits) -> Result<(), EngineError> {
        let zero = [limits.connections, limits.subscriptions, limits.publishes_per_second].contains(&Some(0))
            || limits.publish_bytes_per_second == Some(0);
        if zero {
            return Err(invalid("a limit of 0 would refuse everything; leave the limit out to lift it".into()));
        }
        self.change_access(AccessChange::AlterLimits { name: name.to_string(), limits }).await?;
        Ok(())
    }

    /// Drops the user `name` with its grants, role memberships and tokens. Its open connections
    /// are refused from their next request on.
    pub async fn drop_user(&self, name: &str, if_exists: bool) -> Result<bool, EngineError> {
        Ok(self.change_access(AccessChange::DropUser { name: name.to_string(), if_exists }).await?.changed())
    }

    pub async fn create_role(&self, name: &str, if_not_exists: bool) -> Result<bool, EngineError> {
        validate_grantee_name(name)?;
        Ok(self.change_access(AccessChange::CreateRole { name: name.to_string(), if_not_exists }).await?.changed())
    }

    /// Drops the role `name`, its grants and its memberships.
    pub async fn drop_role(&self, name: &str, if_exists: bool) -> Result<bool, EngineError> {
        Ok(self.change_access(AccessChange::DropRole { name: name.to_string(), if_exists }).await?.changed())
    }

    /// Grants `grant`; `false` when it was granted already.
    pub async fn grant(&self, grant: Grant) -> Result<bool, EngineError> {
        grant.object.validate().map_err(invalid)?;
        Ok(self.change_access(AccessChange::Grant(grant)).await?.changed())
    }

    /// Revokes exactly `grant` (a grant on `orders*` is not narrowed by revoking `orders`);
    /// `false` when it was not granted.
    pub async fn revoke(&self, grant: &Grant) -> Result<bool, EngineError> {
        Ok(self.change_access(AccessChange::Revoke(grant.clone())).await?.changed())
    }

    /// Makes `user` a member of `role` (`member`) or no longer one; `false` when nothing changed.
    pub async fn set_role_member(&self, role: &str, user: &str, member: bool) -> Result<bool, EngineError> {
        let change = AccessChange::SetRoleMember { role: role.to_string(), user: user.to_string(), member };
        Ok(self.change_access(change).await?.changed())
    }

    /// A new token for `user`, valid for `valid_ms` (or until dropped): its definition and the
    /// secret, which is shown once and kept nowhere.
    pub async fn create_token(&self, user: &str, valid_ms: Option<u64>) -> Result<(TokenDef, String), EngineError> {
        if valid_ms == Some(0) {
            return Err(invalid("a token valid for 0 would never work".into()));
        }
        let (def, secret) = access::new_token(user, now_ms(), valid_ms);
        let change = AccessChange::CreateToken {
            id: def.id.clone(),
            user: def.user.clone(),
            secret_sha256: def.secret_sha256.clone(),
            created_ms: def.created_ms,
            expires_ms: def.expires_ms,
        };
        self.change_access(change).await?;
        Ok((def, secret))
    }

    /// Drops the token whose id is `id`; `false` when there is none.
    pub async fn drop_token(&self, id: &str) -> Result<bool, EngineError> {
        Ok(self.change_access(AccessChange::DropToken(id.to_string())).await?.changed())
    }

    /// The first superuser, from the operator's settings: creates `name` with `ADMIN ON ALL`
    /// unless a user of that name exists (its password then stays as it is: a restart with the
    /// setting still there must not undo a password change). `true` when it was created. On a
    /// cluster node it is created through the cluster, once for every node.
    pub async fn bootstrap_superuser(&self, name: &str, password: &str) -> Result<bool, EngineError> {
        if self.access.defs().users.contains_key(name) {
            return Ok(false);
        }
        validate_grantee_name(name)?;
        validate_password(password)?;
        let credentials = derive_credentials(password).await?;
        let change = AccessChange::Bootstrap { name: name.to_string(), credentials, created_ms: now_ms() };
        Ok(self.change_access(change).await?.changed())
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
            assert!(engine.access().login_password("device", b"", None).await.is_err(), "no password logs it in");
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
        assert!(access.login_password("alice", b"secret", None).await.is_err());
        let alice = access.login_password("alice", b"changed", None).await.unwrap();
        access.authorize(&alice, Privilege::Read, ObjectKind::Stream, "orders").unwrap();
        assert!(access.authorize(&alice, Privilege::Write, ObjectKind::Stream, "orders").is_err());
        assert_eq!(access.login_token(&token, now_ms()).unwrap().user(), Some("alice"));
        let root = access.login_password("root", b"first", None).await.unwrap();
        access.authorize_superuser(&root, "manage users").unwrap();
        assert!(engine.drop_user("alice", false).await.unwrap());
        assert!(access.login_token(&token, now_ms()).is_err());
        assert!(engine.access().defs().members.is_empty());
        assert!(!engine.drop_role("nobody", true).await.unwrap());
    }
}
