//! zstd contexts kept for reuse, rather than made for every Parquet column chunk.
//!
//! parquet makes a zstd compressor and a decompressor for each column chunk it writes or
//! reads (`ZSTDCodec::new`), and zstd asks the CPU for its features (three `CPUID`s) each
//! time it makes a context. On a virtual machine `CPUID` traps to the hypervisor: 7-9 us
//! each on the machines floe is measured on, ~50 us for a chunk's two contexts, ~0.5 ms for
//! a 150-row file of 11 columns that compresses a few KB. A job routing to 10,000 tables
//! writes such files by the ten thousand, and a query over hundreds of files reads a chunk
//! per column and file.
//!
//! So the binaries are linked with `--wrap` for zstd's four context functions (`build.rs`,
//! Linux only), and every zstd user in the process asks here:
//!
//! ```text
//! ZSTD_createCCtx --> a kept context, else a new one (CPUID)
//! ZSTD_freeCCtx   --> reset as new (parameters and dictionary; memory kept) and kept,
//!                     else freed: past MAX_ONE, or with KEPT_BYTES kept already
//! ```
//!
//! (The same for decompression contexts.) A context reset with
//! `ZSTD_reset_session_and_parameters` behaves as one just made; zstd resizes a context's
//! memory to what it is next asked to do.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use zstd_sys::{
    ZSTD_CCtx, ZSTD_CCtx_reset, ZSTD_DCtx, ZSTD_DCtx_reset, ZSTD_ResetDirective, ZSTD_isError,
    ZSTD_sizeof_CCtx, ZSTD_sizeof_DCtx,
};

/// A context larger than this is freed, not kept (a large window's, say).
const MAX_ONE: usize = 4 << 20;

/// What the contexts kept of one kind may hold together.
const KEPT_BYTES: usize = 32 << 20;

/// Contexts of one kind, freed and reset, with the bytes they hold.
struct Kept {
    contexts: Vec<(usize, usize)>,
    bytes: usize,
}

impl Kept {
    const fn new() -> Self {
        Self {
            contexts: Vec::new(),
            bytes: 0,
        }
    }
}

static COMPRESSION: Mutex<Kept> = Mutex::new(Kept::new());
static DECOMPRESSION: Mutex<Kept> = Mutex::new(Kept::new());

/// Contexts of either kind asked for, and those zstd made (none was kept to give).
static ASKED: AtomicUsize = AtomicUsize::new(0);
static MADE: AtomicUsize = AtomicUsize::new(0);

/// How many contexts this process asked zstd for, and how many zstd made: with the binary
/// linked as `build.rs` links it, far fewer made than asked for (none asked for otherwise,
/// as far as this count knows).
pub fn contexts_asked_and_made() -> (usize, usize) {
    (ASKED.load(Ordering::Relaxed), MADE.load(Ordering::Relaxed))
}

/// A context of the kind `kept` holds: a kept one, else one `make` makes.
fn given<T>(kept: &Mutex<Kept>, make: unsafe extern "C" fn() -> *mut T) -> *mut T {
    ASKED.fetch_add(1, Ordering::Relaxed);
    let taken = {
        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.contexts.pop().map(|(address, size)| {
            kept.bytes -= size;
            address as *mut T
        })
    };
    taken.unwrap_or_else(|| {
        MADE.fetch_add(1, Ordering::Relaxed);
        // SAFETY: zstd's own constructor, no arguments.
        unsafe { make() }
    })
}

/// How zstd resets, sizes and frees a context of one kind.
struct Kind<T> {
    reset: unsafe extern "C" fn(*mut T, ZSTD_ResetDirective) -> usize,
    size: unsafe extern "C" fn(*const T) -> usize,
    free: unsafe extern "C" fn(*mut T) -> usize,
}

/// A context its owner frees: reset as new and kept in `kept`, unless it is too large or
/// `kept` holds enough already; then freed. zstd's result of freeing: 0 for success.
///
/// # Safety
/// `context` is null or a live context of the kind `kind` describes, its owner done with it.
unsafe fn given_back<T>(kept: &Mutex<Kept>, context: *mut T, kind: Kind<T>) -> usize {
    if context.is_null() {
        return 0;
    }
    // SAFETY: the caller's promise; the context is reset and sized before anyone may take it.
    unsafe {
        let size = (kind.size)(context);
        if size <= MAX_ONE && ZSTD_isError((kind.reset)(context, AS_NEW)) == 0 {
            let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.bytes + size <= KEPT_BYTES {
                kept.bytes += size;
                kept.contexts.push((context as usize, size));
                return 0;
            }
        }
        (kind.free)(context)
    }
}

unsafe extern "C" {
    fn __real_ZSTD_createCCtx() -> *mut ZSTD_CCtx;
    fn __real_ZSTD_freeCCtx(cctx: *mut ZSTD_CCtx) -> usize;
    fn __real_ZSTD_createDCtx() -> *mut ZSTD_DCtx;
    fn __real_ZSTD_freeDCtx(dctx: *mut ZSTD_DCtx) -> usize;
}

const AS_NEW: ZSTD_ResetDirective = ZSTD_ResetDirective::ZSTD_reset_session_and_parameters;

/// `ZSTD_createCCtx`, as the binaries are linked.
#[unsafe(no_mangle)]
extern "C" fn __wrap_ZSTD_createCCtx() -> *mut ZSTD_CCtx {
    given(&COMPRESSION, __real_ZSTD_createCCtx)
}

/// `ZSTD_freeCCtx`, as the binaries are linked.
///
/// # Safety
/// As zstd's: `cctx` is null or a live context its owner is done with.
#[unsafe(no_mangle)]
unsafe extern "C" fn __wrap_ZSTD_freeCCtx(cctx: *mut ZSTD_CCtx) -> usize {
    let kind = Kind {
        reset: ZSTD_CCtx_reset,
        size: ZSTD_sizeof_CCtx,
        free: __real_ZSTD_freeCCtx,
    };
    // SAFETY: the caller's promise, as zstd's free asks.
    unsafe { given_back(&COMPRESSION, cctx, kind) }
}

/// `ZSTD_createDCtx`, as the binaries are linked.
#[unsafe(no_mangle)]
extern "C" fn __wrap_ZSTD_createDCtx() -> *mut ZSTD_DCtx {
    given(&DECOMPRESSION, __real_ZSTD_createDCtx)
}

/// `ZSTD_freeDCtx`, as the binaries are linked.
///
/// # Safety
/// As zstd's: `dctx` is null or a live context its owner is done with.
#[unsafe(no_mangle)]
unsafe extern "C" fn __wrap_ZSTD_freeDCtx(dctx: *mut ZSTD_DCtx) -> usize {
    let kind = Kind {
        reset: ZSTD_DCtx_reset,
        size: ZSTD_sizeof_DCtx,
        free: __real_ZSTD_freeDCtx,
    };
    // SAFETY: the caller's promise, as zstd's free asks.
    unsafe { given_back(&DECOMPRESSION, dctx, kind) }
}
