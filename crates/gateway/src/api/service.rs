//! The `switchyard.v1.Gateway` service over core.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use switchyard_core::{CallerIdentity, Core, DurableDispatcher, WorkerId, normalise_task_queue};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_server::{Gateway as GatewayRpc, GatewayServer};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::access::{self, CANCEL, DISPATCH, OPERATE, VIEW};
use super::cluster_views::{self, ClusterViews};
use super::durability::DurabilityDefaults;
use super::run::Runner;
use super::stream::StreamLimits;
use super::{caller, convert, drain, outcome, stream};
use crate::auth::Principals;
use crate::ops::PoolHandles;

/// Settings of the producer API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiConfig {
    /// Timeout of a dispatch that asks for none.
    pub default_timeout: Duration,
    /// Dispatches one `DispatchStream` runs at once.
    pub max_in_flight_per_stream: usize,
    /// Dispatches running plus replies the producer has not taken, per `DispatchStream`; at
    /// the limit the stream is not read (the producer is slowed).
    pub max_stream_outstanding: usize,
    /// How long a stream may stay at `max_stream_outstanding` with the producer taking no
    /// reply before it is ended as a slow consumer.
    pub slow_consumer_timeout: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(60),
            max_in_flight_per_stream: 1024,
            max_stream_outstanding: 1024,
            slow_consumer_timeout: Duration::from_secs(30),
        }
    }
}

/// The producer and operator API: implements the generated `Gateway` service over [`Core`]
/// and its [`DurableDispatcher`].
#[derive(Clone, Debug)]
pub struct GatewayApi {
    pub(super) core: Core,
    pub(super) durable: DurableDispatcher,
    runner: Arc<Runner>,
    principals: Arc<Principals>,
    pub(super) settings: ApiConfig,
    pub(super) closing: CancellationToken,
    /// In a cluster: the other nodes, whose answers the views and drains merge in.
    pub(super) cluster: Option<Arc<ClusterViews>>,
}

impl GatewayApi {
    /// The API over `core` and `durable` (the durable dispatcher started over the same core's
    /// dispatcher), authenticating callers against `principals`. A dispatch is ephemeral
    /// unless its request says `durable` (the gateway applies the configured defaults).
    pub fn new(
        core: Core,
        durable: DurableDispatcher,
        principals: Arc<Principals>,
        settings: ApiConfig,
    ) -> Self {
        let runner = Arc::new(Runner::new(
            core.dispatcher().clone(),
            durable.clone(),
            DurabilityDefaults::default(),
            settings.default_timeout,
        ));
        Self {
            core,
            durable,
            runner,
            principals,
            settings,
            closing: CancellationToken::new(),
            cluster: None,
        }
    }

    /// Makes the views (`ListWorkers`, `DescribePool`, `ExplainPool`, `UnservedQueues`) and
    /// `Drain` cluster-wide: they ask every other live node through `admin` and merge.
    pub(crate) fn cluster_wide(mut self, admin: Option<switchyard_cluster::Admin>) -> Self {
        self.cluster = admin.map(|admin| Arc::new(ClusterViews::new(admin)));
        self
    }

    /// Makes a dispatch that leaves `durable` unset durable as `config` says
    /// (`namespaces.known[].durability`, else `dispatch.durability`).
    pub(crate) fn durability(mut self, defaults: DurabilityDefaults) -> Self {
        self.runner = Arc::new(Runner::new(
            self.core.dispatcher().clone(),
            self.durable.clone(),
            defaults,
            self.settings.default_timeout,
        ));
        self
    }

    /// Ends the API's long-lived streams (`DispatchStream`, `Drain`, `WatchEvents`) when
    /// `closing` fires, so a server shutting down is not held open by them.
    pub fn ending_on(mut self, closing: CancellationToken) -> Self {
        self.closing = closing;
        self
    }

    /// The tonic service, ready to be added to a server or router.
    pub fn into_service(self) -> GatewayServer<Self> {
        GatewayServer::new(self)
    }

    /// The caller of `request`, once it is known to hold one of `roles` for `rpc`.
    pub(super) fn caller<T>(
        &self,
        request: &Request<T>,
        roles: &[switchyard_core::Role],
        rpc: &str,
    ) -> Result<CallerIdentity, Status> {
        let caller = caller::identify(&self.principals, request)?;
        access::require_role(&caller, roles, rpc)?;
        Ok(caller)
    }
}

fn require(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} is empty")))
    } else {
        Ok(())
    }
}

pub(super) fn require_grant(caller: &CallerIdentity, namespace: &str) -> Result<(), Status> {
    if caller.grant.allows(namespace) {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "principal {:?} is not granted namespace {namespace:?}",
            caller.principal
        )))
    }
}

