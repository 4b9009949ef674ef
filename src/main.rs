//! The `capn` binary; see `capn --help`.

// jemalloc rather than the system allocator: at 1000 control planes capn spent 29% of its
// CPU in glibc's malloc and free (perf); with jemalloc the same benchmark took 29%
// fewer CPU seconds (51 s against 72 s) and 3% less peak RSS.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// jemalloc's options, read when it starts (`_RJEM_MALLOC_CONF` in the environment overrides
// them): one arena instead of four per CPU, since a controller's few threads contend little,
// and freed pages handed back to the kernel after one second instead of ten (dirty_decay_ms,
// then no muzzy stage). At 1000 control planes: 1.1 MiB less peak RSS and no more CPU
// seconds (hack/bench.sh). A thin pointer to a C string, as jemalloc declares it
// (`const char *malloc_conf`).
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: &[u8; 47] = b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

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
