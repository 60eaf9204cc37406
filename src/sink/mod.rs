//! Writing to Iceberg tables: per-table writers and the commit path.

pub mod dead_letter;
pub mod route;
pub mod table_sink;
