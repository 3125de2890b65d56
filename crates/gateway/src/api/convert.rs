//! Core's types in the API's wire types (census, workers, standings, events).

use std::time::{Duration, SystemTime};

use switchyard_core::{
    DispatchExclusion, Eligibility, PoolCensus, UnservedQueue, UnservedReason, Worker, WorkerEvent,
    WorkerSnapshot,
};
use switchyard_proto::v1 as pb;

/// Milliseconds since the Unix epoch (0 for instants before it).
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, millis)
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The wire value of an unserved reason.
pub(crate) fn unserved_reason(reason: UnservedReason) -> pb::UnservedReason {
    match reason {
        UnservedReason::NoWorkers => pb::UnservedReason::NoWorkers,
        UnservedReason::WorkersIncompatible => pb::UnservedReason::WorkersIncompatible,
        UnservedReason::AllAtCapacity => pb::UnservedReason::AllAtCapacity,
        UnservedReason::CapacityUnannounced => pb::UnservedReason::CapacityUnannounced,
        UnservedReason::WorkersUnreachable => pb::UnservedReason::WorkersUnreachable,
        UnservedReason::OnProbation => pb::UnservedReason::OnProbation,
        UnservedReason::Draining => pb::UnservedReason::Draining,
        UnservedReason::AwaitingStreams => pb::UnservedReason::AwaitingStreams,
        UnservedReason::WorkersSuspended => pb::UnservedReason::WorkersSuspended,
        UnservedReason::NoCapacityInCluster => pb::UnservedReason::NoCapacityInCluster,
        _ => pb::UnservedReason::Unspecified,
    }
}

/// The wire form of a census.
pub(crate) fn census(census: &PoolCensus) -> pb::PoolCensus {
    pb::PoolCensus {
        pool_workers: count(census.pool_workers),
        activity_workers: count(census.activity_workers),
        compatible: count(census.compatible),
        at_capacity: count(census.at_capacity),
        capacity_unannounced: count(census.capacity_unannounced),
        on_probation: count(census.on_probation),
        reachability_lost: count(census.reachability_lost),
        draining: count(census.draining),
        disconnected: count(census.disconnected),
        eligible: count(census.eligible),
        last_compatible_departure_ms: census.last_compatible_departure.map(millis),
        awaiting_streams: count(census.awaiting_streams),
        unresponsive: count(census.unresponsive),
        suspended: count(census.suspended),
        suspended_grace_left_ms: census.suspended_grace_left.map(millis),
    }
}

/// The wire value of a standing.
pub(crate) fn eligibility(eligibility: &Eligibility) -> pb::Eligibility {
    match eligibility {
        Eligibility::Eligible => pb::Eligibility::Eligible,
        Eligibility::ServesOtherActivity => pb::Eligibility::ServesOtherActivity,
        Eligibility::OtherNode { .. } => pb::Eligibility::OtherNode,
        Eligibility::AtCapacity { .. } => pb::Eligibility::AtCapacity,
        Eligibility::CapacityUnannounced => pb::Eligibility::CapacityUnannounced,
        Eligibility::OnProbation => pb::Eligibility::OnProbation,
        Eligibility::Unreachable => pb::Eligibility::Unreachable,
        Eligibility::Draining => pb::Eligibility::Draining,
        Eligibility::Disconnected => pb::Eligibility::Disconnected,
        Eligibility::AwaitingStreams { .. } => pb::Eligibility::AwaitingStreams,
        Eligibility::Suspended => pb::Eligibility::Suspended,
        _ => pb::Eligibility::Other,
    }
}

/// A worker's fixed facts, with the live ones left at zero.
pub(crate) fn worker_facts(worker: &Worker) -> pb::WorkerInfo {
    pb::WorkerInfo {
        worker_id: worker.id().get(),
        identity: worker.identity().to_owned(),
        principal: worker.principal().to_owned(),
        transport: worker.transport().as_str().to_owned(),
        namespaces: worker.namespaces().iter().cloned().collect(),
        task_queue: worker.task_queue().to_owned(),
        node: worker
            .node()
            .map(|n| n.as_str().to_owned())
            .unwrap_or_default(),
        activity_types: worker.activity_types().iter().cloned().collect(),
        ..pb::WorkerInfo::default()
    }
}

/// A worker as listed.
pub(crate) fn worker_info(snapshot: &WorkerSnapshot) -> pb::WorkerInfo {
    pb::WorkerInfo {
        capacity: snapshot.capacity,
        in_flight: snapshot.in_flight,
        eligibility: eligibility(&snapshot.eligibility).into(),
        connected_since_unix_ms: unix_ms(snapshot.connected_at),
        unresponsive_tasks: snapshot.unresponsive,
        suspended_for_ms: snapshot.suspended_for.map(millis),
        ..worker_facts(&snapshot.worker)
    }
}

