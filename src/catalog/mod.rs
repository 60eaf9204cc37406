//! Iceberg catalogs: opening them, showing them to DataFusion, and mapping SQL to Iceberg.

pub mod commit;
pub mod connect;
pub mod evolved_scan;
pub mod local_storage;
pub mod metadata;
pub mod provider;
pub mod schema;
pub mod table;

pub use connect::{CatalogHandle, connect, table_exists};
pub use provider::LakeCatalogProvider;
