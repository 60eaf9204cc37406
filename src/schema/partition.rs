//! Partition fields as SQL names them: `region`, `days(ts)`, `bucket(16, id)`,
//! `truncate(4, s)` (`PARTITIONED BY`, `'partition.candidates'`).

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Value,
};
use iceberg::spec::{Schema, Transform, UnboundPartitionSpec};

use crate::error::{Error, Result};

/// The partition spec for `PARTITIONED BY (...)` over `schema`.
pub fn partition_spec(exprs: &[Expr], schema: &Schema) -> Result<UnboundPartitionSpec> {
    let mut builder = UnboundPartitionSpec::builder();
    for expr in exprs {
        let (column, transform, suffix) = partition_field(expr)?;
        let field = schema.field_by_name(&column).ok_or_else(|| {
            Error::Plan(format!(
                "PARTITIONED BY names column '{column}', which the table does not have"
            ))
        })?;
        let name = match suffix {
            None => column.clone(),
            Some(s) => format!("{column}_{s}"),
        };
        builder = builder.add_partition_field(field.id, name, transform)?;
    }
    Ok(builder.build())
}

/// The source column, transform and partition-name suffix of one partition field.
pub fn partition_field(expr: &Expr) -> Result<(String, Transform, Option<&'static str>)> {
    let bad = || {
        Error::Plan(format!(
            "'{expr}' is not a partition field: use a column, years(col), months(col), \
             days(col), hours(col), bucket(N, col) or truncate(N, col)"
        ))
    };
    match expr {
        Expr::Identifier(id) => Ok((id.value.clone(), Transform::Identity, None)),
        Expr::Function(f) => {
            let fname = f.name.to_string().to_ascii_lowercase();
            let FunctionArguments::List(list) = &f.args else {
                return Err(bad());
            };
            let args: Vec<&Expr> = list
                .args
                .iter()
                .map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
                    _ => Err(bad()),
                })
                .collect::<Result<_>>()?;
            let column = |e: &Expr| match e {
                Expr::Identifier(id) => Ok(id.value.clone()),
                _ => Err(bad()),
            };
            let number = |e: &Expr| match e {
                Expr::Value(v) => match &v.value {
                    Value::Number(n, _) => n.parse::<u32>().map_err(|_| bad()),
                    _ => Err(bad()),
                },
                _ => Err(bad()),
            };
            match (fname.as_str(), args.as_slice()) {
                ("years" | "year", [c]) => Ok((column(c)?, Transform::Year, Some("year"))),
                ("months" | "month", [c]) => Ok((column(c)?, Transform::Month, Some("month"))),
                ("days" | "day" | "date", [c]) => Ok((column(c)?, Transform::Day, Some("day"))),
                ("hours" | "hour", [c]) => Ok((column(c)?, Transform::Hour, Some("hour"))),
                ("bucket", [n, c]) => {
                    Ok((column(c)?, Transform::Bucket(number(n)?), Some("bucket")))
                }
                ("truncate", [n, c]) => {
                    Ok((column(c)?, Transform::Truncate(number(n)?), Some("trunc")))
                }
                _ => Err(bad()),
            }
        }
        _ => Err(bad()),
    }
}
