//! `pg_catalog`: the system tables PostgreSQL clients read to find their way (psql's `\d`,
//! `\dt`, `\l`; JDBC's `DatabaseMetaData`, which DBeaver and other tools use), built at
//! every scan from the session's catalogs.
//!
//! ```text
//! PostgreSQL          floe
//! database         <- the connection's current catalog (psql -d lake), pg_database: all
//! schema           <- a namespace of that catalog (+ pg_catalog, information_schema)
//! table / view     <- an Iceberg table / a view, its columns typed as the server sends them
//! oid              <- a stable hash of the object's full name (the same in every query)
//! ```
//!
//! Tables floe has no counterpart for (indexes, constraints, triggers, policies, ...) are
//! there with PostgreSQL's columns and no rows, so the queries that join them plan and say
//! "none". The tables live in the schema `pg_catalog` of the server's home catalog; the
//! rewrite (`pg_rewrite.rs`) points every client's `pg_catalog.x` there.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int16Array, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray, new_null_array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::information_schema::{INFORMATION_SCHEMA, InformationSchemaProvider};
use datafusion::catalog::{SchemaProvider, Session as DataFusionSession, TableProvider};
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::keywords::ALL_KEYWORDS;
use pgwire::api::Type;
use pgwire::api::portal::Format;

use crate::server::encode;
use tables::{Col, Rows, SystemTable, TABLES, schema_of};
pub use tables::{has_column, is_always_empty, is_null_array_column, is_system_table};
use types::{TYPES, array_of, element_of, type_category, type_len};
pub use types::{format_type, type_oid};

mod tables;
mod types;

/// The schema the tables are in.
pub const PG_CATALOG: &str = "pg_catalog";

/// PostgreSQL's own oids for what clients look up by oid or by `'name'::regclass`.
const PG_CATALOG_OID: i64 = 11;
const PUBLIC_OID: i64 = 2200;
const OWNER_OID: i64 = 10;
/// The first oid PostgreSQL gives user objects; floe's hashed oids start there.
const FIRST_USER_OID: i64 = 16384;

/// The oid of the object named `name` (its full name, parts joined by '.'): the same in
/// every query and every connection, so a client may look an object up and then ask for it
/// by oid. System tables keep PostgreSQL's own oids.
pub fn oid_of(name: &str) -> i64 {
    if let Some(table) = name.strip_prefix("pg_catalog.")
        && let Some(t) = TABLES.iter().find(|t| t.name == table)
    {
        return t.oid;
    }
    match name {
        PG_CATALOG => return PG_CATALOG_OID,
        _ if name.ends_with(".public") && name.matches('.').count() == 1 => return PUBLIC_OID,
        _ => {}
    }
    // FNV-1a, folded into PostgreSQL's range of user oids (below 2^31).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    FIRST_USER_OID + (hash % ((1u64 << 31) - FIRST_USER_OID as u64)) as i64
}

/// The schema `pg_catalog`.
#[derive(Debug)]
pub struct PgCatalogSchema {
    /// The user every object belongs to.
    user: String,
}

impl PgCatalogSchema {
    pub fn new(user: String) -> Self {
        Self { user }
    }
}

#[async_trait]
impl SchemaProvider for PgCatalogSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        TABLES.iter().map(|t| t.name.to_string()).collect()
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        Ok(TABLES.iter().position(|t| t.name == name).map(|index| {
            Arc::new(PgTable {
                table: &TABLES[index],
                schema: schema_of(&TABLES[index]),
                user: self.user.clone(),
            }) as Arc<dyn TableProvider>
        }))
    }

    fn table_exist(&self, name: &str) -> bool {
        is_system_table(name)
    }
}

/// One system table, its rows made at each scan.
#[derive(Debug)]
struct PgTable {
    table: &'static SystemTable,
    schema: SchemaRef,
    user: String,
}

impl std::fmt::Debug for SystemTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

