//! Compiles proto/shoal.proto with protox (pure Rust), so no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/shoal.proto");
    let fds = protox::compile(["proto/shoal.proto"], ["proto"])?;
    // Rows read and encoded keys travel as `Bytes`: decoding slices them out of the received
    // buffer instead of copying each into a Vec of its own.
    tonic_prost_build::configure()
        .bytes(".shoal.v1.OpResult.row_data")
        .bytes(".shoal.v1.Op.key_data")
        .bytes(".shoal.v1.Op.keys")
        .bytes(".shoal.v1.OpResult.rows")
        .bytes(".shoal.v1.OpResult.packed_rows")
        .bytes(".shoal.v1.OpResult.row_ends")
        .compile_fds(fds)?;
    Ok(())
}
