//! The catalog Postgres clients read to learn what a database holds: enough of `pg_catalog`
//! (namespaces, classes, attributes, types, indexes, constraints, access methods, the
//! database and roles) and of `information_schema` (schemata, tables, views, columns) that
//! psql's `\dt`, `\dv`, `\dm` and `\d`, SQLAlchemy's and psycopg's connection-time questions,
//! and anyone's `SELECT … FROM information_schema.columns` get onehop's tables, views and
//! streams as they would get Postgres's.
//!
//! The relations are built from the engine's catalog when a query names one, holding only
//! the objects the principal may see (what SHOW lists for them); they are read like any input
//! of a query and joined like one. onehop's objects are in the schema `public`: a table is a
//! table (`r`), a stream a table of its records (`r`, with `_key`, `_partition`, `_offset`,
//! `_time`, `_subject`), a view a materialized view (`m`: its rows are kept, not computed per
//! query). Object ids are a hash of the object's kind and name, so they stay the same while
//! the object exists.
//!
//! With them, the functions and casts such queries use: `version()`, `current_schema()`,
//! `current_database()`, `current_user`, `pg_table_is_visible`, `pg_get_userbyid`,
//! `format_type`, `to_regtype`/`to_regclass`, `obj_description`, and `::regclass`,
//! `::regtype`, `::regnamespace`, `::oid` and the other integer and name casts, rewritten here
//! into the expression language before a query is planned.

use onehop_engine::{ColumnType, Engine, ObjectKind, Principal};
use serde_json::{Value, json};
use sqlparser::ast;

use super::Answer;
use crate::SqlError;

/// What `version()` answers (clients read the major version from it).
pub(super) fn version() -> String {
    format!("PostgreSQL 15.0 (onehop {}) on a real-time data runtime", env!("CARGO_PKG_VERSION"))
}

/// The database every session is in.
pub(super) const DATABASE: &str = "onehop";
/// The owner every object reports.
const OWNER: &str = "onehop";
const OWNER_OID: i64 = 10;
const PG_CATALOG: i64 = 11;
const PUBLIC: i64 = 2200;
const INFORMATION_SCHEMA: i64 = 13_000;
const HEAP: i64 = 2;
const BTREE: i64 = 403;
/// The default btree operator classes of the column types onehop's tables have, as Postgres
/// numbers them: (oid, name, operator family, input type). An index's `indclass` names one;
/// SQLAlchemy's index reflection reads them.
const OPCLASSES: [(i64, &str, i64, i64); 8] = [
    (424, "bool_ops", 424, 16),
    (3124, "int8_ops", 1976, 20),
    (3126, "text_ops", 1994, 25),
    (3123, "float8_ops", 1970, 701),
    (3127, "timestamptz_ops", 434, 1184),
    (3125, "numeric_ops", 1988, 1700),
    (4033, "jsonb_ops", 4033, 3802),
    (397, "array_ops", 397, 2277),
];

/// The default btree operator class of a column of type `type_oid` (arrays: `array_ops`).
fn opclass_of(type_oid: i64) -> i64 {
    match OPCLASSES.iter().find(|(_, _, _, input)| *input == type_oid) {
        Some((oid, ..)) => *oid,
        None if TYPES.iter().any(|ty| ty.array == type_oid) => 397,
        None => 3126,
    }
}
/// The first object id of a user object, as on Postgres.
const FIRST_OID: i64 = 16_384;

const SCHEMAS: [(i64, &str); 3] =
    [(PG_CATALOG, "pg_catalog"), (PUBLIC, "public"), (INFORMATION_SCHEMA, "information_schema")];

/// A type clients may meet: (oid, name, name `format_type` gives, length, category, array type
/// (or element type, for an array)).
struct Type {
    oid: i64,
    name: &'static str,
    display: &'static str,
    len: i64,
    category: &'static str,
    array: i64,
    element: i64,
}

const fn ty(oid: i64, name: &'static str, display: &'static str, len: i64, category: &'static str, array: i64) -> Type {
    Type { oid, name, display, len, category, array, element: 0 }
}

const fn array(oid: i64, name: &'static str, display: &'static str, element: i64) -> Type {
    Type { oid, name, display, len: -1, category: "A", array: 0, element }
}

const TYPES: [Type; 38] = [
    ty(16, "bool", "boolean", 1, "B", 1000),
    ty(17, "bytea", "bytea", -1, "U", 1001),
    ty(18, "char", "\"char\"", 1, "Z", 1002),
    ty(19, "name", "name", 64, "S", 1003),
    ty(20, "int8", "bigint", 8, "N", 1016),
    ty(21, "int2", "smallint", 2, "N", 1005),
    ty(23, "int4", "integer", 4, "N", 1007),
    ty(25, "text", "text", -1, "S", 1009),
    ty(26, "oid", "oid", 4, "N", 1028),
    ty(114, "json", "json", -1, "U", 199),
    ty(700, "float4", "real", 4, "N", 1021),
    ty(701, "float8", "double precision", 8, "N", 1022),
    ty(1043, "varchar", "character varying", -1, "S", 1015),
    ty(1082, "date", "date", 4, "D", 1182),
    ty(1114, "timestamp", "timestamp without time zone", 8, "D", 1115),
    ty(1184, "timestamptz", "timestamp with time zone", 8, "D", 1185),
    ty(1700, "numeric", "numeric", -1, "N", 1231),
    ty(2205, "regclass", "regclass", 4, "N", 2210),
    ty(2206, "regtype", "regtype", 4, "N", 2211),
    ty(2950, "uuid", "uuid", 16, "U", 2951),
    ty(3802, "jsonb", "jsonb", -1, "U", 3807),
    array(1000, "_bool", "boolean[]", 16),
    array(1001, "_bytea", "bytea[]", 17),
    array(1002, "_char", "\"char\"[]", 18),
    array(1003, "_name", "name[]", 19),
    array(1016, "_int8", "bigint[]", 20),
    array(1005, "_int2", "smallint[]", 21),
    array(1007, "_int4", "integer[]", 23),
    array(1009, "_text", "text[]", 25),
    array(1028, "_oid", "oid[]", 26),
    array(199, "_json", "json[]", 114),
    array(1021, "_float4", "real[]", 700),
    array(1022, "_float8", "double precision[]", 701),
    array(1015, "_varchar", "character varying[]", 1043),
    array(1182, "_date", "date[]", 1082),
    array(1115, "_timestamp", "timestamp without time zone[]", 1114),
    array(1185, "_timestamptz", "timestamp with time zone[]", 1184),
    array(3807, "_jsonb", "jsonb[]", 3802),
];