#[async_trait]
impl TableProvider for PgTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        // Seen by the scan (see `relation_filter`); DataFusion still applies them all.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn DataFusionSession,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let state = state
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| DataFusionError::Internal("pg_catalog needs a SessionState".into()))?;
        // pg_attribute loads the tables whose columns it shows: only the one a filter names
        // (`attrelid = 16384`, as psql and DBeaver ask), else all.
        let columns = match self.table.rows {
            Rows::Attributes => Columns::Of(relation_filter(filters, "attrelid")),
            _ => Columns::None,
        };
        let objects = Objects::list(state, &self.user, columns).await?;
        let batch = self.rows(&objects)?;
        MemTable::try_new(self.schema.clone(), vec![vec![batch]])?
            .scan(state, projection, filters, limit)
            .await
    }
}

/// Which relations' columns a scan needs.
#[derive(Clone, Copy)]
enum Columns {
    None,
    /// Of the relation with this oid, or of all.
    Of(Option<i64>),
}

/// The oid `filters` compare `column` with (`attrelid = 16384`, or `= '16384'` as psql
/// writes it), if one does.
fn relation_filter(filters: &[Expr], column: &str) -> Option<i64> {
    use datafusion::logical_expr::{BinaryExpr, Operator};
    use datafusion::scalar::ScalarValue;
    let strip = |e: &Expr| -> Expr {
        match e {
            Expr::Cast(c) => (*c.expr).clone(),
            Expr::TryCast(c) => (*c.expr).clone(),
            other => other.clone(),
        }
    };
    filters.iter().find_map(|f| {
        let Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Eq,
            right,
        }) = f
        else {
            return None;
        };
        let (l, r) = (strip(left), strip(right));
        let (col, value) = match (&l, &r) {
            (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) => {
                (c, v)
            }
            _ => return None,
        };
        if col.name != column {
            return None;
        }
        match value {
            ScalarValue::Int64(Some(n)) => Some(*n),
            ScalarValue::Int32(Some(n)) => Some(i64::from(*n)),
            ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => s.parse().ok(),
            _ => None,
        }
    })
}

/// What the current catalog holds, as PostgreSQL numbers it.
struct Objects {
    user: String,
    /// Every catalog (PostgreSQL's databases).
    databases: Vec<String>,
    namespaces: Vec<(i64, String)>,
    relations: Vec<Relation>,
}

struct Relation {
    oid: i64,
    name: String,
    namespace: String,
    namespace_oid: i64,
    kind: &'static str,
    /// Name, type, type modifier, nullable; read only for `pg_attribute`.
    columns: Vec<Column>,
}

impl Objects {
    async fn list(state: &SessionState, user: &str, columns: Columns) -> DFResult<Objects> {
        let database = state.config_options().catalog.default_catalog.clone();
        let list = state.catalog_list().clone();
        let databases = list.catalog_names();
        let mut namespaces = Vec::new();
        let mut relations = Vec::new();
        let mut add = |namespace: &str, schema: Arc<dyn SchemaProvider>| {
            let full = format!("{database}.{namespace}");
            let namespace_oid = if namespace == PG_CATALOG {
                PG_CATALOG_OID
            } else {
                oid_of(&full)
            };
            namespaces.push((namespace_oid, namespace.to_string()));
            (namespace_oid, schema)
        };
        let mut schemas = Vec::new();
        if let Some(catalog) = list.catalog(&database) {
            let names: BTreeSet<String> = catalog.schema_names().into_iter().collect();
            for name in names {
                if name == PG_CATALOG {
                    continue;
                }
                if let Some(schema) = catalog.schema(&name) {
                    // Nested namespaces are listed with their levels joined by '.'.
                    let shown = name.replace('\u{1f}', ".");
                    schemas.push((shown.clone(), add(&shown, schema)));
                }
            }
        }
        let pg = Arc::new(PgCatalogSchema::new(user.to_string())) as Arc<dyn SchemaProvider>;
        schemas.push((PG_CATALOG.to_string(), add(PG_CATALOG, pg)));
        let info =
            Arc::new(InformationSchemaProvider::new(list.clone())) as Arc<dyn SchemaProvider>;
        schemas.push((
            INFORMATION_SCHEMA.to_string(),
            add(INFORMATION_SCHEMA, info),
        ));
        for (namespace, (namespace_oid, schema)) in schemas {
            let mut names = schema.table_names();
            names.sort();
            for name in names {
                let full = format!("{database}.{namespace}.{name}");
                let oid = if namespace == PG_CATALOG {
                    oid_of(&format!("{PG_CATALOG}.{name}"))
                } else {
                    oid_of(&full)
                };
                let kind = match schema.table_type(&name).await {
                    Ok(Some(TableType::View)) if namespace != PG_CATALOG => "v",
                    Ok(Some(_)) => "r",
                    // A table another writer dropped meanwhile, or one the catalog cannot
                    // answer for: not listed.
                    _ => continue,
                };
                let columns = match columns {
                    Columns::Of(only) if only.is_none_or(|o| o == oid) => {
                        match schema.table(&name).await {
                            Ok(Some(t)) => columns_of(&t.schema()),
                            _ => continue,
                        }
                    }
                    _ => Vec::new(),
                };
                relations.push(Relation {
                    oid,
                    name,
                    namespace: namespace.clone(),
                    namespace_oid,
                    kind,
                    columns,
                });
            }
        }
        Ok(Objects {
            user: user.to_string(),
            databases,
            namespaces,
            relations,
        })
    }
}

