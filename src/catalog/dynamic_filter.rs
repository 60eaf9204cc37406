//! What a filter DataFusion learns while a query runs says about a lake table's files: the
//! bounds and small key lists a hash join pushes to its probe side once its build side is in
//! (`key >= min AND key <= max AND key IN (...)`) and the threshold a top-N tightens as rows
//! arrive (`x IS NULL OR x > t`), as an Iceberg predicate that the table's manifests can
//! prune files with.
//!
//! ```text
//! HashJoinExec (build: 10,000 first order ids) --DynamicFilter--> LakeScan (probe)
//!   snapshot: order_id >= 3 AND order_id <= 91204 AND hash_lookup(...)
//!   predicate: order_id >= 3 AND order_id <= 91204      -> 4 of 360 files read
//! ```
//!
//! The translation keeps only what it can say for sure: a row the filter passes also passes
//! the predicate. What it cannot translate (a hash look-up, an expression over columns, a
//! type Iceberg has no literal for) it drops, so the predicate may keep more files than the
//! filter would, never fewer; DataFusion still applies the filter to every row.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, Literal,
};
use datafusion::physical_expr_common::physical_expr::snapshot_physical_expr;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::Datum;

/// The predicate the filters (read now, as they stand) imply together, or `None` when they
/// imply nothing a manifest can use (a filter not yet set is `true`).
pub fn predicate(filters: &[Arc<dyn PhysicalExpr>]) -> Option<Predicate> {
    filters
        .iter()
        .filter_map(|f| snapshot_physical_expr(Arc::clone(f)).ok())
        .filter_map(|f| implied(&f))
        .reduce(Predicate::and)
}

/// A predicate every row `expr` passes also passes; `None` for "any row may".
fn implied(expr: &Arc<dyn PhysicalExpr>) -> Option<Predicate> {
    let any = expr.as_any();
    if let Some(b) = any.downcast_ref::<BinaryExpr>() {
        return binary(b);
    }
    if let Some(list) = any.downcast_ref::<InListExpr>() {
        if list.negated() {
            return None;
        }
        let column = column_name(list.expr())?;
        let values: Option<Vec<Datum>> = list
            .list()
            .iter()
            .map(|v| literal(v).and_then(datum))
            .collect();
        return Some(Reference::new(column).is_in(values?));
    }
    // A top-N over a nullable column keeps its nulls: `x IS NULL OR x > threshold`.
    if let Some(e) = any.downcast_ref::<IsNullExpr>() {
        return Some(Reference::new(column_name(e.arg())?).is_null());
    }
    if let Some(e) = any.downcast_ref::<IsNotNullExpr>() {
        return Some(Reference::new(column_name(e.arg())?).is_not_null());
    }
    if let Some(case) = any.downcast_ref::<CaseExpr>() {
        // Some branch's result holds for every row the CASE passes (an ELSE that is not
        // `false` could pass rows no branch says anything of).
        if case
            .else_expr()
            .is_some_and(|e| literal(e) != Some(&ScalarValue::Boolean(Some(false))))
        {
            return None;
        }
        return case
            .when_then_expr()
            .iter()
            .map(|(_, then)| implied(then))
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .reduce(Predicate::or)
            .or(Some(Predicate::AlwaysFalse));
    }
    match literal(expr) {
        Some(ScalarValue::Boolean(Some(false))) => Some(Predicate::AlwaysFalse),
        _ => None,
    }
}

fn binary(b: &BinaryExpr) -> Option<Predicate> {
    match b.op() {
        Operator::And => match (implied(b.left()), implied(b.right())) {
            (Some(l), Some(r)) => Some(l.and(r)),
            (one, other) => one.or(other),
        },
        Operator::Or => Some(implied(b.left())?.or(implied(b.right())?)),
        op => {
            // `column op literal`, or `literal op column` read the other way round.
            let (column, value, op) = match (column_name(b.left()), literal(b.right())) {
                (Some(c), Some(v)) => (c, v, *op),
                _ => (column_name(b.right())?, literal(b.left())?, op.swap()?),
            };
            let r = Reference::new(column);
            let d = datum(value)?;
            match op {
                Operator::Eq => Some(r.equal_to(d)),
                Operator::Lt => Some(r.less_than(d)),
                Operator::LtEq => Some(r.less_than_or_equal_to(d)),
                Operator::Gt => Some(r.greater_than(d)),
                Operator::GtEq => Some(r.greater_than_or_equal_to(d)),
                _ => None,
            }
        }
    }
}

fn column_name(expr: &Arc<dyn PhysicalExpr>) -> Option<&str> {
    expr.as_any().downcast_ref::<Column>().map(Column::name)
}

fn literal(expr: &Arc<dyn PhysicalExpr>) -> Option<&ScalarValue> {
    expr.as_any().downcast_ref::<Literal>().map(Literal::value)
}