/// An address with parked dispatches.
pub(crate) fn unserved_queue(queue: &UnservedQueue) -> pb::UnservedQueueInfo {
    pb::UnservedQueueInfo {
        namespace: queue.address.namespace.clone(),
        task_queue: queue.address.task_queue.clone(),
        activity_type: queue.address.activity_type.clone(),
        node: queue.address.node.clone().unwrap_or_default(),
        reason: unserved_reason(queue.reason).into(),
        detail: queue
            .census
            .describe()
            .unwrap_or_else(|| queue.reason.as_str().to_owned()),
        census: Some(census(&queue.census)),
        waiting: count(queue.waiting),
        oldest_wait_ms: millis(queue.oldest_wait),
        gateway_node: String::new(),
    }
}

/// A worker event, stamped now; `None` for events this API version does not carry.
pub(crate) fn event(event: &WorkerEvent) -> Option<pb::GatewayEvent> {
    use pb::gateway_event::Event;
    let (worker, body) = match event {
        WorkerEvent::Connected {
            worker,
            transport,
            namespaces,
            task_queue,
            node,
        } => (
            *worker,
            Event::Connected(pb::WorkerConnectedEvent {
                transport: transport.as_str().to_owned(),
                namespaces: namespaces.iter().cloned().collect(),
                task_queue: task_queue.clone(),
                node: node
                    .as_ref()
                    .map(|n| n.as_str().to_owned())
                    .unwrap_or_default(),
            }),
        ),
        WorkerEvent::Disconnected { worker, reason } => (
            *worker,
            Event::Disconnected(pb::WorkerDisconnectedEvent {
                reason: reason.as_str().to_owned(),
            }),
        ),
        WorkerEvent::Excluded { worker, exclusion } => (
            *worker,
            Event::Excluded(pb::WorkerExcludedEvent {
                exclusion: match exclusion {
                    DispatchExclusion::OpeningProbation => "opening_probation",
                    DispatchExclusion::ReachabilityLost => "reachability_lost",
                }
                .to_owned(),
            }),
        ),
        // Every new worker passes its probation; watchers learn it is serving from the census.
        WorkerEvent::ProbationPassed { .. } => return None,
        WorkerEvent::Recovered { worker } => {
            (*worker, Event::Recovered(pb::WorkerRecoveredEvent {}))
        }
        WorkerEvent::CapacityAnnounced { worker, capacity } => (
            *worker,
            Event::Capacity(pb::WorkerCapacityEvent {
                capacity: *capacity,
            }),
        ),
        WorkerEvent::Suspended { worker, grace } => (
            *worker,
            Event::Suspended(pb::WorkerSuspendedEvent {
                grace_ms: millis(*grace),
            }),
        ),
        WorkerEvent::Resumed { worker } => (*worker, Event::Resumed(pb::WorkerResumedEvent {})),
        _ => return None,
    };
    Some(pb::GatewayEvent {
        worker_id: worker.get(),
        at_unix_ms: unix_ms(SystemTime::now()),
        event: Some(body),
    })
}

/// The event telling a watcher it missed `count` events.
pub(crate) fn missed(count: u64) -> pb::GatewayEvent {
    pb::GatewayEvent {
        worker_id: 0,
        at_unix_ms: unix_ms(SystemTime::now()),
        event: Some(pb::gateway_event::Event::Missed(pb::EventsMissed { count })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unserved_reason_has_its_own_wire_value() {
        let reasons = UnservedReason::ALL;
        let wire: Vec<pb::UnservedReason> = reasons.into_iter().map(unserved_reason).collect();
        assert!(!wire.contains(&pb::UnservedReason::Unspecified), "{wire:?}");
        let mut distinct = wire.clone();
        distinct.sort_by_key(|reason| *reason as i32);
        distinct.dedup();
        assert_eq!(distinct.len(), wire.len(), "{wire:?}");
    }

    #[test]
    fn awaiting_streams_is_its_own_standing_on_the_wire() {
        let standing = Eligibility::AwaitingStreams { announced: 4 };
        assert_eq!(eligibility(&standing), pb::Eligibility::AwaitingStreams);
        // Control: a standing the wire names keeps its own value too.
        assert_eq!(
            eligibility(&Eligibility::CapacityUnannounced),
            pb::Eligibility::CapacityUnannounced
        );
    }

    #[test]
    fn a_suspension_and_a_resume_reach_watchers_and_listings() {
        let worker = switchyard_core::WorkerId::from_raw(7);
        let suspended = event(&WorkerEvent::Suspended {
            worker,
            grace: std::time::Duration::from_millis(1500),
        })
        .expect("carried");
        assert_eq!(suspended.worker_id, 7);
        assert_eq!(
            suspended.event,
            Some(pb::gateway_event::Event::Suspended(
                pb::WorkerSuspendedEvent { grace_ms: 1500 }
            ))
        );
        let resumed = event(&WorkerEvent::Resumed { worker }).expect("carried");
        assert_eq!(
            resumed.event,
            Some(pb::gateway_event::Event::Resumed(pb::WorkerResumedEvent {}))
        );
        assert_eq!(
            eligibility(&Eligibility::Suspended),
            pb::Eligibility::Suspended
        );
        // Control: an event this API does not carry is still dropped.
        assert!(event(&WorkerEvent::ProbationPassed { worker }).is_none());
    }
}