/// A column as `pg_attribute` shows it.
struct Column {
    name: String,
    ty: Type,
    /// PostgreSQL's type modifier (`numeric(p, s)`), or -1.
    typmod: i32,
    nullable: bool,
}

/// A table's columns as a client sees them.
fn columns_of(schema: &Schema) -> Vec<Column> {
    let fields = encode::fields(schema, &Format::UnifiedText);
    schema
        .fields()
        .iter()
        .zip(fields)
        .map(|(f, info)| {
            let typmod = match f.data_type() {
                DataType::Decimal128(p, s) if info.datatype() == &Type::NUMERIC => {
                    ((i32::from(*p) << 16) | i32::from(*s as u8)) + 4
                }
                _ => -1,
            };
            Column {
                name: f.name().clone(),
                ty: info.datatype().clone(),
                typmod,
                nullable: f.is_nullable(),
            }
        })
        .collect()
}

impl PgTable {
    fn rows(&self, o: &Objects) -> DFResult<RecordBatch> {
        let columns: Vec<ArrayRef> = match self.table.rows {
            Rows::Namespaces => vec![
                oids(o.namespaces.iter().map(|n| n.0)),
                texts(o.namespaces.iter().map(|n| Some(n.1.clone()))),
                oids(o.namespaces.iter().map(|_| OWNER_OID)),
                nulls(Col::TextArray, o.namespaces.len()),
            ],
            Rows::Relations => self.relations(o),
            Rows::Attributes => self.attributes(o),
            Rows::Types => self.types(),
            Rows::Databases => {
                let n = o.databases.len();
                vec![
                    oids(o.databases.iter().map(|d| oid_of(d))),
                    texts(o.databases.iter().map(|d| Some(d.clone()))),
                    oids((0..n).map(|_| OWNER_OID)),
                    Arc::new(Int32Array::from(vec![6; n])),
                    texts((0..n).map(|_| Some("c".into()))),
                    bools((0..n).map(|_| false)),
                    bools((0..n).map(|_| true)),
                    Arc::new(Int32Array::from(vec![-1; n])),
                    oids((0..n).map(|_| 0)),
                    oids((0..n).map(|_| 0)),
                    oids((0..n).map(|_| 1663)),
                    texts((0..n).map(|_| Some("C".into()))),
                    texts((0..n).map(|_| Some("C".into()))),
                    nulls(Col::Text, n),
                    nulls(Col::Text, n),
                    nulls(Col::Text, n),
                    nulls(Col::TextArray, n),
                ]
            }
            Rows::AccessMethods => vec![
                oids([2, 403]),
                texts([Some("heap".into()), Some("btree".into())]),
                texts([
                    Some("heap_tableam_handler".into()),
                    Some("bthandler".into()),
                ]),
                texts([Some("t".into()), Some("i".into())]),
            ],
            Rows::Roles if self.table.name == "pg_roles" => vec![
                oids([OWNER_OID]),
                texts([Some(o.user.clone())]),
                bools([true]),
                bools([true]),
                bools([true]),
                bools([true]),
                bools([true]),
                bools([false]),
                Arc::new(Int32Array::from(vec![-1])),
                texts([Some("********".into())]),
                nulls(Col::Text, 1),
                bools([true]),
                nulls(Col::TextArray, 1),
            ],
            Rows::Roles => vec![
                texts([Some(o.user.clone())]),
                oids([OWNER_OID]),
                bools([true]),
                bools([true]),
                bools([false]),
                bools([true]),
                texts([Some("********".into())]),
                nulls(Col::Text, 1),
                nulls(Col::TextArray, 1),
            ],
            Rows::Tablespaces => vec![
                oids([1663, 1664]),
                texts([Some("pg_default".into()), Some("pg_global".into())]),
                oids([OWNER_OID, OWNER_OID]),
                nulls(Col::TextArray, 2),
                nulls(Col::TextArray, 2),
            ],
            Rows::Settings => {
                let settings = crate::server::pg_rewrite::PG_SETTINGS;
                let n = settings.len();
                vec![
                    texts(settings.iter().map(|(k, _)| Some(k.to_string()))),
                    texts(settings.iter().map(|(_, v)| Some(v.to_string()))),
                    nulls(Col::Text, n),
                    texts((0..n).map(|_| Some("Client Connection Defaults".into()))),
                    nulls(Col::Text, n),
                    texts((0..n).map(|_| Some("user".into()))),
                    texts((0..n).map(|_| Some("string".into()))),
                    texts((0..n).map(|_| Some("default".into()))),
                ]
            }
            Rows::Tables | Rows::Views => {
                let kind = if self.table.rows == Rows::Tables {
                    "r"
                } else {
                    "v"
                };
                let rels: Vec<&Relation> = o.relations.iter().filter(|r| r.kind == kind).collect();
                let n = rels.len();
                let mut cols = vec![
                    texts(rels.iter().map(|r| Some(r.namespace.clone()))),
                    texts(rels.iter().map(|r| Some(r.name.clone()))),
                    texts((0..n).map(|_| Some(o.user.clone()))),
                ];
                if kind == "r" {
                    cols.push(nulls(Col::Text, n));
                    for _ in 0..4 {
                        cols.push(bools((0..n).map(|_| false)));
                    }
                } else {
                    cols.push(nulls(Col::Text, n));
                }
                cols
            }
            Rows::Keywords => {
                let words: Vec<String> = ALL_KEYWORDS.iter().map(|k| k.to_lowercase()).collect();
                let n = words.len();
                vec![
                    texts(words.into_iter().map(Some)),
                    texts((0..n).map(|_| Some("U".into()))),
                    bools((0..n).map(|_| true)),
                    texts((0..n).map(|_| Some("unreserved".into()))),
                    texts((0..n).map(|_| Some("can be bare label".into()))),
                ]
            }
            Rows::None => self
                .table
                .columns
                .iter()
                .map(|(_, c)| nulls(*c, 0))
                .collect(),
        };
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| {
            DataFusionError::Internal(format!("building pg_catalog.{}: {e}", self.table.name))
        })
    }

    fn relations(&self, o: &Objects) -> Vec<ArrayRef> {
        let r = &o.relations;
        let n = r.len();
        let all = |v: i64| oids((0..n).map(move |_| v));
        let no = || bools((0..n).map(|_| false));
        vec![
            oids(r.iter().map(|r| r.oid)),
            texts(r.iter().map(|r| Some(r.name.clone()))),
            oids(r.iter().map(|r| r.namespace_oid)),
            all(0),
            all(0),
            all(OWNER_OID),
            oids(r.iter().map(|r| if r.kind == "r" { 2 } else { 0 })),
            oids(r.iter().map(|r| r.oid)),
            all(0),
            Arc::new(Int32Array::from(vec![0; n])),
            Arc::new(datafusion::arrow::array::Float32Array::from(vec![-1.0; n])),
            Arc::new(Int32Array::from(vec![0; n])),
            all(0),
            no(),
            no(),
            texts((0..n).map(|_| Some("p".into()))),
            texts(r.iter().map(|r| Some(r.kind.to_string()))),
            Arc::new(Int16Array::from(
                r.iter()
                    .map(|r| i16::try_from(r.columns.len()).unwrap_or(i16::MAX))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Int16Array::from(vec![0; n])),
            no(),
            no(),
            no(),
            no(),
            no(),
            bools((0..n).map(|_| true)),
            texts((0..n).map(|_| Some("d".into()))),
            no(),
            all(0),
            all(0),
            all(0),
            nulls(Col::TextArray, n),
            nulls(Col::TextArray, n),
            nulls(Col::Text, n),
        ]
    }

    fn attributes(&self, o: &Objects) -> Vec<ArrayRef> {
        let rows: Vec<(&Relation, usize, &Column)> = o
            .relations
            .iter()
            .flat_map(|r| r.columns.iter().enumerate().map(move |(i, c)| (r, i, c)))
            .collect();
        let n = rows.len();
        let no = || bools((0..n).map(|_| false));
        let empty = || texts((0..n).map(|_| Some(String::new())));
        vec![
            oids(rows.iter().map(|(r, _, _)| r.oid)),
            texts(rows.iter().map(|(_, _, c)| Some(c.name.clone()))),
            oids(rows.iter().map(|(_, _, c)| i64::from(c.ty.oid()))),
            Arc::new(Int32Array::from(vec![-1; n])),
            Arc::new(Int16Array::from(
                rows.iter()
                    .map(|(_, _, c)| type_len(&c.ty))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Int16Array::from(
                rows.iter()
                    .map(|(_, i, _)| i16::try_from(i + 1).unwrap_or(i16::MAX))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Int32Array::from(vec![0; n])),
            Arc::new(Int32Array::from(vec![-1; n])),
            Arc::new(Int32Array::from(
                rows.iter().map(|(_, _, c)| c.typmod).collect::<Vec<_>>(),
            )),
            bools(
                rows.iter()
                    .map(|(_, _, c)| (1..=8).contains(&type_len(&c.ty))),
            ),
            texts((0..n).map(|_| Some("i".into()))),
            texts((0..n).map(|_| Some("x".into()))),
            empty(),
            bools(rows.iter().map(|(_, _, c)| !c.nullable)),
            no(),
            no(),
            empty(),
            empty(),
            no(),
            bools((0..n).map(|_| true)),
            Arc::new(Int32Array::from(vec![0; n])),
            oids(
                rows.iter()
                    .map(|(_, _, c)| if type_category(&c.ty) == "S" { 100 } else { 0 }),
            ),
            nulls(Col::TextArray, n),
            nulls(Col::TextArray, n),
            nulls(Col::TextArray, n),
        ]
    }

    fn types(&self) -> Vec<ArrayRef> {
        let t = &*TYPES;
        let n = t.len();
        let array = |ty: &Type| array_of(ty).map(|a| i64::from(a.oid())).unwrap_or(0);
        let element = |ty: &Type| element_of(ty).map(|e| i64::from(e.oid())).unwrap_or(0);
        let io = |ty: &Type, suffix: &str| {
            Some(match element_of(ty) {
                Some(_) => format!("array_{suffix}"),
                None => format!("{}{suffix}", ty.name()),
            })
        };
        vec![
            oids(t.iter().map(|t| i64::from(t.oid()))),
            texts(t.iter().map(|t| Some(t.name().to_string()))),
            oids((0..n).map(|_| PG_CATALOG_OID)),
            oids((0..n).map(|_| OWNER_OID)),
            Arc::new(Int16Array::from(t.iter().map(type_len).collect::<Vec<_>>())),
            bools(t.iter().map(|t| (1..=8).contains(&type_len(t)))),
            texts((0..n).map(|_| Some("b".into()))),
            texts(t.iter().map(|t| Some(type_category(t).to_string()))),
            bools((0..n).map(|_| false)),
            bools((0..n).map(|_| true)),
            texts((0..n).map(|_| Some(",".into()))),
            oids((0..n).map(|_| 0)),
            texts((0..n).map(|_| Some("-".into()))),
            oids(t.iter().map(element)),
            oids(t.iter().map(array)),
            texts(t.iter().map(|t| io(t, "in"))),
            texts(t.iter().map(|t| io(t, "out"))),
            texts(t.iter().map(|t| io(t, "recv"))),
            texts(t.iter().map(|t| io(t, "send"))),
            texts((0..n).map(|_| Some("i".into()))),
            texts((0..n).map(|_| Some("x".into()))),
            bools((0..n).map(|_| false)),
            oids((0..n).map(|_| 0)),
            Arc::new(Int32Array::from(vec![-1; n])),
            Arc::new(Int32Array::from(vec![0; n])),
            oids(
                t.iter()
                    .map(|t| if type_category(t) == "S" { 100 } else { 0 }),
            ),
            nulls(Col::Text, n),
            nulls(Col::TextArray, n),
        ]
    }
}

fn oids(values: impl IntoIterator<Item = i64>) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(values))
}

