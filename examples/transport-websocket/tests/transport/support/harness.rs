//! The conformance kit's harness: a `WsServer` over the kit's core, and workers built with the
//! crate's own client, each behind a relay so the kit can freeze or sever it.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use switchyard_core::testkit::{
    self, BoxError, ConformanceWorker, Handler, HarnessError, TaskCall, TransportHarness,
    WorkerSpec,
};
use switchyard_core::{Core, TaskResult, WorkerId};
use switchyard_test_support::TcpRelay;
use switchyard_transport_websocket::client::WsLinkError;
use switchyard_transport_websocket::{
    ActivityContext, ActivityError, ActivityHandler, CloseCode, WsServer, WsServerConfig, WsWorker,
};
use tokio::task::JoinHandle;

use super::pki::Pki;

/// Runs the kit over `ws://`, or over `wss://` with a test PKI.
#[derive(Clone, Debug)]
pub struct WsHarness {
    tls: Option<Pki>,
}

impl WsHarness {
    pub fn plain() -> Self {
        Self { tls: None }
    }

    pub fn tls() -> Self {
        Self {
            tls: Some(Pki::new()),
        }
    }
}

/// The running gateway side, and the token it issued to each of the kit's callers.
pub struct KitGateway {
    server: WsServer,
    tokens: HashMap<String, String>,
}

/// A connected worker: its client running on a task, behind its relay.
pub struct KitWorker {
    id: WorkerId,
    relay: TcpRelay,
    run: JoinHandle<()>,
}

impl Drop for KitWorker {
    fn drop(&mut self) {
        self.run.abort();
    }
}

impl ConformanceWorker for KitWorker {
    fn worker_id(&self) -> WorkerId {
        self.id
    }

    fn sever(&self) {
        self.run.abort();
        self.relay.sever();
    }

    fn freeze(&self) {
        self.relay.freeze();
    }

    // `break_link` keeps its default, `sever`: the client does not reconnect, so a worker
    // whose link breaks is gone for good.
}

#[async_trait]
impl TransportHarness for WsHarness {
    type Gateway = KitGateway;
    type Worker = KitWorker;

    async fn start(&self, core: Core) -> Result<KitGateway, BoxError> {
        let mut table = switchyard_auth::CallerTable::new();
        let mut tokens = HashMap::new();
        for (i, caller) in testkit::callers().into_iter().enumerate() {
            let token = format!("kit-token-{i}");
            tokens.insert(caller.principal.clone(), token.clone());
            table = table.with_token(token, caller);
        }
        let config = WsServerConfig {
            tls: self.tls.as_ref().map(|pki| Arc::clone(&pki.server)),
            ..WsServerConfig::default()
        };
        let server = WsServer::bind("127.0.0.1:0", core, Arc::new(table), config).await?;
        Ok(KitGateway { server, tokens })
    }

    async fn connect(
        &self,
        gateway: &KitGateway,
        spec: WorkerSpec,
    ) -> Result<KitWorker, HarnessError> {
        let token = gateway.tokens.get(&spec.caller.principal).ok_or_else(|| {
            HarnessError::Transport(format!("no token for {}", spec.caller.principal).into())
        })?;
        let relay = TcpRelay::start(gateway.server.local_addr())
            .await
            .map_err(|error| HarnessError::Transport(error.into()))?;
        let scheme = if self.tls.is_some() { "wss" } else { "ws" };
        let registration = spec.registration;
        let mut builder = WsWorker::builder(format!("{scheme}://127.0.0.1:{}/", relay.port()))
            .namespaces(registration.namespaces)
            .task_queue(registration.task_queue)
            .identity(registration.identity)
            .max_concurrency(registration.max_concurrency.unwrap_or(0))
            .token(token.as_str());
        if let Some(node) = registration.node {
            builder = builder.node(node.as_str());
        }
        for activity in registration.activity_types {
            builder = builder.activity(activity, kit_handler(spec.handler.clone()));
        }
        if let Some(pki) = &self.tls {
            builder = builder.tls(Arc::clone(&pki.client));
        }
        // `registration.reconnect_grace` is not carried: this protocol has no sessions (see
        // `supports_resume`), so a worker asking for one registers without.
        let worker = builder.connect().await.map_err(refusal)?;
        let id = worker.worker_id();
        let run = tokio::spawn(async move {
            if let Err(error) = worker.run().await {
                tracing::debug!(%error, "kit worker ended");
            }
        });
        Ok(KitWorker { id, relay, run })
    }

    /// This example protocol has no resume: the kit checks that a worker whose link breaks
    /// leaves at once and its task moves.
    fn supports_resume(&self) -> bool {
        false
    }
}

/// The kit's view of a failed connect: a refusal with the family its close code reports.
fn refusal(error: WsLinkError) -> HarnessError {
    if let WsLinkError::Invalid(_) = &error {
        // The worker runtime refuses what the gate would, before dialling.
        return HarnessError::Refused {
            kind: switchyard_core::RefusalKind::Invalid,
            message: error.to_string(),
        };
    }
    match error.close_code().and_then(CloseCode::refusal_kind) {
        Some(kind) => HarnessError::Refused {
            kind,
            message: match error {
                WsLinkError::Refused { message, .. } => message,
                other => other.to_string(),
            },
        },
        None => HarnessError::Transport(Box::new(error)),
    }
}

/// The kit's handler as a client activity handler.
pub fn kit_handler(handler: Handler) -> impl ActivityHandler {
    move |context: ActivityContext, input: Bytes| {
        let call = TaskCall {
            activity_type: context.activity_type().to_owned(),
            input,
            cancelled: context.cancellation().clone(),
        };
        let running = handler.call(call);
        async move {
            match running.await {
                TaskResult::Success(output) => Ok(output),
                TaskResult::Failure {
                    message,
                    retryable: true,
                } => Err(ActivityError::retryable(message)),
                TaskResult::Failure { message, .. } => Err(ActivityError::fatal(message)),
            }
        }
    }
}
