fn main() {
    shoal_sqlnode::main_entry()
}
