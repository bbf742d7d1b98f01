//! The API's OpenAPI document, generated from the daemon's router (`daemon::http`) and the
//! schemas in `vgpu_api::api`.

pub use crate::daemon::http::{openapi, openapi_json};
