//! vgpud's REST client (vgpu-api's blocking one) from async code.

use std::sync::Arc;

use vgpu_api::client::{Client, ClientError};

/// The local vgpud.
#[derive(Clone, Debug)]
pub struct Vgpud {
    client: Arc<Client>,
}

impl Vgpud {
    pub fn new(client: Client) -> Self {
        Self {
            client: Arc::new(client),
        }
    }

    /// Runs `f` with the client on a blocking thread.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Client) -> Result<T, ClientError> + Send + 'static,
    ) -> Result<T, ClientError> {
        let c = self.client.clone();
        match tokio::task::spawn_blocking(move || f(&c)).await {
            Ok(r) => r,
            Err(e) => Err(ClientError::Protocol(format!(
                "the request to vgpud did not finish: {e}"
            ))),
        }
    }
}

/// Whether an error means the vGPU is gone already (a delete that finds nothing to do).
pub fn gone(e: &ClientError) -> bool {
    e.status() == Some(404)
}
