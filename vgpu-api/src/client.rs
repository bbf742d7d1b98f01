//! A small blocking HTTP/1.1 client for the vgpud API over its unix socket or TCP (with a
//! bearer token): what vgpuctl, the demo and the tests use. One connection per request
//! (`Connection: close`); responses are parsed strictly into the API's types, which reject
//! unknown fields, so a response that drifts from the schema is an error.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use crate::api::ErrorBody;
use crate::api::{Gpu, MigrateRequest, Vgpu, VgpuCreate, VgpuPatch, VgpuStats, Vm, VmCreate};

/// Where the daemon listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket path.
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "http://{a}"),
        }
    }
}

impl Endpoint {
    /// `http://127.0.0.1:7070` (or `127.0.0.1:7070`) as a TCP endpoint.
    pub fn from_url(url: &str) -> Result<Self, ClientError> {
        let rest = url.strip_prefix("http://").unwrap_or(url);
        let host = rest.trim_end_matches('/');
        if host.is_empty() || host.contains('/') || !host.contains(':') {
            return Err(ClientError::Usage(format!(
                "{url:?} is not a daemon URL; write http://HOST:PORT (https is not served)"
            )));
        }
        Ok(Endpoint::Tcp(host.to_owned()))
    }
}

/// Root's default directory for vgpud's socket and state: no other user can create it
/// first (`/run` is root's).
pub const ROOT_DIR: &str = "/run/vgpud";

/// vgpud's default directory for this user: [`ROOT_DIR`] for root, else
/// `$XDG_RUNTIME_DIR/vgpud` (a directory only this user can write in). Never a shared
/// directory such as `/tmp`, where another user could have made it first.
pub fn default_dir() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(PathBuf::from(ROOT_DIR));
    }
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(d) if d.is_absolute() => Ok(d.join("vgpud")),
        _ => Err(
            "XDG_RUNTIME_DIR is not set to a directory (as under sudo, su or cron), and \
                  only root has a default outside it: log in as this user, or name the socket \
                  with --socket (and --state-dir for vgpud)"
                .into(),
        ),
    }
}

/// Where vgpud listens unless told otherwise: `vgpud.sock` in [`default_dir`]. Refused
/// when that directory exists but is owned by someone other than the caller or root, or
/// others may write in it: the socket there may be another user's, posing as vgpud.
pub fn default_socket() -> Result<PathBuf, ClientError> {
    let dir = default_dir().map_err(ClientError::Usage)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    check_socket_dir(&dir, unsafe { libc::geteuid() })?;
    Ok(dir.join("vgpud.sock"))
}

