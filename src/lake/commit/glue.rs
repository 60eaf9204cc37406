//! Committing to the AWS Glue Data Catalog. A table's current metadata file is the
//! `metadata_location` parameter of its Glue table, swapped with Glue's optimistic
//! `UpdateTable`, as iceberg-java's `GlueTableOperations` does:
//!
//! ```text
//! GetTable                       -> VersionId v, parameters.metadata_location m
//!   m is not base's location     -> a retryable conflict (someone committed first)
//! new metadata file written next to base's
//! UpdateTable(VersionId = v)     metadata_location = new, previous_metadata_location = m,
//!                                columns = the new schema's
//!   ConcurrentModificationException (v is no longer current) -> a retryable conflict
//! ```
//!
//! A crash before `UpdateTable` leaves the table as it was (the new metadata file is an
//! orphan). The Glue table's columns follow the schema, so that engines reading Glue's own
//! columns (Athena, Glue ETL) see the evolved table.

use aws_sdk_glue::types::{Column, StorageDescriptor, Table as GlueTable, TableInput};
use iceberg::spec::{NestedField, PrimitiveType, TableMetadata, Type};
use iceberg::table::Table;
use iceberg::{ErrorKind, TableIdent};

use crate::connector::aws::describe;
use crate::error::Result;

/// Glue table parameters an Iceberg table carries.
pub const TABLE_TYPE: &str = "table_type";
pub const ICEBERG: &str = "ICEBERG";
pub const METADATA_LOCATION: &str = "metadata_location";
const PREVIOUS_METADATA_LOCATION: &str = "previous_metadata_location";

/// Glue calls for one catalog: the client, the catalog id (the account, by default) and
/// where it is, for messages.
#[derive(Debug, Clone)]
pub struct GlueCommitter {
    pub client: aws_sdk_glue::Client,
    pub catalog_id: Option<String>,
    /// `the AWS Glue Data Catalog at http://...` (or `in region ...`).
    pub at: String,
}

impl GlueCommitter {
    /// An error of a Glue call, as iceberg-rust's catalogs report them: a version conflict is
    /// a retryable commit conflict, anything else unexpected (an outage, retried by jobs).
    pub fn error<E>(&self, what: &str, e: aws_sdk_glue::error::SdkError<E>) -> iceberg::Error
    where
        E: aws_sdk_glue::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        use aws_sdk_glue::error::ProvideErrorMetadata;
        if e.code() == Some("ConcurrentModificationException") {
            return iceberg::Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("{}: {what}: the table changed meanwhile", self.at),
            )
            .with_retryable(true);
        }
        iceberg::Error::new(
            ErrorKind::Unexpected,
            format!("{}: {what}: {}", self.at, describe(&e)),
        )
    }

    /// The Glue table of `ident` and its version, or `None` when there is none.
    pub async fn get(&self, ident: &TableIdent) -> iceberg::Result<Option<GlueTable>> {
        let db = database_of(ident.namespace())?;
        let got = self
            .client
            .get_table()
            .set_catalog_id(self.catalog_id.clone())
            .database_name(db)
            .name(ident.name())
            .send()
            .await;
        match got {
            Ok(out) => Ok(out.table),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.error(&format!("reading table {ident}"), e)),
        }
    }

    /// Write `metadata` as the next version of `base` and make it current, unless `base`
    /// is no longer current (a retryable conflict).
    pub async fn commit(&self, base: &Table, metadata: TableMetadata) -> Result<Table> {
        let ident = base.identifier();
        let base_location = base.metadata_location_result()?.to_string();
        let current = self.get(ident).await?.ok_or_else(|| {
            iceberg::Error::new(
                ErrorKind::TableNotFound,
                format!("table {ident} no longer exists in {}", self.at),
            )
        })?;
        if metadata_location(&current) != Some(base_location.as_str()) {
            return Err(conflict(ident).into());
        }
        let location = super::write_next_metadata(base, &metadata).await?;
        crate::lake::storage::sync_written().await?;
        self.swap(ident, &current, &base_location, &location, &metadata)
            .await?;
        super::table_like(base, metadata, Some(&location))
    }

    /// Point `current` (the Glue table as read, at `base_location`) at `location`, unless
    /// another writer updated it since it was read.
    pub async fn swap(
        &self,
        ident: &TableIdent,
        current: &GlueTable,
        base_location: &str,
        location: &str,
        metadata: &TableMetadata,
    ) -> iceberg::Result<()> {
        let mut parameters = current.parameters.clone().unwrap_or_default();
        parameters.insert(TABLE_TYPE.into(), ICEBERG.into());
        parameters.insert(METADATA_LOCATION.into(), location.into());
        parameters.insert(PREVIOUS_METADATA_LOCATION.into(), base_location.into());
        let input = table_input(ident.name(), metadata, parameters, Some(current))?;
        self.client
            .update_table()
            .set_catalog_id(self.catalog_id.clone())
            .database_name(database_of(ident.namespace())?)
            .table_input(input)
            .set_version_id(current.version_id.clone())
            .skip_archive(true)
            .send()
            .await
            .map_err(|e| self.error(&format!("committing to table {ident}"), e))?;
        Ok(())
    }
}

