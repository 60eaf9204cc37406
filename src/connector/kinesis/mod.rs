//! `kinesis`: records of an Amazon Kinesis data stream (or a server that speaks its API).
//!
//! ```text
//! 'connector' = 'kinesis'
//! 'stream'    = 'clicks'
//! 'format'    = 'json' | 'csv' | 'raw'            (and the format's own options)
//! 'aws.region'   = 'us-east-1'                    (default: the AWS environment's)
//! 'aws.endpoint' = 'http://127.0.0.1:4567'        (default: the region's AWS endpoint)
//! 'aws.access-key-id' / 'aws.secret-access-key' / 'aws.session-token'
//!                                                 (default: the usual AWS credential chain)
//! 'scan.startup.mode' = 'trim-horizon'            oldest records kept (default)
//!                     | 'latest'                  records arriving after the job first starts
//!                     | 'at-timestamp'            records arriving at or after
//!                                                 'scan.startup.timestamp' (ISO or epoch ms)
//! 'scan.bounded.mode' = 'unbounded'               follow the stream (default)
//!                     | 'latest'                  stop at the records that had arrived when
//!                                                 the job first started
//! 'scan.shard-discovery.interval' = '10s'         how often new shards are looked for
//! 'scan.failure-timeout' = '60s'                  how long the server may keep failing
//!                                                 before the job fails
//! ```
//!
//! Columns are declared. Declare `_shard STRING`, `_sequence STRING`, `_partition_key
//! STRING` and `_arrival_time TIMESTAMP` to get each record's shard, sequence number,
//! partition key and approximate arrival time.
//!
//! Guarantees: each shard's records are read in order, and a shard made by a split or
//! merge is read only after its parents were read to their end, so the records of one
//! partition key keep their order across resharding. The offsets hold every shard's
//! last sequence number read (see [`shards`]); a job resumes after them, so no record is
//! lost or read twice.
//!
//! `latest` reads each shard from its tip. Until a record of the shard is read, its offset
//! is the time the job first started, so a job restarted before then reads the shard from
//! that time, not from a later tip (it may then also read records that arrived in the few
//! milliseconds between that time and the first iterator). The bounded mode's stop is the
//! same time, kept in the offsets so that a restart stops at the same records; it is
//! compared with the server's approximate arrival times, so the two clocks must agree.

mod client;
mod options;
mod reader;
pub mod shards;

pub use options::{BoundedMode, KinesisOptions, StartupMode, metadata_columns};
pub use reader::KinesisReader;

/// The metadata columns a source may declare.
const SHARD_COLUMN: &str = "_shard";
const SEQUENCE_COLUMN: &str = "_sequence";
const PARTITION_KEY_COLUMN: &str = "_partition_key";
const ARRIVAL_COLUMN: &str = "_arrival_time";
