//! Request bodies and error answers: a body read within a deadline and a size limit,
//! parsed strictly (an object where the spec says object, errors naming the field), and
//! a JSON error body on every error answer, whoever produced it.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;

use super::super::error::ApiError;

/// Largest request body.
pub(super) const MAX_BODY: usize = 1 << 20;
/// How long a client may take to send a request body.
pub(super) const BODY_DEADLINE: Duration = Duration::from_secs(10);
/// Largest error text taken over from a response that had no JSON body.
const MAX_TEXT: usize = 1024;

/// A JSON body whose errors name the field at fault; an object wherever the spec says
/// object.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + ToSchema> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_body(req, state).await?;
        parse_object(&bytes).map(ApiJson)
    }
}

/// A raw body, read within [`BODY_DEADLINE`] and [`MAX_BODY`].
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        read_body(req, state).await.map(RawBody)
    }
}

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(BODY_DEADLINE, Bytes::from_request(req, state)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::bad_body(format!(
            "cannot read the request body ({e}); send at most {} KiB of JSON",
            MAX_BODY / 1024
        ))),
        Err(_) => Err(ApiError::timeout(format!(
            "the request body did not arrive within {} s; send the whole body at once",
            BODY_DEADLINE.as_secs()
        ))),
    }
}

fn too_large() -> ApiError {
    ApiError::too_large(format!(
        "the request body is larger than {} KiB; the API's requests are small JSON objects",
        MAX_BODY / 1024
    ))
}

/// Refuses a body announced larger than [`MAX_BODY`] before reading any of it, and gives
/// every error answer a JSON body (`{error, field}`), keeping its headers (`Allow` on a
/// 405). An error answer about the request's framing closes the connection.
pub(super) async fn strict(req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return closing(too_large().into_response());
    }
    let method = req.method().clone();
    let r = next.run(req).await;
    let status = r.status();
    let r = if status.is_client_error() || status.is_server_error() {
        json_error(r, &method).await
    } else {
        r
    };
    if matches!(
        status,
        StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
    ) {
        closing(r)
    } else {
        r
    }
}

fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// An error answer with a JSON body: as it is when it has one, else its text (or its
/// status's name) as `error`.
async fn json_error(r: Response, method: &axum::http::Method) -> Response {
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let text = match axum::body::to_bytes(body, MAX_TEXT).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => String::new(),
    };
    let error = match (parts.status, text.is_empty()) {
        (StatusCode::METHOD_NOT_ALLOWED, _) => ApiError::method_not_allowed(format!(
            "this path does not take {method}; the Allow header lists the methods it takes (see docs/api.md)"
        )),
        (status, true) => ApiError::status(
            status,
            status.canonical_reason().unwrap_or("error").to_owned(),
        ),
        (status, false) => ApiError::status(status, text),
    };
    let fresh = error.into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let (_, body) = fresh.into_parts();
    Response::from_parts(parts, Body::new(body))
}

/// Parses a request body that must be the object `T` (an array or a scalar where the
/// spec says object is refused, naming what was expected), errors naming the field.
pub fn parse_object<T: DeserializeOwned + ToSchema>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
        let name = T::name();
        let schema = Value::String(format!("#/components/schemas/{name}"));
        let schema = serde_json::json!({ "$ref": schema });
        if let Some((path, want)) = misshapen(spec(), &schema, &v, String::new()) {
            let got = kind_of(&v_at(&v, &path));
            return Err(if path.is_empty() {
                ApiError::bad_body(format!(
                    "the body is {got}; send a JSON object ({want}, see docs/api.md)"
                ))
            } else {
                ApiError::bad(
                    &path,
                    format!("{path} is {got}; give a JSON object ({want}, see docs/api.md)"),
                )
            });
        }
    }
    parse_json(bytes)
}

/// The OpenAPI document as JSON, parsed once.
fn spec() -> &'static Value {
    static SPEC: OnceLock<Value> = OnceLock::new();
    SPEC.get_or_init(|| serde_json::from_str(&crate::openapi::openapi_json()).unwrap_or_default())
}

/// The value at dotted `path` (with `[i]` for array items) inside `v`.
fn v_at(v: &Value, path: &str) -> Value {
    let mut cur = v;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, index) = match part.split_once('[') {
            Some((k, i)) => (k, i.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        cur = match cur.get(key) {
            Some(c) => c,
            None => return Value::Null,
        };
        if let Some(i) = index {
            cur = match cur.get(i) {
                Some(c) => c,
                None => return Value::Null,
            };
        }
    }
    cur.clone()
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "a JSON array",
        Value::Object(_) => "a JSON object",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    }
}

