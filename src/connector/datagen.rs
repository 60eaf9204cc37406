//! `datagen`: a deterministic generator for demos, tests and benchmarks.
//!
//! ```text
//! 'connector' = 'datagen'
//! 'profile'         = 'orders'   rows of an order stream (when no columns are declared)
//!                   = 'events'   web events of several types whose fields drift: from row
//!                                'events.drift-at' on (default: half the rows, or 100,000),
//!                                page views carry user_agent and scroll_depth, and a new
//!                                event type, interaction, appears
//!                 = 'nexmark.person' | 'nexmark.auction' | 'nexmark.bid'
//!                                the Nexmark benchmark's streams (see `nexmark`), with
//!                                'nexmark.events-per-second' of event time (default 10000)
//! 'number-of-rows'  = N          stop after N rows (default: never)
//! 'rows-per-second' = R          at most R rows a second (default: as fast as possible)
//! 'seed'            = S          a different seed gives different values (default 0)
//! 'time.disorder'   = '10s'      event times (order_time, event_time) come up to this much
//!                                out of order: each is its place in the stream less a
//!                                pseudo-random part of it (default: in order)
//! ```
//!
//! With declared columns, every column gets pseudo-random values of its type. Row `i` is a
//! pure function of the seed and `i`, so re-reading from an offset gives the same rows:
//! replays after recovery are exact.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Float32Array, Float64Array, Int32Array, Int64Array,
    RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::nexmark::Stream;
use super::{Offsets, Poll, SourceReader};
use crate::error::{Error, Result};
use crate::sql::Options;

/// Parsed `datagen` options.
#[derive(Debug, Clone)]
pub struct DatagenOptions {
    pub profile: Profile,
    /// For `events`: the first row of the second version of the payloads.
    pub drift_at: u64,
    pub number_of_rows: Option<u64>,
    pub rows_per_second: Option<f64>,
    pub seed: u64,
    /// How far out of order event times come, in microseconds.
    pub disorder: u64,
    /// For the Nexmark streams: event time between two events, in microseconds.
    pub nexmark_interval: i64,
}

/// What the generated rows look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// An order stream with a fixed schema.
    Orders,
    /// Web events whose fields drift part-way through.
    Events,
    /// Random values for the declared columns.
    Declared,
    /// One of the Nexmark benchmark's streams.
    Nexmark(Stream),
}

const PRODUCTS: [&str; 8] = [
    "keyboard", "mouse", "monitor", "laptop", "headset", "webcam", "dock", "cable",
];
const REGIONS: [&str; 4] = ["eu", "us", "ap", "sa"];
const STATUSES: [&str; 3] = ["new", "paid", "shipped"];
/// 2024-01-01T00:00:00Z in microseconds.
const BASE_MICROS: i64 = 1_704_067_200_000_000;

fn orders_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, false),
        Field::new("customer_id", DataType::Int64, false),
        Field::new("product", DataType::Utf8, false),
        Field::new("quantity", DataType::Int32, false),
        Field::new("price", DataType::Float64, false),
        Field::new("region", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new(
            "order_time",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]))
}

