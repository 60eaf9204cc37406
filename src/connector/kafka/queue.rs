//! A queue of the reader's own that its partitions' messages are forwarded to, taken a
//! batch at a time.
//!
//! rdkafka's `poll` takes one message per call, each wrapped in an event (an allocation,
//! clock reads, the queue's lock). `rd_kafka_consume_batch_queue` takes every message
//! queued in one call, but on the consumer's queue it would also serve librdkafka's log and
//! error operations, which rdkafka hands to the reader only as events. So each assigned
//! partition's fetch queue is forwarded to a queue of the reader's own, which holds only
//! that partition's messages and consumer errors (end of partition) in their order, and the
//! consumer's queue is still polled for the rest.
//!
//! librdkafka clears a partition's forwarding when its fetching stops (an unassignment), and
//! then keeps its messages in the partition's queue until it is forwarded again; the reader
//! forwards its assigned partitions before every batch, which moves any such messages over
//! in order.

use std::ffi::{CString, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaErrorCode;

/// The most messages one call takes.
const BATCH: usize = 1024;

/// What a batch holds: a message, or a partition's end (bounded reads), or an error.
pub enum Taken<'a> {
    Message(Incoming<'a>),
    End(i32),
    Error(RDKafkaErrorCode),
}

/// A message as librdkafka holds it.
pub struct Incoming<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub timestamp_ms: Option<i64>,
}

/// The reader's queue. It holds the consumer, which it outlives.
pub struct Fetched<C: ConsumerContext> {
    consumer: Arc<BaseConsumer<C>>,
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// Woken when the queue stops being empty; kept alive while librdkafka may call it.
    ready: Arc<tokio::sync::Notify>,
}

// SAFETY: librdkafka's queues may be used from any thread; the notifier is thread-safe.
unsafe impl<C: ConsumerContext> Send for Fetched<C> {}
// SAFETY: as above: every operation on the queue takes its lock.
unsafe impl<C: ConsumerContext> Sync for Fetched<C> {}

unsafe extern "C" fn wake(_: *mut rd::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Notify` of a live `Fetched` (see `Fetched::new` and its drop).
    let ready = unsafe { &*(opaque as *const tokio::sync::Notify) };
    ready.notify_one();
}

impl<C: ConsumerContext> Fetched<C> {
    /// A new queue of `consumer`'s, waking `ready` when it stops being empty.
    pub fn new(consumer: Arc<BaseConsumer<C>>, ready: Arc<tokio::sync::Notify>) -> Option<Self> {
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is the live client `consumer` holds.
        let queue = NonNull::new(unsafe { rd::rd_kafka_queue_new(rk) })?;
        // SAFETY: the queue is live; the callback's opaque pointer stays valid until the
        // callback is removed in `drop`, since `ready` is held by `self`.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(
                queue.as_ptr(),
                Some(wake),
                Arc::as_ptr(&ready) as *mut c_void,
            )
        };
        Some(Self {
            consumer,
            queue,
            ready,
        })
    }

    /// Forward `topic`'s `partition` here: whether librdkafka knows the partition.
    pub fn forward(&self, topic: &str, partition: i32) -> bool {
        let Ok(name) = CString::new(topic) else {
            return false;
        };
        let rk = self.consumer.client().native_ptr();
        // SAFETY: `rk` is live; the returned queue handle is released right after use.
        unsafe {
            let own = rd::rd_kafka_queue_get_partition(rk, name.as_ptr(), partition);
            if own.is_null() {
                return false;
            }
            rd::rd_kafka_queue_forward(own, self.queue.as_ptr());
            rd::rd_kafka_queue_destroy(own);
        }
        true
    }

    /// Take up to `max` of what is queued, without waiting, each handed to `each`: how many
    /// were taken.
    pub fn take(&self, max: usize, mut each: impl FnMut(Taken<'_>)) -> usize {
        let mut batch = Batch {
            messages: [std::ptr::null_mut(); BATCH],
            len: 0,
        };
        // SAFETY: the queue is live and `messages` has room for `BATCH` pointers.
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(
                self.queue.as_ptr(),
                0,
                batch.messages.as_mut_ptr(),
                max.clamp(1, BATCH),
            )
        };
        batch.len = usize::try_from(n).unwrap_or(0);
        for &m in &batch.messages[..batch.len] {
            // SAFETY: librdkafka returned `m` as a live message, destroyed by `batch`'s drop
            // after `each` is done with what borrows it.
            each(unsafe { taken(&*m) });
        }
        batch.len
    }

    /// The notifier this queue wakes.
    pub fn ready(&self) -> &Arc<tokio::sync::Notify> {
        &self.ready
    }
}

impl<C: ConsumerContext> Drop for Fetched<C> {
    fn drop(&mut self) {
        // SAFETY: the queue is live; after this, librdkafka no longer calls `wake` with
        // `ready`, and the queue handle is released once.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), None, std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(self.queue.as_ptr());
        }
    }
}

/// Messages taken from librdkafka, destroyed when dropped.
struct Batch {
    messages: [*mut rd::rd_kafka_message_t; BATCH],
    len: usize,
}

impl Drop for Batch {
    fn drop(&mut self) {
        for &m in &self.messages[..self.len] {
            // SAFETY: each of the first `len` pointers is a message librdkafka returned and
            // nothing else destroys.
            unsafe { rd::rd_kafka_message_destroy(m) };
        }
    }
}

/// What `m` holds.
///
/// # Safety
/// `m` is a live message; what is returned borrows it.
unsafe fn taken(m: &rd::rd_kafka_message_t) -> Taken<'_> {
    use rd::rd_kafka_resp_err_t as E;
    match m.err {
        E::RD_KAFKA_RESP_ERR_NO_ERROR => {}
        E::RD_KAFKA_RESP_ERR__PARTITION_EOF => return Taken::End(m.partition),
        e => return Taken::Error(e.into()),
    }
    // SAFETY (all below): a live message's topic handle, name, key and payload pointers are
    // valid for their lengths while the message is.
    let topic = unsafe { std::ffi::CStr::from_ptr(rd::rd_kafka_topic_name(m.rkt)) };
    let bytes = |p: *mut c_void, len: usize| {
        (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p as *const u8, len) })
    };
    let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    let timestamp = unsafe { rd::rd_kafka_message_timestamp(m, &mut kind) };
    Taken::Message(Incoming {
        topic: topic.to_str().unwrap_or_default(),
        partition: m.partition,
        offset: m.offset,
        key: bytes(m.key, m.key_len),
        payload: bytes(m.payload, m.len),
        timestamp_ms: (timestamp != -1
            && kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
            .then_some(timestamp),
    })
}
