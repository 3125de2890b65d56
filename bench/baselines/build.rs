//! Compiles `proto/baseline.proto` with protox (pure Rust, no `protoc`), as `proto/` of the
//! main workspace does.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["proto/baseline.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
