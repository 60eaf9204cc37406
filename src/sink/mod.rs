//! Writing to Iceberg tables: per-table writers and the commit path.

pub mod commit;
pub mod writer;

pub use writer::TableWriter;