fn type_oid(column: &ColumnType) -> i64 {
    match column {
        ColumnType::Text => 25,
        ColumnType::Integer => 20,
        ColumnType::Float => 701,
        ColumnType::Boolean => 16,
        ColumnType::Timestamp => 1184,
        ColumnType::Json => 114,
        ColumnType::Array(inner) => {
            let element = type_oid(inner);
            TYPES.iter().find(|ty| ty.oid == element).map_or(199, |ty| ty.array)
        }
    }
}

/// The catalog's own relations: (schema, name, object id, columns).
const RELATIONS: [(&str, &str, i64, &[&str]); 32] = [
    ("pg_catalog", "pg_namespace", 2615, &["oid", "nspname", "nspowner", "nspacl"]),
    (
        "pg_catalog",
        "pg_class",
        1259,
        &[
            "oid",
            "relname",
            "relnamespace",
            "reltype",
            "reloftype",
            "relowner",
            "relam",
            "relfilenode",
            "reltablespace",
            "relpages",
            "reltuples",
            "relallvisible",
            "reltoastrelid",
            "relhasindex",
            "relisshared",
            "relpersistence",
            "relkind",
            "relnatts",
            "relchecks",
            "relhasrules",
            "relhastriggers",
            "relhassubclass",
            "relrowsecurity",
            "relforcerowsecurity",
            "relispopulated",
            "relreplident",
            "relispartition",
            "relacl",
            "reloptions",
            "relpartbound",
        ],
    ),
    (
        "pg_catalog",
        "pg_attribute",
        1249,
        &[
            "attrelid",
            "attname",
            "atttypid",
            "attlen",
            "attnum",
            "atttypmod",
            "attndims",
            "attnotnull",
            "atthasdef",
            "atthasmissing",
            "attidentity",
            "attgenerated",
            "attisdropped",
            "attislocal",
            "attinhcount",
            "attcollation",
            "attstattarget",
            "attstorage",
            "attcompression",
            "attacl",
            "attoptions",
        ],
    ),
    (
        "pg_catalog",
        "pg_type",
        1247,
        &[
            "oid",
            "typname",
            "typnamespace",
            "typowner",
            "typlen",
            "typbyval",
            "typtype",
            "typcategory",
            "typispreferred",
            "typisdefined",
            "typdelim",
            "typrelid",
            "typelem",
            "typarray",
            "typinput",
            "typoutput",
            "typreceive",
            "typsend",
            "typalign",
            "typstorage",
            "typnotnull",
            "typbasetype",
            "typtypmod",
            "typndims",
            "typcollation",
            "typdefault",
        ],
    ),
    ("pg_catalog", "pg_am", 2601, &["oid", "amname", "amhandler", "amtype"]),
    (
        "pg_catalog",
        "pg_opclass",
        2616,
        &[
            "oid",
            "opcmethod",
            "opcname",
            "opcnamespace",
            "opcowner",
            "opcfamily",
            "opcintype",
            "opcdefault",
            "opckeytype",
        ],
    ),
    (
        "pg_catalog",
        "pg_index",
        2610,
        &[
            "indexrelid",
            "indrelid",
            "indnatts",
            "indnkeyatts",
            "indisunique",
            "indnullsnotdistinct",
            "indisprimary",
            "indisexclusion",
            "indimmediate",
            "indisclustered",
            "indisvalid",
            "indisready",
            "indislive",
            "indisreplident",
            "indkey",
            "indclass",
            "indoption",
            "indexprs",
            "indpred",
        ],
    ),
    (
        "pg_catalog",
        "pg_constraint",
        2606,
        &[
            "oid",
            "conname",
            "connamespace",
            "contype",
            "condeferrable",
            "condeferred",
            "convalidated",
            "conrelid",
            "contypid",
            "conindid",
            "conparentid",
            "confrelid",
            "confupdtype",
            "confdeltype",
            "confmatchtype",
            "conislocal",
            "coninhcount",
            "connoinherit",
            "conkey",
            "confkey",
        ],
    ),
    ("pg_catalog", "pg_description", 2609, &["objoid", "classoid", "objsubid", "description"]),
    (
        "pg_catalog",
        "pg_database",
        1262,
        &[
            "oid",
            "datname",
            "datdba",
            "encoding",
            "datlocprovider",
            "datcollate",
            "datctype",
            "daticulocale",
            "datistemplate",
            "datallowconn",
            "datacl",
        ],
    ),
    (
        "pg_catalog",
        "pg_roles",
        1260,
        &[
            "oid",
            "rolname",
            "rolsuper",
            "rolinherit",
            "rolcreaterole",
            "rolcreatedb",
            "rolcanlogin",
            "rolreplication",
            "rolconnlimit",
            "rolvaliduntil",
            "rolbypassrls",
            "rolconfig",
        ],
    ),
    // What onehop has none of: defaults, collations beyond the default, policies, extended
    // statistics, publications, triggers, inheritance, role memberships, sequences, enums,
    // dependencies, functions, extensions, settings rows.
    ("pg_catalog", "pg_attrdef", 2604, &["oid", "adrelid", "adnum", "adbin"]),
    (
        "pg_catalog",
        "pg_collation",
        3456,
        &["oid", "collname", "collnamespace", "collowner", "collprovider", "collisdeterministic", "collencoding"],
    ),
    (
        "pg_catalog",
        "pg_policy",
        3256,
        &["oid", "polname", "polrelid", "polcmd", "polpermissive", "polroles", "polqual", "polwithcheck"],
    ),
    (
        "pg_catalog",
        "pg_statistic_ext",
        3381,
        &["oid", "stxrelid", "stxname", "stxnamespace", "stxowner", "stxstattarget", "stxkeys", "stxkind"],
    ),
    ("pg_catalog", "pg_publication", 6104, &["oid", "pubname", "pubowner", "puballtables"]),
    ("pg_catalog", "pg_publication_namespace", 6237, &["oid", "pnpubid", "pnnspid"]),
    ("pg_catalog", "pg_publication_rel", 6106, &["oid", "prpubid", "prrelid", "prqual", "prattrs"]),
    (
        "pg_catalog",
        "pg_trigger",
        2620,
        &["oid", "tgrelid", "tgparentid", "tgname", "tgfoid", "tgtype", "tgenabled", "tgisinternal"],
    ),
    ("pg_catalog", "pg_inherits", 2611, &["inhrelid", "inhparent", "inhseqno", "inhdetachpending"]),
    ("pg_catalog", "pg_auth_members", 1261, &["oid", "roleid", "member", "grantor", "admin_option"]),
    (
        "pg_catalog",
        "pg_sequence",
        2224,
        &["seqrelid", "seqtypid", "seqstart", "seqincrement", "seqmax", "seqmin", "seqcache", "seqcycle"],
    ),
    ("pg_catalog", "pg_enum", 3501, &["oid", "enumtypid", "enumsortorder", "enumlabel"]),
    (
        "pg_catalog",
        "pg_depend",
        2608,
        &["classid", "objid", "objsubid", "refclassid", "refobjid", "refobjsubid", "deptype"],
    ),
    ("pg_catalog", "pg_proc", 1255, &["oid", "proname", "pronamespace", "proowner", "prokind", "prorettype"]),
    ("pg_catalog", "pg_extension", 3079, &["oid", "extname", "extowner", "extnamespace", "extversion"]),
    ("pg_catalog", "pg_tables", 0, &["schemaname", "tablename", "tableowner", "hasindexes"]),
    ("pg_catalog", "pg_views", 0, &["schemaname", "viewname", "viewowner", "definition"]),
    ("information_schema", "schemata", 0, &["catalog_name", "schema_name", "schema_owner"]),
    (
        "information_schema",
        "tables",
        0,
        &["table_catalog", "table_schema", "table_name", "table_type", "is_insertable_into", "is_typed"],
    ),
    (
        "information_schema",
        "views",
        0,
        &["table_catalog", "table_schema", "table_name", "view_definition", "is_updatable", "is_insertable_into"],
    ),
    (
        "information_schema",
        "columns",
        0,
        &[
            "table_catalog",
            "table_schema",
            "table_name",
            "column_name",
            "ordinal_position",
            "column_default",
            "is_nullable",
            "data_type",
            "udt_name",
            "character_maximum_length",
            "numeric_precision",
            "is_updatable",
        ],
    ),
];

