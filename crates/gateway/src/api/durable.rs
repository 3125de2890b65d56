//! The durable-dispatch RPCs: `Submit`, `AwaitOutcome`, `WatchOutcomes`, `GetDispatch`,
//! `ListDispatches`, and `Cancel` by `dispatch_id`, over core's [`DurableDispatcher`].
//!
//! Who reaches which dispatch is core's rule (the submitting principal, or an operator of the
//! namespace; anyone else gets `NOT_FOUND`); the roles each RPC needs are in [`access`].
//!
//! [`DurableDispatcher`]: switchyard_core::DurableDispatcher
//! [`access`]: super::access

use std::time::Duration;

use futures::StreamExt;
use switchyard_core::{CallerIdentity, DispatchFilter, WatchEvent, normalise_task_queue};
use switchyard_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::access::{DISPATCH, LOOKUP};
use super::dispatch_info::{backlog, dispatch_info};
use super::outcome;
use super::service::{BoxStream, GatewayApi, require_grant};

/// `ListDispatches` without a limit returns this many.
const DEFAULT_LIST_LIMIT: usize = 100;
/// The most `ListDispatches` returns.
const MAX_LIST_LIMIT: usize = 1000;
/// The states `ListDispatches` filters by.
const STATES: [&str; 4] = ["queued", "parked", "running", "finished"];

impl GatewayApi {
    pub(super) async fn submit_rpc(
        &self,
        request: Request<pb::DispatchRequest>,
    ) -> Result<Response<pb::SubmitReply>, Status> {
        let caller = self.caller(&request, DISPATCH, "Submit")?;
        let (request, key) =
            outcome::durable_request(request.into_inner(), self.settings.default_timeout);
        let submitted = self
            .durable
            .submit(&caller, request, key)
            .await
            .map_err(|error| outcome::submit_refusal(&error))?;
        Ok(Response::new(pb::SubmitReply {
            dispatch_id: submitted.id.to_string(),
            existing: submitted.existing,
        }))
    }

    pub(super) async fn await_outcome_rpc(
        &self,
        request: Request<pb::AwaitOutcomeRequest>,
    ) -> Result<Response<pb::AwaitOutcomeReply>, Status> {
        use pb::await_outcome_reply::Result as Awaited;
        let caller = self.caller(&request, LOOKUP, "AwaitOutcome")?;
        let request = request.into_inner();
        let id = outcome::dispatch_id(&request.dispatch_id)?;
        let wait = Duration::from_millis(request.wait_ms).min(self.core.dispatcher().max_timeout());
        let heard = self
            .durable
            .await_outcome(&caller, &id, wait)
            .await
            .map_err(|error| outcome::lookup_refusal(&error))?;
        let result = match heard {
            Some(ended) => Awaited::Outcome(outcome::outcome(ended)),
            None => {
                let state = self
                    .durable
                    .get(&caller, &id)
                    .await
                    .map_err(|error| outcome::lookup_refusal(&error))?
                    .state;
                match state {
                    // It ended between the wait and the read.
                    switchyard_core::DispatchState::Finished { outcome, .. } => {
                        Awaited::Outcome(super::dispatch_info::recorded_outcome(&outcome))
                    }
                    other => Awaited::Pending(pb::DispatchPending {
                        state: other.label().to_owned(),
                    }),
                }
            }
        };
        Ok(Response::new(pb::AwaitOutcomeReply {
            result: Some(result),
        }))
    }

    pub(super) fn watch_outcomes_rpc(
        &self,
        request: &Request<pb::WatchOutcomesRequest>,
    ) -> Result<Response<BoxStream<pb::WatchOutcomesReply>>, Status> {
        use pb::watch_outcomes_reply::Event;
        let caller = self.caller(request, DISPATCH, "WatchOutcomes")?;
        let watch = self.durable.watch(&caller);
        let outcomes = futures::stream::unfold(watch, |mut watch| async move {
            loop {
                let reply = match watch.next().await? {
                    WatchEvent::Outcome { id, outcome: ended } => pb::WatchOutcomesReply {
                        dispatch_id: id.to_string(),
                        event: Some(Event::Outcome(outcome::outcome(ended))),
                    },
                    WatchEvent::Lagged { missed } => pb::WatchOutcomesReply {
                        dispatch_id: String::new(),
                        event: Some(Event::Missed(pb::OutcomesMissed { count: missed })),
                    },
                    // An event this build has no message for is not sent.
                    _ => continue,
                };
                return Some((Ok(reply), watch));
            }
        });
        Ok(Response::new(Box::pin(
            outcomes.take_until(self.closing.clone().cancelled_owned()),
        )))
    }

