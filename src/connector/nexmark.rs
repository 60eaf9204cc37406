//! The Nexmark benchmark's streams for `datagen`: `'profile' = 'nexmark.person'`,
//! `'nexmark.auction'` or `'nexmark.bid'`, with the columns RisingWave's Nexmark queries use.
//!
//! ```text
//! one event sequence n = 0, 1, 2, ...; per 50 events: 1 person, 3 auctions, 46 bids
//! (the benchmark's proportions). Each profile reads its own events of that sequence:
//!   person  row r = event 50 r                     id = 1000 + r
//!   auction row r = event 50 (r / 3) + 1 + r % 3   id = 1000 + r, seller: a person before it
//!   bid     row r = event 50 (r / 46) + 4 + r % 46 auction: one of the 100 latest auctions,
//!                                                  bidder: one of the 1,000 latest persons
//! date_time = 2024-01-01 + n / 'nexmark.events-per-second' (default 10,000)
//! ```
//!
//! Every value is a pure function of the seed and the event number, so the three sources
//! declared with the same seed describe one consistent world (a bid's auction and bidder exist
//! and came before it), and re-reading from an offset gives the same rows.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::error::{Error, Result};

/// The first person and auction ids, and the first category, as the benchmark has them.
const FIRST_PERSON: i64 = 1000;
const FIRST_AUCTION: i64 = 1000;
const FIRST_CATEGORY: i64 = 10;
/// Events per round: 1 person, 3 auctions, 46 bids.
const ROUND: u64 = 50;
const AUCTIONS: u64 = 3;
const BIDS: u64 = 46;
/// 2024-01-01T00:00:00Z in microseconds.
const BASE_MICROS: i64 = 1_704_067_200_000_000;

const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const WORDS: [&str; 8] = [
    "vintage", "camera", "guitar", "lamp", "chair", "watch", "bicycle", "poster",
];

/// Which of the three streams a source reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Person,
    Auction,
    Bid,
}

impl Stream {
    /// The stream a `'profile'` names, if it names one.
    pub fn of_profile(profile: &str) -> Option<Self> {
        match profile {
            "nexmark.person" => Some(Self::Person),
            "nexmark.auction" => Some(Self::Auction),
            "nexmark.bid" => Some(Self::Bid),
            _ => None,
        }
    }

    /// The stream's columns.
    pub fn schema(self) -> SchemaRef {
        let ts = || DataType::Timestamp(TimeUnit::Microsecond, None);
        let int = |n: &str| Field::new(n, DataType::Int64, false);
        let text = |n: &str| Field::new(n, DataType::Utf8, false);
        let time = |n: &str| Field::new(n, ts(), false);
        Arc::new(Schema::new(match self {
            Self::Person => vec![
                int("id"),
                text("name"),
                text("email_address"),
                text("credit_card"),
                text("city"),
                text("state"),
                time("date_time"),
                text("extra"),
            ],
            Self::Auction => vec![
                int("id"),
                text("item_name"),
                text("description"),
                int("initial_bid"),
                int("reserve"),
                time("date_time"),
                time("expires"),
                int("seller"),
                int("category"),
                text("extra"),
            ],
            Self::Bid => vec![
                int("auction"),
                int("bidder"),
                int("price"),
                text("channel"),
                text("url"),
                time("date_time"),
                text("extra"),
            ],
        }))
    }

    /// The event number of the stream's row `r`.
    fn event(self, r: u64) -> u64 {
        match self {
            Self::Person => r * ROUND,
            Self::Auction => (r / AUCTIONS) * ROUND + 1 + r % AUCTIONS,
            Self::Bid => (r / BIDS) * ROUND + 1 + AUCTIONS + r % BIDS,
        }
    }
}

/// `'nexmark.events-per-second'`: event time per event, in microseconds.
pub fn event_interval(events_per_second: Option<String>) -> Result<i64> {
    let Some(v) = events_per_second else {
        return Ok(100);
    };
    match v.parse::<u64>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(1_000_000 / n as i64),
        _ => Err(Error::Option(format!(
            "'nexmark.events-per-second' must be a whole number from 1 to 1000000, got '{v}'"
        ))),
    }
}