/// The catalog relation `[schema.]name` names, if any: pg_catalog's are found unqualified
/// too (Postgres searches it first), information_schema's only qualified.
pub(super) fn relation(schema: Option<&str>, name: &str) -> Option<(&'static str, &'static str)> {
    RELATIONS.iter().find_map(|(relation_schema, relation_name, _, _)| {
        let schema_matches = match schema {
            Some(schema) => schema.eq_ignore_ascii_case(relation_schema),
            None => *relation_schema == "pg_catalog",
        };
        (schema_matches && relation_name.eq_ignore_ascii_case(name)).then_some((*relation_schema, *relation_name))
    })
}

/// `schema.relation.column` as `relation.column`, when `schema` is one of onehop's (`public`,
/// or the catalog's): the schema adds nothing once the relation is named. Anything else as it is.
pub(super) fn without_schema(parts: &[ast::Ident]) -> &[ast::Ident] {
    match parts {
        [schema, rest @ ..]
            if rest.len() == 2 && (schema.value.eq_ignore_ascii_case("public") || is_catalog_schema(&schema.value)) =>
        {
            rest
        }
        parts => parts,
    }
}

/// Whether `schema` is one of the catalog's.
pub(super) fn is_catalog_schema(schema: &str) -> bool {
    schema.eq_ignore_ascii_case("pg_catalog") || schema.eq_ignore_ascii_case("information_schema")
}

/// (object id, its definition as text).
type Definitions = Vec<(i64, String)>;

/// One of onehop's objects as the catalog shows it.
struct Object {
    oid: i64,
    name: String,
    /// `r` (table, stream) or `m` (view).
    kind: &'static str,
    /// What it is, for information_schema.
    label: &'static str,
    /// (name, type oid, not null).
    columns: Vec<(String, i64, bool)>,
    /// (object id, name, column position from 1, primary key).
    indexes: Vec<(i64, String, i64, bool)>,
    /// (column, the table it references).
    references: Vec<(String, String)>,
    definition: Option<String>,
}

/// A foreign key as `pg_constraint` shows it.
struct Reference {
    oid: i64,
    name: String,
    table: i64,
    column: i64,
    referenced: i64,
    referenced_column: i64,
    definition: String,
}

/// The objects a principal may see, with their object ids.
pub(super) struct Catalog {
    objects: Vec<Object>,
    /// (object id, name, superuser, logs in): every user and role for a superuser (or without
    /// users), else the principal's own user.
    roles: Vec<(i64, String, bool, bool)>,
    /// (role, member) object ids.
    members: Vec<(i64, i64)>,
    references: Vec<Reference>,
}

/// An object id from `kind` and `name`: stable while the object exists.
fn object_id(kind: &str, name: &str, taken: &mut std::collections::HashSet<i64>) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in kind.bytes().chain([0]).chain(name.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let span = (i32::MAX as i64 - FIRST_OID) as u64;
    let mut oid = FIRST_OID + (hash % span) as i64;
    while !taken.insert(oid) {
        oid = if oid == i32::MAX as i64 { FIRST_OID } else { oid + 1 };
    }
    oid
}

