//! Writing to Iceberg tables: per-table writers and the commit path.

pub mod commit;
pub mod dead_letter;
pub mod route;
pub mod table_sink;
pub mod writer;

pub use writer::TableWriter;
