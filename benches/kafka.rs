//! Kafka (the test broker) -> floe -> Iceberg: the rate on one core against the machine's
//! own limit and against a small Python consumer, and produce-to-visible latency with 1 s
//! checkpoints, and the time back to full rate after a SIGKILL (issue 15, targets 4, 6 and 8).
//!
//! ```text
//! scripts/test-env.sh start && eval "$(scripts/test-env.sh env)"
//! cargo bench --bench kafka                   # 1,000,000 events; 20,000 events/s for 25 s
//! FLOE_BENCH_EVENTS=300000 FLOE_BENCH_RATE=50000 FLOE_BENCH_SECONDS=15 cargo bench --bench kafka
//! cargo bench --bench kafka -- avro           # some runs alone: rate, avro, latency, recovery
//! ```
//!
//! Rate: the ingest benchmark's JSON events (285 bytes, 11 fields) produced into a topic of
//! four partitions, then read to their end three ways, each on the same one core:
//! - the limit: a librdkafka consumer (rdkafka's `BaseConsumer`) whose payloads are decoded
//!   by arrow-json and encoded as zstd Parquet, in one thread, nothing around it (the faster
//!   of 4,096 and 8,192 records a batch, as for the Avro limit);
//! - floe: a whole `floe -f` process, a bounded Kafka source with declared columns into one
//!   table (default settings: 10 s checkpoints);
//! - the peer (`benches/peers/consumer.py`, in the test environment's Python: confluent-kafka,
//!   `json.loads`, pyiceberg appending every 10 s).
//!
//! Avro: the same events in the Confluent wire format (their schema registered with the test
//! environment's registry), read to their end on one core two ways: the limit (the consumer,
//! arrow-avro with the writer schema known, zstd Parquet, one thread) and floe (a whole
//! process, `'format' = 'avro-confluent'`, into one table). Target: 70% of the limit.
//!
//! Latency: floe on one core runs the same job unbounded with `checkpoint.interval` 1 s while
//! a producer sends `FLOE_BENCH_RATE` events a second, noting when it handed each to the
//! client, and a reader (a floe session on the same catalog, in this process) polls the
//! table every 50 ms: an event's latency is from its send to the first poll that finds it.
//! The first 5 s are warm-up (the process starting, the consumer connecting) and not counted.
//!
//! Recovery: floe on one core with 1 s checkpoints reads a backlog (about 20 s of its rate,
//! or `FLOE_BENCH_BACKLOG` events); half a second after its fourth commit it is killed with
//! SIGKILL and started again at once. The time back to full rate runs from the kill to the
//! start of the first interval between commits at 90% of the rate before; at the end every
//! event is in the table once.
//!
//! Targets: floe at least 60% of the limit, at least 8x the peer; latency p50 under 1.2 s,
//! p99 under 2 s; back to full rate within 5 s of the kill.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::json::ReaderBuilder;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};

mod common;
use common::process::{allowed_cpus, finish, floe_command, lake_script, on_cores, run_script};
use common::{EVENT_COLUMNS, env};

/// The binary's allocator (see src/main.rs): the limit's figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PARTITIONS: i32 = 4;
/// Records not counted in the latency: the floe process starting and connecting.
const WARM_UP: Duration = Duration::from_secs(5);
/// How often the latency reader looks at the table.
const READ_EVERY: Duration = Duration::from_millis(50);

fn brokers() -> String {
    std::env::var("FLOE_KAFKA").unwrap_or_else(|_| {
        panic!(
            "FLOE_KAFKA is not set: the bench needs the test broker. Start it with \
             `scripts/test-env.sh install && scripts/test-env.sh start`, then \
             `eval \"$(scripts/test-env.sh env)\"`"
        )
    })
}

/// A new topic of [`PARTITIONS`] partitions: its name.
fn create_topic(brokers: &str, what: &str) -> String {
    let name = format!("bench-{what}-{}-{}", std::process::id(), now_millis());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let topic = NewTopic::new(&name, PARTITIONS, TopicReplication::Fixed(1));
    let results = block_on(admin.create_topics([&topic], &AdminOptions::new()))
        .unwrap_or_else(|e| panic!("creating topic {name} at {brokers}: {e}"));
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
    }
    name
}

