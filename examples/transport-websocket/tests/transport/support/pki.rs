//! rustls configs for a `localhost` / `127.0.0.1` server and a client trusting it, issued by a
//! fresh CA from the shared test PKI.

use std::sync::Arc;

use switchyard_test_support::TestCa;

/// A server config presenting a certificate from a fresh CA, and a client config trusting
/// exactly that CA.
#[derive(Clone, Debug)]
pub struct Pki {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

impl Pki {
    pub fn new() -> Self {
        let ca = TestCa::new("switchyard test ca");
        Self {
            server: ca.server().rustls_server(),
            client: ca.rustls_client(),
        }
    }
}
