fn main() {
    shoal_datanode::main_entry()
}
