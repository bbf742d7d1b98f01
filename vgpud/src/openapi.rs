//! The API's OpenAPI document, generated from the daemon's router and the schemas in
//! `vgpu_api::api`.

/// The OpenAPI document of the API, pretty-printed JSON with a trailing newline (what
/// `vgpud --print-openapi` prints and docs/openapi.json holds).
pub fn openapi_json() -> String {
    let mut s = crate::daemon::http::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()));
    s.push('\n');
    s
}
