//! Generates the gRPC code of the vendored kubelet APIs (proto/, see proto/README.md) with
//! the protoc that the `protoc-bin-vendored` crate ships, so a build needs no protoc
//! installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = tonic_build::Config::new();
    config.protoc_executable(protoc);
    let protos = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos_with_config(config, &protos, &["proto"])?;
    Ok(())
}
