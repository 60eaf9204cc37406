use clap::Parser;

/// mimalloc, as datafusion-cli uses: glibc's malloc keeps the memory of many tables' short-lived
/// Parquet encoders and compression contexts resident long after they are freed.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    floe::process::tune();
    let args = floe::cli::Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(floe::cli::main(args));
    // Do not wait for idle connection pools and the like to wind down.
    runtime.shutdown_background();
    std::process::exit(code);
}