fn texts(values: impl IntoIterator<Item = Option<String>>) -> ArrayRef {
    Arc::new(StringArray::from_iter(values))
}

fn bools(values: impl IntoIterator<Item = bool>) -> ArrayRef {
    Arc::new(BooleanArray::from_iter(values.into_iter().map(Some)))
}

fn nulls(col: Col, n: usize) -> ArrayRef {
    match col {
        Col::TextArray => Arc::new(ListArray::new_null(
            Arc::new(Field::new_list_field(DataType::Utf8, true)),
            n,
        )),
        other => new_null_array(&other.arrow(), n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_as_many_columns_as_it_makes() {
        let objects = Objects {
            user: "floe".into(),
            databases: vec!["datafusion".into(), "lake".into()],
            namespaces: vec![(oid_of("lake.sales"), "sales".into())],
            relations: vec![Relation {
                oid: oid_of("lake.sales.orders"),
                name: "orders".into(),
                namespace: "sales".into(),
                namespace_oid: oid_of("lake.sales"),
                kind: "r",
                columns: vec![
                    Column {
                        name: "id".into(),
                        ty: Type::INT8,
                        typmod: -1,
                        nullable: false,
                    },
                    Column {
                        name: "amount".into(),
                        ty: Type::NUMERIC,
                        typmod: 655366,
                        nullable: true,
                    },
                ],
            }],
        };
        for table in TABLES {
            let t = PgTable {
                table,
                schema: schema_of(table),
                user: "floe".into(),
            };
            let batch = t
                .rows(&objects)
                .unwrap_or_else(|e| panic!("{}: {e}", table.name));
            assert_eq!(batch.num_columns(), table.columns.len(), "{}", table.name);
        }
    }

    #[test]
    fn the_relation_a_filter_names_is_found() {
        use datafusion::prelude::{col, lit};
        let by_number = col("attrelid").eq(lit(16384i64));
        assert_eq!(relation_filter(&[by_number], "attrelid"), Some(16384));
        let by_text = lit("16385").eq(col("attrelid"));
        assert_eq!(relation_filter(&[by_text], "attrelid"), Some(16385));
        let other = col("attnum").eq(lit(1i64));
        assert_eq!(relation_filter(&[other], "attrelid"), None);
        let range = col("attrelid").gt(lit(1i64));
        assert_eq!(relation_filter(&[range], "attrelid"), None);
    }

    #[test]
    fn oids_are_stable_and_system_tables_keep_postgresqls() {
        assert_eq!(oid_of("pg_catalog.pg_class"), 1259);
        assert_eq!(oid_of(PG_CATALOG), 11);
        let a = oid_of("lake.sales.orders");
        assert_eq!(a, oid_of("lake.sales.orders"));
        assert_ne!(a, oid_of("lake.sales.order"));
        assert!((FIRST_USER_OID..1 << 31).contains(&a));
    }

    #[test]
    fn types_are_named_as_postgresql_formats_them() {
        assert_eq!(format_type(20, None).as_deref(), Some("bigint"));
        assert_eq!(
            format_type(1700, Some(((10 << 16) | 2) + 4)).as_deref(),
            Some("numeric(10,2)")
        );
        assert_eq!(format_type(1016, None).as_deref(), Some("bigint[]"));
        assert_eq!(
            format_type(1114, None).as_deref(),
            Some("timestamp without time zone")
        );
        assert_eq!(format_type(999_999, None), None);
    }
}
