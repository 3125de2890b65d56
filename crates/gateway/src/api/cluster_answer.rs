//! The answering side of the cluster-wide views and drains: [`ViewsHandler`] runs another
//! node's call on this node's own API, as the caller the asking node authenticated, and
//! answers with the encoded reply (or the refusal's code and message as the reason).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::BoxFuture;
use prost::Message;
use switchyard_cluster::{AdminCall, AdminHandler};
use switchyard_proto::v1 as pb;
use tonic::Status;

use super::cluster_drain::{self, RemoteDrains};
use super::cluster_views::{
    CallContext, DESCRIBE_POOL, DRAIN_START, DRAIN_STATUS, EXPLAIN_POOL, LIST_WORKERS, OPS,
    UNSERVED_QUEUES, own_part,
};
use super::service::GatewayApi;

/// Answers an operations view (`view`, query string) as this node's JSON; `None` for a view
/// it does not know.
type OpsViews = dyn Fn(&str, &str) -> Option<serde_json::Value> + Send + Sync;

/// The answering side: runs the other nodes' calls on this node's own API.
pub(crate) struct ViewsHandler {
    api: GatewayApi,
    node: String,
    ops: Box<OpsViews>,
    drains: Arc<Mutex<RemoteDrains>>,
}

impl ViewsHandler {
    /// Answers over `api` (a node-local API: its `cluster` is unset) as `node`; `ops` answers
    /// the operations listener's views (`view`, query string) as JSON.
    pub(crate) fn new(
        api: GatewayApi,
        node: String,
        ops: impl Fn(&str, &str) -> Option<serde_json::Value> + Send + Sync + 'static,
    ) -> Self {
        Self {
            api,
            node,
            ops: Box::new(ops),
            drains: Arc::new(Mutex::new(RemoteDrains::default())),
        }
    }

    async fn run(
        api: GatewayApi,
        node: String,
        drains: Arc<Mutex<RemoteDrains>>,
        call: AdminCall,
    ) -> Result<Bytes, String> {
        let (caller, drain) = CallContext::read(&call.context)?;
        let refused = |status: Status| format!("{:?}: {}", status.code(), status.message());
        let body = call.body;
        let bytes = match call.call.as_str() {
            LIST_WORKERS => {
                let filter = decode::<pb::ListWorkersRequest>(body)?;
                api.local_list_workers(&caller, &filter).encode_to_vec()
            }
            EXPLAIN_POOL => {
                let request = decode::<pb::ExplainPoolRequest>(body)?;
                api.local_explain_pool(&caller, &request)
                    .map_err(refused)?
                    .encode_to_vec()
            }
            UNSERVED_QUEUES => api
                .local_unserved_queues(&caller)
                .await
                .map_err(refused)?
                .encode_to_vec(),
            DESCRIBE_POOL => {
                let request = decode::<pb::DescribePoolRequest>(body)?;
                let reply = api
                    .local_describe_pool(&caller, &request)
                    .await
                    .map_err(refused)?;
                own_part(&api, &node, &request, reply).encode_to_vec()
            }
            DRAIN_START => {
                let request = decode::<pb::DrainWorkersRequest>(body)?;
                let key = (call.from, drain);
                return cluster_drain::start_here(&api, &drains, &caller, &request, key)
                    .map_err(refused);
            }
            DRAIN_STATUS => {
                return cluster_drain::status_here(&drains, &(call.from, drain));
            }
            other => return Err(format!("unknown admin call {other:?}")),
        };
        Ok(bytes.into())
    }
}

fn decode<M: Message + Default>(body: Bytes) -> Result<M, String> {
    M::decode(body).map_err(|error| format!("unreadable request: {error}"))
}

impl AdminHandler for ViewsHandler {
    fn handle(&self, call: AdminCall) -> BoxFuture<'static, Result<Bytes, String>> {
        if let Some(view) = call.call.strip_prefix(OPS) {
            let query = String::from_utf8_lossy(&call.body).into_owned();
            let answer = (self.ops)(view, &query)
                .map(|json| Bytes::from(serde_json::to_vec(&json).unwrap_or_default()))
                .ok_or_else(|| format!("unknown operations view {view:?}"));
            return Box::pin(std::future::ready(answer));
        }
        Box::pin(Self::run(
            self.api.clone(),
            self.node.clone(),
            Arc::clone(&self.drains),
            call,
        ))
    }
}
