//! State every connection of one listener shares.

use std::sync::Arc;

use switchyard_core::Core;
use tokio_util::sync::CancellationToken;

use crate::config::WsServerConfig;
use switchyard_auth::Authenticate;

/// What every connection of one [`WsServer`](crate::WsServer) reads.
pub(crate) struct ServerState {
    pub(crate) core: Core,
    pub(crate) config: WsServerConfig,
    pub(crate) auth: Arc<dyn Authenticate>,
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// Cancelled when the listener stops accepting: no new connection or registration is
    /// taken; registered workers stay. A child of `stop`.
    pub(crate) accepting: CancellationToken,
    /// Cancelled when the listener closes; every worker socket closes with 1001.
    pub(crate) stop: CancellationToken,
}

impl ServerState {
    pub(crate) fn new(
        core: Core,
        auth: Arc<dyn Authenticate>,
        config: WsServerConfig,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let tls = config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        Arc::new(Self {
            core,
            config,
            auth,
            tls,
            accepting: stop.child_token(),
            stop,
        })
    }
}
