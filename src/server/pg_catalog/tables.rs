//! The system tables: their names, PostgreSQL's oids for them, their columns (those clients
//! read, typed as PostgreSQL types them) and where their rows come from.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

/// A column type of a system table, as PostgreSQL types it.
#[derive(Clone, Copy)]
pub(super) enum Col {
    Oid,
    Text,
    Bool,
    Int2,
    Int4,
    Float4,
    TextArray,
}

impl Col {
    pub(super) fn arrow(self) -> DataType {
        match self {
            Col::Oid => DataType::Int64,
            Col::Text => DataType::Utf8,
            Col::Bool => DataType::Boolean,
            Col::Int2 => DataType::Int16,
            Col::Int4 => DataType::Int32,
            Col::Float4 => DataType::Float32,
            Col::TextArray => DataType::new_list(DataType::Utf8, true),
        }
    }
}

/// One system table: its name, oid, columns, and how its rows are made.
pub(super) struct SystemTable {
    pub(super) name: &'static str,
    pub(super) oid: i64,
    pub(super) columns: &'static [(&'static str, Col)],
    pub(super) rows: Rows,
}

/// How a system table's rows are made.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Rows {
    Namespaces,
    Relations,
    Attributes,
    Types,
    Databases,
    AccessMethods,
    Roles,
    Tablespaces,
    Settings,
    Tables,
    Views,
    /// `pg_get_keywords()`, a table function in PostgreSQL, read as a table here.
    Keywords,
    /// Nothing floe has is of this kind.
    None,
}

use Col::{Bool, Float4, Int2, Int4, Oid, Text, TextArray};

