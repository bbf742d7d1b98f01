//! Errors: the REST API's (status + JSON body naming the field) and the daemon's own.

use std::path::PathBuf;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::ErrorBody;

/// An error answer of the REST API.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: String,
    pub field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, field: Option<&str>, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            field: field.map(str::to_owned),
        }
    }

    /// 400: the request is wrong.
    pub fn bad(field: &str, error: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Some(field), error)
    }

    /// 400 without a particular field (malformed body).
    pub fn bad_body(error: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, None, error)
    }

    /// 401 for a credential the request carried for another vgpud (`field` names it),
    /// which refused it.
    pub fn peer_unauthorized(field: &str, error: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, Some(field), error)
    }

    /// 404: no such object.
    pub fn not_found(field: &str, error: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, Some(field), error)
    }

    /// 409: the request conflicts with the state (capacity, an object in use).
    pub fn conflict(field: &str, error: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, Some(field), error)
    }

    /// 405: the path exists, the method does not.
    pub fn method_not_allowed(error: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, Some("method"), error)
    }

    /// 408: the request did not arrive in time.
    pub fn timeout(error: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, None, error)
    }

    /// 413: the request body is larger than the API takes.
    pub fn too_large(error: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, None, error)
    }

    /// Any other error status, with `error` as its message.
    pub fn status(status: StatusCode, error: impl Into<String>) -> Self {
        Self::new(status, None, error)
    }

    /// 501: not built yet.
    pub fn not_implemented(field: Option<&str>, error: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, field, error)
    }

    /// 500: the daemon could not do it (a process would not start, ...).
    pub fn internal(error: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, None, error)
    }

    /// 500: the change is in effect but the state file could not be written, so it would
    /// not survive a vgpud restart until a later save succeeds.
    pub fn unsaved(done: &str, why: &str) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("state_file"),
            format!("{done} and is in effect now, but it is not saved: {why}. The next change that saves successfully saves it too"),
        )
    }

    /// 502: a worker did not do what it was asked.
    pub fn worker(error: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, None, error)
    }

    /// 401: missing or wrong token.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            Some("authorization"),
            "missing or wrong bearer token: send `Authorization: Bearer <token>` with the token from vgpud's --token-file",
        )
    }

    /// 503: the daemon is shutting down.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "vgpud is shutting down; start it again and retry",
        )
    }

    /// Prefixes the field with `prefix.` (errors of a nested object).
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = Some(match self.field {
            Some(f) => format!("{prefix}.{f}"),
            None => prefix.to_owned(),
        });
        self
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.error.clone(),
            field: self.field.clone(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} ({field}): {}", self.status.as_u16(), self.error),
            None => write!(f, "{}: {}", self.status.as_u16(), self.error),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), field = self.field.as_deref(), error = %self.error, "request failed");
        } else {
            tracing::debug!(status = self.status.as_u16(), field = self.field.as_deref(), error = %self.error, "request rejected");
        }
        (self.status, Json(self.body())).into_response()
    }
}

/// Why vgpud could not start or serve. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("another vgpud is already running on the state directory {state_dir} (pid {pid}, serving {socket}); stop it first, or give this one its own --state-dir and --socket")]
    AlreadyRunning {
        state_dir: PathBuf,
        socket: String,
        pid: String,
    },
    #[error("another vgpud is already running on {socket}; stop it first, or give this one its own --socket and --state-dir")]
    SocketInUse { socket: PathBuf },
    #[error("{path}: exists and is not a socket; remove it or pick another --socket")]
    NotASocket { path: PathBuf },
    #[error("cannot create the state directory {path}: {source}; pick a writable --state-dir")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("refusing the {what} {path}: {why}; another user may have made it first or may plant files in it. Give vgpud a directory of its own (mode 0700), or remove this one")]
    SharedDir {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot start the GPU schedulers: {0}")]
    Scheduler(#[from] vgpu_grant::GrantError),
    #[error("refusing to listen on {addr} without a token: a TCP listener needs --token-file (a non-loopback address even more so)")]
    TokenRequired { addr: String },
    #[error("cannot read the token file {path}: {why}")]
    Token { path: PathBuf, why: String },
    #[error("{name} not found at {path}: vgpud starts it from beside its own program; install it there (the vgpu package installs both in /usr/bin; from source: `cargo build -p {package}`), or point {flag} at it")]
    MissingBinary {
        name: &'static str,
        package: &'static str,
        path: PathBuf,
        flag: &'static str,
    },
    #[error("bad option: {0}")]
    Option(String),
    /// The state file cannot be read or set aside (the message says what to do).
    #[error(transparent)]
    State(#[from] super::statefile::StateError),
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
}
