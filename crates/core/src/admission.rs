//! The one admission gate every transport's registrations pass through.

mod audit;
mod capacity;
mod error;
mod quota;
#[cfg(test)]
mod tests;
mod validate;

use std::num::NonZeroU32;
use std::sync::Arc;

use tokio::time::Instant;

pub use audit::AdmissionAudit;
pub use capacity::DEFAULT_MAX_CONCURRENCY_LIMIT;
pub use error::{AdmissionError, RefusalKind};
pub use quota::DEFAULT_MAX_WORKERS_PER_PRINCIPAL;
pub use validate::{MAX_ACTIVITY_TYPES, MAX_NAME_BYTES, MAX_NAMESPACES, MAX_SERVED_PAIRS};

use crate::address::normalise_task_queue;
use crate::delivery::WorkerDelivery;
use crate::eligibility::DispatchExclusion;
use crate::namespace::{NamespacePolicy, NamespaceRecord, Placement};
use crate::registration::{CallerIdentity, Registration};
use crate::registry::{RegistrationToken, Registry};
use crate::role::Role;
use crate::worker::Worker;

impl Registry {
    /// Admits a worker: the only way into the registry, shared by every transport.
    ///
    /// In order: check that `caller` holds the `worker` role; validate the request's shape;
    /// check that `caller` is granted every namespace;
    /// apply the namespace policy (mint unknown namespaces under `Open`, refuse them under
    /// `Closed`); enforce pinned placement for every namespace; settle capacity (required,
    /// non-zero and within [`Registry::max_concurrency_limit`] when the transport's
    /// registration carries it, otherwise unknown until [`Registry::set_advertised_capacity`]
    /// applies the same rule); check the caller's worker quota
    /// ([`CallerIdentity::max_workers`]); then insert and announce: emit `Connected` and wake parked
    /// selections. Any refusal refuses the whole registration and changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use switchyard_core::{AdmissionError, CallerIdentity, DeliveryError, Registration,
    /// #     Registry, TransportName, WorkerDelivery, WorkerMessage};
    /// # struct Leg;
    /// # impl WorkerDelivery for Leg {
    /// #     fn transport(&self) -> TransportName { TransportName::from_static("doc") }
    /// #     fn is_connected(&self) -> bool { true }
    /// #     fn registration_carries_capacity(&self) -> bool { true }
    /// #     fn deliver(&self, _: WorkerMessage) -> Result<(), DeliveryError> { Ok(()) }
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let registry = Registry::default();
    /// let caller = CallerIdentity::granted("team-a", ["billing"]);
    /// let mut registration = Registration {
    ///     namespaces: ["billing".to_owned()].into(),
    ///     activity_types: ["charge".to_owned()].into(),
    ///     max_concurrency: Some(8),
    ///     ..Registration::default()
    /// };
    /// let token = registry.admit(&caller, registration.clone(), Arc::new(Leg)).await?;
    /// assert!(registry.is_registered(token.worker_id()));
    ///
    /// registration.namespaces = ["payroll".to_owned()].into();
    /// let refused = registry.admit(&caller, registration, Arc::new(Leg)).await;
    /// assert!(matches!(refused, Err(AdmissionError::NamespaceNotGranted { .. })));
    /// # Ok::<(), AdmissionError>(())
    /// # }).unwrap();
    /// ```
    pub async fn admit(
        &self,
        caller: &CallerIdentity,
        registration: Registration,
        delivery: Arc<dyn WorkerDelivery>,
    ) -> Result<RegistrationToken, AdmissionError> {
        let token = self
            .admit_unannounced(caller, registration, delivery)
            .await?;
        token.announce();
        Ok(token)
    }