pub(super) static TABLES: &[SystemTable] = &[
    SystemTable {
        name: "pg_namespace",
        oid: 2615,
        columns: &[
            ("oid", Oid),
            ("nspname", Text),
            ("nspowner", Oid),
            ("nspacl", TextArray),
        ],
        rows: Rows::Namespaces,
    },
    SystemTable {
        name: "pg_class",
        oid: 1259,
        columns: &[
            ("oid", Oid),
            ("relname", Text),
            ("relnamespace", Oid),
            ("reltype", Oid),
            ("reloftype", Oid),
            ("relowner", Oid),
            ("relam", Oid),
            ("relfilenode", Oid),
            ("reltablespace", Oid),
            ("relpages", Int4),
            ("reltuples", Float4),
            ("relallvisible", Int4),
            ("reltoastrelid", Oid),
            ("relhasindex", Bool),
            ("relisshared", Bool),
            ("relpersistence", Text),
            ("relkind", Text),
            ("relnatts", Int2),
            ("relchecks", Int2),
            ("relhasrules", Bool),
            ("relhastriggers", Bool),
            ("relhassubclass", Bool),
            ("relrowsecurity", Bool),
            ("relforcerowsecurity", Bool),
            ("relispopulated", Bool),
            ("relreplident", Text),
            ("relispartition", Bool),
            ("relrewrite", Oid),
            ("relfrozenxid", Oid),
            ("relminmxid", Oid),
            ("relacl", TextArray),
            ("reloptions", TextArray),
            ("relpartbound", Text),
        ],
        rows: Rows::Relations,
    },
    SystemTable {
        name: "pg_attribute",
        oid: 1249,
        columns: &[
            ("attrelid", Oid),
            ("attname", Text),
            ("atttypid", Oid),
            ("attstattarget", Int4),
            ("attlen", Int2),
            ("attnum", Int2),
            ("attndims", Int4),
            ("attcacheoff", Int4),
            ("atttypmod", Int4),
            ("attbyval", Bool),
            ("attalign", Text),
            ("attstorage", Text),
            ("attcompression", Text),
            ("attnotnull", Bool),
            ("atthasdef", Bool),
            ("atthasmissing", Bool),
            ("attidentity", Text),
            ("attgenerated", Text),
            ("attisdropped", Bool),
            ("attislocal", Bool),
            ("attinhcount", Int4),
            ("attcollation", Oid),
            ("attacl", TextArray),
            ("attoptions", TextArray),
            ("attfdwoptions", TextArray),
        ],
        rows: Rows::Attributes,
    },
    SystemTable {
        name: "pg_type",
        oid: 1247,
        columns: &[
            ("oid", Oid),
            ("typname", Text),
            ("typnamespace", Oid),
            ("typowner", Oid),
            ("typlen", Int2),
            ("typbyval", Bool),
            ("typtype", Text),
            ("typcategory", Text),
            ("typispreferred", Bool),
            ("typisdefined", Bool),
            ("typdelim", Text),
            ("typrelid", Oid),
            ("typsubscript", Text),
            ("typelem", Oid),
            ("typarray", Oid),
            ("typinput", Text),
            ("typoutput", Text),
            ("typreceive", Text),
            ("typsend", Text),
            ("typalign", Text),
            ("typstorage", Text),
            ("typnotnull", Bool),
            ("typbasetype", Oid),
            ("typtypmod", Int4),
            ("typndims", Int4),
            ("typcollation", Oid),
            ("typdefault", Text),
            ("typacl", TextArray),
        ],
        rows: Rows::Types,
    },
    SystemTable {
        name: "pg_database",
        oid: 1262,
        columns: &[
            ("oid", Oid),
            ("datname", Text),
            ("datdba", Oid),
            ("encoding", Int4),
            ("datlocprovider", Text),
            ("datistemplate", Bool),
            ("datallowconn", Bool),
            ("datconnlimit", Int4),
            ("datfrozenxid", Oid),
            ("datminmxid", Oid),
            ("dattablespace", Oid),
            ("datcollate", Text),
            ("datctype", Text),
            ("daticulocale", Text),
            ("daticurules", Text),
            ("datcollversion", Text),
            ("datacl", TextArray),
        ],
        rows: Rows::Databases,
    },
    SystemTable {
        name: "pg_am",
        oid: 2601,
        columns: &[
            ("oid", Oid),
            ("amname", Text),
            ("amhandler", Text),
            ("amtype", Text),
        ],
        rows: Rows::AccessMethods,
    },
    SystemTable {
        name: "pg_roles",
        oid: 1260,
        columns: &[
            ("oid", Oid),
            ("rolname", Text),
            ("rolsuper", Bool),
            ("rolinherit", Bool),
            ("rolcreaterole", Bool),
            ("rolcreatedb", Bool),
            ("rolcanlogin", Bool),
            ("rolreplication", Bool),
            ("rolconnlimit", Int4),
            ("rolpassword", Text),
            ("rolvaliduntil", Text),
            ("rolbypassrls", Bool),
            ("rolconfig", TextArray),
        ],
        rows: Rows::Roles,
    },
    SystemTable {
        name: "pg_user",
        oid: 12000,
        columns: &[
            ("usename", Text),
            ("usesysid", Oid),
            ("usecreatedb", Bool),
            ("usesuper", Bool),
            ("userepl", Bool),
            ("usebypassrls", Bool),
            ("passwd", Text),
            ("valuntil", Text),
            ("useconfig", TextArray),
        ],
        rows: Rows::Roles,
    },
    SystemTable {
        name: "pg_tablespace",
        oid: 1213,
        columns: &[
            ("oid", Oid),
            ("spcname", Text),
            ("spcowner", Oid),
            ("spcacl", TextArray),
            ("spcoptions", TextArray),
        ],
        rows: Rows::Tablespaces,
    },
    SystemTable {
        name: "pg_settings",
        oid: 12001,
        columns: &[
            ("name", Text),
            ("setting", Text),
            ("unit", Text),
            ("category", Text),
            ("short_desc", Text),
            ("context", Text),
            ("vartype", Text),
            ("source", Text),
        ],
        rows: Rows::Settings,
    },
    SystemTable {
        name: "pg_tables",
        oid: 12002,
        columns: &[
            ("schemaname", Text),
            ("tablename", Text),
            ("tableowner", Text),
            ("tablespace", Text),
            ("hasindexes", Bool),
            ("hasrules", Bool),
            ("hastriggers", Bool),
            ("rowsecurity", Bool),
        ],
        rows: Rows::Tables,
    },
    SystemTable {
        name: "pg_views",
        oid: 12003,
        columns: &[
            ("schemaname", Text),
            ("viewname", Text),
            ("viewowner", Text),
            ("definition", Text),
        ],
        rows: Rows::Views,
    },
    SystemTable {
        name: "pg_get_keywords",
        oid: 12005,
        columns: &[
            ("word", Text),
            ("catcode", Text),
            ("barelabel", Bool),
            ("catdesc", Text),
            ("baredesc", Text),
        ],
        rows: Rows::Keywords,
    },
    SystemTable {
        name: "pg_index",
        oid: 2610,
        columns: &[
            ("indexrelid", Oid),
            ("indrelid", Oid),
            ("indnatts", Int2),
            ("indnkeyatts", Int2),
            ("indisunique", Bool),
            ("indnullsnotdistinct", Bool),
            ("indisprimary", Bool),
            ("indisexclusion", Bool),
            ("indimmediate", Bool),
            ("indisclustered", Bool),
            ("indisvalid", Bool),
            ("indcheckxmin", Bool),
            ("indisready", Bool),
            ("indislive", Bool),
            ("indisreplident", Bool),
            ("indkey", Text),
            ("indcollation", Text),
            ("indclass", Text),
            ("indoption", Text),
            ("indexprs", Text),
            ("indpred", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_constraint",
        oid: 2606,
        columns: &[
            ("oid", Oid),
            ("conname", Text),
            ("connamespace", Oid),
            ("contype", Text),
            ("condeferrable", Bool),
            ("condeferred", Bool),
            ("convalidated", Bool),
            ("conrelid", Oid),
            ("contypid", Oid),
            ("conindid", Oid),
            ("conparentid", Oid),
            ("confrelid", Oid),
            ("confupdtype", Text),
            ("confdeltype", Text),
            ("confmatchtype", Text),
            ("conislocal", Bool),
            ("coninhcount", Int4),
            ("connoinherit", Bool),
            ("conkey", TextArray),
            ("confkey", TextArray),
            ("conbin", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_attrdef",
        oid: 2604,
        columns: &[
            ("oid", Oid),
            ("adrelid", Oid),
            ("adnum", Int2),
            ("adbin", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_description",
        oid: 2609,
        columns: &[
            ("objoid", Oid),
            ("classoid", Oid),
            ("objsubid", Int4),
            ("description", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_shdescription",
        oid: 2396,
        columns: &[("objoid", Oid), ("classoid", Oid), ("description", Text)],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_inherits",
        oid: 2611,
        columns: &[
            ("inhrelid", Oid),
            ("inhparent", Oid),
            ("inhseqno", Int4),
            ("inhdetachpending", Bool),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_proc",
        oid: 1255,
        columns: &[
            ("oid", Oid),
            ("proname", Text),
            ("pronamespace", Oid),
            ("proowner", Oid),
            ("prolang", Oid),
            ("prokind", Text),
            ("prorettype", Oid),
            ("proargtypes", Text),
            ("proargnames", TextArray),
            ("prosrc", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_collation",
        oid: 3456,
        columns: &[
            ("oid", Oid),
            ("collname", Text),
            ("collnamespace", Oid),
            ("collprovider", Text),
            ("collcollate", Text),
            ("collctype", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_trigger",
        oid: 2620,
        columns: &[
            ("oid", Oid),
            ("tgrelid", Oid),
            ("tgparentid", Oid),
            ("tgname", Text),
            ("tgfoid", Oid),
            ("tgtype", Int2),
            ("tgenabled", Text),
            ("tgisinternal", Bool),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_rewrite",
        oid: 2618,
        columns: &[
            ("oid", Oid),
            ("rulename", Text),
            ("ev_class", Oid),
            ("ev_type", Text),
            ("ev_enabled", Text),
            ("is_instead", Bool),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_policy",
        oid: 3256,
        columns: &[
            ("oid", Oid),
            ("polname", Text),
            ("polrelid", Oid),
            ("polcmd", Text),
            ("polpermissive", Bool),
            ("polroles", TextArray),
            ("polqual", Text),
            ("polwithcheck", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_statistic_ext",
        oid: 3381,
        columns: &[
            ("oid", Oid),
            ("stxrelid", Oid),
            ("stxname", Text),
            ("stxnamespace", Oid),
            ("stxowner", Oid),
            ("stxstattarget", Int4),
            ("stxkeys", Text),
            ("stxkind", TextArray),
            ("stxexprs", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_publication",
        oid: 6104,
        columns: &[
            ("oid", Oid),
            ("pubname", Text),
            ("pubowner", Oid),
            ("puballtables", Bool),
            ("pubinsert", Bool),
            ("pubupdate", Bool),
            ("pubdelete", Bool),
            ("pubtruncate", Bool),
            ("pubviaroot", Bool),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_publication_rel",
        oid: 6106,
        columns: &[
            ("oid", Oid),
            ("prpubid", Oid),
            ("prrelid", Oid),
            ("prqual", Text),
            ("prattrs", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_publication_namespace",
        oid: 6237,
        columns: &[("oid", Oid), ("pnpubid", Oid), ("pnnspid", Oid)],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_foreign_table",
        oid: 3118,
        columns: &[
            ("ftrelid", Oid),
            ("ftserver", Oid),
            ("ftoptions", TextArray),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_partitioned_table",
        oid: 3350,
        columns: &[
            ("partrelid", Oid),
            ("partstrat", Text),
            ("partnatts", Int2),
            ("partdefid", Oid),
            ("partattrs", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_sequence",
        oid: 2224,
        columns: &[
            ("seqrelid", Oid),
            ("seqtypid", Oid),
            ("seqstart", Oid),
            ("seqincrement", Oid),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_enum",
        oid: 3501,
        columns: &[
            ("oid", Oid),
            ("enumtypid", Oid),
            ("enumsortorder", Float4),
            ("enumlabel", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_depend",
        oid: 2608,
        columns: &[
            ("classid", Oid),
            ("objid", Oid),
            ("objsubid", Int4),
            ("refclassid", Oid),
            ("refobjid", Oid),
            ("refobjsubid", Int4),
            ("deptype", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_extension",
        oid: 3079,
        columns: &[
            ("oid", Oid),
            ("extname", Text),
            ("extowner", Oid),
            ("extnamespace", Oid),
            ("extversion", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_matviews",
        oid: 12004,
        columns: &[
            ("schemaname", Text),
            ("matviewname", Text),
            ("matviewowner", Text),
            ("definition", Text),
        ],
        rows: Rows::None,
    },
    SystemTable {
        name: "pg_auth_members",
        oid: 1261,
        columns: &[
            ("oid", Oid),
            ("roleid", Oid),
            ("member", Oid),
            ("grantor", Oid),
            ("admin_option", Bool),
        ],
        rows: Rows::None,
    },
];

/// Whether `name` is one of the system tables (clients also name them unqualified).
pub fn is_system_table(name: &str) -> bool {
    TABLES.iter().any(|t| t.name == name)
}

/// Whether system table `table` has a column `column`.
pub fn has_column(table: &str, column: &str) -> bool {
    TABLES
        .iter()
        .any(|t| t.name == table && t.columns.iter().any(|(c, _)| *c == column))
}

/// Whether system table `name` never has rows (floe has nothing of its kind).
pub fn is_always_empty(name: &str) -> bool {
    TABLES
        .iter()
        .any(|t| t.name == name && t.rows == Rows::None)
}

/// Whether `column` is one of the system tables' array columns (options, access lists),
/// which floe never fills: always NULL.
pub fn is_null_array_column(column: &str) -> bool {
    TABLES.iter().any(|t| {
        t.columns
            .iter()
            .any(|(name, col)| *name == column && matches!(col, Col::TextArray))
    })
}

pub(super) fn schema_of(table: &SystemTable) -> SchemaRef {
    Arc::new(Schema::new(
        table
            .columns
            .iter()
            .map(|(name, col)| Field::new(*name, col.arrow(), true))
            .collect::<Vec<_>>(),
    ))
}