/// The `TableInput` of an Iceberg table named `name` with `metadata` and `parameters`: an
/// external table at the table's location with the current schema's columns, and the
/// description and owner of the Glue table it replaces, if any.
pub fn table_input(
    name: &str,
    metadata: &TableMetadata,
    parameters: std::collections::HashMap<String, String>,
    replaces: Option<&GlueTable>,
) -> iceberg::Result<TableInput> {
    let columns = metadata
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| column(f))
        .collect::<iceberg::Result<Vec<_>>>()?;
    let descriptor = StorageDescriptor::builder()
        .set_columns(Some(columns))
        .location(metadata.location())
        .build();
    TableInput::builder()
        .name(name)
        .table_type("EXTERNAL_TABLE")
        .set_parameters(Some(parameters))
        .storage_descriptor(descriptor)
        .set_description(replaces.and_then(|t| t.description.clone()))
        .set_owner(replaces.and_then(|t| t.owner.clone()))
        .build()
        .map_err(|e| built(name, e))
}

/// A Glue column for an Iceberg field, with the field id and optionality as parameters
/// (as iceberg-java writes them).
fn column(field: &NestedField) -> iceberg::Result<Column> {
    Column::builder()
        .name(&field.name)
        .r#type(glue_type(&field.field_type))
        .set_comment(field.doc.clone())
        .parameters("iceberg.field.id", field.id.to_string())
        .parameters("iceberg.field.optional", (!field.required).to_string())
        .parameters("iceberg.field.current", "true")
        .build()
        .map_err(|e| built(&field.name, e))
}

/// The Hive type name Glue shows for an Iceberg type.
fn glue_type(t: &Type) -> String {
    match t {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean => "boolean".into(),
            PrimitiveType::Int => "int".into(),
            PrimitiveType::Long => "bigint".into(),
            PrimitiveType::Float => "float".into(),
            PrimitiveType::Double => "double".into(),
            PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            PrimitiveType::Date => "date".into(),
            PrimitiveType::Timestamp
            | PrimitiveType::Timestamptz
            | PrimitiveType::TimestampNs
            | PrimitiveType::TimestamptzNs => "timestamp".into(),
            PrimitiveType::Time | PrimitiveType::String | PrimitiveType::Uuid => "string".into(),
            PrimitiveType::Fixed(_) | PrimitiveType::Binary => "binary".into(),
        },
        Type::Struct(s) => format!(
            "struct<{}>",
            s.fields()
                .iter()
                .map(|f| format!("{}:{}", f.name, glue_type(&f.field_type)))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Type::List(l) => format!("array<{}>", glue_type(&l.element_field.field_type)),
        Type::Map(m) => format!(
            "map<{},{}>",
            glue_type(&m.key_field.field_type),
            glue_type(&m.value_field.field_type)
        ),
    }
}

