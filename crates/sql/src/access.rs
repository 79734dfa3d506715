//! Users, roles, grants and tokens in SQL: parsing (from the same token stream as the other
//! statements) and running them.
//!
//! ```sql
//! CREATE USER [IF NOT EXISTS] alice [WITH] PASSWORD 's3cret';
//! CREATE USER device1;                  -- no password: token or client certificate only
//! ALTER USER alice [WITH] PASSWORD 'n3w';
//! ALTER USER alice SET LIMITS (connections = 10, subscriptions = 100,
//!                              publishes_per_second = 500, publish_bytes_per_second = '1MiB');
//! ALTER USER alice RESET LIMITS;
//! DROP USER [IF EXISTS] alice;
//! CREATE ROLE [IF NOT EXISTS] readers;   DROP ROLE [IF EXISTS] readers;
//! GRANT READ, WRITE ON STREAM orders, TABLE carts, VIEW 'sensor_*' TO alice, readers;
//! GRANT ADMIN ON ALL TO bob;             GRANT READ ON ALL VIEWS TO PUBLIC;
//! GRANT readers TO alice;                REVOKE readers FROM alice;
//! REVOKE WRITE ON STREAM orders FROM alice;
//! GRANT WRITE ON TOPIC 'devices/%u/#' TO PUBLIC;   GRANT READ ON TOPIC 'devices/+/status' TO ops;
//! GRANT READ ON GROUP 'billing-*' TO billing;      GRANT WRITE ON TRANSACTIONAL ID 'etl' TO etl;
//! CREATE TOKEN [FOR alice] [VALID FOR '30d'];   DROP TOKEN 'a1b2c3d4';
//! SHOW USERS; SHOW ROLES; SHOW GRANTS [FOR alice]; SHOW TOKENS;
//! ```

use onehop_engine::access::model::{Grant, ObjectPattern, PUBLIC, UserLimits};
use onehop_engine::units::parse_duration;
use onehop_engine::{Engine, ObjectKind, Principal, Privilege};
use serde_json::{Value, json};
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

use crate::SqlError;
use crate::execute::Output;
use crate::parse::syntax;

/// A statement about access.
#[derive(Clone, PartialEq, Eq)]
pub enum AccessStatement {
    CreateUser {
        name: String,
        /// `None`: the user logs in with a token or a client certificate only.
        password: Option<String>,
        if_not_exists: bool,
    },
    AlterUser {
        name: String,
        password: String,
    },
    /// `SET LIMITS (…)` (the limits given, every other lifted) or `RESET LIMITS` (none).
    AlterUserLimits {
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
    /// `GRANT`/`REVOKE` (`grant` false) of privileges on objects to (from) grantees.
    Privileges {
        grant: bool,
        privileges: Vec<Privilege>,
        objects: Vec<ObjectPattern>,
        grantees: Vec<String>,
    },
    /// `GRANT role TO users` / `REVOKE role FROM users`.
    Membership {
        grant: bool,
        role: String,
        users: Vec<String>,
    },
    /// `CREATE TOKEN [FOR user] [VALID FOR 'duration']`: for the user running it when `user` is
    /// `None`.
    CreateToken {
        user: Option<String>,
        valid_ms: Option<u64>,
    },
    DropToken {
        id: String,
    },
    ShowUsers,
    ShowRoles,
    ShowGrants {
        grantee: Option<String>,
    },
    ShowTokens,
}

// Passwords never reach a log line or an answer through `Debug`.
impl std::fmt::Debug for AccessStatement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl AccessStatement {
    /// Whether it only lists (SHOW USERS, ROLES, GRANTS, TOKENS).
    pub fn is_show(&self) -> bool {
        matches!(
            self,
            AccessStatement::ShowUsers
                | AccessStatement::ShowRoles
                | AccessStatement::ShowGrants { .. }
                | AccessStatement::ShowTokens
        )
    }