impl DatagenOptions {
    /// Read the options; returns the source schema with them.
    pub fn try_new(
        declared: Option<SchemaRef>,
        options: &mut Options,
    ) -> Result<(SchemaRef, Self)> {
        let profile = match (options.take_str("profile").as_deref(), &declared) {
            (Some("orders") | None, None) => Profile::Orders,
            (Some("events"), None) => Profile::Events,
            (None, Some(_)) => Profile::Declared,
            (Some(p), None) if Stream::of_profile(p).is_some() => {
                Profile::Nexmark(Stream::of_profile(p).expect("matched"))
            }
            (Some(p), Some(_))
                if matches!(p, "orders" | "events") || Stream::of_profile(p).is_some() =>
            {
                return Err(Error::Option(format!(
                    "'profile' = '{p}' has its own columns: declare no columns"
                )));
            }
            (Some(other), _) => {
                return Err(Error::Option(format!(
                    "datagen profile '{other}' is not known; use 'orders', 'events', \
                     'nexmark.person', 'nexmark.auction' or 'nexmark.bid', or declare columns \
                     for random values"
                )));
            }
        };
        let number_of_rows = options
            .take_str("number-of-rows")
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    Error::Option(format!(
                        "'number-of-rows' must be a whole number, got '{v}'"
                    ))
                })
            })
            .transpose()?;
        let rows_per_second = options
            .take_str("rows-per-second")
            .map(|v| match v.parse::<f64>() {
                Ok(r) if r > 0.0 => Ok(r),
                _ => Err(Error::Option(format!(
                    "'rows-per-second' must be a positive number, got '{v}'"
                ))),
            })
            .transpose()?;
        let seed = options
            .take_str("seed")
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| Error::Option(format!("'seed' must be a whole number, got '{v}'")))
            })
            .transpose()?
            .unwrap_or(0);
        let drift_at = options
            .take_str("events.drift-at")
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    Error::Option(format!(
                        "'events.drift-at' must be a whole number, got '{v}'"
                    ))
                })
            })
            .transpose()?
            .unwrap_or(number_of_rows.map_or(100_000, |n| n / 2));
        let disorder = options
            .take_str("time.disorder")
            .map(|v| {
                crate::sql::options::parse_duration(&v)
                    .map(|d| d.as_micros() as u64)
                    .map_err(|e| Error::Option(format!("'time.disorder': {e}")))
            })
            .transpose()?
            .unwrap_or(0);
        let nexmark_interval =
            super::nexmark::event_interval(options.take_str("nexmark.events-per-second"))?;
        let schema = match profile {
            Profile::Nexmark(stream) => stream.schema(),
            Profile::Orders => orders_schema(),
            Profile::Events => events_schema(),
            Profile::Declared => {
                let schema = declared.unwrap_or_else(orders_schema);
                for f in schema.fields() {
                    if !supported(f.data_type()) {
                        return Err(Error::Unsupported(format!(
                            "datagen cannot generate column '{}' of type {}",
                            f.name(),
                            f.data_type()
                        )));
                    }
                }
                schema
            }
        };
        Ok((
            schema,
            Self {
                profile,
                drift_at,
                number_of_rows,
                rows_per_second,
                seed,
                disorder,
                nexmark_interval,
            },
        ))
    }
}

fn events_schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
    Arc::new(Schema::new(vec![
        Field::new("event_id", DataType::Int64, false),
        Field::new("event_type", DataType::Utf8, false),
        Field::new("event_time", ts, false),
        Field::new("user_id", DataType::Int64, false),
        Field::new("region", DataType::Utf8, false),
        Field::new("order_id", DataType::Int64, true),
        Field::new("amount", DataType::Float64, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("duration_ms", DataType::Int64, true),
        Field::new("user_agent", DataType::Utf8, true),
        Field::new("scroll_depth", DataType::Float64, true),
        Field::new("element", DataType::Utf8, true),
    ]))
}

const URLS: [&str; 5] = ["/", "/search", "/product/42", "/cart", "/checkout"];
const AGENTS: [&str; 3] = ["firefox/128", "chrome/131", "safari/18"];
const ELEMENTS: [&str; 3] = ["buy-button", "carousel", "newsletter"];

/// The type of event `row`: orders and page views from the start, interactions only after
/// the drift.
fn event_type(seed: u64, row: u64, drift_at: u64) -> &'static str {
    let kinds: &[&'static str] = if row >= drift_at {
        &["order", "page-view", "page-view", "interaction"]
    } else {
        &["order", "page-view", "page-view"]
    };
    kinds[(mix(seed, row, 99) % kinds.len() as u64) as usize]
}

fn supported(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Boolean
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Utf8
            | DataType::Date32
            | DataType::Timestamp(TimeUnit::Microsecond, _)
    )
}

