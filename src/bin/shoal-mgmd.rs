fn main() {
    shoal_mgmd::main_entry()
}