impl Catalog {
    pub(super) fn of(engine: &Engine, principal: Option<&Principal>) -> Result<Catalog, SqlError> {
        let permissions = match principal {
            Some(principal) => engine.access().permissions(principal)?,
            None => None,
        };
        let visible = |kind: ObjectKind, name: &str| permissions.as_ref().is_none_or(|p| p.sees(kind, name));
        let mut taken = std::collections::HashSet::new();
        let mut objects = Vec::new();
        let mut tables = engine.tables();
        tables.sort_by_key(|table| table.name());
        for table in tables {
            let def = table.def();
            if !visible(ObjectKind::Table, &def.name) {
                continue;
            }
            let columns: Vec<(String, i64, bool)> = def
                .columns
                .iter()
                .map(|column| {
                    (column.name.clone(), type_oid(&column.ty), column.not_null || column.name == def.primary_key)
                })
                .collect();
            let position =
                |field: &str| columns.iter().position(|(name, _, _)| name == field).map_or(0, |i| i as i64 + 1);
            let mut indexes = vec![(
                object_id("index", &format!("{}_pkey", def.name), &mut taken),
                format!("{}_pkey", def.name),
                position(&def.primary_key),
                true,
            )];
            for index in &def.indexes {
                indexes.push((
                    object_id("index", &index.name, &mut taken),
                    index.name.clone(),
                    position(&index.field),
                    false,
                ));
            }
            objects.push(Object {
                oid: object_id("table", &def.name, &mut taken),
                name: def.name.clone(),
                kind: "r",
                label: "BASE TABLE",
                columns,
                indexes,
                references: def.foreign_keys.iter().map(|key| (key.column.clone(), key.table.clone())).collect(),
                definition: None,
            });
        }
        let mut streams = engine.streams();
        streams.sort_by_key(|stream| stream.def().name.clone());
        for stream in streams {
            let name = stream.def().name.clone();
            if !visible(ObjectKind::Stream, &name) {
                continue;
            }
            let columns = [("_key", 25), ("_partition", 23), ("_offset", 20), ("_time", 20), ("_subject", 25)]
                .iter()
                .map(|(column, oid)| (column.to_string(), *oid, *column != "_key" && *column != "_subject"))
                .collect();
            objects.push(Object {
                oid: object_id("stream", &name, &mut taken),
                name,
                kind: "r",
                label: "BASE TABLE",
                columns,
                indexes: Vec::new(),
                references: Vec::new(),
                definition: None,
            });
        }
        let mut views = engine.views();
        views.sort_by_key(|view| view.def().name.clone());
        for view in views {
            let def = view.def();
            if !visible(ObjectKind::View, &def.name) {
                continue;
            }
            // A joined view's columns are expressions of JSON values: json, as aggregates are.
            let joined = def
                .row_join()
                .into_iter()
                .flat_map(|join| join.columns.iter())
                .map(|column| (column.name.clone(), 114, false));
            let mut columns: Vec<(String, i64, bool)> = joined.collect();
            columns.extend(def.columns.iter().map(|column| {
                let oid = match column {
                    onehop_engine::view::Column::Key { .. } => 25,
                    onehop_engine::view::Column::Aggregate { function, .. } => match function {
                        onehop_engine::view::AggregateKind::Count
                        | onehop_engine::view::AggregateKind::CountDistinct => 20,
                        onehop_engine::view::AggregateKind::Avg => 701,
                        _ => 114,
                    },
                };
                (column.name().to_string(), oid, false)
            }));
            if !matches!(def.window, onehop_engine::view::Window::None) {
                columns.push(("window_start".into(), 114, false));
                columns.push(("window_end".into(), 114, false));
            }
            objects.push(Object {
                oid: object_id("view", &def.name, &mut taken),
                name: def.name.clone(),
                kind: "m",
                label: "VIEW",
                columns,
                indexes: Vec::new(),
                references: Vec::new(),
                definition: Some(format!("source {}", def.sources().join(", "))),
            });
        }
        let (mut roles, mut members) = (Vec::new(), Vec::new());
        let access = engine.access();
        if !access.enabled() {
            roles.push((OWNER_OID, OWNER.to_string(), true, true));
        } else {
            let defs = access.defs();
            let superusers = defs.superusers();
            let everyone = permissions.as_ref().is_none_or(|permissions| permissions.is_superuser());
            let me = principal.and_then(|principal| principal.user());
            let oid = |kind: &str, name: &str| {
                let mut seen = std::collections::HashSet::new();
                object_id(kind, name, &mut seen)
            };
            for user in defs.users.keys().filter(|user| everyone || Some(user.as_str()) == me) {
                roles.push((oid("user", user), user.clone(), superusers.contains(user), true));
            }
            if everyone {
                for role in &defs.roles {
                    roles.push((oid("role", role), role.clone(), false, false));
                }
                for (role, users) in &defs.members {
                    for user in users {
                        members.push((oid("role", role), oid("user", user)));
                    }
                }
            }
        }
        // Foreign keys between tables the principal sees both of.
        let mut references = Vec::new();
        let position = |object: &Object, column: &str| {
            object.columns.iter().position(|(name, _, _)| name == column).map_or(0, |index| index as i64 + 1)
        };
        for object in &objects {
            for (column, table) in &object.references {
                let Some(other) = objects.iter().find(|other| other.kind == "r" && other.name == *table) else {
                    continue;
                };
                let Some(&(_, _, key_column, _)) = other.indexes.iter().find(|(_, _, _, primary)| *primary) else {
                    continue;
                };
                let key_name =
                    other.columns.get((key_column - 1).max(0) as usize).map_or("", |(name, _, _)| name.as_str());
                let name = format!("{}_{column}_fkey", object.name);
                references.push(Reference {
                    oid: object_id("constraint", &name, &mut taken),
                    definition: format!("FOREIGN KEY ({column}) REFERENCES {table}({key_name})"),
                    name,
                    table: object.oid,
                    column: position(object, column),
                    referenced: other.oid,
                    referenced_column: key_column,
                });
            }
        }
        Ok(Catalog { objects, roles, members, references })
    }

    /// The object id of the relation `name` (`schema.name`, or the name alone), or of one of
    /// the catalog's relations.
    pub(super) fn relation_oid(&self, name: &str) -> Option<i64> {
        let (schema, bare) = match name.split_once('.') {
            Some((schema, bare)) => (Some(schema.trim_matches('"')), bare.trim_matches('"')),
            None => (None, name.trim_matches('"')),
        };
        if let Some((_, relation)) = relation(schema, bare) {
            return RELATIONS.iter().find(|(_, other, _, _)| *other == relation).map(|(_, _, oid, _)| *oid);
        }
        if schema.is_some_and(|schema| !schema.eq_ignore_ascii_case("public")) {
            return None;
        }
        self.objects.iter().find(|object| object.name == bare).map(|object| object.oid)
    }

    /// (object id, what `pg_get_indexdef` answers) of every index, and (constraint id, what
    /// `pg_get_constraintdef` answers) of every primary key.
    fn definitions(&self) -> (Definitions, Definitions) {
        let (mut indexes, mut constraints) = (Vec::new(), Vec::new());
        for object in &self.objects {
            for (oid, name, column, primary) in &object.indexes {
                let field = object.columns.get((*column - 1).max(0) as usize).map_or("", |(name, _, _)| name.as_str());
                let unique = if *primary { "UNIQUE " } else { "" };
                indexes.push((
                    *oid,
                    format!("CREATE {unique}INDEX {name} ON public.{} USING btree ({field})", object.name),
                ));
                if *primary {
                    constraints.push((oid + 1, format!("PRIMARY KEY ({field})")));
                }
            }
        }
        constraints.extend(self.references.iter().map(|reference| (reference.oid, reference.definition.clone())));
        (indexes, constraints)
    }