    /// A label for answers, without the password.
    pub fn label(&self) -> String {
        match self {
            AccessStatement::CreateUser { name, .. } => format!("CREATE USER {name}"),
            AccessStatement::AlterUser { name, .. } | AccessStatement::AlterUserLimits { name, .. } => {
                format!("ALTER USER {name}")
            }
            AccessStatement::DropUser { name, .. } => format!("DROP USER {name}"),
            AccessStatement::CreateRole { name, .. } => format!("CREATE ROLE {name}"),
            AccessStatement::DropRole { name, .. } => format!("DROP ROLE {name}"),
            AccessStatement::Privileges { grant, .. } => (if *grant { "GRANT" } else { "REVOKE" }).to_string(),
            AccessStatement::Membership { grant, role, .. } => {
                format!("{} {role}", if *grant { "GRANT" } else { "REVOKE" })
            }
            AccessStatement::CreateToken { user, .. } => match user {
                Some(user) => format!("CREATE TOKEN FOR {user}"),
                None => "CREATE TOKEN".into(),
            },
            AccessStatement::DropToken { id } => format!("DROP TOKEN {id}"),
            AccessStatement::ShowUsers => "SHOW USERS".into(),
            AccessStatement::ShowRoles => "SHOW ROLES".into(),
            AccessStatement::ShowGrants { .. } => "SHOW GRANTS".into(),
            AccessStatement::ShowTokens => "SHOW TOKENS".into(),
        }
    }
}

/// Whether the next token is the word `word` (keyword or not); takes it if so.
fn word(parser: &mut Parser, word: &str) -> bool {
    if let Token::Word(next) = &parser.peek_token().token
        && next.quote_style.is_none()
        && next.value.eq_ignore_ascii_case(word)
    {
        parser.next_token();
        return true;
    }
    false
}

fn name(parser: &mut Parser) -> Result<String, SqlError> {
    Ok(parser.parse_identifier().map_err(syntax)?.value)
}

fn string(parser: &mut Parser, what: &str) -> Result<String, SqlError> {
    match parser.next_token().token {
        Token::SingleQuotedString(text) => Ok(text),
        other => Err(SqlError::Syntax(format!("expected {what} as a quoted string, found {other}"))),
    }
}

fn names(parser: &mut Parser) -> Result<Vec<String>, SqlError> {
    let mut out = vec![grantee(parser)?];
    while parser.consume_token(&Token::Comma) {
        out.push(grantee(parser)?);
    }
    Ok(out)
}

/// A user, role or `PUBLIC` (stored as `public`).
fn grantee(parser: &mut Parser) -> Result<String, SqlError> {
    if word(parser, "public") {
        return Ok(PUBLIC.to_string());
    }
    name(parser)
}

fn password(parser: &mut Parser) -> Result<String, SqlError> {
    // `WITH` is optional, as in Postgres.
    let _ = parser.parse_keyword(Keyword::WITH);
    if !parser.parse_keyword(Keyword::PASSWORD) {
        return Err(SqlError::Syntax("expected PASSWORD 'text'".into()));
    }
    string(parser, "the password")
}

/// Parses what follows `CREATE` when it is `USER`, `ROLE` or `TOKEN`; `None` otherwise (nothing
/// taken).
pub(crate) fn parse_create(parser: &mut Parser) -> Result<Option<AccessStatement>, SqlError> {
    if parser.parse_keyword(Keyword::USER) {
        let if_not_exists = parser.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let name = name(parser)?;
        // Without a password, the user logs in with a token or a client certificate only.
        let password = if parser.peek_token().token == sqlparser::tokenizer::Token::EOF
            || parser.peek_token().token == sqlparser::tokenizer::Token::SemiColon
        {
            None
        } else {
            Some(password(parser)?)
        };
        return Ok(Some(AccessStatement::CreateUser { name, password, if_not_exists }));
    }
    if parser.parse_keyword(Keyword::ROLE) {
        let if_not_exists = parser.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        return Ok(Some(AccessStatement::CreateRole { name: name(parser)?, if_not_exists }));
    }
    if word(parser, "token") {
        let user = if parser.parse_keyword(Keyword::FOR) { Some(name(parser)?) } else { None };
        let valid_ms = if word(parser, "valid") {
            parser.expect_keyword(Keyword::FOR).map_err(syntax)?;
            let text = string(parser, "how long the token is valid ('30d', '1h')")?;
            let valid = parse_duration(&text)
                .map_err(|error| SqlError::InvalidOption(format!("VALID FOR '{text}': {error}")))?;
            Some(valid.as_millis() as u64)
        } else {
            None
        };
        return Ok(Some(AccessStatement::CreateToken { user, valid_ms }));
    }
    Ok(None)
}

/// `ALTER USER` (already read) `name [WITH] PASSWORD '…'`, `name SET LIMITS (…)` or
/// `name RESET LIMITS`.
pub(crate) fn parse_alter_user(parser: &mut Parser) -> Result<AccessStatement, SqlError> {
    let name = name(parser)?;
    if parser.parse_keyword(Keyword::RESET) {
        if !word(parser, "limits") {
            return Err(SqlError::Syntax("expected RESET LIMITS".into()));
        }
        return Ok(AccessStatement::AlterUserLimits { name, limits: UserLimits::default() });
    }
    if parser.parse_keyword(Keyword::SET) {
        if !word(parser, "limits") {
            return Err(SqlError::Syntax("expected SET LIMITS (name = value, …)".into()));
        }
        return Ok(AccessStatement::AlterUserLimits { name, limits: limits(parser)? });
    }
    Ok(AccessStatement::AlterUser { name, password: password(parser)? })
}

/// `(name = value, …)`: each of the four limits at most once; a count is a whole number, a
/// byte rate a number or a quoted size (`'1MiB'`).
fn limits(parser: &mut Parser) -> Result<UserLimits, SqlError> {
    parser.expect_token(&Token::LParen).map_err(syntax)?;
    let mut limits = UserLimits::default();
    loop {
        let key = name(parser)?.to_ascii_lowercase();
        parser.expect_token(&Token::Eq).map_err(syntax)?;
        let value = match parser.next_token().token {
            Token::Number(text, _) | Token::SingleQuotedString(text) => text,
            other => return Err(SqlError::Syntax(format!("expected a number for {key}, found {other}"))),
        };
        let invalid = |reason: String| SqlError::InvalidOption(format!("{key} = {value}: {reason}"));
        let count = || value.parse::<u32>().map_err(|_| invalid("a whole number up to 4294967295".into()));
        let slot_taken = match key.as_str() {
            "connections" => limits.connections.replace(count()?).is_some(),
            "subscriptions" => limits.subscriptions.replace(count()?).is_some(),
            "publishes_per_second" => limits.publishes_per_second.replace(count()?).is_some(),
            "publish_bytes_per_second" => limits
                .publish_bytes_per_second
                .replace(onehop_engine::units::parse_bytes(&value).map_err(invalid)?)
                .is_some(),
            _ => {
                return Err(SqlError::InvalidOption(format!(
                    "unknown limit {key}: connections, subscriptions, publishes_per_second or publish_bytes_per_second"
                )));
            }
        };
        if slot_taken {
            return Err(SqlError::InvalidOption(format!("{key} is given twice")));
        }
        if !parser.consume_token(&Token::Comma) {
            break;
        }
    }
    parser.expect_token(&Token::RParen).map_err(syntax)?;
    Ok(limits)
}

/// Parses what follows `DROP` when it is `USER`, `ROLE` or `TOKEN`; `None` otherwise.
pub(crate) fn parse_drop(parser: &mut Parser) -> Result<Option<AccessStatement>, SqlError> {
    if parser.parse_keyword(Keyword::USER) {
        let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        return Ok(Some(AccessStatement::DropUser { name: name(parser)?, if_exists }));
    }
    if parser.parse_keyword(Keyword::ROLE) {
        let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        return Ok(Some(AccessStatement::DropRole { name: name(parser)?, if_exists }));
    }
    if word(parser, "token") {
        let id = match parser.peek_token().token {
            Token::SingleQuotedString(_) => string(parser, "the token's id")?,
            _ => name(parser)?,
        };
        return Ok(Some(AccessStatement::DropToken { id }));
    }
    Ok(None)
}

/// Parses what follows `SHOW` when it is `USERS`, `ROLES`, `GRANTS` or `TOKENS`.
pub(crate) fn parse_show(parser: &mut Parser) -> Result<Option<AccessStatement>, SqlError> {
    if word(parser, "users") {
        return Ok(Some(AccessStatement::ShowUsers));
    }
    if word(parser, "roles") {
        return Ok(Some(AccessStatement::ShowRoles));
    }
    if word(parser, "grants") {
        let grantee = if parser.parse_keyword(Keyword::FOR) { Some(grantee(parser)?) } else { None };
        return Ok(Some(AccessStatement::ShowGrants { grantee }));
    }
    if word(parser, "tokens") {
        return Ok(Some(AccessStatement::ShowTokens));
    }
    Ok(None)
}

fn privilege(parser: &mut Parser) -> Option<Privilege> {
    [("read", Privilege::Read), ("write", Privilege::Write), ("admin", Privilege::Admin)]
        .into_iter()
        .find_map(|(text, privilege)| word(parser, text).then_some(privilege))
}

/// `GRANT` or `REVOKE` (already read, `grant` says which).
pub(crate) fn parse_grant(parser: &mut Parser, grant: bool) -> Result<AccessStatement, SqlError> {
    let (to, to_text) = if grant { (Keyword::TO, "TO") } else { (Keyword::FROM, "FROM") };
    let Some(first) = privilege(parser) else {
        // `GRANT role TO users`.
        let role = name(parser)?;
        if !parser.parse_keyword(to) {
            return Err(SqlError::Syntax(format!(
                "expected READ, WRITE or ADMIN … ON …, or a role and {to_text}, after {}",
                if grant { "GRANT" } else { "REVOKE" }
            )));
        }
        return Ok(AccessStatement::Membership { grant, role, users: names(parser)? });
    };
    let mut privileges = vec![first];
    while parser.consume_token(&Token::Comma) {
        privileges.push(privilege(parser).ok_or_else(|| SqlError::Syntax("expected READ, WRITE or ADMIN".into()))?);
    }
    parser.expect_keyword(Keyword::ON).map_err(syntax)?;
    let mut objects = vec![object(parser)?];
    while parser.consume_token(&Token::Comma) {
        objects.push(object(parser)?);
    }
    if !parser.parse_keyword(to) {
        return Err(SqlError::Syntax(format!("expected {to_text} and who")));
    }
    Ok(AccessStatement::Privileges { grant, privileges, objects, grantees: names(parser)? })
}

/// `ALL`, `ALL STREAMS|TABLES|VIEWS`, `[STREAM|TABLE|VIEW] pattern`, or `TOPIC 'filter'` (an
/// MQTT topic filter; `%u` stands for the user's name).
fn object(parser: &mut Parser) -> Result<ObjectPattern, SqlError> {
    if parser.parse_keyword(Keyword::ALL) {
        let kind = [("streams", ObjectKind::Stream), ("tables", ObjectKind::Table), ("views", ObjectKind::View)]
            .into_iter()
            .find_map(|(text, kind)| word(parser, text).then_some(kind));
        return Ok(ObjectPattern { kind, name: "*".into() });
    }
    let kind = if parser.parse_keyword(Keyword::STREAM) {
        Some(ObjectKind::Stream)
    } else if parser.parse_keyword(Keyword::TABLE) {
        Some(ObjectKind::Table)
    } else if parser.parse_keyword(Keyword::VIEW) {
        Some(ObjectKind::View)
    } else if word(parser, "topic") {
        Some(ObjectKind::Topic)
    } else if word(parser, "group") {
        Some(ObjectKind::Group)
    } else if word(parser, "transactional") {
        if !word(parser, "id") {
            return Err(SqlError::Syntax("expected TRANSACTIONAL ID name".into()));
        }
        Some(ObjectKind::TransactionalId)
    } else {
        None
    };
    let name = pattern(parser)?;
    let object = ObjectPattern { kind, name };
    object.validate().map_err(SqlError::InvalidOption)?;
    Ok(object)
}

/// A name, a name's start followed by `*`, `*`, or any of these quoted.
fn pattern(parser: &mut Parser) -> Result<String, SqlError> {
    let token = parser.next_token().token;
    let mut text = match token {
        Token::Mul => return Ok("*".into()),
        Token::SingleQuotedString(text) => return Ok(text),
        Token::Word(word) => word.value,
        other => return Err(SqlError::Syntax(format!("expected a name or a pattern such as sensor_*, found {other}"))),
    };
    // `sensor_*` reaches here as the word `sensor_` and `*`, with nothing between them.
    let star = parser.peek_token_no_skip();
    if star.token == Token::Mul {
        parser.next_token();
        text.push('*');
    }
    Ok(text)
}

// --- running -----------------------------------------------------------------------------

fn rows(statement: String, columns: &[&str], rows: Vec<Vec<Value>>) -> Output {
    Output::Rows { statement, columns: columns.iter().map(|column| column.to_string()).collect(), rows, verb: None }
}

/// How long a token made without `VALID FOR` is valid: 30 days.
pub const TOKEN_VALID_MS_DEFAULT: u64 = 30 * 86_400_000;

/// Refuses a grant on a named object of the wrong kind (`ON STREAM orders` where `orders` is a
/// table): it would grant nothing, and look as if it did.
fn check_object_kind(engine: &Engine, object: &ObjectPattern) -> Result<(), SqlError> {
    let Some(kind) = object.kind else { return Ok(()) };
    if object.name.contains('*') {
        return Ok(());
    }
    let name = object.name.as_str();
    let actual = if engine.has_table(name) {
        ObjectKind::Table
    } else if engine.view(name).is_ok() {
        ObjectKind::View
    } else if engine.stream(name).is_ok() {
        ObjectKind::Stream
    } else {
        return Ok(());
    };
    let named = matches!(kind, ObjectKind::Stream | ObjectKind::Table | ObjectKind::View);
    if named && kind != actual {
        return Err(SqlError::InvalidOption(format!(
            "{name} is a {actual}, not a {kind}: grant it ON {} {name}",
            actual.as_str().to_ascii_uppercase()
        )));
    }
    Ok(())
}

/// Runs an access statement for `principal`. Managing users, roles, grants and other users'
/// tokens takes a superuser (`ADMIN ON ALL`); a user may change its own password, make and
/// drop its own tokens and see its own grants.
pub(crate) async fn execute(
    engine: &Engine,
    principal: Option<&Principal>,
    statement: &AccessStatement,
) -> Result<Output, SqlError> {
    let access = engine.access();
    let label = statement.label();
    let own = |name: &str| principal.is_some_and(|principal| principal.user() == Some(name));
    let superuser = |what: &str| match principal {
        Some(principal) => access.authorize_superuser(principal, what),
        None => Ok(()),
    };
    let output = match statement {
        AccessStatement::CreateUser { name, password, if_not_exists } => {
            superuser("create users")?;
            match engine.create_user(name, password.as_deref(), *if_not_exists).await? {
                onehop_engine::access::UserCreated::Created => {
                    Output::Created { statement: label, definition: format!("user {name}") }
                }
                onehop_engine::access::UserCreated::CreatedSuperuser => Output::Created {
                    statement: label,
                    definition: format!(
                        "user {name}, a superuser (ADMIN ON ALL): the first user turns access on, and someone must \
                         manage it"
                    ),
                },
                onehop_engine::access::UserCreated::Existed => Output::Unchanged {
                    statement: label,
                    definition: format!("user {name}"),
                    note: "IF NOT EXISTS: the user exists; its password was left as it was".into(),
                },
            }
        }
        AccessStatement::AlterUser { name, password } => {
            if !own(name) {
                superuser("change another user's password")?;
            }
            engine.alter_user_password(name, password).await?;
            Output::Altered { statement: label, definition: format!("user {name}: new password") }
        }
        AccessStatement::AlterUserLimits { name, limits } => {
            superuser("change users' limits")?;
            engine.alter_user_limits(name, *limits).await?;
            Output::Altered { statement: label, definition: format!("user {name}: limits {limits}") }
        }
        AccessStatement::DropUser { name, if_exists } => {
            superuser("drop users")?;
            if engine.drop_user(name, *if_exists).await? {
                Output::Dropped { statement: label }
            } else {
                Output::Unchanged {
                    statement: label,
                    definition: String::new(),
                    note: "IF EXISTS: no such user".into(),
                }
            }
        }
        AccessStatement::CreateRole { name, if_not_exists } => {
            superuser("create roles")?;
            if engine.create_role(name, *if_not_exists).await? {
                Output::Created { statement: label, definition: format!("role {name}") }
            } else {
                Output::Unchanged {
                    statement: label,
                    definition: format!("role {name}"),
                    note: "IF NOT EXISTS: the role exists".into(),
                }
            }
        }
        AccessStatement::DropRole { name, if_exists } => {
            superuser("drop roles")?;
            if engine.drop_role(name, *if_exists).await? {
                Output::Dropped { statement: label }
            } else {
                Output::Unchanged {
                    statement: label,
                    definition: String::new(),
                    note: "IF EXISTS: no such role".into(),
                }
            }
        }
        AccessStatement::Privileges { grant, privileges, objects, grantees } => {
            superuser("grant and revoke")?;
            if *grant {
                for object in objects {
                    check_object_kind(engine, object)?;
                }
            }
            let mut changed = Vec::new();
            let mut unchanged = Vec::new();
            for grantee in grantees {
                for privilege in privileges {
                    for object in objects {
                        let one = Grant { grantee: grantee.clone(), privilege: *privilege, object: object.clone() };
                        let did = if *grant { engine.grant(one.clone()).await? } else { engine.revoke(&one).await? };
                        if did { changed.push(one.to_string()) } else { unchanged.push(one.to_string()) }
                    }
                }
            }
            let definition = changed.join("; ");
            match (grant, changed.is_empty()) {
                (true, false) => Output::Created { statement: label, definition },
                (false, false) => Output::Altered { statement: label, definition: format!("revoked {definition}") },
                (_, true) => Output::Unchanged {
                    statement: label,
                    definition: unchanged.join("; "),
                    note: if *grant {
                        "granted already".into()
                    } else {
                        "not granted (revoke names a grant exactly)".into()
                    },
                },
            }
        }
        AccessStatement::Membership { grant, role, users } => {
            superuser("grant and revoke roles")?;
            let mut changed = false;
            for user in users {
                changed |= engine.set_role_member(role, user, *grant).await?;
            }
            let definition = format!("role {role}: {}", users.join(", "));
            match (grant, changed) {
                (true, true) => Output::Created { statement: label, definition },
                (false, true) => Output::Altered { statement: label, definition },
                (_, false) => Output::Unchanged { statement: label, definition, note: "nothing changed".into() },
            }
        }
        AccessStatement::CreateToken { user, valid_ms } => {
            let user = match (user, principal.and_then(Principal::user)) {
                (Some(user), _) => user.clone(),
                (None, Some(own)) => own.to_string(),
                (None, None) => {
                    return Err(SqlError::InvalidOption("CREATE TOKEN without a login needs FOR user".into()));
                }
            };
            if !own(&user) {
                superuser("create tokens for another user")?;
            }
            // A token without VALID FOR lasts TOKEN_VALID_MS_DEFAULT, said in its answer
            // (`expires_ms`): a forgotten one must not stay a way in for good.
            let (def, secret) = engine.create_token(&user, Some(valid_ms.unwrap_or(TOKEN_VALID_MS_DEFAULT))).await?;
            rows(
                label,
                &["id", "user", "token", "expires_ms"],
                vec![vec![json!(def.id), json!(def.user), json!(secret), json!(def.expires_ms)]],
            )
        }
        AccessStatement::DropToken { id } => {
            let owner = access.defs().tokens.get(id).map(|token| token.user.clone());
            if !owner.as_deref().is_some_and(own) {
                superuser("drop another user's token")?;
            }
            if engine.drop_token(id).await? {
                Output::Dropped { statement: label }
            } else {
                Output::Unchanged { statement: label, definition: String::new(), note: "no such token".into() }
            }
        }
        AccessStatement::ShowUsers => {
            superuser("list users")?;
            let defs = access.defs();
            let superusers = defs.superusers();
            let list = defs
                .users
                .values()
                .map(|user| {
                    let roles: Vec<&String> = defs
                        .members
                        .iter()
                        .filter(|(_, members)| members.contains(&user.name))
                        .map(|(role, _)| role)
                        .collect();
                    vec![
                        json!(user.name),
                        json!(superusers.contains(&user.name)),
                        json!(roles),
                        json!(!user.credentials.is_empty()),
                        json!(user.limits.to_string()),
                        json!(user.created_ms),
                    ]
                })
                .collect();
            rows(label, &["name", "superuser", "roles", "password", "limits", "created_ms"], list)
        }
        AccessStatement::ShowRoles => {
            superuser("list roles")?;
            let defs = access.defs();
            let list = defs
                .roles
                .iter()
                .map(|role| vec![json!(role), json!(defs.members.get(role).cloned().unwrap_or_default())])
                .collect();
            rows(label, &["name", "members"], list)
        }
        AccessStatement::ShowGrants { grantee } => {
            // Without FOR: everyone's for a superuser, the caller's own for anyone else.
            let grantee = match (grantee, principal.and_then(Principal::user)) {
                (None, Some(user)) if superuser("list other users' grants").is_err() => Some(user.to_string()),
                (grantee, _) => grantee.clone(),
            };
            if !grantee.as_deref().is_some_and(own) {
                superuser("list other users' grants")?;
            }
            let defs = access.defs();
            let list = defs
                .grants
                .iter()
                .filter(|grant| grantee.as_ref().is_none_or(|wanted| &grant.grantee == wanted))
                .map(|grant| {
                    vec![
                        json!(grant.grantee),
                        json!(grant.privilege.as_str()),
                        json!(grant.object.kind.map(ObjectKind::as_str)),
                        json!(grant.object.name),
                    ]
                })
                .collect();
            rows(label, &["grantee", "privilege", "kind", "name"], list)
        }
        AccessStatement::ShowTokens => {
            let everyone = superuser("list other users' tokens").is_ok();
            let defs = access.defs();
            let list = defs
                .tokens
                .values()
                .filter(|token| everyone || own(&token.user))
                .map(|token| vec![json!(token.id), json!(token.user), json!(token.created_ms), json!(token.expires_ms)])
                .collect();
            rows(label, &["id", "user", "created_ms", "expires_ms"], list)
        }
    };
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Statement, parse};

