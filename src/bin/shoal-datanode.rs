// mimalloc (see `shoal_proto::alloc`).
#[global_allocator]
static GLOBAL: shoal_proto::alloc::Allocator = shoal_proto::alloc::Allocator;

fn main() {
    shoal_datanode::main_entry()
}
