//! The PostgreSQL functions clients call in their catalog queries (`pg_table_is_visible`,
//! `format_type`, `pg_get_userbyid`, ...), answered from what floe has: every object is
//! visible and allowed to the one user, types are named from their oids, and what floe keeps
//! no record of (comments, defaults, index and constraint definitions) is NULL.
//!
//! Functions that only read the session (`current_database()`, `version()`, ...) are not
//! here: the rewrite (`pg_rewrite.rs`) puts their values in the statement.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::scalar::ScalarValue;

use super::pg_catalog::format_type;

/// What a function answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Answer {
    /// `true` for every row (visibility, privileges).
    True,
    /// NULL text for every row (comments, definitions).
    NullText,
    /// NULL bigint for every row (sizes).
    NullInt,
    /// This text for every row.
    Text(String),
    /// `format_type(oid, typmod)`.
    FormatType,
    /// `pg_size_pretty(bytes)`.
    SizePretty,
}

/// One function: its name and answer.
#[derive(Debug, PartialEq, Eq, Hash)]
struct PgFunction {
    name: &'static str,
    answer: Answer,
    signature: Signature,
}

impl ScalarUDFImpl for PgFunction {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DFResult<DataType> {
        Ok(match self.answer {
            Answer::True => DataType::Boolean,
            Answer::NullInt => DataType::Int64,
            Answer::NullText | Answer::Text(_) | Answer::FormatType | Answer::SizePretty => {
                DataType::Utf8
            }
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        Ok(match &self.answer {
            Answer::True => ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))),
            Answer::NullText => ColumnarValue::Scalar(ScalarValue::Utf8(None)),
            Answer::NullInt => ColumnarValue::Scalar(ScalarValue::Int64(None)),
            Answer::Text(t) => ColumnarValue::Scalar(ScalarValue::Utf8(Some(t.clone()))),
            Answer::SizePretty => {
                let arrays = ColumnarValue::values_to_arrays(&args.args)?;
                let bytes = cast(&arrays[0], &DataType::Int64)?;
                let bytes = bytes.as_primitive::<Int64Type>();
                let shown: StringArray = bytes.iter().map(|b| b.map(size_pretty)).collect();
                ColumnarValue::Array(Arc::new(shown) as ArrayRef)
            }
            Answer::FormatType => {
                let arrays = ColumnarValue::values_to_arrays(&args.args)?;
                let oids = cast(&arrays[0], &DataType::Int64)?;
                let oids = oids.as_primitive::<Int64Type>();
                let typmods: Option<ArrayRef> = match arrays.get(1) {
                    Some(a) => Some(cast(a, &DataType::Int64)?),
                    None => None,
                };
                let typmods = typmods.as_ref().map(|a| a.as_primitive::<Int64Type>());
                let names: StringArray = (0..oids.len())
                    .map(|i| {
                        if oids.is_null(i) {
                            return None;
                        }
                        let typmod = typmods.and_then(|m| (!m.is_null(i)).then(|| m.value(i)));
                        format_type(oids.value(i), typmod)
                            .or_else(|| Some(format!("oid {}", oids.value(i))))
                    })
                    .collect();
                ColumnarValue::Array(Arc::new(names) as ArrayRef)
            }
        })
    }
}

/// Bytes as PostgreSQL's `pg_size_pretty` shows them: bytes, kB, MB, GB, TB (each unit
/// from 10 240 of the one below, rounded half up).
fn size_pretty(bytes: i64) -> String {
    let mut size = bytes;
    for unit in ["bytes", "kB", "MB", "GB"] {
        if size.abs() < 10 * 1024 {
            return format!("{size} {unit}");
        }
        size = (size + size.signum() * 512) / 1024;
    }
    format!("{size} TB")
}