    /// (object id, name) of every relation: onehop's objects and their indexes.
    pub(super) fn relation_names(&self) -> Vec<(i64, String)> {
        let mut names = Vec::new();
        for object in &self.objects {
            names.push((object.oid, object.name.clone()));
            for (oid, name, _, _) in &object.indexes {
                names.push((*oid, name.clone()));
            }
        }
        names.extend(
            RELATIONS.iter().filter(|(_, _, oid, _)| *oid != 0).map(|(_, name, oid, _)| (*oid, name.to_string())),
        );
        names
    }

    /// The rows of the catalog relation `schema.name` (as [`relation`] found it).
    pub(super) fn rows(&self, schema: &str, name: &str) -> Answer {
        let columns: Vec<String> = RELATIONS
            .iter()
            .find(|(relation_schema, relation_name, _, _)| *relation_schema == schema && *relation_name == name)
            .map(|(_, _, _, columns)| columns.iter().map(|column| column.to_string()).collect())
            .unwrap_or_default();
        let rows: Vec<Value> = match (schema, name) {
            ("pg_catalog", "pg_namespace") => {
                SCHEMAS.iter().map(|(oid, name)| json!({"oid": oid, "nspname": name, "nspowner": OWNER_OID})).collect()
            }
            ("pg_catalog", "pg_class") => self.classes(),
            ("pg_catalog", "pg_attribute") => self.attributes(),
            ("pg_catalog", "pg_type") => TYPES.iter().map(type_row).collect(),
            ("pg_catalog", "pg_am") => vec![
                json!({"oid": HEAP, "amname": "heap", "amhandler": "heap_tableam_handler", "amtype": "t"}),
                json!({"oid": BTREE, "amname": "btree", "amhandler": "bthandler", "amtype": "i"}),
            ],
            ("pg_catalog", "pg_index") => self.indexes(),
            ("pg_catalog", "pg_opclass") => OPCLASSES
                .iter()
                .map(|(oid, name, family, input)| {
                    json!({
                        "oid": oid, "opcmethod": BTREE, "opcname": name, "opcnamespace": PG_CATALOG,
                        "opcowner": OWNER_OID, "opcfamily": family, "opcintype": input, "opcdefault": true,
                        "opckeytype": 0,
                    })
                })
                .collect(),
            ("pg_catalog", "pg_constraint") => self.constraints(),
            ("pg_catalog", "pg_database") => vec![json!({
                "oid": 16_383, "datname": DATABASE, "datdba": OWNER_OID, "encoding": 6, "datlocprovider": "c", "datcollate": "C",
                "datctype": "C", "datistemplate": false, "datallowconn": true,
            })],
            ("pg_catalog", "pg_roles") => self
                .roles
                .iter()
                .map(|(oid, name, superuser, login)| {
                    json!({
                        "oid": oid, "rolname": name, "rolsuper": superuser, "rolinherit": true,
                        "rolcreaterole": superuser, "rolcreatedb": superuser, "rolcanlogin": login,
                        "rolreplication": false, "rolconnlimit": -1, "rolbypassrls": superuser,
                    })
                })
                .collect(),
            ("pg_catalog", "pg_auth_members") => self
                .members
                .iter()
                .map(|(role, member)| {
                    json!({"oid": role ^ member, "roleid": role, "member": member, "grantor": OWNER_OID,
                           "admin_option": false})
                })
                .collect(),
            ("pg_catalog", "pg_tables") => self
                .objects
                .iter()
                .filter(|object| object.kind == "r")
                .map(|object| {
                    json!({"schemaname": "public", "tablename": object.name, "tableowner": OWNER,
                           "hasindexes": !object.indexes.is_empty()})
                })
                .collect(),
            ("pg_catalog", "pg_collation") => vec![json!({
                "oid": 100, "collname": "default", "collnamespace": PG_CATALOG, "collowner": OWNER_OID,
                "collprovider": "d", "collisdeterministic": true, "collencoding": -1,
            })],
            ("information_schema", "schemata") => SCHEMAS
                .iter()
                .map(|(_, name)| json!({"catalog_name": DATABASE, "schema_name": name, "schema_owner": OWNER}))
                .collect(),
            ("information_schema", "tables") => self
                .objects
                .iter()
                .map(|object| {
                    json!({"table_catalog": DATABASE, "table_schema": "public", "table_name": object.name,
                           "table_type": object.label,
                           "is_insertable_into": if object.kind == "r" { "YES" } else { "NO" }, "is_typed": "NO"})
                })
                .collect(),
            ("information_schema", "views") => self
                .objects
                .iter()
                .filter(|object| object.kind == "m")
                .map(|object| {
                    json!({"table_catalog": DATABASE, "table_schema": "public", "table_name": object.name,
                           "view_definition": object.definition, "is_updatable": "NO", "is_insertable_into": "NO"})
                })
                .collect(),
            ("information_schema", "columns") => self.columns(),
            _ => Vec::new(),
        };
        let rows = rows
            .into_iter()
            .map(|row| columns.iter().map(|column| row.get(column).cloned().unwrap_or(Value::Null)).collect())
            .collect();
        Answer { columns, rows }
    }

    fn classes(&self) -> Vec<Value> {
        let mut rows = Vec::new();
        for object in &self.objects {
            rows.push(json!({
                "oid": object.oid, "relname": object.name, "relnamespace": PUBLIC, "reltype": 0, "reloftype": 0,
                "relowner": OWNER_OID, "relam": if object.kind == "r" { HEAP } else { 0 }, "relfilenode": object.oid,
                "reltablespace": 0, "relpages": 0, "reltuples": -1.0, "relallvisible": 0, "reltoastrelid": 0,
                "relhasindex": !object.indexes.is_empty(), "relisshared": false, "relpersistence": "p",
                "relkind": object.kind, "relnatts": object.columns.len(), "relchecks": 0, "relhasrules": false,
                // Postgres keeps foreign keys with triggers, and psql lists them only then.
                "relhastriggers": self.references.iter().any(|r| r.table == object.oid || r.referenced == object.oid), "relhassubclass": false, "relrowsecurity": false,
                "relforcerowsecurity": false, "relispopulated": true, "relreplident": "d", "relispartition": false,
            }));
            for (oid, name, _, _) in &object.indexes {
                rows.push(json!({
                    "oid": oid, "relname": name, "relnamespace": PUBLIC, "reltype": 0, "reloftype": 0,
                    "relowner": OWNER_OID, "relam": BTREE, "relfilenode": oid, "reltablespace": 0, "relpages": 0,
                    "reltuples": -1.0, "relallvisible": 0, "reltoastrelid": 0, "relhasindex": false,
                    "relisshared": false, "relpersistence": "p", "relkind": "i", "relnatts": 1, "relchecks": 0,
                    "relhasrules": false, "relhastriggers": false, "relhassubclass": false, "relrowsecurity": false,
                    "relforcerowsecurity": false, "relispopulated": true, "relreplident": "n",
                    "relispartition": false,
                }));
            }
        }
        rows
    }

