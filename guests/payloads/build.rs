//! Link settings for the payload binaries. They live here rather than in
//! .cargo/config.toml because the linker script needs an absolute path, and cargo only
//! resolves the package directory for build scripts.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rerun-if-changed=build.rs");
    // No C runtime, no libc, one static image at a fixed address (docs/payload-abi.md).
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-no-pie",
        "-Wl,--build-id=none",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
}