fn node(label: &str) -> Option<&str> {
    (!label.is_empty()).then_some(label)
}

/// The refusal of a drain whose target matches no worker the caller may drain.
pub(super) const NOTHING_TO_DRAIN: &str =
    "no registered worker you may drain matches the drain target";

/// This node's own answers to the views and drains; in a cluster every node runs these for
/// its own workers and the asking node merges them.
impl GatewayApi {
    pub(super) async fn local_describe_pool(
        &self,
        caller: &CallerIdentity,
        request: &pb::DescribePoolRequest,
    ) -> Result<pb::DescribePoolReply, Status> {
        require("namespace", &request.namespace)?;
        require("activity_type", &request.activity_type)?;
        require_grant(caller, &request.namespace)?;
        let census = self.core.registry().pool_census(
            &request.namespace,
            &request.task_queue,
            &request.activity_type,
            node(&request.node),
        );
        let task_queue = normalise_task_queue(&request.task_queue);
        let parked = self
            .core
            .dispatcher()
            .unserved_queues()
            .into_iter()
            .find(|queue| {
                let address = &queue.address;
                address.namespace == request.namespace
                    && address.task_queue == task_queue
                    && address.activity_type == request.activity_type
                    && address.node.as_deref() == node(&request.node)
            });
        let reason = census.classify();
        let backlog = self
            .pool_backlog(&request.namespace, task_queue, &request.activity_type)
            .await?;
        Ok(pb::DescribePoolReply {
            census: Some(convert::census(&census)),
            served: reason.is_none(),
            reason: reason
                .map_or(pb::UnservedReason::Unspecified, convert::unserved_reason)
                .into(),
            detail: census.describe().unwrap_or_default(),
            parked: parked
                .as_ref()
                .map_or(0, |queue| u32::try_from(queue.waiting).unwrap_or(u32::MAX)),
            oldest_parked_ms: parked.map_or(0, |queue| convert::millis(queue.oldest_wait)),
            backlog_waiting: backlog.waiting,
            backlog_running: backlog.running,
            backlog_oldest_waiting_ms: backlog.oldest_waiting_ms,
            ..pb::DescribePoolReply::default()
        })
    }

    /// Capacity and in-flight of the compatible workers of a pool on this node (core's
    /// explanation decides which are compatible: same activity, matching node).
    pub(super) fn local_pool_load(&self, request: &pb::DescribePoolRequest) -> (u64, u64) {
        use switchyard_core::Eligibility;
        let registry = self.core.registry();
        registry
            .explain(
                &request.namespace,
                &request.task_queue,
                &request.activity_type,
                node(&request.node),
            )
            .into_iter()
            .filter(|explained| {
                !matches!(
                    explained.eligibility,
                    Eligibility::ServesOtherActivity | Eligibility::OtherNode { .. }
                )
            })
            .filter_map(|explained| registry.worker(explained.worker.id()))
            .fold((0, 0), |(capacity, in_flight), s| {
                (
                    capacity + u64::from(s.capacity.unwrap_or(0)),
                    in_flight + u64::from(s.in_flight),
                )
            })
    }

    pub(super) async fn local_unserved_queues(
        &self,
        caller: &CallerIdentity,
    ) -> Result<pb::UnservedQueuesReply, Status> {
        let queues = self
            .core
            .dispatcher()
            .unserved_queues()
            .iter()
            .filter(|queue| caller.grant.allows(&queue.address.namespace))
            .map(convert::unserved_queue)
            .collect();
        let backlog = self.backlog_of(caller).await?;
        Ok(pb::UnservedQueuesReply {
            queues,
            backlog,
            ..pb::UnservedQueuesReply::default()
        })
    }

    pub(super) fn local_explain_pool(
        &self,
        caller: &CallerIdentity,
        request: &pb::ExplainPoolRequest,
    ) -> Result<pb::ExplainPoolReply, Status> {
        require("namespace", &request.namespace)?;
        require("activity_type", &request.activity_type)?;
        require_grant(caller, &request.namespace)?;
        let registry = self.core.registry();
        let workers = registry
            .explain(
                &request.namespace,
                &request.task_queue,
                &request.activity_type,
                node(&request.node),
            )
            .into_iter()
            .map(|explained| pb::WorkerExplanation {
                worker: Some(access::redact(
                    caller,
                    registry.worker(explained.worker.id()).map_or_else(
                        || convert::worker_facts(&explained.worker),
                        |s| convert::worker_info(&s),
                    ),
                )),
                eligibility: convert::eligibility(&explained.eligibility).into(),
                explanation: explained.eligibility.to_string(),
            })
            .collect();
        Ok(pb::ExplainPoolReply {
            workers,
            ..pb::ExplainPoolReply::default()
        })
    }

