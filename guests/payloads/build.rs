//! Link settings for the payload binaries. They live here rather than in
//! .cargo/config.toml because the linker script needs an absolute path, and cargo only
//! resolves the package directory for build scripts.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rerun-if-changed=build.rs");
    // rust-lld links x86_64-unknown-none images directly: no C runtime, no libc. The
    // script fixes the load address (docs/payload-abi.md).
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
    println!("cargo:rustc-link-arg-bins=--build-id=none");
}