fn now_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
}

/// Counts the records the broker refused.
#[derive(Default)]
struct Deliveries {
    failed: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result
            && self.failed.fetch_add(1, Ordering::Relaxed) == 0
        {
            eprintln!("a record was not delivered: {e}");
        }
    }
}

/// A producer sending records as they come (5 ms linger), its delivery reports served by a
/// thread of its own.
fn producer(brokers: &str) -> ThreadedProducer<Deliveries> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create_with_context(Deliveries::default())
        .expect("producer")
}

/// Send event `i` to `topic` (partition `i` mod [`PARTITIONS`]), waiting while the client's
/// queue is full.
fn send(producer: &ThreadedProducer<Deliveries>, topic: &str, i: u64) {
    send_payload(producer, topic, i, common::event(i).as_bytes());
}

/// Send `payload` as event `i` (see [`send`]).
fn send_payload(producer: &ThreadedProducer<Deliveries>, topic: &str, i: u64, payload: &[u8]) {
    let mut record = BaseRecord::<(), [u8]>::to(topic)
        .payload(payload)
        .partition((i % PARTITIONS as u64) as i32);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => panic!("producing to {topic}: {e}"),
        }
    }
}

/// `count` events into `topic` as fast as the client sends them: seconds taken.
fn produce(brokers: &str, topic: &str, count: u64) -> f64 {
    let started = Instant::now();
    let producer = producer(brokers);
    for i in 0..count {
        send(&producer, topic, i);
    }
    delivered(&producer);
    started.elapsed().as_secs_f64()
}

fn delete_topic(brokers: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let results = block_on(admin.delete_topics(&[topic], &AdminOptions::new()))
        .unwrap_or_else(|e| panic!("deleting topic {topic}: {e}"));
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("deleting topic {t}: {e}"));
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Wait until every record sent was delivered, and none failed.
fn delivered(producer: &ThreadedProducer<Deliveries>) {
    producer
        .flush(Duration::from_secs(120))
        .expect("every record delivered within 120 s");
    let failed = producer.context().failed.load(Ordering::Relaxed);
    assert_eq!(failed, 0, "{failed} records were not delivered");
}

fn schema() -> Arc<Schema> {
    let text = |name| Field::new(name, DataType::Utf8, true);
    let time = DataType::Timestamp(TimeUnit::Microsecond, None);
    Arc::new(Schema::new(vec![
        Field::new("event_id", DataType::Int64, true),
        text("event_type"),
        Field::new("event_time", time, true),
        Field::new("user_id", DataType::Int64, true),
        text("session_id"),
        text("region"),
        Field::new("amount", DataType::Float64, true),
        text("url"),
        text("device"),
        Field::new("ok", DataType::Boolean, true),
        text("tags"),
    ]))
}

/// Run `f` on `cpus` (threads it starts inherit them), then give the thread every CPU the
/// bench may use back.
fn on_cpus<T>(cpus: &[usize], f: impl FnOnce() -> T) -> T {
    let set_affinity = |cpus: &[usize]| {
        // SAFETY: a zeroed cpu_set_t is an empty set, filled with CPUs below CPU_SETSIZE.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in cpus {
            // SAFETY: as above.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: pid 0 is this thread; the size is the set's.
        let set = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        assert_eq!(set, 0, "sched_setaffinity");
    };
    let all = allowed_cpus();
    set_affinity(cpus);
    let out = f();
    set_affinity(&all);
    out
}

/// A librdkafka consumer of every partition of `topic` from its start, set as floe's source
/// sets its own.
fn consumer(brokers: &str, topic: &str, group: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        // As floe's source: librdkafka's default (1 s) stops fetching a partition for a
        // second each time its local queue fills, and a consumer that decodes slower than
        // it fetches then waits most of the time.
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .expect("assignment");
    }
    // As floe's reader does: with the topic's leaders unknown at assignment, librdkafka
    // looks for the partitions' start half a second later.
    consumer
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .expect("the topic's metadata");
    consumer.assign(&assignment).expect("assign");
    consumer
}

/// A decoder of records into batches: arrow-json's and arrow-avro's.
trait BatchDecoder {
    /// Bytes of `buf` taken: fewer than all once a batch is full.
    fn decode(&mut self, buf: &[u8]) -> usize;
    fn flush(&mut self) -> Option<RecordBatch>;
    fn schema(&self) -> SchemaRef;
}