/// The Iceberg literal of a value (`None` for a null, which no comparison passes, or a type
/// without one here).
fn datum(value: &ScalarValue) -> Option<Datum> {
    Some(match value {
        ScalarValue::Boolean(Some(v)) => Datum::bool(*v),
        ScalarValue::Int8(Some(v)) => Datum::int(*v),
        ScalarValue::Int16(Some(v)) => Datum::int(*v),
        ScalarValue::Int32(Some(v)) => Datum::int(*v),
        ScalarValue::Int64(Some(v)) => Datum::long(*v),
        ScalarValue::Float32(Some(v)) => Datum::float(*v),
        ScalarValue::Float64(Some(v)) => Datum::double(*v),
        ScalarValue::Utf8(Some(v))
        | ScalarValue::LargeUtf8(Some(v))
        | ScalarValue::Utf8View(Some(v)) => Datum::string(v),
        ScalarValue::Date32(Some(v)) => Datum::date(*v),
        ScalarValue::TimestampMicrosecond(Some(v), None) => Datum::timestamp_micros(*v),
        ScalarValue::TimestampMicrosecond(Some(v), Some(_)) => Datum::timestamptz_micros(*v),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::{DynamicFilterPhysicalExpr, col, lit};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ])
    }

    fn expr(
        l: Arc<dyn PhysicalExpr>,
        op: Operator,
        r: Arc<dyn PhysicalExpr>,
    ) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(l, op, r))
    }

    fn shown(filters: &[Arc<dyn PhysicalExpr>]) -> Option<String> {
        predicate(filters).map(|p| p.to_string())
    }

    #[test]
    fn bounds_are_kept_and_what_cannot_be_said_is_dropped() {
        let s = schema();
        let id = col("id", &s).unwrap();
        let bounds = expr(
            expr(id.clone(), Operator::GtEq, lit(3i64)),
            Operator::And,
            expr(lit(9i64), Operator::GtEq, id.clone()),
        );
        // `id + 1 = 5` says something of rows, nothing a manifest can check.
        let opaque = expr(
            expr(id.clone(), Operator::Plus, lit(1i64)),
            Operator::Eq,
            lit(5i64),
        );
        assert_eq!(
            shown(&[expr(bounds, Operator::And, opaque.clone())]).as_deref(),
            Some("(id >= 3) AND (id <= 9)")
        );
        assert_eq!(shown(std::slice::from_ref(&opaque)), None);
        // An OR with a side that says nothing says nothing.
        let either = expr(
            expr(id.clone(), Operator::Eq, lit(1i64)),
            Operator::Or,
            opaque,
        );
        assert_eq!(shown(&[either]), None);
        // A null or a type without an Iceberg literal says nothing either.
        assert_eq!(
            shown(&[expr(id, Operator::Lt, lit(ScalarValue::Int64(None)))]),
            None
        );
    }

    #[test]
    fn key_lists_and_partitioned_joins_become_sets_and_alternatives() {
        let s = schema();
        let name = col("name", &s).unwrap();
        let id = col("id", &s).unwrap();
        let list = Arc::new(
            InListExpr::try_new(name.clone(), vec![lit("a"), lit("b")], false, &s).unwrap(),
        );
        let range = expr(
            expr(id.clone(), Operator::GtEq, lit(1i64)),
            Operator::And,
            expr(id.clone(), Operator::LtEq, lit(2i64)),
        );
        // A partitioned join's filter: CASE hash % 2 WHEN 0 THEN .. WHEN 1 THEN .. ELSE false.
        let case = |otherwise: bool| -> Arc<dyn PhysicalExpr> {
            Arc::new(
                CaseExpr::try_new(
                    Some(expr(id.clone(), Operator::Modulo, lit(2i64))),
                    vec![(lit(0i64), list.clone() as _), (lit(1i64), range.clone())],
                    Some(lit(otherwise)),
                )
                .unwrap(),
            )
        };
        assert_eq!(
            shown(&[case(false)]).as_deref(),
            Some("(name IN (\"a\", \"b\")) OR ((id >= 1) AND (id <= 2))")
        );
        assert_eq!(shown(&[case(true)]), None);
        // Every build partition empty: nothing can match.
        assert_eq!(shown(&[lit(false)]).as_deref(), Some("FALSE"));
        let negated = Arc::new(InListExpr::try_new(name, vec![lit("a")], true, &s).unwrap());
        assert_eq!(shown(&[negated]), None);
    }

    #[test]
    fn a_dynamic_filter_is_read_as_it_stands() {
        let s = schema();
        let id = col("id", &s).unwrap();
        let filter = Arc::new(DynamicFilterPhysicalExpr::new(vec![id.clone()], lit(true)));
        let filters: Vec<Arc<dyn PhysicalExpr>> = vec![filter.clone()];
        assert_eq!(shown(&filters), None, "not set yet");
        filter.update(expr(id, Operator::Eq, lit(7i64))).unwrap();
        assert_eq!(shown(&filters).as_deref(), Some("id = 7"));
    }

    #[test]
    fn a_top_n_threshold_keeps_its_nulls() {
        let s = Schema::new(vec![Field::new("v", DataType::Int64, true)]);
        let v = col("v", &s).unwrap();
        // `ORDER BY v DESC LIMIT n` (nulls first): its filter once n rows are in.
        let nulls_or_above = expr(
            Arc::new(IsNullExpr::new(v.clone())),
            Operator::Or,
            expr(v.clone(), Operator::Gt, lit(97i64)),
        );
        assert_eq!(
            shown(&[nulls_or_above]).as_deref(),
            Some("(v IS NULL) OR (v > 97)")
        );
        // `ORDER BY v LIMIT n` with fewer than n non-null values: any non-null one.
        assert_eq!(
            shown(&[Arc::new(IsNotNullExpr::new(v))]).as_deref(),
            Some("v IS NOT NULL")
        );
    }
}
