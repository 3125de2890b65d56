//! Fuzzes the admission gate: an arbitrary `Registration` (names of any bytes and length, sets
//! of any size, any capacity) from an arbitrary caller grant, against a registry with an
//! in-memory namespace store holding one open and one pinned namespace, under an open or
//! closed policy. The gate must never panic; an admitted worker must satisfy every rule the
//! gate states (so nothing invalid slips through); a refusal must leave the registry as it
//! was; a dropped token must deregister.
#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use switchyard_core::InMemoryNamespaceStore;
use switchyard_core::{
    AdmissionError, CallerIdentity, DeliveryError, MAX_ACTIVITY_TYPES, MAX_NAME_BYTES,
    MAX_NAMESPACES, MAX_SERVED_PAIRS, NamespacePolicy, NamespaceRecord, Node, Placement,
    Registration, Registry, TransportName, WorkerDelivery, WorkerMessage,
};

/// A delivery that accepts nothing: admission never delivers.
struct Inert;

impl WorkerDelivery for Inert {
    fn transport(&self) -> TransportName {
        TransportName::from_static("fuzz")
    }
    fn is_connected(&self) -> bool {
        true
    }
    fn registration_carries_capacity(&self) -> bool {
        true
    }
    fn deliver(&self, _: WorkerMessage) -> Result<(), DeliveryError> {
        Err(DeliveryError::Closed)
    }
}

/// Reads fuzz bytes as a stream of small decisions.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        first
    }

    /// A name: mostly short picks from a small alphabet (so names collide with the store's),
    /// sometimes raw bytes made valid UTF-8 lossily, sometimes very long.
    fn name(&mut self) -> String {
        match self.byte() % 8 {
            0 => String::new(),
            1 => "open".to_owned(),
            2 => "edge".to_owned(),
            3 => "x".repeat(MAX_NAME_BYTES + usize::from(self.byte() % 3)),
            4 => "é".repeat(usize::from(self.byte())),
            _ => {
                let len = usize::from(self.byte() % 16);
                let take = len.min(self.0.len());
                let (raw, rest) = self.0.split_at(take);
                self.0 = rest;
                String::from_utf8_lossy(raw).into_owned()
            }
        }
    }

    fn set(&mut self, big: usize) -> BTreeSet<String> {
        let count = match self.byte() % 8 {
            0 => 0,
            1 => big + usize::from(self.byte() % 2),
            n => usize::from(n),
        };
        (0..count)
            .map(|i| {
                if count > 8 {
                    format!("n{i}")
                } else {
                    self.name()
                }
            })
            .collect()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let closed = input.byte() % 2 == 0;
    let store = InMemoryNamespaceStore::with_records([
        NamespaceRecord {
            name: "open".to_owned(),
            placement: Placement::Unplaced,
        },
        NamespaceRecord {
            name: "edge".to_owned(),
            placement: Placement::Pinned(Node::new("n1").into_iter().collect()),
        },
    ]);
    let registry = Registry::builder()
        .namespace_store(Arc::new(store))
        .namespace_policy(if closed {
            NamespacePolicy::Closed
        } else {
            NamespacePolicy::Open
        })
        .build();
    let caller = if input.byte() % 2 == 0 {
        CallerIdentity::trusted("fuzz")
    } else {
        CallerIdentity::granted("fuzz", ["open", "edge"])
    };
    let registration = Registration {
        namespaces: input.set(MAX_NAMESPACES),
        task_queue: input.name(),
        node: Node::new(input.name()),
        activity_types: input.set(MAX_ACTIVITY_TYPES),
        identity: input.name(),
        max_concurrency: match input.byte() % 4 {
            0 => None,
            1 => Some(0),
            _ => Some(u32::from(input.byte()) + 1),
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        match registry
            .admit(&caller, registration.clone(), Arc::new(Inert))
            .await
        {
            Ok(token) => {
                assert!(registry.is_registered(token.worker_id()));
                assert_admissible(&registration, &caller, closed);
                drop(token);
                assert!(registry.is_empty(), "a dropped token left the worker in");
            }
            Err(error) => {
                assert!(
                    registry.is_empty(),
                    "a refusal changed the registry: {error}"
                );
                assert!(!error.to_string().is_empty());
                let _ = error.kind();
                if let AdmissionError::TooLong { max, len, .. } = &error {
                    assert!(len > max);
                }
            }
        }
    });
});

/// Every rule the gate states, checked independently of its code.
fn assert_admissible(registration: &Registration, caller: &CallerIdentity, closed: bool) {
    let names = registration
        .namespaces
        .iter()
        .chain(&registration.activity_types)
        .chain([&registration.task_queue, &registration.identity]);
    for name in names {
        assert!(name.len() <= MAX_NAME_BYTES, "a long name admitted");
        assert!(
            !name.chars().any(char::is_control),
            "a control character admitted"
        );
    }
    assert!(!registration.namespaces.is_empty() && registration.namespaces.len() <= MAX_NAMESPACES);
    assert!(
        !registration.activity_types.is_empty()
            && registration.activity_types.len() <= MAX_ACTIVITY_TYPES
    );
    assert!(
        registration.namespaces.len() * registration.activity_types.len() <= MAX_SERVED_PAIRS,
        "more (namespace, activity type) pairs admitted than the limit"
    );
    assert!(registration.namespaces.iter().all(|n| !n.is_empty()));
    assert!(registration.activity_types.iter().all(|a| !a.is_empty()));
    assert!(matches!(registration.max_concurrency, Some(n) if n > 0));
    assert!(
        registration
            .namespaces
            .iter()
            .all(|n| caller.grant.allows(n))
    );
    if closed {
        assert!(
            registration
                .namespaces
                .iter()
                .all(|n| n == "open" || n == "edge")
        );
    }
    if registration.namespaces.contains("edge") {
        assert_eq!(
            registration.node.as_ref().map(Node::as_str),
            Some("n1"),
            "pinned placement admitted elsewhere"
        );
    }
}
