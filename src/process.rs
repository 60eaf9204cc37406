//! Process-wide settings the binary (and the benchmarks) make first thing: the allocator's
//! (they allocate with mimalloc) and the open-files limit.

use libmimalloc_sys::{mi_option_get, mi_option_set, mi_option_t};

/// Both settings: call first thing in `main`, before other threads start.
pub fn tune() {
    tune_allocator();
    raise_open_files_limit();
}

/// Raise the soft limit on open files to the hard one: a routed job keeps a file open per
/// table and partition (`route.max-open-files`, 1,000 by default), more than the soft limit
/// many systems start processes with (1,024). Best effort: the limits stay as they are if
/// the system refuses.
pub fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The soft limit on open files.
pub fn open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct given.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    limit.rlim_cur
}

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_t`; the Rust bindings name
/// no constant for it).
const PURGE_DELAY: mi_option_t = 15;

/// How long freed memory stays with the process before it goes back to the system, in ms.
const PURGE_DELAY_MS: i64 = 100;

/// mimalloc 3's `mi_option_allow_thp`.
const ALLOW_THP: mi_option_t = 43;

/// Give freed memory back to the system after `PURGE_DELAY_MS` rather than mimalloc 3's
/// second: a job allocates and frees its batches at hundreds of MB/s, so a second's worth of
/// freed memory was a third of a routing job's resident memory; returning it sooner costs no
/// throughput measurably (`cargo bench --bench routing`).
///
/// And no transparent huge pages: memory given back and taken again comes as 2 MiB pages the
/// kernel must find (compacting memory when none is free) and zero. A scan of 20 M rows spent
/// a third of its time there, its system time 1 s without them against 2.5-4 s with, its peak
/// memory half; ingest of inferred JSON ran 30-50% faster, of declared JSON up to 10% slower
/// (`cargo bench --bench query`, `--bench ingest`, `benches/RESULTS.md`).
///
/// `MIMALLOC_PURGE_DELAY` or `MIMALLOC_ALLOW_THP` set in the environment win. (mimalloc's
/// options are not thread-safe: see [`tune`].)
pub fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: a plain setter of an integer option, called before other threads exist.
        unsafe { mi_option_set(PURGE_DELAY, PURGE_DELAY_MS as _) }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: as above. mimalloc read the option when it started (before `main`), so the
        // process's own switch too: it holds whatever the system's THP mode.
        unsafe {
            mi_option_set(ALLOW_THP, 0);
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

/// Whether transparent huge pages are off for this process (Linux).
pub fn huge_pages_disabled() -> bool {
    // SAFETY: a query of the process's flag, nothing written.
    unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1 }
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
    fn the_open_files_limit_rises_to_the_hard_limit() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `raise_open_files_limit`.
        unsafe {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            // Start from a soft limit below the hard one, as many systems do.
            let low = libc::rlimit {
                rlim_cur: limit.rlim_max.min(1024) - 1,
                rlim_max: limit.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &low);
        }
        assert!(open_files_limit() < limit.rlim_max);
        raise_open_files_limit();
        assert_eq!(open_files_limit(), limit.rlim_max);
    }

    #[test]
    fn the_allocator_options_set_are_the_ones_meant() {
        // mimalloc 3's defaults, a second's purge delay and huge pages allowed, tell that
        // these are the options meant (not neighbours).
        // SAFETY: plain getters of integer options.
        let thp = || unsafe { mi_option_get(ALLOW_THP) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay_ms(), 1000);
        }
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
            assert_eq!(thp(), 1);
        }
        tune_allocator();
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
        }
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
            assert_eq!(thp(), 0);
            assert!(huge_pages_disabled(), "the process's own switch is off too");
        }
    }
}