impl BatchDecoder for datafusion::arrow::json::reader::Decoder {
    fn decode(&mut self, buf: &[u8]) -> usize {
        self.decode(buf).expect("decode")
    }
    fn flush(&mut self) -> Option<RecordBatch> {
        self.flush().expect("decode")
    }
    fn schema(&self) -> SchemaRef {
        schema()
    }
}

impl BatchDecoder for arrow_avro::reader::Decoder {
    fn decode(&mut self, buf: &[u8]) -> usize {
        self.decode(buf).expect("decode")
    }
    fn flush(&mut self) -> Option<RecordBatch> {
        self.flush().expect("decode")
    }
    fn schema(&self) -> SchemaRef {
        self.schema()
    }
}

/// `events` records from `consumer` decoded by `decoder` and encoded as zstd Parquet, in
/// this thread; every event must be there.
fn to_parquet(consumer: &BaseConsumer, brokers: &str, events: u64, mut decoder: impl BatchDecoder) {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut writer =
        ArrowWriter::try_new(Vec::new(), decoder.schema(), Some(props)).expect("writer");
    let mut write = |decoder: &mut dyn BatchDecoder| {
        if let Some(batch) = decoder.flush() {
            writer.write(&batch).expect("encode");
        }
    };
    let mut read = 0;
    while read < events {
        let message = consumer
            .poll(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("no record from {brokers} in 30 s, {read} of {events} read"))
            .expect("a record");
        let mut payload = message.payload().expect("a payload");
        // The decoder takes a batch's worth of records, then wants flushing.
        loop {
            let taken = decoder.decode(payload);
            payload = &payload[taken..];
            if payload.is_empty() {
                break;
            }
            write(&mut decoder);
        }
        read += 1;
    }
    write(&mut decoder);
    let rows = writer.close().expect("close").file_metadata().num_rows();
    assert_eq!(rows as u64, events, "every event encoded");
}

/// The limits are taken at the faster of these batch sizes (floe decodes 4,096 records at a
/// time).
const LIMIT_BATCHES: [usize; 2] = [4096, 8192];

/// `limit` at each of [`LIMIT_BATCHES`], the faster.
fn fastest(limit: impl Fn(usize) -> f64) -> f64 {
    LIMIT_BATCHES.map(limit).into_iter().fold(0.0, f64::max)
}

/// The limit: `topic`'s `events` read by a librdkafka consumer, their payloads decoded by
/// arrow-json `batch` at a time and encoded as zstd Parquet, one thread: records per second,
/// the consumer's start included.
fn limit(brokers: &str, topic: &str, events: u64, batch: usize) -> f64 {
    let start = Instant::now();
    let consumer = consumer(brokers, topic, "floe-bench-limit");
    let decoder = ReaderBuilder::new(schema())
        .with_batch_size(batch)
        .build_decoder()
        .expect("decoder");
    to_parquet(&consumer, brokers, events, decoder);
    events as f64 / start.elapsed().as_secs_f64()
}

/// The job's statements: `topic` into `lake.bench.events`, a bounded source or not; they
/// run again as they are when the job restarts.
fn job(brokers: &str, topic: &str, bounded: bool, settings: &str) -> String {
    let bounded = if bounded {
        ", 'scan.bounded.mode' = 'latest-offset'"
    } else {
        ""
    };
    format!(
        "CREATE SCHEMA IF NOT EXISTS lake.bench;
         CREATE TABLE IF NOT EXISTS lake.bench.events ({EVENT_COLUMNS})
           WITH ('write.parquet.compression-codec' = 'zstd');
         CREATE SOURCE events ({EVENT_COLUMNS}) WITH ('connector' = 'kafka', 'topic' = '{topic}',
           'properties.bootstrap.servers' = '{brokers}', 'format' = 'json'{bounded});
         SET 'pipeline.name' = 'kafka';
         {settings}
         INSERT INTO lake.bench.events SELECT * FROM events;"
    )
}