    pub(super) fn local_list_workers(
        &self,
        caller: &CallerIdentity,
        filter: &pb::ListWorkersRequest,
    ) -> pb::ListWorkersReply {
        let task_queue = normalise_task_queue(&filter.task_queue);
        let workers = self
            .core
            .registry()
            .workers()
            .iter()
            .filter(|s| access::may_see(caller, &s.worker))
            .filter(|s| {
                filter.namespace.is_empty()
                    || (caller.grant.allows(&filter.namespace)
                        && s.worker.namespaces().contains(&filter.namespace))
            })
            .filter(|s| filter.task_queue.is_empty() || s.worker.task_queue() == task_queue)
            .map(|s| access::redact(caller, convert::worker_info(s)))
            .collect();
        pb::ListWorkersReply {
            workers,
            ..pb::ListWorkersReply::default()
        }
    }

    /// The workers on this node that `request` targets and `caller` may drain (maybe none).
    ///
    /// A worker the caller may not drain is left out exactly as one that does not exist, so
    /// the answer never tells the two apart.
    pub(super) fn local_drain_targets(
        &self,
        caller: &CallerIdentity,
        request: &pb::DrainWorkersRequest,
    ) -> Result<Vec<WorkerId>, Status> {
        use pb::drain_workers_request::Target;
        let registry = self.core.registry();
        let targets: Vec<_> = match &request.target {
            Some(Target::WorkerId(id)) => registry
                .worker(WorkerId::from_raw(*id))
                .into_iter()
                .filter(|s| access::may_drain(caller, &s.worker))
                .collect(),
            Some(Target::Node(label)) if !label.is_empty() => registry
                .workers()
                .into_iter()
                .filter(|s| s.worker.node().is_some_and(|n| n.as_str() == label))
                .filter(|s| access::may_drain(caller, &s.worker))
                .collect(),
            _ => {
                return Err(Status::invalid_argument(
                    "target is empty: give worker_id or node",
                ));
            }
        };
        Ok(targets.iter().map(|s| s.worker.id()).collect())
    }

    /// Drains `targets` on this node, streaming its progress.
    pub(super) fn local_drain(
        &self,
        targets: Vec<WorkerId>,
        request: &pb::DrainWorkersRequest,
    ) -> drain::ProgressStream {
        let deadline =
            (request.deadline_ms > 0).then(|| Duration::from_millis(request.deadline_ms));
        drain::start(self.core.clone(), targets, deadline, self.closing.clone())
    }
}

