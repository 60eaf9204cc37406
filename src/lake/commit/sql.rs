//! Committing to an Iceberg SQL catalog (SQLite, PostgreSQL) by compare-and-set on its
//! `iceberg_tables` row:
//!
//! ```text
//! new metadata file written next to base's
//! UPDATE iceberg_tables SET metadata_location = new WHERE metadata_location = base
//!   (0 rows: someone else committed first -> a retryable conflict)
//! ```
//!
//! A crash before the compare-and-set leaves the table as it was (the new metadata file is
//! an orphan), so a schema is never visible without the snapshot that uses it.

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use sqlx::AnyPool;

use crate::error::{Error, Result};

/// Commits to an Iceberg SQL catalog by compare-and-set on its `iceberg_tables` row.
#[derive(Debug, Clone)]
pub struct SqlCommitter {
    pool: AnyPool,
    catalog_name: String,
    dollar_params: bool,
}

impl SqlCommitter {
    /// A committer on the catalog database at `uri` (the one the catalog uses).
    pub async fn connect(uri: &str, catalog_name: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(2)
            .connect(uri)
            .await
            .map_err(|e| Error::catalog_database("opening the catalog database for commits", e))?;
        Ok(Self {
            pool,
            catalog_name: catalog_name.to_string(),
            dollar_params: !uri.starts_with("sqlite:"),
        })
    }

    /// Write `metadata` as the next version of `base` and make it current, unless `base`
    /// is no longer current (a retryable conflict).
    pub async fn commit(&self, base: &Table, metadata: TableMetadata) -> Result<Table> {
        let base_location = base.metadata_location_result()?.to_string();
        let location = super::write_next_metadata(base, &metadata).await?;
        let ident = base.identifier();
        let p = |i: usize| {
            if self.dollar_params {
                format!("${i}")
            } else {
                "?".to_string()
            }
        };
        let sql = format!(
            "UPDATE iceberg_tables SET metadata_location = {}, previous_metadata_location = {} \
             WHERE catalog_name = {} AND table_namespace = {} AND table_name = {} \
             AND metadata_location = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6)
        );
        let done = sqlx::query(&sql)
            .bind(location.clone())
            .bind(base_location.clone())
            .bind(self.catalog_name.clone())
            .bind(ident.namespace().join("."))
            .bind(ident.name().to_string())
            .bind(base_location)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::catalog_database(format!("committing {ident}"), e))?;
        if done.rows_affected() == 0 {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::CatalogCommitConflicts,
                format!("table {ident} changed while floe was committing to it"),
            )
            .with_retryable(true)
            .into());
        }
        super::table_like(base, metadata, Some(&location))
    }
}
