//! The types of `pg_type`, named as PostgreSQL names them.

use std::sync::LazyLock;

use pgwire::api::Type;

/// The types clients meet (every type floe sends, and the catalog's own), each with its
/// array type.
static TYPE_PAIRS: LazyLock<Vec<(Type, Type)>> = LazyLock::new(|| {
    vec![
        (Type::BOOL, Type::BOOL_ARRAY),
        (Type::BYTEA, Type::BYTEA_ARRAY),
        (Type::CHAR, Type::CHAR_ARRAY),
        (Type::NAME, Type::NAME_ARRAY),
        (Type::INT8, Type::INT8_ARRAY),
        (Type::INT2, Type::INT2_ARRAY),
        (Type::INT4, Type::INT4_ARRAY),
        (Type::TEXT, Type::TEXT_ARRAY),
        (Type::OID, Type::OID_ARRAY),
        (Type::JSON, Type::JSON_ARRAY),
        (Type::FLOAT4, Type::FLOAT4_ARRAY),
        (Type::FLOAT8, Type::FLOAT8_ARRAY),
        (Type::BPCHAR, Type::BPCHAR_ARRAY),
        (Type::VARCHAR, Type::VARCHAR_ARRAY),
        (Type::DATE, Type::DATE_ARRAY),
        (Type::TIME, Type::TIME_ARRAY),
        (Type::TIMESTAMP, Type::TIMESTAMP_ARRAY),
        (Type::TIMESTAMPTZ, Type::TIMESTAMPTZ_ARRAY),
        (Type::INTERVAL, Type::INTERVAL_ARRAY),
        (Type::NUMERIC, Type::NUMERIC_ARRAY),
        (Type::UUID, Type::UUID_ARRAY),
        (Type::JSONB, Type::JSONB_ARRAY),
    ]
});

/// Every type of `pg_type`: the base types, then their arrays.
pub(super) static TYPES: LazyLock<Vec<Type>> = LazyLock::new(|| {
    let pairs = &*TYPE_PAIRS;
    pairs
        .iter()
        .map(|p| p.0.clone())
        .chain(pairs.iter().map(|p| p.1.clone()))
        .collect()
});

/// The element type of array type `t` (`None`: not an array).
pub(super) fn element_of(t: &Type) -> Option<&'static Type> {
    TYPE_PAIRS.iter().find(|p| &p.1 == t).map(|p| &p.0)
}

/// The array type of `t` (`None`: none, or `t` is an array).
pub(super) fn array_of(t: &Type) -> Option<&'static Type> {
    TYPE_PAIRS.iter().find(|p| &p.0 == t).map(|p| &p.1)
}

/// The oid of the type named `name` (`int4`, `integer`, `pg_catalog.text`), as a
/// `'name'::regtype` literal gives it.
pub fn type_oid(name: &str) -> Option<i64> {
    let name = name
        .strip_prefix("pg_catalog.")
        .unwrap_or(name)
        .to_lowercase();
    TYPES
        .iter()
        .find(|t| {
            t.name() == name || format_type(i64::from(t.oid()), None).as_deref() == Some(&name)
        })
        .map(|t| i64::from(t.oid()))
}

/// A type's length in bytes (-1: variable), as `pg_type.typlen`.
pub(super) fn type_len(t: &Type) -> i16 {
    match *t {
        Type::BOOL | Type::CHAR => 1,
        Type::INT2 => 2,
        Type::INT4 | Type::OID | Type::FLOAT4 | Type::DATE => 4,
        Type::INT8 | Type::FLOAT8 | Type::TIME | Type::TIMESTAMP | Type::TIMESTAMPTZ => 8,
        Type::INTERVAL | Type::UUID => 16,
        Type::NAME => 64,
        _ => -1,
    }
}

/// A type's category, as `pg_type.typcategory`.
pub(super) fn type_category(t: &Type) -> &'static str {
    if element_of(t).is_some() {
        return "A";
    }
    match *t {
        Type::BOOL => "B",
        Type::INT2 | Type::INT4 | Type::INT8 | Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC => "N",
        Type::OID => "N",
        Type::DATE | Type::TIME | Type::TIMESTAMP | Type::TIMESTAMPTZ => "D",
        Type::INTERVAL => "T",
        Type::BYTEA | Type::JSON | Type::JSONB | Type::UUID => "U",
        _ => "S",
    }
}

/// The SQL name of type `oid` with modifier `typmod`, as PostgreSQL's `format_type` gives it.
pub fn format_type(oid: i64, typmod: Option<i64>) -> Option<String> {
    let t = Type::from_oid(u32::try_from(oid).ok()?)?;
    let name = match t {
        Type::BOOL => "boolean".to_string(),
        Type::INT2 => "smallint".to_string(),
        Type::INT4 => "integer".to_string(),
        Type::INT8 => "bigint".to_string(),
        Type::FLOAT4 => "real".to_string(),
        Type::FLOAT8 => "double precision".to_string(),
        Type::VARCHAR => "character varying".to_string(),
        Type::BPCHAR => "character".to_string(),
        Type::CHAR => "\"char\"".to_string(),
        Type::TIME => "time without time zone".to_string(),
        Type::TIMESTAMP => "timestamp without time zone".to_string(),
        Type::TIMESTAMPTZ => "timestamp with time zone".to_string(),
        Type::NUMERIC => match typmod {
            Some(m) if m >= 4 => format!("numeric({},{})", (m - 4) >> 16, (m - 4) & 0xffff),
            _ => "numeric".to_string(),
        },
        ref other => match element_of(other) {
            Some(element) => format!("{}[]", format_type(i64::from(element.oid()), None)?),
            None => other.name().to_string(),
        },
    };
    Some(name)
}
