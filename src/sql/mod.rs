//! The SQL front end: a parser that wraps DataFusion's, floe's own statements, and
//! `WITH (...)` option bags.

pub mod options;
pub mod parser;
pub mod statement;
pub mod windows;

pub use options::Options;
pub use parser::{
    Literal, ScriptStatement, is_complete, parse_sql, split_statements, visit_sql_mut,
};
pub use statement::Statement;