    fn attributes(&self) -> Vec<Value> {
        let attribute = |relation: i64, name: &str, oid: i64, number: i64, not_null: bool| {
            let len = TYPES.iter().find(|ty| ty.oid == oid).map_or(-1, |ty| ty.len);
            json!({
                "attrelid": relation, "attname": name, "atttypid": oid, "attlen": len, "attnum": number,
                "atttypmod": -1, "attndims": 0, "attnotnull": not_null, "atthasdef": false, "atthasmissing": false,
                "attidentity": "", "attgenerated": "", "attisdropped": false, "attislocal": true, "attinhcount": 0,
                "attcollation": if oid == 25 || oid == 1043 { 100 } else { 0 }, "attstattarget": -1,
                "attstorage": if len < 0 { "x" } else { "p" }, "attcompression": "",
            })
        };
        let mut rows = Vec::new();
        for object in &self.objects {
            for (index, (name, oid, not_null)) in object.columns.iter().enumerate() {
                rows.push(attribute(object.oid, name, *oid, index as i64 + 1, *not_null));
            }
            for (oid, _, column, _) in &object.indexes {
                if let Some((name, type_oid, _)) = object.columns.get((*column - 1).max(0) as usize) {
                    rows.push(attribute(*oid, name, *type_oid, 1, false));
                }
            }
        }
        rows
    }

    fn indexes(&self) -> Vec<Value> {
        let mut rows = Vec::new();
        for object in &self.objects {
            for (oid, _, column, primary) in &object.indexes {
                let column_type = object.columns.get((*column - 1).max(0) as usize).map_or(25, |(_, ty, _)| *ty);
                rows.push(json!({
                    "indexrelid": oid, "indrelid": object.oid, "indnatts": 1, "indnkeyatts": 1,
                    "indisunique": primary, "indnullsnotdistinct": false, "indisprimary": primary,
                    "indisexclusion": false, "indimmediate": true, "indisclustered": false, "indisvalid": true,
                    "indisready": true, "indislive": true, "indisreplident": false,
                    // int2vector columns, in Postgres's text form.
                    "indkey": column.to_string(), "indoption": "0",
                    // oidvector: the column's btree operator class.
                    "indclass": opclass_of(column_type).to_string(),
                }));
            }
        }
        rows
    }

    fn constraints(&self) -> Vec<Value> {
        let mut rows: Vec<Value> = self
            .references
            .iter()
            .map(|reference| {
                json!({
                    "oid": reference.oid, "conname": reference.name, "connamespace": PUBLIC, "contype": "f",
                    "condeferrable": false, "condeferred": false, "convalidated": true, "conrelid": reference.table,
                    "contypid": 0, "conindid": 0, "conparentid": 0, "confrelid": reference.referenced,
                    "confupdtype": "a", "confdeltype": "a", "confmatchtype": "s", "conislocal": true,
                    "coninhcount": 0, "connoinherit": true, "conkey": [reference.column],
                    "confkey": [reference.referenced_column],
                })
            })
            .collect();
        for object in &self.objects {
            for (oid, name, column, primary) in &object.indexes {
                if !primary {
                    continue;
                }
                rows.push(json!({
                    "oid": oid + 1, "conname": name, "connamespace": PUBLIC, "contype": "p", "condeferrable": false,
                    "condeferred": false, "convalidated": true, "conrelid": object.oid, "contypid": 0,
                    "conindid": oid, "conparentid": 0, "confrelid": 0, "confupdtype": " ", "confdeltype": " ",
                    "confmatchtype": " ", "conislocal": true, "coninhcount": 0, "connoinherit": true,
                    "conkey": [column],
                }));
            }
        }
        rows
    }

    fn columns(&self) -> Vec<Value> {
        let mut rows = Vec::new();
        for object in &self.objects {
            for (index, (name, oid, not_null)) in object.columns.iter().enumerate() {
                let ty = TYPES.iter().find(|ty| ty.oid == *oid);
                let (data_type, udt) = match ty {
                    Some(ty) if ty.element != 0 => ("ARRAY", ty.name),
                    Some(ty) => (ty.display, ty.name),
                    None => ("json", "json"),
                };
                rows.push(json!({
                    "table_catalog": DATABASE, "table_schema": "public", "table_name": object.name,
                    "column_name": name, "ordinal_position": index + 1,
                    "is_nullable": if *not_null { "NO" } else { "YES" }, "data_type": data_type, "udt_name": udt,
                    "numeric_precision": match oid { 20 => Some(64), 23 => Some(32), 701 => Some(53), _ => None },
                    "is_updatable": if object.kind == "r" { "YES" } else { "NO" },
                }));
            }
        }
        rows
    }
}

fn type_row(ty: &Type) -> Value {
    json!({
        "oid": ty.oid, "typname": ty.name, "typnamespace": PG_CATALOG, "typowner": OWNER_OID, "typlen": ty.len,
        "typbyval": ty.len > 0 && ty.len <= 8, "typtype": "b", "typcategory": ty.category,
        "typispreferred": matches!(ty.name, "bool" | "text" | "float8" | "oid" | "timestamptz"),
        "typisdefined": true, "typdelim": ",", "typrelid": 0, "typelem": ty.element, "typarray": ty.array,
        "typinput": format!("{}in", ty.name), "typoutput": format!("{}out", ty.name),
        "typreceive": format!("{}recv", ty.name), "typsend": format!("{}send", ty.name),
        "typalign": if ty.len == 8 { "d" } else { "i" }, "typstorage": if ty.len < 0 { "x" } else { "p" },
        "typnotnull": false, "typbasetype": 0, "typtypmod": -1, "typndims": 0,
        "typcollation": if matches!(ty.name, "text" | "varchar" | "name") { 100 } else { 0 },
    })
}

