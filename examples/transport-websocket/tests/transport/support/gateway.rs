//! A core with the kit's fast liveness and a `WsServer` over it, with known tokens.

use std::sync::Arc;

use switchyard_auth::CallerTable;
use switchyard_core::testkit::conformance_config;
use switchyard_core::{CallerIdentity, Core, Registry};
use switchyard_transport_websocket::{WsServer, WsServerConfig};

/// The namespace the test principal is granted.
pub const NAMESPACE: &str = "shop";
/// A token for a principal granted only [`NAMESPACE`].
pub const TOKEN: &str = "shop-token";

pub struct TestGateway {
    pub core: Core,
    pub server: WsServer,
}

impl TestGateway {
    pub async fn start(config: WsServerConfig) -> Self {
        let core = Core::start(Registry::builder(), conformance_config());
        let tokens = CallerTable::new()
            .with_token(TOKEN, CallerIdentity::granted("shop-workers", [NAMESPACE]));
        let server = WsServer::bind("127.0.0.1:0", core.clone(), Arc::new(tokens), config)
            .await
            .expect("bind a loopback listener");
        Self { core, server }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/", self.server.local_addr())
    }
}