/// floe on one core, the whole process: records per second.
fn floe_rate(dir: &std::path::Path, brokers: &str, topic: &str, events: u64) -> f64 {
    let lake = tempfile::tempdir_in(dir).expect("lake dir");
    let script = lake_script(lake.path(), &job(brokers, topic, true, ""));
    let run = run_script(&script, Some(1));
    assert_eq!(run.count("records_out"), events, "every event written");
    events as f64 / run.seconds
}

/// The Python consumer on one core, the whole process: records per second.
fn peer_rate(dir: &std::path::Path, brokers: &str, topic: &str, events: u64) -> f64 {
    let python = std::env::var("FLOE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "FLOE_TEST_PYTHON is not set: the peer runs in the test environment's Python. Run \
             `scripts/test-env.sh install` and `eval \"$(scripts/test-env.sh env)\"`"
        )
    });
    let lake = tempfile::tempdir_in(dir).expect("lake dir");
    let mut command = std::process::Command::new(python);
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/peers/consumer.py"
        ))
        .args([brokers, topic, &PARTITIONS.to_string(), &events.to_string()])
        .arg(lake.path())
        .arg("10");
    on_cores(&mut command, Some(1));
    let done = finish(command);
    let line = done.stdout.lines().last().unwrap_or_default();
    assert!(
        line.contains(&format!("\"events\": {events},")),
        "the peer appended every event: {line}"
    );
    events as f64 / done.seconds
}

/// The first column of `sql`'s rows, a BIGINT.
async fn numbers(session: &floe::Session, sql: &str) -> Result<Vec<i64>, floe::Error> {
    let outputs = session.sql(sql).await?;
    let Some(floe::Output::Rows(_, batches)) = outputs.into_iter().last() else {
        panic!("no rows from {sql}")
    };
    let mut ids = Vec::new();
    for batch in batches {
        let column = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("a BIGINT");
        ids.extend(column.iter().flatten());
        assert_eq!(column.null_count(), 0);
    }
    Ok(ids)
}

/// The event ids in `lake.bench.events` now.
async fn ids(session: &floe::Session) -> Vec<i64> {
    numbers(session, "SELECT event_id FROM lake.bench.events")
        .await
        .expect("reading the table")
}

/// How many events `lake.bench.events` holds now (an error until floe created it).
async fn count(session: &floe::Session) -> Result<u64, floe::Error> {
    let n = numbers(session, "SELECT count(*) FROM lake.bench.events").await?;
    Ok(u64::try_from(n[0]).expect("a count"))
}

/// 1 s checkpoints, for the latency and the recovery.
const ONE_SECOND: &str = "SET 'checkpoint.interval' = '1s';";

/// A `floe -f` process running an unbounded job on one core, its errors in a file.
struct Running {
    script: std::path::PathBuf,
    errors: std::path::PathBuf,
    child: std::process::Child,
}

impl Running {
    /// Start `statements` on a lake in `lake`.
    fn start(lake: &std::path::Path, statements: &str) -> Self {
        let script = lake_script(lake, statements);
        let errors = lake.join("floe.err");
        let child = Self::spawn(&script, &errors);
        Self {
            script,
            errors,
            child,
        }
    }

    fn spawn(script: &std::path::Path, errors: &std::path::Path) -> std::process::Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(errors)
            .expect("floe.err");
        let mut command = floe_command(script);
        command.stdout(std::process::Stdio::null()).stderr(log);
        on_cores(&mut command, Some(1));
        command.spawn().expect("start floe")
    }

    /// Panic, with floe's errors, if it exited.
    fn check(&mut self) {
        if let Some(status) = self.child.try_wait().expect("floe's status") {
            let err = std::fs::read_to_string(&self.errors).unwrap_or_default();
            panic!("floe exited ({status}) while its job should run: {err}");
        }
    }

    /// SIGKILL, and wait for the process to end.
    fn kill(&mut self) {
        self.child.kill().expect("kill floe");
        self.child.wait().expect("floe ended");
    }

    /// Start the same script again (the job resumes from its checkpoint).
    fn restart(&mut self) {
        self.child = Self::spawn(&self.script, &self.errors);
    }
}

