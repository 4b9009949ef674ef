//! The `capn` binary; see `capn --help`.

// jemalloc rather than the system allocator: at 1000 control planes capn spent 29% of its
// CPU in glibc's malloc and free (perf, issue 11); with jemalloc the same benchmark took 29%
// fewer CPU seconds (51 s against 72 s) and 3% less peak RSS.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match capn::cli::main().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