pub(super) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl GatewayRpc for GatewayApi {
    async fn dispatch(
        &self,
        request: Request<pb::DispatchRequest>,
    ) -> Result<Response<pb::DispatchReply>, Status> {
        let caller = self.caller(&request, DISPATCH, "Dispatch")?;
        let wire = request.into_inner();
        let pool = Runner::pool_of(&mut PoolHandles::default(), &wire);
        let ended = self.runner.run(&caller, wire, pool).await?;
        Ok(Response::new(pb::DispatchReply {
            outcome: Some(outcome::outcome(ended)),
        }))
    }

    type DispatchStreamStream = stream::ReplyStream;

    async fn dispatch_stream(
        &self,
        request: Request<Streaming<pb::DispatchStreamRequest>>,
    ) -> Result<Response<Self::DispatchStreamStream>, Status> {
        let caller = self.caller(&request, DISPATCH, "DispatchStream")?;
        let limits = StreamLimits {
            max_in_flight: self.settings.max_in_flight_per_stream,
            max_outstanding: self.settings.max_stream_outstanding,
            slow_consumer_timeout: self.settings.slow_consumer_timeout,
        };
        Ok(Response::new(stream::start(
            Arc::clone(&self.runner),
            caller,
            request.into_inner(),
            limits,
            self.closing.clone(),
        )))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelDispatchRequest>,
    ) -> Result<Response<pb::CancelDispatchReply>, Status> {
        let caller = self.caller(&request, CANCEL, "Cancel")?;
        let request = request.into_inner();
        if !request.dispatch_id.is_empty() {
            return self.cancel_by_id(&caller, &request).await;
        }
        require("namespace", &request.namespace)?;
        require("activity_id", &request.activity_id)?;
        self.core
            .dispatcher()
            .cancel(&caller, &request.namespace, &request.activity_id)
            .map_err(|error| outcome::cancel_refusal(&error))?;
        Ok(Response::new(pb::CancelDispatchReply {}))
    }

    async fn describe_pool(
        &self,
        request: Request<pb::DescribePoolRequest>,
    ) -> Result<Response<pb::DescribePoolReply>, Status> {
        let caller = self.caller(&request, VIEW, "DescribePool")?;
        let request = request.into_inner();
        let local = self.local_describe_pool(&caller, &request).await?;
        Ok(Response::new(match &self.cluster {
            Some(views) => {
                let local = cluster_views::own_part(self, views.node(), &request, local);
                views.describe_pool(&caller, &request, local).await
            }
            None => local,
        }))
    }

    async fn unserved_queues(
        &self,
        request: Request<pb::UnservedQueuesRequest>,
    ) -> Result<Response<pb::UnservedQueuesReply>, Status> {
        let caller = self.caller(&request, VIEW, "UnservedQueues")?;
        let local = self.local_unserved_queues(&caller).await?;
        Ok(Response::new(match &self.cluster {
            Some(views) => views.unserved_queues(&caller, local).await,
            None => local,
        }))
    }

    async fn explain_pool(
        &self,
        request: Request<pb::ExplainPoolRequest>,
    ) -> Result<Response<pb::ExplainPoolReply>, Status> {
        let caller = self.caller(&request, VIEW, "ExplainPool")?;
        let request = request.into_inner();
        let local = self.local_explain_pool(&caller, &request)?;
        Ok(Response::new(match &self.cluster {
            Some(views) => views.explain_pool(&caller, &request, local).await,
            None => local,
        }))
    }

    async fn list_workers(
        &self,
        request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersReply>, Status> {
        let caller = self.caller(&request, VIEW, "ListWorkers")?;
        let filter = request.into_inner();
        let local = self.local_list_workers(&caller, &filter);
        Ok(Response::new(match &self.cluster {
            Some(views) => views.list_workers(&caller, &filter, local).await,
            None => local,
        }))
    }

    type DrainStream = drain::ProgressStream;

    async fn drain(
        &self,
        request: Request<pb::DrainWorkersRequest>,
    ) -> Result<Response<Self::DrainStream>, Status> {
        let caller = self.caller(&request, OPERATE, "Drain")?;
        let request = request.into_inner();
        let local = self.local_drain_targets(&caller, &request)?;
        if let Some(views) = &self.cluster {
            return views
                .drain(self, &caller, &request, local)
                .await
                .map(Response::new);
        }
        if local.is_empty() {
            return Err(Status::not_found(NOTHING_TO_DRAIN));
        }
        Ok(Response::new(self.local_drain(local, &request)))
    }

    async fn submit(
        &self,
        request: Request<pb::DispatchRequest>,
    ) -> Result<Response<pb::SubmitReply>, Status> {
        self.submit_rpc(request).await
    }

    async fn await_outcome(
        &self,
        request: Request<pb::AwaitOutcomeRequest>,
    ) -> Result<Response<pb::AwaitOutcomeReply>, Status> {
        self.await_outcome_rpc(request).await
    }

    type WatchOutcomesStream = BoxStream<pb::WatchOutcomesReply>;

    async fn watch_outcomes(
        &self,
        request: Request<pb::WatchOutcomesRequest>,
    ) -> Result<Response<Self::WatchOutcomesStream>, Status> {
        self.watch_outcomes_rpc(&request)
    }

    async fn get_dispatch(
        &self,
        request: Request<pb::GetDispatchRequest>,
    ) -> Result<Response<pb::GetDispatchReply>, Status> {
        self.get_dispatch_rpc(request).await
    }

    async fn list_dispatches(
        &self,
        request: Request<pb::ListDispatchesRequest>,
    ) -> Result<Response<pb::ListDispatchesReply>, Status> {
        self.list_dispatches_rpc(request).await
    }

    type WatchEventsStream = BoxStream<pb::GatewayEvent>;

    async fn watch_events(
        &self,
        request: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let caller = self.caller(&request, OPERATE, "WatchEvents")?;
        let receiver = self.core.registry().subscribe_events();
        let view = access::EventView::new(caller, self.core.registry());
        let events =
            futures::stream::unfold((receiver, view), |(mut receiver, mut view)| async move {
                loop {
                    let wire = match receiver.recv().await {
                        Ok(event) => convert::event(&event),
                        Err(RecvError::Lagged(count)) => Some(convert::missed(count)),
                        Err(RecvError::Closed) => return None,
                    };
                    if let Some(wire) = wire.and_then(|wire| view.admit(wire)) {
                        return Some((Ok(wire), (receiver, view)));
                    }
                }
            });
        Ok(Response::new(Box::pin(
            events.take_until(self.closing.clone().cancelled_owned()),
        )))
    }
}