    fn one(sql: &str) -> AccessStatement {
        match parse(sql).unwrap().remove(0) {
            Statement::Access(statement) => statement,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn access_statements_parse() {
        assert_eq!(
            one("CREATE USER IF NOT EXISTS alice WITH PASSWORD 'it''s'"),
            AccessStatement::CreateUser { name: "alice".into(), password: Some("it's".into()), if_not_exists: true }
        );
        assert_eq!(
            one("alter user alice password 'x'"),
            AccessStatement::AlterUser { name: "alice".into(), password: "x".into() }
        );
        let AccessStatement::Privileges { grant, privileges, objects, grantees } = one(
            "GRANT READ, WRITE ON STREAM orders, TABLE carts, sensor_*, VIEW 'x*', ALL VIEWS, ALL TO alice, PUBLIC",
        ) else {
            panic!()
        };
        assert!(grant);
        assert_eq!(privileges, [Privilege::Read, Privilege::Write]);
        let shown: Vec<String> = objects.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["STREAM orders", "TABLE carts", "sensor_*", "VIEW x*", "VIEW *", "ALL"]);
        assert_eq!(grantees, ["alice", "public"]);
        assert_eq!(
            one("REVOKE readers FROM alice, bob"),
            AccessStatement::Membership {
                grant: false,
                role: "readers".into(),
                users: vec!["alice".into(), "bob".into()]
            }
        );
        assert_eq!(
            one("CREATE TOKEN FOR alice VALID FOR '30d'"),
            AccessStatement::CreateToken { user: Some("alice".into()), valid_ms: Some(30 * 86_400_000) }
        );
        assert_eq!(one("DROP TOKEN 'ab12'"), AccessStatement::DropToken { id: "ab12".into() });
        assert_eq!(one("SHOW GRANTS FOR public"), AccessStatement::ShowGrants { grantee: Some("public".into()) });
        assert_eq!(one("show tokens"), AccessStatement::ShowTokens);
        assert_eq!(
            one("ALTER USER alice SET LIMITS (connections = 3, PUBLISH_BYTES_PER_SECOND = '1KiB')"),
            AccessStatement::AlterUserLimits {
                name: "alice".into(),
                limits: UserLimits {
                    connections: Some(3),
                    publish_bytes_per_second: Some(1024),
                    ..UserLimits::default()
                }
            }
        );
        assert_eq!(
            one("alter user alice reset limits"),
            AccessStatement::AlterUserLimits { name: "alice".into(), limits: UserLimits::default() }
        );
        for bad in [
            "ALTER USER alice SET LIMITS (connections = -1)",
            "ALTER USER alice SET LIMITS (connections = 1, connections = 2)",
            "ALTER USER alice SET LIMITS (speed = 1)",
            "ALTER USER alice SET LIMITS ()",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let topic = one("GRANT WRITE ON TOPIC 'devices/%u/#' TO PUBLIC");
        let AccessStatement::Privileges { objects, .. } = &topic else { panic!("{topic:?}") };
        assert_eq!(objects[0], ObjectPattern { kind: Some(ObjectKind::Topic), name: "devices/%u/#".into() });
        assert_eq!(objects[0].to_string(), "TOPIC 'devices/%u/#'");
        assert!(parse("GRANT READ ON TOPIC 'a/#/b' TO x").is_err(), "not a topic filter");
        let group = one("GRANT READ ON GROUP 'billing.v2-*' TO billing");
        let AccessStatement::Privileges { objects, .. } = &group else { panic!("{group:?}") };
        assert_eq!(objects[0].to_string(), "GROUP 'billing.v2-*'");
        let id = one("GRANT WRITE ON TRANSACTIONAL ID etl TO etl");
        let AccessStatement::Privileges { objects, .. } = &id else { panic!("{id:?}") };
        assert_eq!(objects[0], ObjectPattern { kind: Some(ObjectKind::TransactionalId), name: "etl".into() });
        assert_eq!(
            one("CREATE USER device1"),
            AccessStatement::CreateUser { name: "device1".into(), password: None, if_not_exists: false }
        );
        for bad in [
            "CREATE USER alice 'x'",
            "GRANT FLY ON orders TO a",
            "GRANT READ ON STREAM 'a*b' TO x",
            "GRANT READ orders TO x",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        // The password never shows in what is printed of a statement.
        let shown = format!("{:?}", one("CREATE USER alice PASSWORD 'hunter2'"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
