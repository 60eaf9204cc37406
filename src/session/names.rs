//! Resolving names (`[catalog.][namespace.]table`) against the session's defaults and its
//! registered catalogs.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::sql::sqlparser::ast::ObjectName;
use iceberg::{Catalog, NamespaceIdent};

use super::Session;
use crate::error::{Error, Result};
use crate::lake::{CatalogHandle, Committer};
use crate::sql::parser::name_parts;

/// A table's name, resolved to its catalog, namespace and name.
pub(super) struct TableName {
    pub(super) catalog: String,
    pub(super) namespace: NamespaceIdent,
    pub(super) table: String,
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}.{}",
            self.catalog,
            self.namespace.to_url_string(),
            self.table
        )
    }
}

impl Session {
    /// The Iceberg catalogs registered, by name.
    pub fn catalogs(&self) -> BTreeMap<String, CatalogHandle> {
        self.catalogs.read().map(|c| c.clone()).unwrap_or_default()
    }

    pub(super) fn iceberg(&self, catalog: &str) -> Result<Arc<dyn Catalog>> {
        if let Some(h) = self
            .catalogs
            .read()
            .ok()
            .and_then(|c| c.get(catalog).cloned())
        {
            return Ok(h.catalog);
        }
        if self.ctx.catalog(catalog).is_some() {
            return Err(Error::Plan(format!(
                "catalog '{catalog}' is DataFusion's in-memory catalog, not an Iceberg catalog"
            )));
        }
        Err(Error::NotFound(format!(
            "catalog '{catalog}' does not exist (SHOW CATALOGS lists them; CREATE CATALOG \
             registers one)"
        )))
    }

    pub(super) fn is_iceberg(&self, catalog: &str) -> bool {
        self.catalogs
            .read()
            .map(|c| c.contains_key(catalog))
            .unwrap_or(false)
    }

    pub(super) fn defaults(&self) -> (String, String) {
        let state = self.ctx.state();
        let opts = &state.config().options().catalog;
        (opts.default_catalog.clone(), opts.default_schema.clone())
    }

    /// `[catalog.][namespace.]table` with the session's defaults filled in.
    pub(super) fn table_name(&self, name: &ObjectName) -> Result<TableName> {
        let parts = name_parts(name)?;
        let (dc, ds) = self.defaults();
        let (catalog, ns, table) = match parts.as_slice() {
            [t] => (dc, ds, t.clone()),
            [n, t] => (dc, n.clone(), t.clone()),
            [c, n, t] => (c.clone(), n.clone(), t.clone()),
            _ => {
                return Err(Error::Plan(format!(
                    "'{name}' has too many parts: write catalog.namespace.table"
                )));
            }
        };
        Ok(TableName {
            catalog,
            namespace: NamespaceIdent::new(ns),
            table,
        })
    }

    /// `[catalog.]namespace` with the default catalog filled in.
    pub(super) fn namespace_name(&self, name: &ObjectName) -> Result<(String, NamespaceIdent)> {
        let parts = name_parts(name)?;
        let (dc, _) = self.defaults();
        match parts.as_slice() {
            [n] => Ok((dc, NamespaceIdent::new(n.clone()))),
            [c, n] => Ok((c.clone(), NamespaceIdent::new(n.clone()))),
            _ => Err(Error::Plan(format!(
                "'{name}' is not a namespace name: write catalog.namespace"
            ))),
        }
    }

    pub(super) fn committer(&self, catalog: &str) -> Option<Arc<Committer>> {
        self.catalogs
            .read()
            .ok()?
            .get(catalog)
            .and_then(|h| h.committer.clone())
    }
}