    /// [`Registry::admit`] for a transport that must get its acknowledgement out first: the
    /// worker is registered (listed, counted) but not dispatched to, not pinged, and without
    /// a `Connected` event until [`RegistrationToken::announce`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use switchyard_core::{AdmissionError, CallerIdentity, DeliveryError, DisconnectReason,
    /// #     Registration, Registry, TransportName, WorkerDelivery, WorkerMessage};
    /// # struct Leg;
    /// # impl WorkerDelivery for Leg {
    /// #     fn transport(&self) -> TransportName { TransportName::from_static("doc") }
    /// #     fn is_connected(&self) -> bool { true }
    /// #     fn registration_carries_capacity(&self) -> bool { true }
    /// #     fn deliver(&self, _: WorkerMessage) -> Result<(), DeliveryError> { Ok(()) }
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let registry = Registry::default();
    /// let registration = Registration {
    ///     namespaces: ["billing".to_owned()].into(),
    ///     activity_types: ["charge".to_owned()].into(),
    ///     max_concurrency: Some(8),
    ///     ..Registration::default()
    /// };
    /// let caller = CallerIdentity::trusted("team-a");
    /// let token = registry.admit_unannounced(&caller, registration, Arc::new(Leg)).await?;
    /// assert!(registry.select_and_reserve("billing", "", "charge", None).is_none());
    /// // ... the transport writes its acknowledgement here ...
    /// assert!(token.announce());
    /// assert!(registry.select_and_reserve("billing", "", "charge", None).is_some());
    ///
    /// // Core lets the worker go: the transport's serving loop wakes with the reason.
    /// registry.deregister(token.worker_id(), DisconnectReason::Timeout);
    /// assert_eq!(token.departed().await, DisconnectReason::Timeout);
    /// # Ok::<(), AdmissionError>(())
    /// # }).unwrap();
    /// ```
    pub async fn admit_unannounced(
        &self,
        caller: &CallerIdentity,
        registration: Registration,
        delivery: Arc<dyn WorkerDelivery>,
    ) -> Result<RegistrationToken, AdmissionError> {
        let identity = registration.identity.clone();
        let admitted = self.run_gate(caller, registration, delivery).await;
        if let Err(error) = &admitted {
            self.inner
                .audit
                .refused(&caller.principal, &identity, error);
        }
        admitted
    }

    async fn run_gate(
        &self,
        caller: &CallerIdentity,
        registration: Registration,
        delivery: Arc<dyn WorkerDelivery>,
    ) -> Result<RegistrationToken, AdmissionError> {
        if !caller.has_role(Role::Worker) {
            return Err(AdmissionError::RoleMissing {
                principal: caller.principal.clone(),
                role: Role::Worker,
            });
        }
        validate::validate(&registration)?;
        if let Some(namespace) = registration
            .namespaces
            .iter()
            .find(|ns| !caller.grant.allows(ns.as_str()))
        {
            return Err(AdmissionError::NamespaceNotGranted {
                principal: caller.principal.clone(),
                namespace: namespace.clone(),
            });
        }
        self.check_room(&registration)?;
        let unknown = self.check_namespaces(&registration).await?;
        let capacity = if delivery.registration_carries_capacity() {
            let stated = registration
                .max_concurrency
                .ok_or(AdmissionError::MissingCapacity)?;
            Some(capacity::settle(stated, self.inner.max_concurrency_limit)?)
        } else {
            None
        };
        self.mint(unknown, &registration).await?;
        let (token, forgotten) = self.insert(caller, registration, delivery, capacity)?;
        for name in forgotten {
            if let Err(error) = self.inner.store.forget(&name).await {
                tracing::warn!(namespace = %name, %error, "namespace store could not forget an idle namespace");
            }
        }
        Ok(token)
    }

    /// Refuses, before anything is minted, a registration whose new namespaces cannot fit
    /// under `registry.max_namespaces` even after the idle ones are forgotten.
    fn check_room(&self, registration: &Registration) -> Result<(), AdmissionError> {
        self.inner.ledger().fits(&registration.namespaces)
    }

    /// Steps three and four for the namespaces the store knows: refuses unknown ones under
    /// `Closed` and enforces `Pinned` placement. Returns the unknown namespaces, which are
    /// minted only once every other step has passed, so a refused registration creates nothing.
    async fn check_namespaces(
        &self,
        registration: &Registration,
    ) -> Result<Vec<String>, AdmissionError> {
        let mut unknown = Vec::new();
        for namespace in &registration.namespaces {
            match self.inner.store.get(namespace).await? {
                Some(record) => check_placement(&record, registration)?,
                None if self.inner.policy == NamespacePolicy::Closed => {
                    return Err(AdmissionError::UnknownNamespace {
                        namespace: namespace.clone(),
                    });
                }
                None => unknown.push(namespace.clone()),
            }
        }
        Ok(unknown)
    }