/// A 64-bit mix of the seed, the row and the column (splitmix64).
fn mix(seed: u64, row: u64, column: u64) -> u64 {
    let mut z = seed
        .wrapping_add(row.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(column.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Generates rows `next..` for one source.
pub struct DatagenReader {
    schema: SchemaRef,
    options: DatagenOptions,
    next: u64,
    started: Option<(Instant, u64)>,
}

impl DatagenReader {
    pub fn new(schema: SchemaRef, options: DatagenOptions) -> Self {
        Self {
            schema,
            options,
            next: 0,
            started: None,
        }
    }

    /// How much earlier than its place in the stream row `r`'s event time is ('time.disorder').
    fn jitter(&self, r: u64, c: u64) -> i64 {
        match self.options.disorder {
            0 => 0,
            d => (mix(self.options.seed, r, c) % (d + 1)) as i64,
        }
    }

    fn column(&self, index: usize, rows: std::ops::Range<u64>) -> ArrayRef {
        let seed = self.options.seed;
        let c = index as u64;
        let field = self.schema.field(index);
        if let Profile::Nexmark(stream) = self.options.profile {
            let interval = self.options.nexmark_interval;
            return super::nexmark::column(stream, field.name(), rows, interval, |n, salt| {
                mix(seed, n, 100 + salt)
            });
        }
        if self.options.profile == Profile::Events {
            return self.event_column(field.name(), c, rows);
        }
        if self.options.profile == Profile::Orders {
            return match field.name().as_str() {
                "order_id" => Arc::new(Int64Array::from_iter_values(rows.map(|r| r as i64 + 1))),
                "customer_id" => Arc::new(Int64Array::from_iter_values(
                    rows.map(|r| (mix(seed, r, c) % 10_000) as i64 + 1),
                )),
                "product" => {
                    Arc::new(StringArray::from_iter_values(rows.map(|r| {
                        PRODUCTS[(mix(seed, r, c) % PRODUCTS.len() as u64) as usize]
                    })))
                }
                "quantity" => Arc::new(Int32Array::from_iter_values(
                    rows.map(|r| (mix(seed, r, c) % 5) as i32 + 1),
                )),
                "price" => Arc::new(Float64Array::from_iter_values(
                    rows.map(|r| (mix(seed, r, c) % 100_000) as f64 / 100.0),
                )),
                "region" => {
                    Arc::new(StringArray::from_iter_values(rows.map(|r| {
                        REGIONS[(mix(seed, r, c) % REGIONS.len() as u64) as usize]
                    })))
                }
                "status" => {
                    Arc::new(StringArray::from_iter_values(rows.map(|r| {
                        STATUSES[(mix(seed, r, c) % STATUSES.len() as u64) as usize]
                    })))
                }
                _ => Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.map(|r| BASE_MICROS + r as i64 * 100_000 - self.jitter(r, c)),
                )),
            };
        }
        match field.data_type() {
            DataType::Boolean => Arc::new(BooleanArray::from_iter(
                rows.map(|r| Some(mix(seed, r, c) & 1 == 1)),
            )),
            DataType::Int32 => Arc::new(Int32Array::from_iter_values(
                rows.map(|r| (mix(seed, r, c) % 1_000_000) as i32),
            )),
            DataType::Int64 => Arc::new(Int64Array::from_iter_values(
                rows.map(|r| (mix(seed, r, c) >> 1) as i64),
            )),
            DataType::Float32 => Arc::new(Float32Array::from_iter_values(
                rows.map(|r| (mix(seed, r, c) % 1_000_000) as f32 / 100.0),
            )),
            DataType::Float64 => Arc::new(Float64Array::from_iter_values(
                rows.map(|r| (mix(seed, r, c) % 100_000_000) as f64 / 100.0),
            )),
            DataType::Date32 => Arc::new(Date32Array::from_iter_values(
                rows.map(|r| 19_723 + (mix(seed, r, c) % 365) as i32),
            )),
            DataType::Timestamp(TimeUnit::Microsecond, tz) => Arc::new(
                TimestampMicrosecondArray::from_iter_values(
                    rows.map(|r| BASE_MICROS + (mix(seed, r, c) % 31_536_000_000_000) as i64),
                )
                .with_timezone_opt(tz.clone()),
            ),
            _ => Arc::new(StringArray::from_iter_values(
                rows.map(|r| format!("{:x}", mix(seed, r, c) % 0xFF_FFFF)),
            )),
        }
    }

    fn event_column(&self, name: &str, c: u64, rows: std::ops::Range<u64>) -> ArrayRef {
        let seed = self.options.seed;
        let drift = self.options.drift_at;
        let kind = |r: u64| event_type(seed, r, drift);
        let pick =
            |r: u64, list: &[&'static str]| list[(mix(seed, r, c) % list.len() as u64) as usize];
        match name {
            "event_id" => Arc::new(Int64Array::from_iter_values(rows.map(|r| r as i64 + 1))),
            "event_type" => Arc::new(StringArray::from_iter_values(rows.map(kind))),
            "event_time" => Arc::new(TimestampMicrosecondArray::from_iter_values(
                rows.map(|r| BASE_MICROS + r as i64 * 10_000 - self.jitter(r, c)),
            )),
            "user_id" => Arc::new(Int64Array::from_iter_values(
                rows.map(|r| (mix(seed, r, c) % 5_000) as i64 + 1),
            )),
            "region" => Arc::new(StringArray::from_iter_values(
                rows.map(|r| pick(r, &REGIONS)),
            )),
            "order_id" => {
                Arc::new(Int64Array::from_iter(rows.map(|r| {
                    (kind(r) == "order").then(|| (mix(seed, r, c) >> 20) as i64)
                })))
            }
            "amount" => Arc::new(Float64Array::from_iter(rows.map(|r| {
                (kind(r) == "order").then(|| (mix(seed, r, c) % 50_000) as f64 / 100.0)
            }))),
            "url" => Arc::new(StringArray::from_iter(
                rows.map(|r| (kind(r) == "page-view").then(|| pick(r, &URLS))),
            )),
            "duration_ms" => {
                Arc::new(Int64Array::from_iter(rows.map(|r| {
                    (kind(r) == "page-view").then(|| (mix(seed, r, c) % 30_000) as i64)
                })))
            }
            "user_agent" => {
                Arc::new(StringArray::from_iter(rows.map(|r| {
                    (r >= drift && kind(r) != "order").then(|| pick(r, &AGENTS))
                })))
            }
            "scroll_depth" => Arc::new(Float64Array::from_iter(rows.map(|r| {
                (r >= drift && kind(r) == "page-view")
                    .then(|| (mix(seed, r, c) % 101) as f64 / 100.0)
            }))),
            _ => Arc::new(StringArray::from_iter(
                rows.map(|r| (kind(r) == "interaction").then(|| pick(r, &ELEMENTS))),
            )),
        }
    }

    /// Rows allowed now by `rows-per-second`, waiting up to 100 ms for the first.
    async fn allowance(&mut self, want: u64) -> u64 {
        let Some(rate) = self.options.rows_per_second else {
            return want;
        };
        let (start, first) = *self.started.get_or_insert((Instant::now(), self.next));
        loop {
            let due = (start.elapsed().as_secs_f64() * rate) as u64 + 1;
            let done = self.next - first;
            if due > done {
                return want.min(due - done);
            }
            let wait = Duration::from_secs_f64(((done + 1 - due) as f64 / rate).min(0.1));
            tokio::time::sleep(wait).await;
        }
    }
}

#[async_trait]
impl SourceReader for DatagenReader {
    async fn poll(&mut self, max_rows: usize) -> Result<Poll> {
        let left = match self.options.number_of_rows {
            Some(n) if self.next >= n => return Ok(Poll::Finished),
            Some(n) => n - self.next,
            None => u64::MAX,
        };
        let n = self.allowance((max_rows as u64).min(left)).await;
        if n == 0 {
            return Ok(Poll::Idle);
        }
        let rows = self.next..self.next + n;
        let columns = (0..self.schema.fields().len())
            .map(|i| self.column(i, rows.clone()))
            .collect();
        let batch = RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| Error::Internal(format!("datagen batch: {e}")))?;
        self.next += n;
        Ok(Poll::batch(batch))
    }

    fn offsets(&self) -> Offsets {
        Offsets::from([("0".to_string(), self.next.to_string())])
    }

    fn seek(&mut self, offsets: &Offsets) -> Result<()> {
        self.next = match offsets.get("0") {
            Some(v) => v.parse().map_err(|_| {
                Error::Internal(format!("datagen offset '{v}' is not a row number"))
            })?,
            None => 0,
        };
        self.started = None;
        Ok(())
    }

    fn is_bounded(&self) -> bool {
        self.options.number_of_rows.is_some()
    }

    fn lag(&self) -> Option<u64> {
        self.options
            .number_of_rows
            .map(|n| n.saturating_sub(self.next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(pairs: &[(&str, &str)]) -> DatagenReader {
        let mut o = Options::try_new(
            "t",
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        let (schema, opts) = DatagenOptions::try_new(None, &mut o).unwrap();
        o.finish().unwrap();
        DatagenReader::new(schema, opts)
    }

    #[tokio::test]
    async fn replays_from_an_offset_are_identical() {
        let mut a = reader(&[("number-of-rows", "100"), ("seed", "7")]);
        let Poll::Records { batches: first, .. } = a.poll(60).await.unwrap() else {
            panic!()
        };
        let first = crate::connector::concat(&first);
        let Poll::Records { batches: rest, .. } = a.poll(60).await.unwrap() else {
            panic!()
        };
        let rest = crate::connector::concat(&rest);
        assert_eq!(first.num_rows() + rest.num_rows(), 100);
        assert!(matches!(a.poll(60).await.unwrap(), Poll::Finished));

        let mut b = reader(&[("number-of-rows", "100"), ("seed", "7")]);
        b.seek(&Offsets::from([("0".to_string(), "60".to_string())]))
            .unwrap();
        let Poll::Records { batches: again, .. } = b.poll(60).await.unwrap() else {
            panic!()
        };
        let again = crate::connector::concat(&again);
        assert_eq!(again, rest);
    }

    #[tokio::test]
    async fn events_drift_part_way_through() {
        let mut r = reader(&[
            ("profile", "events"),
            ("number-of-rows", "2000"),
            ("events.drift-at", "1000"),
        ]);
        let Poll::Records { batches: early, .. } = r.poll(1000).await.unwrap() else {
            panic!()
        };
        let early = crate::connector::concat(&early);
        let Poll::Records { batches: late, .. } = r.poll(1000).await.unwrap() else {
            panic!()
        };
        let late = crate::connector::concat(&late);
        let col = |b: &RecordBatch, n: &str| b.column_by_name(n).unwrap().clone();
        assert_eq!(
            col(&early, "user_agent").null_count(),
            1000,
            "no v2 fields before"
        );
        assert_eq!(
            col(&early, "element").null_count(),
            1000,
            "no interactions before"
        );
        assert!(col(&late, "user_agent").null_count() < 1000);
        assert!(
            col(&late, "element").null_count() < 1000,
            "interactions appear"
        );
    }

    #[tokio::test]
    async fn the_rate_limit_holds() {
        let mut r = reader(&[("rows-per-second", "200")]);
        let start = Instant::now();
        let mut n = 0;
        while n < 100 {
            if let Poll::Records { batches: b, .. } = r.poll(1000).await.unwrap() {
                let b = crate::connector::concat(&b);
                n += b.num_rows();
            }
        }
        // 100 rows at 200/s take about half a second; never much less.
        assert!(
            start.elapsed() >= Duration::from_millis(400),
            "{:?}",
            start.elapsed()
        );
    }
}
