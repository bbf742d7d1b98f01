//! The kubelet's gRPC APIs, generated at build time from the vendored protos (proto/,
//! versions in proto/README.md).

#![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]

/// Device plugin API v1beta1: `Registration` (the kubelet's) and `DevicePlugin` (ours).
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// PodResources API v1: what the kubelet's pods hold.
pub mod podresources {
    tonic::include_proto!("v1");
}

/// DRA kubelet plugin API v1: `DRAPlugin` (ours).
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Kubelet plugin registration v1 (`plugins_registry/`): `Registration` (ours).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}