/// A type's oid from a name as SQL writes it (`text`, `pg_catalog.int4`, `double precision`).
fn type_named(name: &str) -> Option<i64> {
    let name = name.trim().trim_matches('"').to_ascii_lowercase();
    let name = name.strip_prefix("pg_catalog.").unwrap_or(&name).trim_matches('"');
    let alias = match name {
        "integer" | "int" => "int4",
        "bigint" => "int8",
        "smallint" => "int2",
        "boolean" => "bool",
        "real" => "float4",
        "double precision" => "float8",
        "character varying" => "varchar",
        "timestamp with time zone" => "timestamptz",
        "timestamp without time zone" => "timestamp",
        other => other,
    };
    TYPES.iter().find(|ty| ty.name == alias || ty.display == alias).map(|ty| ty.oid)
}

fn text(value: &str) -> ast::Expr {
    ast::Expr::Value(ast::Value::SingleQuotedString(value.to_string()).into())
}

fn number(value: i64) -> ast::Expr {
    ast::Expr::Value(ast::Value::Number(value.to_string(), false).into())
}

fn null() -> ast::Expr {
    ast::Expr::Value(ast::Value::Null.into())
}

fn boolean(value: bool) -> ast::Expr {
    ast::Expr::Value(ast::Value::Boolean(value).into())
}

/// `CASE operand WHEN key THEN value … END` (null when none matches).
fn case(operand: ast::Expr, pairs: Vec<(ast::Expr, ast::Expr)>) -> ast::Expr {
    if pairs.is_empty() {
        return null();
    }
    ast::Expr::Case {
        case_token: ast::helpers::attached_token::AttachedToken::empty(),
        end_token: ast::helpers::attached_token::AttachedToken::empty(),
        operand: Some(Box::new(ast::Expr::Nested(Box::new(operand)))),
        conditions: pairs.into_iter().map(|(condition, result)| ast::CaseWhen { condition, result }).collect(),
        else_result: None,
    }
}

/// A literal's text, if `expr` is one.
fn literal_text(expr: &ast::Expr) -> Option<String> {
    match expr {
        ast::Expr::Value(value) => match &value.value {
            ast::Value::SingleQuotedString(text) | ast::Value::DoubleQuotedString(text) => Some(text.clone()),
            ast::Value::Number(text, _) => Some(text.clone()),
            _ => None,
        },
        ast::Expr::Nested(inner) => literal_text(inner),
        ast::Expr::Cast { expr, .. } => literal_text(expr),
        _ => None,
    }
}

/// The function's name without a `pg_catalog.` qualifier, in lower case.
fn bare_name(name: &ast::ObjectName) -> Option<String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|part| part.as_ident().map(|ident| ident.value.to_ascii_lowercase()))
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        [name] => Some(name.clone()),
        [schema, name] if schema == "pg_catalog" => Some(name.clone()),
        _ => None,
    }
}

