//! Who may call which RPC, and what a caller may see of a worker: the producer API's one
//! table of roles and its visibility rules.
//!
//! | RPC | needs |
//! |---|---|
//! | `Dispatch`, `DispatchStream`, `Submit`, `WatchOutcomes` | `producer` |
//! | `Cancel` | `producer` (its own dispatches) or `operator` (any in its namespaces) |
//! | `AwaitOutcome`, `GetDispatch`, `ListDispatches` | `producer` (its own durable dispatches) or `operator` (any in its namespaces) |
//! | `ListWorkers`, `DescribePool`, `ExplainPool`, `UnservedQueues` | `producer` or `operator` |
//! | `Drain`, `WatchEvents` | `operator` |
//!
//! `WatchEvents` carries only the events of workers serving a namespace the caller is granted
//! ([`EventView`]).
//!
//! `admin` holds every role. A caller sees only the namespaces it is granted, and the
//! `identity` and `principal` of another principal's worker only as an operator of the
//! namespaces it shares with that worker. A worker it may not drain is, to a drain by id,
//! the same as a worker that does not exist.

use std::collections::HashSet;

use switchyard_core::{CallerIdentity, Registry, Role, Worker};
use switchyard_proto::v1 as pb;
use tonic::Status;

/// Running work: `Dispatch`, `DispatchStream`.
pub(crate) const DISPATCH: &[Role] = &[Role::Producer];
/// `Cancel`: a producer reaches its own dispatches, an operator every dispatch it may see.
pub(crate) const CANCEL: &[Role] = &[Role::Producer, Role::Operator];
/// Reading durable dispatches: `AwaitOutcome`, `GetDispatch`, `ListDispatches`; a producer
/// reaches its own, an operator every one in the namespaces it operates (core's rule).
pub(crate) const LOOKUP: &[Role] = &[Role::Producer, Role::Operator];
/// Read-only views: `ListWorkers`, `DescribePool`, `ExplainPool`, `UnservedQueues`.
pub(crate) const VIEW: &[Role] = &[Role::Producer, Role::Operator];
/// Acting on workers and watching the fleet: `Drain`, `WatchEvents`.
pub(crate) const OPERATE: &[Role] = &[Role::Operator];

/// PERMISSION_DENIED unless `caller` holds one of `roles` for `rpc`, naming what it lacks
/// ("principal `w1` lacks role `producer` for Dispatch").
pub(crate) fn require_role(
    caller: &CallerIdentity,
    roles: &[Role],
    rpc: &str,
) -> Result<(), Status> {
    if roles.iter().any(|role| caller.has_role(*role)) {
        return Ok(());
    }
    let needed = roles
        .iter()
        .map(|role| format!("`{role}`"))
        .collect::<Vec<_>>()
        .join(" or ");
    Err(Status::permission_denied(format!(
        "principal `{}` lacks role {needed} for {rpc}",
        caller.principal
    )))
}

/// True when `caller` may see `worker` at all: it serves a namespace the caller is granted.
pub(crate) fn may_see(caller: &CallerIdentity, worker: &Worker) -> bool {
    worker.namespaces().iter().any(|ns| caller.grant.allows(ns))
}

/// True when `caller` may drain `worker`: an operator of every namespace it serves.
pub(crate) fn may_drain(caller: &CallerIdentity, worker: &Worker) -> bool {
    worker.namespaces().iter().all(|ns| caller.operates(ns))
}

/// `info` as `caller` may see it: only namespaces it is granted, and no `identity` or
/// `principal` of another principal's worker unless it operates a namespace they share.
pub(crate) fn redact(caller: &CallerIdentity, mut info: pb::WorkerInfo) -> pb::WorkerInfo {
    info.namespaces.retain(|ns| caller.grant.allows(ns));
    let own = info.principal == caller.principal;
    let operated = info.namespaces.iter().any(|ns| caller.operates(ns));
    if !own && !operated {
        info.identity.clear();
        info.principal.clear();
    }
    info
}

/// The part of the event stream one watcher may see: events of workers serving a namespace it
/// is granted, their `Connected` namespaces cut to the granted ones, and the `Missed` notices.
#[derive(Debug)]
pub(crate) struct EventView {
    caller: CallerIdentity,
    visible: HashSet<u64>,
}

impl EventView {
    /// A view for `caller`, seeded with the workers `registry` holds now; subscribe to the
    /// events before calling this, so no worker falls between the two.
    pub(crate) fn new(caller: CallerIdentity, registry: &Registry) -> Self {
        let visible = registry
            .workers()
            .iter()
            .filter(|s| may_see(&caller, &s.worker))
            .map(|s| s.worker.id().get())
            .collect();
        Self { caller, visible }
    }

