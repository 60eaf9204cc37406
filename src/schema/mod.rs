//! Schema rules, in one place each, with no I/O: the bottom layer above `error`.
//!
//! - [`changes`]: a change stream's rows, which say whether each deletes its key (and by
//!   which key columns).
//! - [`promote`]: which column types may become which (Iceberg's promotions).
//! - [`types`]: the Iceberg type of an Arrow column, type names for messages, field metadata.
//! - [`infer`]: the shape of a JSON record, and merging shapes for previews.
//! - [`mod@evolve`]: the table schema a batch needs (new optional columns, widened types), and
//!   conforming a batch to a table's schema.
//! - [`merge`]: merging a schema change with one another writer committed first.
//! - [`partition`]: partition fields as SQL names them (`days(ts)`, `bucket(16, id)`).

pub mod changes;
pub mod evolve;
pub mod infer;
pub mod merge;
pub mod partition;
pub mod promote;
pub mod shape_key;
pub mod types;

pub use changes::CHANGE_COLUMN;
pub use evolve::{conform, conform_array, conform_to, evolve, match_case, narrow_integers};
pub use promote::{promotes, widest};
pub use types::{
    FIELD_DOC, INFERRED, arrow_type_name, iceberg_schema, type_name, with_key, with_uuid,
};
