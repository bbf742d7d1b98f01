//! The cdylib carries the real libcuda's SONAME, so programs linked with `-lcuda` against
//! the installed library ask for `libcuda.so.1` at run time, as they do with NVIDIA's.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
