//! The allocator's settings. The binary (and the benchmarks) allocate with mimalloc.

use libmimalloc_sys::{mi_option_get, mi_option_set, mi_option_t};

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_t`; the Rust bindings name
/// no constant for it).
const PURGE_DELAY: mi_option_t = 15;

/// How long freed memory stays with the process before it goes back to the system, in ms.
const PURGE_DELAY_MS: i64 = 100;

/// Give freed memory back to the system after [`PURGE_DELAY_MS`] rather than mimalloc 3's
/// second: a job allocates and frees its batches at hundreds of MB/s, so a second's worth of
/// freed memory was a third of a routing job's resident memory; returning it sooner costs no
/// throughput measurably (`cargo bench --bench routing`). A `MIMALLOC_PURGE_DELAY` set in
/// the environment wins. Call first thing in `main`, before other threads start (mimalloc's
/// options are not thread-safe).
pub fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: a plain setter of an integer option, called before other threads exist.
        unsafe { mi_option_set(PURGE_DELAY, PURGE_DELAY_MS as _) }
    }
}

/// The purge delay in force, in ms.
pub fn purge_delay_ms() -> i64 {
    // SAFETY: a plain getter of an integer option.
    unsafe { mi_option_get(PURGE_DELAY) as i64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_is_the_option_set() {
        // mimalloc 3's default is a second: this is the option meant (not a neighbour).
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay_ms(), 1000);
        }
        tune_allocator();
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
        }
    }
}