/// Where `v` is not an object although `schema` says object: (the path, the schema's
/// name). Only that shape is judged here; the rest is serde's.
fn misshapen(spec: &Value, schema: &Value, v: &Value, path: String) -> Option<(String, String)> {
    let mut schema = schema;
    let mut name = String::from("an object");
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let n = r.rsplit('/').next().unwrap_or(r);
        name = n.to_owned();
        schema = spec.pointer(&format!("/components/schemas/{n}"))?;
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = schema.get(key).and_then(Value::as_array) {
            let mut first = None;
            for alt in alts {
                match misshapen(spec, alt, v, path.clone()) {
                    None if allows(alt, v) || alt.get("$ref").is_some() => return None,
                    None => {}
                    Some(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            return first;
        }
    }
    if let Some(alts) = schema.get("allOf").and_then(Value::as_array) {
        return alts
            .iter()
            .find_map(|alt| misshapen(spec, alt, v, path.clone()));
    }
    let wants_object = types(schema).contains(&"object") || schema.get("properties").is_some();
    match v {
        Value::Object(map) => {
            let props = schema.get("properties")?;
            map.iter().find_map(|(k, item)| {
                let sub = props.get(k)?;
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                misshapen(spec, sub, item, p)
            })
        }
        Value::Array(items) if types(schema).contains(&"array") => {
            let sub = schema.get("items")?;
            items
                .iter()
                .enumerate()
                .find_map(|(i, item)| misshapen(spec, sub, item, format!("{path}[{i}]")))
        }
        Value::Null if types(schema).contains(&"null") => None,
        _ if wants_object => Some((path, name)),
        _ => None,
    }
}

/// The JSON types a schema names.
fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Whether `schema` (no reference) names `v`'s type, or names none.
fn allows(schema: &Value, v: &Value) -> bool {
    let ts = types(schema);
    let t = match v {
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
    };
    ts.is_empty() || ts.contains(&t) || (t == "number" && ts.contains(&"integer"))
}

/// Parses a request body, mapping serde's error to `{error, field}`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_body(
            "the request body is empty; send a JSON object (see docs/api.md)",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        // Trailing garbage after the object is malformed JSON too.
        Ok(v) => match de.end() {
            Ok(()) => Ok(v),
            Err(e) => Err(ApiError::bad_body(format!(
                "{e}; the body must be one well-formed JSON object"
            ))),
        },
        Err(e) => {
            let inner = e.inner();
            let msg = inner.to_string();
            let mut path = e.path().to_string();
            if path == "." || path == "?" {
                path.clear();
            }
            // serde names a missing or unknown field in backticks; the path stops at its parent
            // for a missing one.
            if msg.starts_with("missing field `") {
                if let Some(name) = msg.split('`').nth(1) {
                    path = if path.is_empty() {
                        name.to_owned()
                    } else {
                        format!("{path}.{name}")
                    };
                }
            }
            let hint = if msg.starts_with("unknown field") {
                "; remove it (see docs/api.md for the fields)"
            } else if inner.is_syntax() || inner.is_eof() {
                "; the body must be one well-formed JSON object"
            } else {
                ""
            };
            let error = format!("{msg}{hint}");
            Err(if path.is_empty() {
                ApiError::bad_body(error)
            } else {
                ApiError::bad(&path, error)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MigrateRequest, VgpuCreate, VgpuPatch, VmCreate};

    #[test]
    fn arrays_and_scalars_are_refused_where_an_object_is_expected() {
        let e = parse_object::<VgpuCreate>(b"[0,16777216,0.1]").expect_err("array");
        assert_eq!(
            (e.status, e.field.as_deref()),
            (StatusCode::BAD_REQUEST, None)
        );
        assert!(
            e.error.contains("a JSON array") && e.error.contains("VgpuCreate"),
            "{e}"
        );
        let e = parse_object::<VgpuPatch>(b"0.5").expect_err("scalar");
        assert!(
            e.error.contains("a number") && e.error.contains("VgpuPatch"),
            "{e}"
        );
        let e = parse_object::<VmCreate>(br#"{"payload": "/x", "vgpu": [null, 1, 0.1]}"#)
            .expect_err("nested array");
        assert_eq!(e.field.as_deref(), Some("vgpu"), "{e}");
        let e = parse_object::<VgpuCreate>(
            br#"{"memory_bytes": 1, "compute_share": 0.1, "storage": [[1, "/f", true]]}"#,
        )
        .expect_err("array as a storage attachment");
        assert_eq!(e.field.as_deref(), Some("storage[0]"), "{e}");
        let e = parse_object::<MigrateRequest>(b"[1]").expect_err("array");
        assert!(e.error.contains("MigrateRequest"), "{e}");
        // Objects, nulls and lists where lists belong pass on to serde.
        let ok: VmCreate =
            parse_object(br#"{"payload": "/x", "vgpu": null}"#).expect("null nested object");
        assert!(ok.vgpu.is_none());
        let ok: VgpuCreate = parse_object(
            br#"{"memory_bytes": 1, "compute_share": 0.1, "storage": [{"namespace": 1, "path": "/f"}]}"#,
        )
        .expect("valid");
        assert_eq!(ok.storage.len(), 1);
        let e = parse_object::<VgpuCreate>(br#"{"memory_bytes": "x", "compute_share": 0.1}"#)
            .expect_err("serde's error");
        assert_eq!(e.field.as_deref(), Some("memory_bytes"));
    }
}