fn arguments(function: &ast::Function) -> Vec<ast::Expr> {
    match &function.args {
        ast::FunctionArguments::List(list) => list
            .args
            .iter()
            .filter_map(|arg| match arg {
                ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(expr)) => Some(expr.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn parse_expr(sql: &str) -> Result<ast::Expr, SqlError> {
    sqlparser::parser::Parser::new(&sqlparser::dialect::PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut parser| parser.parse_expr())
        .map_err(|error| SqlError::InvalidQuery(format!("{sql}: {error}")))
}

/// A call of the expression language's function `name`.
fn call(name: &str, args: Vec<ast::Expr>) -> ast::Expr {
    ast::Expr::Function(ast::Function {
        name: ast::ObjectName::from(vec![ast::Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: ast::FunctionArguments::None,
        args: ast::FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: args.into_iter().map(|arg| ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(arg))).collect(),
            clauses: Vec::new(),
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: Vec::new(),
    })
}

/// The column name `array_to_string`'s rewrite gives the array's values.
const HIDDEN_COLUMN: &str = "\u{3}element";

/// The session a rewrite answers for.
pub(super) struct Session {
    pub user: Option<String>,
}

/// Rewrites the Postgres functions and casts this module answers, in place; false when
/// `expr` is none of them. `catalog` builds the catalog when a rewrite needs object names.
pub(super) fn rewrite(
    expr: &mut ast::Expr,
    session: &Session,
    catalog: &mut dyn FnMut() -> Result<std::sync::Arc<Catalog>, SqlError>,
) -> Result<bool, SqlError> {
    let rewritten = match expr {
        ast::Expr::Function(function) if function.over.is_none() => {
            let Some(name) = bare_name(&function.name) else { return Ok(false) };
            let args = arguments(function);
            match name.as_str() {
                "version" => text(&version()),
                "current_schema" => text("public"),
                "current_database" | "current_catalog" => text(DATABASE),
                "current_user" | "session_user" | "user" | "current_role" => {
                    text(session.user.as_deref().unwrap_or(OWNER))
                }
                "pg_table_is_visible" | "pg_type_is_visible" | "pg_function_is_visible" => boolean(true),
                "pg_get_userbyid" => text(OWNER),
                "obj_description" | "col_description" | "shobj_description" => null(),
                "pg_encoding_to_char" => text("UTF8"),
                // onehop keeps no expressions in its catalog (defaults, partition bounds, index
                // predicates, policies), no triggers, statistics objects or sequences.
                "pg_get_expr"
                | "pg_get_triggerdef"
                | "pg_get_statisticsobjdef_columns"
                | "pg_get_serial_sequence"
                | "pg_get_function_result"
                | "pg_get_function_arguments"
                | "pg_get_function_identity_arguments"
                | "pg_get_viewdef" => null(),
                "pg_relation_is_publishable" => boolean(false),
                // A relation that is no partition is its own only ancestor.
                "pg_partition_ancestors" => match args.first().and_then(literal_text) {
                    Some(oid) if oid.chars().all(|c| c.is_ascii_digit()) => number(oid.parse().unwrap_or(0)),
                    _ => return Ok(false),
                },
                // onehop does not report relations' sizes in bytes here (its streams' are in
                // /metrics): unknown, as for a relation Postgres cannot size.
                "pg_table_size" | "pg_relation_size" | "pg_total_relation_size" | "pg_indexes_size" => null(),
                "pg_size_pretty" => match args.first() {
                    Some(size) => ast::Expr::BinaryOp {
                        left: Box::new(ast::Expr::Cast {
                            kind: ast::CastKind::Cast,
                            expr: Box::new(size.clone()),
                            data_type: ast::DataType::Text,
                            format: None,
                        }),
                        op: ast::BinaryOperator::StringConcat,
                        right: Box::new(text(" bytes")),
                    },
                    None => return Ok(false),
                },
                // `ARRAY(SELECT x …)`: the subquery's values as one array (null for none, where
                // Postgres gives an empty array).
                "array" if matches!(function.args, ast::FunctionArguments::Subquery(_)) => {
                    let ast::FunctionArguments::Subquery(query) = &function.args else { unreachable!() };
                    let sql = format!(
                        "(SELECT ARRAY_AGG(\"{HIDDEN_COLUMN}\") FROM ({query}) AS \
                         \"{HIDDEN_COLUMN}s\" (\"{HIDDEN_COLUMN}\"))"
                    );
                    parse_expr(&sql)?
                }
                "pg_get_indexdef" | "pg_get_constraintdef" => {
                    let Some(operand) = args.first().cloned() else { return Ok(false) };
                    let (indexes, constraints) = catalog()?.definitions();
                    let definitions = if name == "pg_get_indexdef" { indexes } else { constraints };
                    case(operand, definitions.into_iter().map(|(oid, text_of)| (number(oid), text(&text_of))).collect())
                }
                // `array_to_string(ARRAY(SELECT x …), sep)`: the subquery's values joined.
                "array_to_string" => match (args.first(), args.get(1)) {
                    (Some(ast::Expr::Function(inner)), Some(separator))
                        if bare_name(&inner.name).as_deref() == Some("array")
                            && matches!(inner.args, ast::FunctionArguments::Subquery(_)) =>
                    {
                        let ast::FunctionArguments::Subquery(query) = &inner.args else { unreachable!() };
                        let sql = format!(
                            "(SELECT STRING_AGG(CAST(\"{HIDDEN_COLUMN}\" AS TEXT), {separator}) FROM ({query}) AS \
                             \"{HIDDEN_COLUMN}s\" (\"{HIDDEN_COLUMN}\"))"
                        );
                        parse_expr(&sql)?
                    }
                    _ => return Ok(false),
                },
                "format_type" => {
                    let Some(operand) = args.first().cloned() else { return Ok(false) };
                    case(operand, TYPES.iter().map(|ty| (number(ty.oid), text(ty.display))).collect())
                }
                "to_regtype" => match args.first() {
                    Some(arg) => match literal_text(arg) {
                        Some(name) => type_named(&name).map_or_else(null, number),
                        None => case(arg.clone(), TYPES.iter().map(|ty| (text(ty.name), number(ty.oid))).collect()),
                    },
                    None => return Ok(false),
                },
                "to_regclass" => match args.first().and_then(literal_text) {
                    Some(name) => catalog()?.relation_oid(&name).map_or_else(null, number),
                    None => return Ok(false),
                },
                _ => return Ok(false),
            }
        }
        ast::Expr::Cast { expr: inner, data_type, .. } => {
            let target = data_type.to_string().to_ascii_lowercase();
            let target = target.strip_prefix("pg_catalog.").unwrap_or(&target).to_string();
            match target.as_str() {
                "regclass" => match literal_text(inner) {
                    Some(name) if name.chars().all(|c| c.is_ascii_digit()) => number(name.parse().unwrap_or(0)),
                    Some(name) => match catalog()?.relation_oid(&name) {
                        Some(oid) => number(oid),
                        None => {
                            return Err(SqlError::InvalidQuery(format!(
                                "relation \"{name}\" is not a table, view or stream (SHOW TABLES, SHOW VIEWS and SHOW \
                                 STREAMS list them)"
                            )));
                        }
                    },
                    None => {
                        let names = catalog()?.relation_names();
                        case(
                            (**inner).clone(),
                            names.into_iter().map(|(oid, name)| (number(oid), text(&name))).collect(),
                        )
                    }
                },
                "regtype" => match literal_text(inner) {
                    Some(name) if name.chars().all(|c| c.is_ascii_digit()) => number(name.parse().unwrap_or(0)),
                    Some(name) => match type_named(&name) {
                        Some(oid) => number(oid),
                        None => return Err(SqlError::InvalidQuery(format!("type \"{name}\" does not exist"))),
                    },
                    None => {
                        case((**inner).clone(), TYPES.iter().map(|ty| (number(ty.oid), text(ty.display))).collect())
                    }
                },
                "regnamespace" => {
                    case((**inner).clone(), SCHEMAS.iter().map(|(oid, name)| (number(*oid), text(name))).collect())
                }
                "oid" | "int2" | "int4" | "smallint" | "regproc" | "xid" => ast::Expr::Cast {
                    kind: ast::CastKind::DoubleColon,
                    expr: inner.clone(),
                    data_type: ast::DataType::BigInt(None),
                    format: None,
                },
                "text" | "varchar" | "int8" | "bool" | "float8" if data_type.to_string().contains('.') => {
                    let data_type = match target.as_str() {
                        "int8" => ast::DataType::BigInt(None),
                        "bool" => ast::DataType::Boolean,
                        "float8" => ast::DataType::DoublePrecision,
                        _ => ast::DataType::Text,
                    };
                    ast::Expr::Cast { kind: ast::CastKind::DoubleColon, expr: inner.clone(), data_type, format: None }
                }
                "name" | "\"char\"" | "char" => ast::Expr::Cast {
                    kind: ast::CastKind::DoubleColon,
                    expr: inner.clone(),
                    data_type: ast::DataType::Text,
                    format: None,
                },
                _ => return Ok(false),
            }
        }
        // Collations do not change how onehop compares text (code points).
        ast::Expr::Collate { expr: inner, .. } => (**inner).clone(),
        // `x = ANY (ARRAY[…])` and `x <> ALL (ARRAY[…])`: lists.
        // `x = ANY (ARRAY[…])` is a list; `x = ANY (array_column)`: where the array holds x.
        ast::Expr::AnyOp { left, compare_op: ast::BinaryOperator::Eq, right, .. }
            if matches!(**right, ast::Expr::Array(_)) =>
        {
            let ast::Expr::Array(items) = &**right else { unreachable!() };
            ast::Expr::InList { expr: left.clone(), list: items.elem.clone(), negated: false }
        }
        ast::Expr::AnyOp { left, compare_op: ast::BinaryOperator::Eq, right, .. } => {
            ast::Expr::IsNotNull(Box::new(call("array_position", vec![(**right).clone(), (**left).clone()])))
        }
        ast::Expr::AllOp { left, compare_op: ast::BinaryOperator::NotEq, right } => match &**right {
            ast::Expr::Array(items) => {
                ast::Expr::InList { expr: left.clone(), list: items.elem.clone(), negated: true }
            }
            _ => return Ok(false),
        },
        _ => return Ok(false),
    };
    *expr = rewritten;
    Ok(true)
}
