//! The API server, reached over plain HTTP (a `kubectl proxy` beside the agent, which adds
//! the service account's credentials and TLS): the DRA driver reads ResourceClaims and
//! writes ResourceSlices through it. One request per connection, HTTP/1.0, JSON bodies.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Why a request to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("the API server at {0} cannot be reached: {1} (is `kubectl proxy` running beside the agent?)")]
    Unreachable(String, std::io::Error),
    #[error("the API server answered {status} to {method} {path}: {body}")]
    Status {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("the API server's answer to {0} is not what Kubernetes sends: {1}")]
    Protocol(String, String),
}

impl KubeError {
    pub fn status(&self) -> Option<u16> {
        match self {
            KubeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The API server at `host:port`.
#[derive(Clone, Debug)]
pub struct KubeApi {
    addr: String,
}

impl KubeApi {
    /// `http://127.0.0.1:8001` or `127.0.0.1:8001`.
    pub fn new(url: &str) -> Result<Self, String> {
        let addr = url
            .strip_prefix("http://")
            .unwrap_or(url)
            .trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') || !addr.contains(':') {
            return Err(format!(
                "{url:?} is not an API server address; give http://HOST:PORT (e.g. kubectl proxy's http://127.0.0.1:8001)"
            ));
        }
        Ok(Self {
            addr: addr.to_owned(),
        })
    }

    /// One request; a 2xx answer's body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Vec<u8>, KubeError> {
        let unreachable = |e| KubeError::Unreachable(self.addr.clone(), e);
        let mut s = TcpStream::connect(&self.addr).map_err(unreachable)?;
        let t = Some(Duration::from_secs(10));
        s.set_read_timeout(t).map_err(unreachable)?;
        s.set_write_timeout(t).map_err(unreachable)?;
        let body = body.unwrap_or(&[]);
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        s.write_all(head.as_bytes()).map_err(unreachable)?;
        s.write_all(body).map_err(unreachable)?;
        let mut raw = Vec::new();
        s.take(64 << 20)
            .read_to_end(&mut raw)
            .map_err(unreachable)?;
        let proto = |why: &str| KubeError::Protocol(format!("{method} {path}"), why.to_owned());
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| proto("no end of headers"))?;
        let head = String::from_utf8_lossy(&raw[..split]);
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| proto("no status line"))?;
        let body = raw[split + 4..].to_vec();
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(KubeError::Status {
                method: method.into(),
                path: path.into(),
                status,
                body: String::from_utf8_lossy(&body).chars().take(500).collect(),
            })
        }
    }

    /// GET `path` as `T`.
    pub fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, KubeError> {
        let body = self.request("GET", path, None)?;
        serde_json::from_slice(&body)
            .map_err(|e| KubeError::Protocol(format!("GET {path}"), e.to_string()))
    }
}