/// Produce-to-visible latency: floe on one core with 1 s checkpoints, `rate` events a second
/// for `seconds`: each counted event's latency in seconds, sorted.
fn latencies(dir: &std::path::Path, brokers: &str, rate: u64, seconds: u64) -> Vec<f64> {
    let topic = create_topic(brokers, "latency");
    let lake = tempfile::tempdir_in(dir).expect("lake dir");
    let mut floe = Running::start(lake.path(), &job(brokers, &topic, false, ONE_SECOND));

    let events = rate * seconds;
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..events).map(|_| AtomicU64::new(0)).collect());
    let start = Instant::now();
    let producing = {
        let (sent, brokers, topic) = (sent.clone(), brokers.to_string(), topic.clone());
        std::thread::spawn(move || {
            let producer = producer(&brokers);
            let mut next = 0;
            while next < events {
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                while next < due.min(events) {
                    let at = start.elapsed().as_nanos() as u64;
                    send(&producer, &topic, next);
                    sent[next as usize].store(at, Ordering::Relaxed);
                    next += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            delivered(&producer);
        })
    };

    let seen_at = common::one_core().block_on(async {
        let session = common::lake_session(lake.path(), "").await;
        let mut seen_at = vec![None; events as usize];
        let mut seen = 0;
        let deadline = Duration::from_secs(seconds + 60);
        while seen < events {
            floe.check();
            assert!(
                start.elapsed() < deadline,
                "{seen} of {events} events visible after {deadline:?}"
            );
            tokio::time::sleep(READ_EVERY).await;
            match count(&session).await {
                Ok(n) if n == seen => continue,
                Ok(_) => {}
                // The table is created by floe's script, which may not have run yet.
                Err(_) if start.elapsed() < WARM_UP => continue,
                Err(e) => panic!("reading the table: {e}"),
            }
            let at = start.elapsed();
            for id in ids(&session).await {
                let slot = &mut seen_at[usize::try_from(id).expect("an id")];
                if slot.is_none() {
                    *slot = Some(at);
                    seen += 1;
                }
            }
        }
        seen_at
    });
    floe.kill();
    producing.join().expect("producer");
    delete_topic(brokers, &topic);

    let mut latencies: Vec<f64> = seen_at
        .iter()
        .zip(sent.iter())
        .map(|(seen, sent)| {
            (
                seen.expect("seen"),
                Duration::from_nanos(sent.load(Ordering::Relaxed)),
            )
        })
        .filter(|(_, sent)| *sent >= WARM_UP)
        .map(|(seen, sent)| (seen - sent).as_secs_f64())
        .collect();
    latencies.sort_by(f64::total_cmp);
    latencies
}

/// What the recovery measured, in seconds from the kill and events a second.
struct Recovery {
    backlog: u64,
    before: f64,
    first_commit: f64,
    full_rate: f64,
    after: f64,
}

/// The events in the newest snapshot of `lake.bench.events` (0 before its first), from its
/// newest metadata file: far cheaper than a query, which would load the growing table 50
/// times a second on the core the broker runs on. A metadata file is written just before
/// the catalog points at it (one a SIGKILL cut short holds what the restarted job commits
/// again).
fn committed(lake: &std::path::Path) -> u64 {
    let dir = lake.join("warehouse/bench/events/metadata");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    // `<version>-<uuid>.metadata.json`: the highest version is the newest.
    let newest = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".metadata.json"))
        .filter_map(|name| Some((name.split('-').next()?.parse::<u64>().ok()?, name)))
        .max();
    let Some((_, name)) = newest else { return 0 };
    let text = std::fs::read_to_string(dir.join(&name)).expect("a metadata file");
    let metadata: serde_json::Value = serde_json::from_str(&text).expect("metadata JSON");
    let current = &metadata["current-snapshot-id"];
    let Some(snapshots) = metadata["snapshots"].as_array() else {
        return 0;
    };
    let snapshot = snapshots
        .iter()
        .find(|s| &s["snapshot-id"] == current)
        .unwrap_or_else(|| panic!("{name}: no current snapshot"));
    snapshot["summary"]["total-records"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}: no total-records in the current snapshot"))
}

