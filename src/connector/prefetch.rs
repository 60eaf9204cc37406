//! Reading ahead: a source's next poll (reading and decoding its records) runs while the job
//! runs its query on the poll before and writes the rows, on another core.
//!
//! ```text
//! reader task:  poll 1 | poll 2 | poll 3 ...        (the channel holds `ahead` polls)
//! job:                 | query + write 1 | query + write 2 ...
//! ```
//!
//! Each poll travels with the offsets after it, so the job's checkpoint names the records it
//! took, never the ones read ahead: exactly-once is the same as without.

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{Offsets, Poll, SourceReader};
use crate::error::{Error, Result};
use crate::lake::runtime;
use crate::task::AbortOnDrop;

/// A reader whose polls run ahead in a task of their own.
pub struct Prefetched {
    polls: mpsc::Receiver<Fetched>,
    /// Polls the reader (the task ends with the source, or on an error).
    _task: AbortOnDrop<()>,
    bounded: bool,
    /// As of the last poll taken.
    offsets: Offsets,
    lag: Option<u64>,
    stalled: Option<String>,
}

/// A poll and what the reader said after it.
struct Fetched {
    poll: Result<Poll>,
    offsets: Offsets,
    lag: Option<u64>,
    stalled: Option<String>,
}

impl Prefetched {
    /// Poll `reader` (already where it should start) for `max_rows` at a time, up to `ahead`
    /// polls before the job takes them.
    pub fn new(mut reader: Box<dyn SourceReader>, max_rows: usize, ahead: usize) -> Self {
        let (offsets, lag, stalled, bounded) = (
            reader.offsets(),
            reader.lag(),
            reader.stalled(),
            reader.is_bounded(),
        );
        let (send, polls) = mpsc::channel(ahead.max(1));
        // On the write runtime: a task spawned here would share the job's worker, and the
        // job, woken while the worker decodes, would wait for it (a worker's next task is not
        // taken by the others).
        let task = runtime::spawn(async move {
            loop {
                let poll = reader.poll(max_rows).await;
                let last = matches!(poll, Err(_) | Ok(Poll::Finished));
                let fetched = Fetched {
                    poll,
                    offsets: reader.offsets(),
                    lag: reader.lag(),
                    stalled: reader.stalled(),
                };
                if send.send(fetched).await.is_err() || last {
                    break;
                }
            }
        });
        Self {
            polls,
            _task: task,
            bounded,
            offsets,
            lag,
            stalled,
        }
    }
}

#[async_trait]
impl SourceReader for Prefetched {
    /// The next poll read ahead (`max_rows` was given when reading ahead began).
    async fn poll(&mut self, _max_rows: usize) -> Result<Poll> {
        let Some(fetched) = self.polls.recv().await else {
            return Err(Error::Internal(
                "a source's reader read ahead stopped: it ended, failed or panicked".into(),
            ));
        };
        self.offsets = fetched.offsets;
        self.lag = fetched.lag;
        self.stalled = fetched.stalled;
        fetched.poll
    }

    fn offsets(&self) -> Offsets {
        self.offsets.clone()
    }

    fn seek(&mut self, _offsets: &Offsets) -> Result<()> {
        Err(Error::Internal(
            "a source read ahead cannot seek: seek before reading ahead".into(),
        ))
    }

    fn is_bounded(&self) -> bool {
        self.bounded
    }

    fn lag(&self) -> Option<u64> {
        self.lag
    }

    fn stalled(&self) -> Option<String> {
        self.stalled.clone()
    }
}