/// Column `name` of `stream`'s rows `rows`; `mix(event, salt)` is the generator's randomness.
pub fn column(
    stream: Stream,
    name: &str,
    rows: std::ops::Range<u64>,
    interval: i64,
    mix: impl Fn(u64, u64) -> u64,
) -> ArrayRef {
    let events = || rows.clone().map(move |r| stream.event(r));
    let pick = |list: &'static [&'static str], n: u64, salt: u64| {
        list[(mix(n, salt) % list.len() as u64) as usize]
    };
    let ints = |f: &dyn Fn(u64, u64) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(
            rows.clone().map(|r| f(r, stream.event(r))),
        ))
    };
    let texts = |f: &dyn Fn(u64) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(events().map(f)))
    };
    let time_of = |n: u64| BASE_MICROS + n as i64 * interval;
    // The latest person and auction before event n, and a recent one of them.
    let last_person = |n: u64| FIRST_PERSON + (n / ROUND) as i64;
    let last_auction = |n: u64| {
        let done = (n / ROUND) * AUCTIONS + (n % ROUND).saturating_sub(1).min(AUCTIONS);
        FIRST_AUCTION + done as i64 - 1
    };
    let recent = |last: i64, first: i64, within: i64, n: u64, salt: u64| {
        let count = (last - first + 1).clamp(1, within);
        last - (mix(n, salt) % count as u64) as i64
    };
    match (stream, name) {
        (Stream::Person, "id") | (Stream::Auction, "id") => {
            let first = if stream == Stream::Person {
                FIRST_PERSON
            } else {
                FIRST_AUCTION
            };
            ints(&|r, _| first + r as i64)
        }
        (_, "date_time") => Arc::new(TimestampMicrosecondArray::from_iter_values(
            events().map(time_of),
        )),
        (_, "extra") => texts(&|n| format!("{:x}", mix(n, 9) % 0xFFFF_FFFF)),
        (Stream::Person, "name") => {
            texts(&|n| format!("{} {}", pick(&FIRST_NAMES, n, 1), pick(&LAST_NAMES, n, 2)))
        }
        (Stream::Person, "email_address") => texts(&|n| {
            format!(
                "{}@{}.com",
                pick(&LAST_NAMES, n, 2).to_lowercase(),
                mix(n, 3) % 1000
            )
        }),
        (Stream::Person, "credit_card") => texts(&|n| {
            let d = mix(n, 4);
            format!(
                "{:04} {:04} {:04} {:04}",
                d % 10_000,
                (d >> 16) % 10_000,
                (d >> 32) % 10_000,
                (d >> 48) % 10_000
            )
        }),
        (Stream::Person, "city") => texts(&|n| pick(&CITIES, n, 5).to_string()),
        (Stream::Person, "state") => texts(&|n| pick(&STATES, n, 6).to_string()),
        (Stream::Auction, "item_name") => {
            texts(&|n| format!("{} {}", pick(&WORDS, n, 1), pick(&WORDS, n, 2)))
        }
        (Stream::Auction, "description") => {
            texts(&|n| format!("a {} in good condition", pick(&WORDS, n, 3)))
        }
        (Stream::Auction, "initial_bid") => ints(&|_, n| initial_bid(&mix, n)),
        (Stream::Auction, "reserve") => {
            ints(&|_, n| initial_bid(&mix, n) + (mix(n, 5) % 100_000) as i64)
        }
        (Stream::Auction, "expires") => Arc::new(TimestampMicrosecondArray::from_iter_values(
            // Open for up to ten minutes of event time.
            events().map(|n| time_of(n) + (1 + mix(n, 6) % 600) as i64 * 1_000_000),
        )),
        (Stream::Auction, "seller") => {
            ints(&|_, n| recent(last_person(n), FIRST_PERSON, 1000, n, 7))
        }
        (Stream::Auction, "category") => ints(&|_, n| FIRST_CATEGORY + (mix(n, 8) % 5) as i64),
        (Stream::Bid, "auction") => ints(&|_, n| recent(last_auction(n), FIRST_AUCTION, 100, n, 1)),
        (Stream::Bid, "bidder") => ints(&|_, n| recent(last_person(n), FIRST_PERSON, 1000, n, 2)),
        (Stream::Bid, "price") => ints(&|_, n| price(&mix, n, 3)),
        (Stream::Bid, "channel") => texts(&|n| pick(&CHANNELS, n, 4).to_string()),
        (Stream::Bid, "url") => texts(&|n| {
            let base = format!(
                "https://www.nexmark.com/{}/{}/item.htm?query=1",
                pick(&WORDS, n, 5),
                pick(&WORDS, n, 6)
            );
            match mix(n, 7) % 10 {
                0..=5 => format!("{base}&channel_id={}", mix(n, 8) % 1000),
                _ => base,
            }
        }),
        _ => Arc::new(StringArray::from_iter_values(events().map(|_| ""))),
    }
}

/// A price in cents, spread over six orders of magnitude as the benchmark's.
fn price(mix: &impl Fn(u64, u64) -> u64, n: u64, salt: u64) -> i64 {
    let unit = (mix(n, salt) % 1_000_000) as f64 / 1_000_000.0;
    (10f64.powf(unit * 6.0) * 100.0).round() as i64
}

fn initial_bid(mix: &impl Fn(u64, u64) -> u64, n: u64) -> i64 {
    price(mix, n, 4)
}