/// Whether a client running as `uid` may trust a socket in `dir`: the directory is the
/// caller's or root's and no one else may write in it. A missing directory is fine
/// (nothing listens there).
pub fn check_socket_dir(dir: &Path, uid: u32) -> Result<(), ClientError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(ClientError::Usage(format!(
                "cannot check vgpud's directory {}: {e}",
                dir.display()
            )))
        }
    };
    let owner = meta.uid();
    if owner != uid && owner != 0 {
        return Err(ClientError::Usage(format!(
            "refusing vgpud's socket in {}: the directory belongs to uid {owner}, not to you \
             (uid {uid}) or root, so its socket may be another user's; remove the directory, \
             or name the socket with --socket",
            dir.display()
        )));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(ClientError::Usage(format!(
            "refusing vgpud's socket in {}: others may write in that directory (mode \
             {mode:04o}), so its socket may be another user's; run `chmod 700 {}`",
            dir.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// Why a request failed. The messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("vgpud is not running at {endpoint} ({why}); start it with `vgpud`, or point --socket/--url at it")]
    NotRunning { endpoint: String, why: String },
    #[error("{}", api_message(*status, body))]
    Api { status: u16, body: ErrorBody },
    #[error("talking to vgpud at {endpoint}: {why}")]
    Io { endpoint: String, why: String },
    #[error("vgpud answered something unexpected: {0}")]
    Protocol(String),
    #[error("{0}")]
    Usage(String),
}

fn api_message(status: u16, body: &ErrorBody) -> String {
    match &body.field {
        Some(f) => format!("vgpud refused ({status}, field `{f}`): {}", body.error),
        None => format!("vgpud refused ({status}): {}", body.error),
    }
}

impl ClientError {
    /// The HTTP status for API errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The error body for API errors.
    pub fn body(&self) -> Option<&ErrorBody> {
        match self {
            ClientError::Api { body, .. } => Some(body),
            _ => None,
        }
    }
}

/// A raw answer.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// A vgpud API client.
#[derive(Clone, Debug)]
pub struct Client {
    endpoint: Endpoint,
    token: Option<String>,
    timeout: Duration,
}

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

impl Client {
    /// A client for `endpoint`, sending `token` as a bearer token when given.
    pub fn new(endpoint: Endpoint, token: Option<String>) -> Self {
        Self {
            endpoint,
            token,
            timeout: Duration::from_secs(30),
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn connect(&self) -> Result<Box<dyn Stream>, ClientError> {
        let not_running = |e: std::io::Error| ClientError::NotRunning {
            endpoint: self.endpoint.to_string(),
            why: e.to_string(),
        };
        let io = |e: std::io::Error| ClientError::Io {
            endpoint: self.endpoint.to_string(),
            why: e.to_string(),
        };
        Ok(match &self.endpoint {
            Endpoint::Unix(p) => {
                let s = UnixStream::connect(p).map_err(not_running)?;
                s.set_read_timeout(Some(self.timeout)).map_err(io)?;
                s.set_write_timeout(Some(self.timeout)).map_err(io)?;
                Box::new(s)
            }
            Endpoint::Tcp(a) => {
                let s = TcpStream::connect(a).map_err(not_running)?;
                s.set_read_timeout(Some(self.timeout)).map_err(io)?;
                s.set_write_timeout(Some(self.timeout)).map_err(io)?;
                Box::new(s)
            }
        })
    }

    /// Sends one request; any status comes back as a [`Reply`].
    pub fn raw(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Reply, ClientError> {
        let mut s = self.connect()?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: */*\r\n"
        );
        if let Some(t) = &self.token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        let body = body.unwrap_or(&[]);
        if !body.is_empty() || matches!(method, "POST" | "PATCH" | "PUT") {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        let io = |e: std::io::Error| ClientError::Io {
            endpoint: self.endpoint.to_string(),
            why: e.to_string(),
        };
        s.write_all(req.as_bytes()).map_err(io)?;
        s.write_all(body).map_err(io)?;
        s.flush().map_err(io)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).map_err(io)?;
        parse_response(&raw)
    }

    /// Sends a request and decodes a 2xx JSON answer into `T`; other statuses become
    /// [`ClientError::Api`].
    pub fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<T, ClientError> {
        let r = self.checked(method, path, body)?;
        serde_json::from_slice(&r.body).map_err(|e| {
            ClientError::Protocol(format!(
                "{method} {path}: the answer does not match the API schema ({e}): {}",
                String::from_utf8_lossy(&r.body)
            ))
        })
    }

    /// Sends a request; a non-2xx answer becomes [`ClientError::Api`].
    pub fn checked(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Reply, ClientError> {
        let r = self.raw(method, path, body)?;
        if (200..300).contains(&r.status) {
            return Ok(r);
        }
        let body = serde_json::from_slice::<ErrorBody>(&r.body).map_err(|_| {
            ClientError::Protocol(format!(
                "{method} {path}: status {} with a body that is not an error object: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ))
        })?;
        Err(ClientError::Api {
            status: r.status,
            body,
        })
    }

    fn json<B: Serialize>(body: &B) -> Result<Vec<u8>, ClientError> {
        serde_json::to_vec(body)
            .map_err(|e| ClientError::Usage(format!("cannot encode the request: {e}")))
    }

    /// `GET /v1/gpus`
    pub fn gpus(&self) -> Result<Vec<Gpu>, ClientError> {
        self.call("GET", "/v1/gpus", None)
    }

    /// `GET /v1/vgpus`
    pub fn vgpus(&self) -> Result<Vec<Vgpu>, ClientError> {
        self.call("GET", "/v1/vgpus", None)
    }

    /// `GET /v1/vgpus/{id}`
    pub fn vgpu(&self, id: u32) -> Result<Vgpu, ClientError> {
        self.call("GET", &format!("/v1/vgpus/{id}"), None)
    }

    /// `POST /v1/vgpus`
    pub fn create_vgpu(&self, spec: &VgpuCreate) -> Result<Vgpu, ClientError> {
        self.call("POST", "/v1/vgpus", Some(&Self::json(spec)?))
    }

    /// `PATCH /v1/vgpus/{id}`
    pub fn patch_vgpu(&self, id: u32, patch: &VgpuPatch) -> Result<Vgpu, ClientError> {
        self.call(
            "PATCH",
            &format!("/v1/vgpus/{id}"),
            Some(&Self::json(patch)?),
        )
    }

    /// `DELETE /v1/vgpus/{id}`
    pub fn delete_vgpu(&self, id: u32) -> Result<(), ClientError> {
        self.checked("DELETE", &format!("/v1/vgpus/{id}"), None)
            .map(drop)
    }

    /// `GET /v1/vgpus/{id}/stats`
    pub fn vgpu_stats(&self, id: u32) -> Result<VgpuStats, ClientError> {
        self.call("GET", &format!("/v1/vgpus/{id}/stats"), None)
    }

    /// `POST /v1/vgpus/{id}/migrate`
    pub fn migrate_vgpu(
        &self,
        id: u32,
        req: &MigrateRequest,
    ) -> Result<crate::api::Migration, ClientError> {
        self.call(
            "POST",
            &format!("/v1/vgpus/{id}/migrate"),
            Some(&Self::json(req)?),
        )
    }

    /// `GET /v1/migrations/{id}`
    pub fn migration(&self, id: u32) -> Result<crate::api::Migration, ClientError> {
        self.call("GET", &format!("/v1/migrations/{id}"), None)
    }

    /// `POST /v1/vms/{id}/migrate` with a destination: the whole VM moves to another
    /// vgpud (follow it with [`Client::wait_migration`]).
    pub fn migrate_vm_to(
        &self,
        id: u32,
        req: &crate::api::VmMigrateRequest,
    ) -> Result<crate::api::Migration, ClientError> {
        let body = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.call("POST", &format!("/v1/vms/{id}/migrate"), Some(&body))
    }

    /// `GET /v1/migrations`
    pub fn migrations(&self) -> Result<Vec<crate::api::Migration>, ClientError> {
        self.call("GET", "/v1/migrations", None)
    }

    /// Polls migration `id` until it completes or fails (or `timeout`); `each` sees every
    /// state polled.
    pub fn wait_migration(
        &self,
        id: u32,
        timeout: Duration,
        mut each: impl FnMut(&crate::api::Migration),
    ) -> Result<crate::api::Migration, ClientError> {
        let start = std::time::Instant::now();
        loop {
            let m = self.migration(id)?;
            each(&m);
            if m.state != "running" {
                return Ok(m);
            }
            if start.elapsed() > timeout {
                return Err(ClientError::Usage(format!(
                    "migration {id} still runs after {} s",
                    timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET /v1/shm`
    pub fn shm(&self) -> Result<Vec<crate::api::ShmObject>, ClientError> {
        self.call("GET", "/v1/shm", None)
    }

    /// `GET /v1/vms`
    pub fn vms(&self) -> Result<Vec<Vm>, ClientError> {
        self.call("GET", "/v1/vms", None)
    }

    /// `GET /v1/vms/{id}`
    pub fn vm(&self, id: u32) -> Result<Vm, ClientError> {
        self.call("GET", &format!("/v1/vms/{id}"), None)
    }

    /// `POST /v1/vms`
    pub fn create_vm(&self, req: &VmCreate) -> Result<Vm, ClientError> {
        self.call("POST", "/v1/vms", Some(&Self::json(req)?))
    }

    /// `DELETE /v1/vms/{id}`
    pub fn delete_vm(&self, id: u32) -> Result<(), ClientError> {
        self.checked("DELETE", &format!("/v1/vms/{id}"), None)
            .map(drop)
    }

    /// `GET /v1/vms/{id}/console?offset=N`
    pub fn console(&self, id: u32, offset: u64) -> Result<Vec<u8>, ClientError> {
        self.checked(
            "GET",
            &format!("/v1/vms/{id}/console?offset={offset}"),
            None,
        )
        .map(|r| r.body)
    }

    /// `POST /v1/vms/{id}/migrate`
    pub fn migrate_vm(
        &self,
        id: u32,
        req: &MigrateRequest,
    ) -> Result<crate::api::Migration, ClientError> {
        self.call(
            "POST",
            &format!("/v1/vms/{id}/migrate"),
            Some(&Self::json(req)?),
        )
    }

    /// `GET /metrics`
    pub fn metrics(&self) -> Result<String, ClientError> {
        self.checked("GET", "/metrics", None)
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
    }

    /// Polls until VM `id` is no longer starting or running, at most `timeout`.
    pub fn wait_vm(&self, id: u32, timeout: Duration) -> Result<Vm, ClientError> {
        let start = std::time::Instant::now();
        loop {
            let vm = self.vm(id)?;
            if !vm.state.is_live() || start.elapsed() >= timeout {
                return Ok(vm);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses a whole HTTP/1.1 response (the connection was closed after it).
pub fn parse_response(raw: &[u8]) -> Result<Reply, ClientError> {
    let bad = |why: &str| ClientError::Protocol(format!("malformed HTTP response: {why}"));
    let end = find(raw, b"\r\n\r\n").ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| bad("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
    let mut content_type = String::new();
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim().to_ascii_lowercase().as_str() {
            "content-type" => content_type = v.to_owned(),
            "content-length" => length = v.parse::<usize>().ok(),
            "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
            _ => {}
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let nl = find(&rest[pos..], b"\r\n").ok_or_else(|| bad("truncated chunk size"))?;
            let size_str =
                std::str::from_utf8(&rest[pos..pos + nl]).map_err(|_| bad("chunk size"))?;
            let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("chunk size"))?;
            pos += nl + 2;
            if size == 0 {
                break;
            }
            let chunk = rest
                .get(pos..pos + size)
                .ok_or_else(|| bad("truncated chunk"))?;
            out.extend_from_slice(chunk);
            pos += size + 2;
        }
        out
    } else if let Some(n) = length {
        rest.get(..n)
            .ok_or_else(|| bad("body shorter than Content-Length"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Reply {
        status,
        content_type,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A non-root user whose `$XDG_RUNTIME_DIR/vgpud` another user made: vgpuctl refuses
    /// the socket there; its own and root's directories are trusted.
    #[test]
    fn a_socket_directory_of_another_user_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("vgpu-api-dir-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        assert!(check_socket_dir(&dir, me).is_ok());
        assert!(check_socket_dir(&dir.join("missing"), me).is_ok());
        if me == 0 {
            // The directory is root's: trusted by any caller.
            assert!(check_socket_dir(&dir, 1000).is_ok());
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown");
            let e = check_socket_dir(&dir, 1000).expect_err("another user's directory");
            assert!(e.to_string().contains("uid 65534"), "{e}");
            assert!(check_socket_dir(&dir, 65534).is_ok());
            std::os::unix::fs::chown(&dir, Some(0), Some(0)).expect("chown");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = check_socket_dir(&dir, me).expect_err("open to others");
        assert!(e.to_string().contains("chmod 700"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn parses_plain_and_chunked_responses() {
        let r = parse_response(b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}").expect("plain");
        assert_eq!((r.status, r.body.as_slice()), (201, &b"{}"[..]));
        assert_eq!(r.content_type, "application/json");
        let r = parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").expect("chunked");
        assert_eq!(r.body, b"abcde");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn urls() {
        assert_eq!(
            Endpoint::from_url("http://127.0.0.1:7070/").expect("url"),
            Endpoint::Tcp("127.0.0.1:7070".into())
        );
        assert!(Endpoint::from_url("https://x").is_err());
        assert!(Endpoint::from_url("http://host/path").is_err());
    }

    #[test]
    fn a_missing_daemon_is_named() {
        let c = Client::new(Endpoint::Unix("/nonexistent/vgpud.sock".into()), None);
        let e = c.gpus().expect_err("no daemon");
        assert!(e.to_string().contains("vgpud is not running"), "{e}");
    }
}