/// The Glue database a namespace names: Glue has one level.
pub fn database_of(namespace: &iceberg::NamespaceIdent) -> iceberg::Result<&str> {
    match namespace.as_ref().as_slice() {
        [db] if !db.is_empty() => Ok(db),
        _ => Err(iceberg::Error::new(
            ErrorKind::FeatureUnsupported,
            format!(
                "the AWS Glue Data Catalog has one level of namespaces (databases), not '{}'",
                namespace.join(".")
            ),
        )),
    }
}

/// The metadata file a Glue table points at, if it is an Iceberg table.
pub fn metadata_location(table: &GlueTable) -> Option<&str> {
    let parameters = table.parameters.as_ref()?;
    let iceberg = parameters
        .get(TABLE_TYPE)
        .is_some_and(|t| t.eq_ignore_ascii_case(ICEBERG));
    parameters
        .get(METADATA_LOCATION)
        .filter(|_| iceberg)
        .map(String::as_str)
}

/// Whether a Glue call failed because what it names does not exist.
pub fn is_not_found<E>(e: &aws_sdk_glue::error::SdkError<E>) -> bool
where
    E: aws_sdk_glue::error::ProvideErrorMetadata,
{
    use aws_sdk_glue::error::ProvideErrorMetadata;
    e.code() == Some("EntityNotFoundException")
}

fn conflict(ident: &TableIdent) -> iceberg::Error {
    iceberg::Error::new(
        ErrorKind::CatalogCommitConflicts,
        format!("table {ident} changed while floe was committing to it"),
    )
    .with_retryable(true)
}

fn built(what: impl std::fmt::Display, e: aws_sdk_glue::error::BuildError) -> iceberg::Error {
    iceberg::Error::new(
        ErrorKind::Unexpected,
        format!("building the Glue request for {what}: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{ListType, MapType, StructType};

    #[test]
    fn iceberg_types_have_glue_names() {
        let long = |id, name: &str| NestedField::required(id, name, PrimitiveType::Long.into());
        let nested = Type::Struct(StructType::new(vec![
            long(2, "a").into(),
            NestedField::optional(
                3,
                "tags",
                Type::List(ListType::new(
                    NestedField::list_element(4, PrimitiveType::String.into(), false).into(),
                )),
            )
            .into(),
            NestedField::optional(
                5,
                "m",
                Type::Map(MapType::new(
                    NestedField::map_key_element(6, PrimitiveType::String.into()).into(),
                    NestedField::map_value_element(
                        7,
                        PrimitiveType::Decimal {
                            precision: 10,
                            scale: 2,
                        }
                        .into(),
                        false,
                    )
                    .into(),
                )),
            )
            .into(),
        ]));
        assert_eq!(
            glue_type(&nested),
            "struct<a:bigint,tags:array<string>,m:map<string,decimal(10,2)>>"
        );
        assert_eq!(glue_type(&PrimitiveType::Timestamptz.into()), "timestamp");
        assert_eq!(glue_type(&PrimitiveType::Fixed(16).into()), "binary");
        let c = column(&NestedField::optional(9, "x", PrimitiveType::Int.into())).unwrap();
        assert_eq!(c.r#type(), Some("int"));
        let p = c.parameters().unwrap();
        assert_eq!(p["iceberg.field.id"], "9");
        assert_eq!(p["iceberg.field.optional"], "true");
    }

    #[test]
    fn glue_has_one_level_of_namespaces() {
        let one = iceberg::NamespaceIdent::new("db".into());
        assert_eq!(database_of(&one).unwrap(), "db");
        let two = iceberg::NamespaceIdent::from_strs(["a", "b"]).unwrap();
        let err = database_of(&two).unwrap_err().to_string();
        assert!(err.contains("one level") && err.contains("a.b"), "{err}");
    }
}
