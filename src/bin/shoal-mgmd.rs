// Every node allocates a row, a message or a key per request; glibc's malloc took a fifth of
// the CPU under load (perf), mimalloc's thread-local free lists much less.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    shoal_mgmd::main_entry()
}