    /// Mints the unknown namespaces (open policy). The stored record is checked again because
    /// an operator may have created the namespace, pinned, since it was looked up.
    async fn mint(
        &self,
        unknown: Vec<String>,
        registration: &Registration,
    ) -> Result<(), AdmissionError> {
        for name in unknown {
            let record = NamespaceRecord {
                name,
                placement: Placement::Unplaced,
            };
            let stored = self.inner.store.create_if_absent(record).await?;
            check_placement(&stored, registration)?;
        }
        Ok(())
    }

    fn insert(
        &self,
        caller: &CallerIdentity,
        registration: Registration,
        delivery: Arc<dyn WorkerDelivery>,
        capacity: Option<NonZeroU32>,
    ) -> Result<(RegistrationToken, Vec<String>), AdmissionError> {
        let Registration {
            namespaces,
            task_queue,
            node,
            activity_types,
            identity,
            reconnect_grace,
            ..
        } = registration;
        let task_queue = normalise_task_queue(&task_queue).to_owned();
        let (sender, departure) = crate::registry::departure_pair();
        // A session worker's leg is core's: a resume swaps the connection beneath it.
        let session_leg = (!reconnect_grace.is_zero())
            .then(|| Arc::new(crate::session::SessionLeg::new(Arc::clone(&delivery))));
        let delivery: Arc<dyn WorkerDelivery> = match &session_leg {
            Some(leg) => Arc::clone(leg) as Arc<dyn WorkerDelivery>,
            None => delivery,
        };
        let (worker, forgotten, grant) = {
            let mut state = self.inner.lock();
            // Checked under the lock the shutdown broadcast takes, so no worker is admitted
            // after the broadcast listed who to tell.
            if state.closed {
                return Err(AdmissionError::ShuttingDown);
            }
            quota::check_worker_quota(&state, caller)?;
            // Under the registry lock, so two registrations cannot both take the last room.
            let forgotten = {
                let mut ledger = self.inner.ledger();
                let mut forgotten = ledger.expire(Instant::now());
                forgotten.extend(ledger.make_room(&namespaces)?);
                ledger.joined(&namespaces, &delivery.transport());
                forgotten
            };
            let id = state.mint_id();
            let worker = Worker::new(
                id,
                namespaces,
                task_queue,
                node,
                activity_types,
                identity,
                caller.principal.clone(),
                delivery,
            );
            let worker = if session_leg.is_some() {
                worker.with_session()
            } else {
                worker
            };
            if self.inner.opening_probation {
                state
                    .exclusions
                    .insert(id, DispatchExclusion::OpeningProbation);
            }
            let grant = session_leg.map(|leg| {
                let grant = crate::session::SessionGrant {
                    session_id: id,
                    secret: crate::session::ResumeSecret::generate(),
                    grace: reconnect_grace,
                };
                (grant, leg)
            });
            state.insert(worker.clone(), capacity, sender, grant.clone());
            (worker, forgotten, grant.map(|(grant, _)| grant))
        };
        tracing::info!(worker = %worker.id(), transport = %worker.transport(),
            namespaces = ?worker.namespaces(), task_queue = worker.task_queue(),
            capacity = capacity.map(NonZeroU32::get), "worker admitted");
        let mut token = RegistrationToken::new(Arc::clone(&self.inner), worker.id(), departure);
        if let Some(grant) = grant {
            token = token.with_session(grant, 0);
        }
        Ok((token, forgotten))
    }
}

fn check_placement(
    record: &NamespaceRecord,
    registration: &Registration,
) -> Result<(), AdmissionError> {
    let Placement::Pinned(nodes) = &record.placement else {
        return Ok(());
    };
    if registration
        .node
        .as_ref()
        .is_some_and(|node| nodes.contains(node))
    {
        return Ok(());
    }
    Err(AdmissionError::PlacementViolated {
        namespace: record.name.clone(),
        node: registration.node.clone(),
        required: nodes.iter().cloned().collect(),
    })
}
