//! The DataFusion side of Iceberg catalogs: providers that look tables up on demand,
//! metadata tables, scans split across cores, scans of evolved tables, and `floe.jobs`.

mod dynamic_filter;
pub mod evolved_scan;
pub mod jobs;
pub mod metadata;
pub mod positioned;
pub mod provider;
pub mod split_scan;
pub mod table;

pub use provider::LakeCatalogProvider;