/// The time (since `start`) and count of the table's next commit after `last` events.
fn next_commit(
    lake: &std::path::Path,
    floe: &mut Running,
    start: Instant,
    last: u64,
) -> (f64, u64) {
    loop {
        floe.check();
        let n = committed(lake);
        if n != last {
            return (start.elapsed().as_secs_f64(), n);
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no commit after {last} events for too long"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Recovery: floe on one core with 1 s checkpoints reads a backlog of `backlog` events;
/// after four commits (at its full rate) it is killed mid-checkpoint (SIGKILL) and started
/// again at once; the restarted job's commits tell when it is back to its rate.
fn recovery(dir: &std::path::Path, brokers: &str, backlog: u64) -> Recovery {
    let topic = create_topic(brokers, "recovery");
    produce(brokers, &topic, backlog);
    let lake = tempfile::tempdir_in(dir).expect("lake dir");
    let lake = lake.path();
    let mut floe = Running::start(lake, &job(brokers, &topic, false, ONE_SECOND));
    let start = Instant::now();
    let mut commits = vec![next_commit(lake, &mut floe, start, 0)];
    while commits.len() < 4 {
        let last = commits.last().expect("a commit").1;
        commits.push(next_commit(lake, &mut floe, start, last));
    }
    let rate = |(t0, c0): (f64, u64), (t1, c1): (f64, u64)| (c1 - c0) as f64 / (t1 - t0);
    // From the second commit: the first holds the start.
    let before = rate(commits[1], commits[3]);
    std::thread::sleep(Duration::from_millis(500));
    let killed_at = start.elapsed().as_secs_f64();
    floe.kill();
    floe.restart();
    let mut last = commits[3];
    let mut after = Vec::new();
    let (full_rate, rate_after) = loop {
        let next = next_commit(lake, &mut floe, start, last.1);
        assert!(
            next.1 < backlog,
            "the backlog ran out before the job was back to its rate ({before:.0} events/s \
             before the kill at {killed_at:.2} s; (seconds, events) at each commit: before \
             {commits:?}, after {after:?}): set FLOE_BENCH_BACKLOG higher than {backlog}"
        );
        if let Some(&first) = after.last() {
            let r = rate(first, next);
            if r >= 0.9 * before {
                break (first.0 - killed_at, r);
            }
        }
        after.push(next);
        last = next;
    };
    while last.1 < backlog {
        last = next_commit(lake, &mut floe, start, last.1);
    }
    assert_eq!(last.1, backlog, "no event twice after the kill");
    // Exactly once through the kill, read back: every event, none twice.
    let mut ids = common::one_core().block_on(async {
        let session = common::lake_session(lake, "").await;
        ids(&session).await
    });
    floe.kill();
    delete_topic(brokers, &topic);
    assert_eq!(
        ids.len() as u64,
        backlog,
        "as many rows as events after the kill"
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, backlog, "every event once after the kill");
    Recovery {
        backlog,
        before,
        first_commit: after[0].0 - killed_at,
        full_rate,
        after: rate_after,
    }
}

/// The events' Avro writer schema: the JSON events' fields, `event_time` in microseconds.
const AVRO_SCHEMA: &str = r#"{"type": "record", "name": "event", "fields": [
  {"name": "event_id", "type": "long"}, {"name": "event_type", "type": "string"},
  {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-micros"}},
  {"name": "user_id", "type": "long"}, {"name": "session_id", "type": "string"},
  {"name": "region", "type": "string"}, {"name": "amount", "type": "double"},
  {"name": "url", "type": "string"}, {"name": "device", "type": "string"},
  {"name": "ok", "type": "boolean"}, {"name": "tags", "type": "string"}]}"#;

/// 2024-05-01T00:00:00Z in microseconds.
const MAY_FIRST_MICROS: i64 = 1_714_521_600_000_000;

fn registry() -> String {
    std::env::var("FLOE_SCHEMA_REGISTRY").unwrap_or_else(|_| {
        panic!(
            "FLOE_SCHEMA_REGISTRY is not set: the Avro run needs the test environment's schema              registry. Run `scripts/test-env.sh start` and `eval \"$(scripts/test-env.sh env)\"`"
        )
    })
}

/// Register [`AVRO_SCHEMA`] as `topic`'s value schema: its id.
fn register(registry: &str, topic: &str) -> u32 {
    let url = format!("{registry}/subjects/{topic}-value/versions");
    let body = serde_json::json!({ "schema": AVRO_SCHEMA });
    let answer: serde_json::Value = block_on(async {
        reqwest::Client::new()
            .post(&url)
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("registering the schema at {url}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("the registry's answer from {url}: {e}"))
    });
    answer["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no schema id from {url}: {answer}")) as u32
}

/// Event `i` in the Confluent wire format: magic byte, schema `id`, Avro binary body.
fn avro_event(i: u64, id: u32, out: &mut Vec<u8>) {
    fn long(n: i64, out: &mut Vec<u8>) {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }
    fn string(s: &str, out: &mut Vec<u8>) {
        long(s.len() as i64, out);
        out.extend_from_slice(s.as_bytes());
    }
    let e = common::Event::new(i);
    out.clear();
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    long(e.id as i64, out);
    string(e.kind, out);
    long(MAY_FIRST_MICROS + e.second_of_day as i64 * 1_000_000, out);
    long(e.user_id as i64, out);
    string(&e.session_id(), out);
    string(e.region, out);
    out.extend_from_slice(&(e.cents as f64 / 100.0).to_le_bytes());
    string(&e.url(), out);
    string(e.device, out);
    out.push(e.ok as u8);
    string(&e.tags(), out);
}

/// `count` Avro events (schema `id`) into `topic`: seconds taken, and the mean record size.
fn produce_avro(brokers: &str, topic: &str, id: u32, count: u64) -> (f64, f64) {
    let started = Instant::now();
    let producer = producer(brokers);
    let mut payload = Vec::new();
    let mut bytes = 0;
    for i in 0..count {
        avro_event(i, id, &mut payload);
        bytes += payload.len();
        send_payload(&producer, topic, i, &payload);
    }
    delivered(&producer);
    (started.elapsed().as_secs_f64(), bytes as f64 / count as f64)
}

/// The Avro limit: `topic`'s `events` read by a librdkafka consumer, decoded by arrow-avro
/// `batch` at a time (the writer schema `id` known, as a registry's client keeps it) and
/// encoded as zstd Parquet, one thread: records per second.
fn avro_limit(brokers: &str, topic: &str, id: u32, events: u64, batch: usize) -> f64 {
    use arrow_avro::reader::ReaderBuilder as AvroReaderBuilder;
    use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
    let start = Instant::now();
    let consumer = consumer(brokers, topic, "floe-bench-avro-limit");
    let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
    store
        .set(
            Fingerprint::Id(id),
            AvroSchema::new(AVRO_SCHEMA.to_string()),
        )
        .expect("schema store");
    let decoder = AvroReaderBuilder::new()
        .with_batch_size(batch)
        .with_writer_schema_store(store)
        .with_active_fingerprint(Fingerprint::Id(id))
        .build_decoder()
        .expect("decoder");
    to_parquet(&consumer, brokers, events, decoder);
    events as f64 / start.elapsed().as_secs_f64()
}

/// floe on one core, the whole process, Avro with the registry into one table: records per
/// second.
fn floe_avro_rate(dir: &std::path::Path, brokers: &str, topic: &str, events: u64) -> f64 {
    let lake = tempfile::tempdir_in(dir).expect("lake dir");
    let registry = registry();
    let job = format!(
        "CREATE SCHEMA IF NOT EXISTS lake.bench;
         CREATE SOURCE events WITH ('connector' = 'kafka', 'topic' = '{topic}',
           'properties.bootstrap.servers' = '{brokers}', 'format' = 'avro-confluent',
           'avro-confluent.url' = '{registry}', 'scan.bounded.mode' = 'latest-offset');
         SET 'pipeline.name' = 'kafka-avro';
         INSERT INTO lake.bench SELECT * FROM events ROUTE BY 'events'
         WITH ('table.properties.write.parquet.compression-codec' = 'zstd');"
    );
    let run = run_script(&lake_script(lake.path(), &job), Some(1));
    assert_eq!(run.count("records_out"), events, "every event written");
    events as f64 / run.seconds
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let events: u64 = env("FLOE_BENCH_EVENTS").unwrap_or(1_000_000);
    let rate: u64 = env("FLOE_BENCH_RATE").unwrap_or(20_000);
    let seconds: u64 = env("FLOE_BENCH_SECONDS").unwrap_or(25);
    let brokers = brokers();
    let dir = tempfile::tempdir().expect("tempdir");

    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runs = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let cpus = allowed_cpus();
    assert!(
        cpus.len() >= 2,
        "the bench needs 2 cores, it may use {}",
        cpus.len()
    );

    let mut floe = None;
    if runs("rate") {
        let topic = create_topic(&brokers, "rate");
        let produced = produce(&brokers, &topic, events);
        let base = on_cpus(&cpus[..1], || {
            fastest(|b| limit(&brokers, &topic, events, b))
        });
        let rate = floe_rate(dir.path(), &brokers, &topic, events);
        let peer = peer_rate(dir.path(), &brokers, &topic, events);
        delete_topic(&brokers, &topic);
        println!(
            "kafka: {events} JSON events of 285 bytes in {PARTITIONS} partitions (produced in \
             {produced:.1} s), read to their end on one core"
        );
        println!("  limit (librdkafka consumer + arrow-json + zstd Parquet): {base:>9.0} events/s");
        println!(
            "  floe (whole process, one table):                          {rate:>9.0} events/s"
        );
        println!(
            "  peer (Python: confluent-kafka + json + pyiceberg, 10 s):  {peer:>9.0} events/s"
        );
        println!(
            "  floe at {:.0}% of the limit (target: at least 60%), {:.1}x the peer (target: at \
             least 8x)",
            100.0 * rate / base,
            rate / peer
        );
        floe = Some(rate);
    }

    if runs("avro") {
        let registry = registry();
        let topic = create_topic(&brokers, "avro");
        let id = register(&registry, &topic);
        let (produced, bytes) = produce_avro(&brokers, &topic, id, events);
        let base = on_cpus(&cpus[..1], || {
            fastest(|b| avro_limit(&brokers, &topic, id, events, b))
        });
        let rate = floe_avro_rate(dir.path(), &brokers, &topic, events);
        delete_topic(&brokers, &topic);
        println!(
            "kafka, Avro: {events} events of {bytes:.0} bytes (Confluent framing, the registry's \
             schema) in {PARTITIONS} partitions (produced in {produced:.1} s), read to their end \
             on one core"
        );
        println!("  limit (librdkafka consumer + arrow-avro + zstd Parquet): {base:>9.0} events/s");
        println!(
            "  floe (whole process, one table):                          {rate:>9.0} events/s"
        );
        println!(
            "  floe at {:.0}% of the limit (target: at least 70%)",
            100.0 * rate / base
        );
    }
    if runs("latency") {
        latency(dir.path(), &brokers, &cpus, rate, seconds);
    }
    if runs("recovery") {
        // A backlog of about 20 s at floe's rate: four commits before the kill, some after.
        let backlog = env("FLOE_BENCH_BACKLOG").unwrap_or_else(|| {
            let floe = floe.unwrap_or(500_000.0);
            ((floe * 20.0) as u64).div_ceil(100_000) * 100_000
        });
        let r = on_cpus(&cpus[1..], || recovery(dir.path(), &brokers, backlog));
        println!(
            "recovery: floe on one core, 1 s checkpoints, a backlog of {} events; SIGKILL half a \
             second after its fourth commit, started again at once",
            r.backlog
        );
        println!(
            "  {:.0} events/s before; first commit {:.2} s after the kill; back to {:.0} events/s \
             ({:.0}%) from {:.2} s after the kill (target: within 5 s); every event once",
            r.before,
            r.first_commit,
            r.after,
            100.0 * r.after / r.before,
            r.full_rate
        );
    }
}

/// Produce-to-visible latency: floe on the first core, the producer and the reader on the
/// others.
fn latency(dir: &std::path::Path, brokers: &str, cpus: &[usize], rate: u64, seconds: u64) {
    let latencies = on_cpus(&cpus[1..], || latencies(dir, brokers, rate, seconds));
    println!(
        "latency: {rate} events/s for {seconds} s into floe on one core, 1 s checkpoints, the \
         table read every {} ms; {} events after {} s of warm-up",
        READ_EVERY.as_millis(),
        latencies.len(),
        WARM_UP.as_secs()
    );
    println!(
        "  produce to visible: p50 {:.2} s, p99 {:.2} s, max {:.2} s (target: p50 under 1.2 s, \
         p99 under 2 s)",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
}
