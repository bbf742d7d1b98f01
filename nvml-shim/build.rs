//! The cdylib carries the real libnvidia-ml's SONAME, so programs linked with
//! `-lnvidia-ml` against the installed library ask for `libnvidia-ml.so.1` at run time, as
//! they do with NVIDIA's.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