    /// `event` as the watcher may see it, or `None` when it concerns a worker it may not see.
    pub(crate) fn admit(&mut self, mut event: pb::GatewayEvent) -> Option<pb::GatewayEvent> {
        use pb::gateway_event::Event;
        let id = event.worker_id;
        match &mut event.event {
            Some(Event::Connected(connected)) => {
                connected
                    .namespaces
                    .retain(|ns| self.caller.grant.allows(ns));
                if connected.namespaces.is_empty() {
                    return None;
                }
                self.visible.insert(id);
            }
            Some(Event::Missed(_)) => {}
            Some(Event::Disconnected(_)) => {
                if !self.visible.remove(&id) {
                    return None;
                }
            }
            _ => {
                if !self.visible.contains(&id) {
                    return None;
                }
            }
        }
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(principal: &str, namespaces: &[&str]) -> pb::WorkerInfo {
        pb::WorkerInfo {
            identity: format!("{principal}-host"),
            principal: principal.to_owned(),
            namespaces: namespaces.iter().map(|ns| (*ns).to_owned()).collect(),
            ..pb::WorkerInfo::default()
        }
    }

    #[test]
    fn a_missing_role_is_refused_naming_it_and_admin_passes_everything() {
        let worker = CallerIdentity::granted("w1", ["a"]).with_roles([Role::Worker]);
        let refused = require_role(&worker, DISPATCH, "Dispatch").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            refused.message(),
            "principal `w1` lacks role `producer` for Dispatch"
        );
        let refused = require_role(&worker, VIEW, "ListWorkers").unwrap_err();
        assert_eq!(
            refused.message(),
            "principal `w1` lacks role `producer` or `operator` for ListWorkers"
        );
        // Controls: the role itself, and admin, pass.
        let producer = CallerIdentity::granted("p1", ["a"]).with_roles([Role::Producer]);
        assert!(require_role(&producer, DISPATCH, "Dispatch").is_ok());
        assert!(require_role(&producer, OPERATE, "Drain").is_err());
        let admin = CallerIdentity::granted("root", ["a"]);
        for roles in [DISPATCH, CANCEL, LOOKUP, VIEW, OPERATE] {
            assert!(require_role(&admin, roles, "any").is_ok());
        }
    }

    #[test]
    fn other_principals_identities_and_ungranted_namespaces_are_hidden_from_non_operators() {
        let producer = CallerIdentity::granted("p1", ["a"]).with_roles([Role::Producer]);
        let theirs = redact(&producer, info("w2", &["a", "secret"]));
        assert_eq!(theirs.namespaces, vec!["a".to_owned()]);
        assert_eq!(
            (theirs.identity.as_str(), theirs.principal.as_str()),
            ("", "")
        );
        let own = redact(&producer, info("p1", &["a"]));
        assert_eq!(own.identity, "p1-host", "a caller sees its own workers");
        // Control: an operator of the namespace sees the identity.
        let operator = CallerIdentity::granted("ops", ["a"]).with_roles([Role::Operator]);
        let seen = redact(&operator, info("w2", &["a", "secret"]));
        assert_eq!(
            (seen.identity.as_str(), seen.principal.as_str()),
            ("w2-host", "w2")
        );
        assert_eq!(seen.namespaces, vec!["a".to_owned()]);
    }

    #[test]
    fn a_watcher_sees_only_the_events_of_workers_in_its_namespaces() {
        use pb::gateway_event::Event;
        let operator = CallerIdentity::granted("ops", ["a"]).with_roles([Role::Operator]);
        let mut view = EventView::new(operator, &Registry::default());
        let connected = |id: u64, namespaces: &[&str]| pb::GatewayEvent {
            worker_id: id,
            event: Some(Event::Connected(pb::WorkerConnectedEvent {
                namespaces: namespaces.iter().map(|ns| (*ns).to_owned()).collect(),
                ..pb::WorkerConnectedEvent::default()
            })),
            ..pb::GatewayEvent::default()
        };
        let gone = |id: u64| pb::GatewayEvent {
            worker_id: id,
            event: Some(Event::Disconnected(pb::WorkerDisconnectedEvent::default())),
            ..pb::GatewayEvent::default()
        };
        assert_eq!(view.admit(connected(1, &["secret"])), None);
        assert_eq!(view.admit(gone(1)), None, "nor its departure");
        // Control: a worker serving a granted namespace is seen, its other namespaces cut.
        let seen = view.admit(connected(2, &["a", "secret"])).expect("seen");
        assert!(matches!(seen.event, Some(Event::Connected(c)) if c.namespaces == ["a"]));
        assert!(view.admit(gone(2)).is_some());
    }
}
