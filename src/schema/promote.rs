//! Iceberg's type promotion: the one rule for which column types may become which, used
//! when a batch widens a table ([`mod@super::evolve`]) and when two writers' schemas merge
//! ([`super::merge`]).
//!
//! ```text
//! int -> long    float -> double    decimal(P, S) -> decimal(P', S) for P' >= P
//! ```
//!
//! Promotion is a partial order (each type promotes to itself); [`widest`] is the least
//! upper bound of two types, when they have one.

use iceberg::spec::PrimitiveType;

/// Whether a column of type `from` may become `to` with no data rewritten.
pub fn promotes(from: &PrimitiveType, to: &PrimitiveType) -> bool {
    use PrimitiveType as P;
    match (from, to) {
        (a, b) if a == b => true,
        (P::Int, P::Long) | (P::Float, P::Double) => true,
        (
            P::Decimal {
                precision: p,
                scale: s,
            },
            P::Decimal {
                precision: q,
                scale: t,
            },
        ) => s == t && q >= p,
        _ => false,
    }
}

/// The narrowest type that both `a` and `b` promote to, if there is one: what a column must
/// be to hold the values of both.
pub fn widest(a: &PrimitiveType, b: &PrimitiveType) -> Option<PrimitiveType> {
    if promotes(a, b) {
        Some(b.clone())
    } else if promotes(b, a) {
        Some(a.clone())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PrimitiveType as P;
    use proptest::prelude::*;

    fn primitive() -> impl Strategy<Value = PrimitiveType> {
        prop_oneof![
            Just(P::Int),
            Just(P::Long),
            Just(P::Float),
            Just(P::Double),
            Just(P::String),
            Just(P::Boolean),
            Just(P::Date),
            (1u32..=38, 0u32..=3).prop_map(|(precision, scale)| P::Decimal {
                precision: precision.max(scale),
                scale,
            }),
        ]
    }

    #[test]
    fn the_promotions_iceberg_allows() {
        assert!(promotes(&P::Int, &P::Long));
        assert!(promotes(&P::Float, &P::Double));
        let d = |precision, scale| P::Decimal { precision, scale };
        assert!(promotes(&d(9, 2), &d(18, 2)));
        assert!(!promotes(&d(18, 2), &d(9, 2)), "precision never shrinks");
        assert!(!promotes(&d(9, 2), &d(18, 3)), "the scale never changes");
        assert!(!promotes(&P::Long, &P::Int));
        assert!(
            !promotes(&P::Long, &P::Double),
            "long to double loses digits"
        );
        assert!(!promotes(&P::Int, &P::String));
        assert_eq!(widest(&P::Long, &P::Int), Some(P::Long));
        assert_eq!(widest(&P::String, &P::Int), None);
    }

    proptest! {
        #[test]
        fn promotion_is_a_partial_order(a in primitive(), b in primitive(), c in primitive()) {
            prop_assert!(promotes(&a, &a));
            if promotes(&a, &b) && promotes(&b, &a) {
                prop_assert_eq!(&a, &b);
            }
            if promotes(&a, &b) && promotes(&b, &c) {
                prop_assert!(promotes(&a, &c));
            }
        }

        #[test]
        fn widest_is_the_least_upper_bound(a in primitive(), b in primitive(), c in primitive()) {
            let w = widest(&a, &b);
            prop_assert_eq!(&w, &widest(&b, &a));
            if let Some(w) = &w {
                prop_assert!(promotes(&a, w) && promotes(&b, w));
                if promotes(&a, &c) && promotes(&b, &c) {
                    prop_assert!(promotes(w, &c));
                }
            }
        }
    }
}