/// The functions, for the server's user `user`.
pub fn functions(user: &str) -> Vec<ScalarUDF> {
    let any = |name: &'static str, answer: Answer| {
        ScalarUDF::new_from_impl(PgFunction {
            name,
            answer,
            signature: Signature::variadic_any(Volatility::Stable),
        })
    };
    // Visibility and privileges: everything, to the one user. Comments, definitions and
    // sizes: floe keeps none.
    let answers: [(&[&'static str], Answer); 3] = [
        (
            &[
                "pg_table_is_visible",
                "pg_type_is_visible",
                "pg_function_is_visible",
                "has_table_privilege",
                "has_schema_privilege",
                "has_database_privilege",
                "has_column_privilege",
                "has_any_column_privilege",
                "has_function_privilege",
                "pg_has_role",
            ],
            Answer::True,
        ),
        (
            &[
                "pg_get_expr",
                "obj_description",
                "col_description",
                "shobj_description",
                "pg_get_constraintdef",
                "pg_get_indexdef",
                "pg_get_viewdef",
                "pg_get_partkeydef",
                "pg_get_triggerdef",
                "pg_get_functiondef",
                "pg_get_statisticsobjdef_columns",
                "pg_tablespace_location",
            ],
            Answer::NullText,
        ),
        (
            &[
                "pg_total_relation_size",
                "pg_relation_size",
                "pg_table_size",
                "pg_indexes_size",
                "pg_database_size",
            ],
            Answer::NullInt,
        ),
    ];
    let mut all: Vec<ScalarUDF> = answers
        .into_iter()
        .flat_map(|(names, answer)| names.iter().map(move |n| (*n, answer.clone())))
        .map(|(name, answer)| any(name, answer))
        .collect();
    all.push(any("pg_get_userbyid", Answer::Text(user.to_string())));
    all.push(any("pg_encoding_to_char", Answer::Text("UTF8".into())));
    all.push(any("format_type", Answer::FormatType));
    all.push(any("pg_size_pretty", Answer::SizePretty));
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::Field;
    use datafusion::config::ConfigOptions;

    fn call(f: &ScalarUDF, args: Vec<ColumnarValue>, rows: usize) -> ColumnarValue {
        let types: Vec<DataType> = args.iter().map(|a| a.data_type()).collect();
        let arg_fields = types
            .iter()
            .map(|t| Arc::new(Field::new("a", t.clone(), true)))
            .collect();
        let returns = f.return_type(&types).expect("a return type");
        f.invoke_with_args(ScalarFunctionArgs {
            args,
            arg_fields,
            number_rows: rows,
            return_field: Arc::new(Field::new("r", returns, true)),
            config_options: Arc::new(ConfigOptions::default()),
        })
        .expect("the function runs")
    }

    #[test]
    fn sizes_are_shown_as_postgresql_shows_them() {
        assert_eq!(size_pretty(8192), "8192 bytes");
        assert_eq!(size_pretty(16384), "16 kB");
        assert_eq!(size_pretty(10 * 1024 * 1024), "10 MB");
        assert_eq!(size_pretty(3 << 40), "3072 GB");
    }

    #[test]
    fn format_type_names_each_row_and_true_is_true() {
        let all = functions("floe");
        let format = all
            .iter()
            .find(|f| f.name() == "format_type")
            .expect("there");
        let oids = ColumnarValue::Array(Arc::new(Int64Array::from(vec![Some(20), None, Some(25)])));
        let mods = ColumnarValue::Scalar(ScalarValue::Int64(Some(-1)));
        let ColumnarValue::Array(out) = call(format, vec![oids, mods], 3) else {
            panic!("an array");
        };
        let out = out.as_string::<i32>();
        assert_eq!(out.value(0), "bigint");
        assert!(out.is_null(1));
        assert_eq!(out.value(2), "text");
        let visible = all
            .iter()
            .find(|f| f.name() == "pg_table_is_visible")
            .expect("there");
        let ColumnarValue::Scalar(v) = call(
            visible,
            vec![ColumnarValue::Scalar(ScalarValue::Int64(Some(1)))],
            1,
        ) else {
            panic!("a scalar");
        };
        assert_eq!(v, ScalarValue::Boolean(Some(true)));
        let owner = all
            .iter()
            .find(|f| f.name() == "pg_get_userbyid")
            .expect("there");
        let ColumnarValue::Scalar(v) = call(
            owner,
            vec![ColumnarValue::Scalar(ScalarValue::Int64(Some(10)))],
            1,
        ) else {
            panic!("a scalar");
        };
        assert_eq!(v, ScalarValue::Utf8(Some("floe".into())));
    }
}