    pub(super) async fn get_dispatch_rpc(
        &self,
        request: Request<pb::GetDispatchRequest>,
    ) -> Result<Response<pb::GetDispatchReply>, Status> {
        let caller = self.caller(&request, LOOKUP, "GetDispatch")?;
        let id = outcome::dispatch_id(&request.into_inner().dispatch_id)?;
        let stored = self
            .durable
            .get(&caller, &id)
            .await
            .map_err(|error| outcome::lookup_refusal(&error))?;
        Ok(Response::new(pb::GetDispatchReply {
            dispatch: Some(dispatch_info(stored)),
        }))
    }

    pub(super) async fn list_dispatches_rpc(
        &self,
        request: Request<pb::ListDispatchesRequest>,
    ) -> Result<Response<pb::ListDispatchesReply>, Status> {
        let caller = self.caller(&request, LOOKUP, "ListDispatches")?;
        let request = request.into_inner();
        if !request.namespace.is_empty() {
            require_grant(&caller, &request.namespace)?;
        }
        if !request.state.is_empty() && !STATES.contains(&request.state.as_str()) {
            return Err(Status::invalid_argument(format!(
                "state {:?} is not one of {}",
                request.state,
                STATES.join(", ")
            )));
        }
        let limit = match request.limit {
            0 => DEFAULT_LIST_LIMIT,
            n => (n as usize).min(MAX_LIST_LIMIT),
        };
        let text = |field: String| (!field.is_empty()).then_some(field);
        let filter = DispatchFilter {
            namespace: text(request.namespace),
            task_queue: text(request.task_queue).map(|q| normalise_task_queue(&q).to_owned()),
            activity_type: text(request.activity_type),
            state: text(request.state),
            principal: None,
            limit,
        };
        let dispatches = self
            .durable
            .list(&caller, filter)
            .await
            .map_err(|error| outcome::lookup_refusal(&error))?
            .into_iter()
            .map(dispatch_info)
            .collect();
        Ok(Response::new(pb::ListDispatchesReply { dispatches }))
    }

    /// `Cancel` with a `dispatch_id`.
    pub(super) async fn cancel_by_id(
        &self,
        caller: &CallerIdentity,
        request: &pb::CancelDispatchRequest,
    ) -> Result<Response<pb::CancelDispatchReply>, Status> {
        if !request.namespace.is_empty() || !request.activity_id.is_empty() {
            return Err(Status::invalid_argument(
                "dispatch_id is set together with namespace or activity_id; give one or the \
                 other",
            ));
        }
        let id = outcome::dispatch_id(&request.dispatch_id)?;
        self.durable
            .cancel(caller, &id)
            .await
            .map_err(|error| outcome::lookup_refusal(&error))?;
        Ok(Response::new(pb::CancelDispatchReply {}))
    }

    /// The durable backlog of the caller's namespaces, for `UnservedQueues`.
    pub(super) async fn backlog_of(
        &self,
        caller: &CallerIdentity,
    ) -> Result<Vec<pb::DurableBacklog>, Status> {
        let mut census = self
            .durable
            .census()
            .await
            .map_err(|error| outcome::store_refusal(&error))?;
        census.retain(|pool| caller.grant.allows(&pool.namespace));
        census.sort_by(|a, b| {
            (&a.namespace, &a.task_queue, &a.activity_type).cmp(&(
                &b.namespace,
                &b.task_queue,
                &b.activity_type,
            ))
        });
        Ok(census.iter().map(backlog).collect())
    }

    /// The durable backlog of one pool address, for `DescribePool` (zeros when it has none).
    pub(super) async fn pool_backlog(
        &self,
        namespace: &str,
        task_queue: &str,
        activity_type: &str,
    ) -> Result<pb::DurableBacklog, Status> {
        let task_queue = normalise_task_queue(task_queue);
        let census = self
            .durable
            .census()
            .await
            .map_err(|error| outcome::store_refusal(&error))?;
        Ok(census
            .iter()
            .find(|pool| {
                pool.namespace == namespace
                    && pool.task_queue == task_queue
                    && pool.activity_type == activity_type
            })
            .map(backlog)
            .unwrap_or_default())
    }
}
