//! Links every binary of the package (floe, its tests and benchmarks) with zstd's context
//! functions going through `src/zstd_contexts.rs`, which keeps contexts for reuse: making
//! one costs three trapped `CPUID`s on a virtual machine, and parquet makes two per column
//! chunk. GNU ld and lld both take `--wrap`; other platforms link zstd as it is.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        for function in [
            "ZSTD_createCCtx",
            "ZSTD_freeCCtx",
            "ZSTD_createDCtx",
            "ZSTD_freeDCtx",
        ] {
            println!("cargo:rustc-link-arg=-Wl,--wrap={function}");
        }
    }
}
