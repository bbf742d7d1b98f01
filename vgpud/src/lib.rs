//! The host daemon, vgpud: state, placement, process supervision, REST handlers, metrics.
//!
//! - [`daemon`]: vgpud itself.
//! - [`openapi`]: the API's OpenAPI document (from the daemon's router).
//! - [`api`], [`control`], [`units`]: `vgpu_api`'s modules under the paths the daemon
//!   uses.

/// The REST API's types (`vgpu_api::api`) and the document they make up.
pub mod api {
    pub use crate::openapi::openapi_json;
    pub use vgpu_api::api::*;
}
pub use vgpu_api::{control, units};

pub mod daemon;
pub mod openapi;

#[cfg(test)]
mod tests {
    #[test]
    fn clients_find_the_daemon_where_it_listens_by_default() {
        assert_eq!(
            vgpu_api::client::default_socket().ok(),
            crate::daemon::default_socket().ok()
        );
    }
}
