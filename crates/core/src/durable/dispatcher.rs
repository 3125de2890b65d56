//! [`DurableDispatcher`]: durable dispatches recorded in a [`DispatchStore`] before they are
//! acknowledged, run by one driver each through the one [`Dispatcher`], their one outcome
//! recorded and then announced to waiters and watchers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::driver::drive;
use super::early::record_while_running;
use super::live::{Live, LiveBook};
use super::record::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchState, NewDispatch,
    OutcomeRecord, Recorded, StoredDispatch,
};
use super::store::{DispatchStore, DispatchStoreError};
use super::watch::{OutcomeWatch, Watchers};
use crate::address::normalise_task_queue;
use crate::dispatcher::Dispatcher;
use crate::outcome::{ActivityOutcome, ActivityRequest, DispatchError};
use crate::registration::CallerIdentity;

/// How a [`DurableDispatcher`] keeps outcomes and feeds watchers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableConfig {
    /// How long a finished dispatch (and its idempotency key) is kept (default 24 h).
    pub outcome_retention: Duration,
    /// How often finished dispatches past their retention are deleted (default 1 min).
    pub purge_interval: Duration,
    /// Outcomes a watcher may fall behind by before it is told it missed some (default
    /// 1024; at least 1).
    pub watch_capacity: usize,
}

impl Default for DurableConfig {
    fn default() -> Self {
        Self {
            outcome_retention: Duration::from_secs(24 * 3600),
            purge_interval: Duration::from_secs(60),
            watch_capacity: 1024,
        }
    }
}

/// What [`DurableDispatcher::submit`] returns: the dispatch's id, once it is recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The dispatch's id.
    pub id: DispatchId,
    /// True when the idempotency key was already used: `id` is the first dispatch's, and
    /// nothing new runs.
    pub existing: bool,
}

/// What [`DurableDispatcher::dispatch`] returns: the dispatch's id and its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Awaited {
    /// The dispatch's id.
    pub id: DispatchId,
    /// Its one outcome; `None` when it had none within the wait (or the gateway stops): it
    /// runs on, also after a restart.
    pub outcome: Option<ActivityOutcome>,
}

/// Why a submission was refused (nothing was recorded).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The request fails the dispatcher's checks (a name, the input size, the grant).
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    /// The store refused it (a bound, the idempotency key) or failed.
    #[error(transparent)]
    Store(#[from] DispatchStoreError),
}

/// Why a durable dispatch could not be read or cancelled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// No such dispatch for this caller: never recorded, deleted after its retention, or
    /// another principal's (its existence is not revealed).
    #[error("dispatch {id} not found")]
    NotFound {
        /// The id asked for.
        id: DispatchId,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] DispatchStoreError),
}

/// Whether `caller` may read and cancel `dispatch`: its submitting principal, or an operator
/// (or admin) granted its namespace.
pub(super) fn may_see(caller: &CallerIdentity, dispatch: &NewDispatch) -> bool {
    owns(caller, &dispatch.principal, &dispatch.namespace)
}

/// The rule of [`may_see`], on a dispatch's principal and namespace.
fn owns(caller: &CallerIdentity, principal: &str, namespace: &str) -> bool {
    principal == caller.principal || caller.operates(namespace)
}

/// What the handles and the drivers share.
pub(super) struct Shared {
    pub(super) dispatcher: Dispatcher,
    pub(super) store: Arc<dyn DispatchStore>,
    pub(super) live: LiveBook,
    watchers: Watchers,
    /// Fired by [`DurableDispatcher::shutdown`].
    pub(super) stopping: CancellationToken,
    /// Drivers running.
    drivers: AtomicUsize,
    /// Told when the last driver running ends.
    drivers_ended: Notify,
}

/// Spawns a dispatch's driver boxed. A driver's state holds the whole dispatch future (some
/// kilobytes); unboxed, tokio copies it into the task at the spawn and copies the task's
/// stage again when it ends, once per durable dispatch (`memcpy` was a tenth of the runtime's
/// CPU in the durable stream's profile, docs/benchmarks.md); boxed, it moves a pointer.
fn spawn_boxed<F>(future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(Box::pin(future));
}

/// Counts one driver, from its spawn until its task ends or is dropped unrun.
pub(super) struct DriverRunning(pub(super) Arc<Shared>);

impl DriverRunning {
    /// Counts a driver about to start.
    fn start(shared: &Arc<Shared>) -> Self {
        shared.drivers.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(shared))
    }
}

impl Drop for DriverRunning {
    fn drop(&mut self) {
        if self.0.drivers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.drivers_ended.notify_waiters();
        }
    }
}

impl Shared {
    /// Starts the driver of `row`, tracked as `live`.
    fn spawn_driver(self: &Arc<Self>, row: StoredDispatch, live: Arc<Live>, resumed: bool) {
        let running = DriverRunning::start(self);
        spawn_boxed(drive(running, row, live, resumed));
    }

    /// Records `dispatch`, tells `submitted` how that went, then drives it on this task
    /// (not after a shutdown: it runs at the next start).
    async fn record_and_drive(
        self: Arc<Self>,
        dispatch: NewDispatch,
        submitted: oneshot::Sender<Result<Submitted, DispatchStoreError>>,
    ) {
        // Tracked before it is recorded: whoever learns the id (this caller, or another one
        // repeating its idempotency key) finds a live dispatch to wait on.
        let live = (!self.stopping.is_cancelled()).then(|| {
            self.live.insert(
                dispatch.id.clone(),
                &dispatch.principal,
                &dispatch.namespace,
            )
        });
        let id = match self.store.record(dispatch.clone()).await {
            Ok(Recorded::New(id)) => id,
            refused_or_existing => {
                if live.is_some() {
                    self.live.finish(&dispatch.id, None);
                }
                let answer = refused_or_existing.map(|recorded| Submitted {
                    id: recorded.id().clone(),
                    existing: true,
                });
                let _ = submitted.send(answer);
                return;
            }
        };
        let Some(live) = live else {
            let _ = submitted.send(Ok(Submitted {
                id,
                existing: false,
            }));
            return;
        };
        // Counted before the caller hears of it, as a spawned driver would be.
        let running = DriverRunning::start(&self);
        // A caller that went away still has its dispatch driven.
        let _ = submitted.send(Ok(Submitted {
            id,
            existing: false,
        }));
        let row = StoredDispatch {
            dispatch,
            state: DispatchState::Queued { not_before: None },
            attempts: 0,
        };
        drive(running, row, live, false).await;
    }

    /// Hands `id`'s recorded outcome to its waiters and its principal's watchers (`None`:
    /// nothing recorded, the waiters keep waiting for the next start).
    pub(super) fn announce(
        &self,
        principal: &str,
        id: &DispatchId,
        outcome: Option<ActivityOutcome>,
    ) {
        if let Some(outcome) = &outcome {
            self.watchers.announce(principal, id, outcome);
        }
        self.live.finish(id, outcome);
    }
}

/// Durable dispatches: recorded before they are acknowledged, run at least once, one outcome
/// each, resumed after a restart; cheap to clone.
///
/// [`start`](Self::start) resumes every unfinished dispatch in the store; from then on
/// [`submit`](Self::submit) records and starts new ones. Each runs through
/// [`Dispatcher::dispatch_with`] as a durable dispatch (exempt from the ephemeral parked and
/// held-bytes quotas; the store bounds it), its deliveries and parking written to the store
/// as they happen. Its outcome is recorded (retried while the store fails) before any waiter
/// or watcher hears it; `ShuttingDown` is not an outcome here: the dispatch stays unfinished
/// and runs again at the next start, with the attempt number counted on.
///
/// Only the submitting principal, or an operator of the namespace, sees a dispatch; to
/// anyone else it is [`LookupError::NotFound`]. A request's `activity_id` is not kept: a
/// durable dispatch is cancelled by its [`DispatchId`].
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use switchyard_core::{
///     ActivityRequest, CallerIdentity, DispatchConfig, Dispatcher, DurableConfig,
///     DurableDispatcher, MemoryDispatchStore, MemoryStoreLimits, Registry,
/// };
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let dispatcher = Dispatcher::new(Registry::default(), DispatchConfig::default());
/// let store = Arc::new(MemoryDispatchStore::new(MemoryStoreLimits::default()));
/// let durable = DurableDispatcher::start(dispatcher, store, DurableConfig::default()).await?;
/// let shop = CallerIdentity::trusted("shop");
/// let request = ActivityRequest {
///     namespace: "payments".into(),
///     task_queue: String::new(),
///     activity_type: "charge".into(),
///     node: None,
///     input: "order 7".into(),
///     activity_id: None,
///     timeout: Duration::from_secs(60),
/// };
/// let submitted = durable.submit(&shop, request, Some("order-7".into())).await?;
/// // No worker serves `payments` yet: the dispatch is recorded and waits for one.
/// let outcome = durable.await_outcome(&shop, &submitted.id, Duration::ZERO).await?;
/// assert_eq!(outcome, None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct DurableDispatcher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DurableDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableDispatcher")
            .field("running", &self.shared.live.len())
            .field("store", &self.shared.store)
            .finish()
    }
}

impl DurableDispatcher {
    /// Resumes every unfinished dispatch in `store` and starts the retention loop.
    pub async fn start(
        dispatcher: Dispatcher,
        store: Arc<dyn DispatchStore>,
        config: DurableConfig,
    ) -> Result<Self, DispatchStoreError> {
        let unfinished = store.unfinished().await?;
        let shared = Arc::new(Shared {
            dispatcher,
            store,
            live: LiveBook::default(),
            watchers: Watchers::new(config.watch_capacity),
            stopping: CancellationToken::new(),
            drivers: AtomicUsize::new(0),
            drivers_ended: Notify::new(),
        });
        tracing::info!(
            dispatches = unfinished.len(),
            "resuming unfinished durable dispatches"
        );
        // Every one is tracked before any driver runs, so no cancel misses it.
        let resumed: Vec<_> = unfinished
            .into_iter()
            .map(|row| {
                let d = &row.dispatch;
                let live = shared.live.insert(d.id.clone(), &d.principal, &d.namespace);
                (row, live)
            })
            .collect();
        for (row, live) in resumed {
            shared.spawn_driver(row, live, true);
        }
        if let Some(feed) = shared.store.recorded_elsewhere() {
            tokio::spawn(hear_elsewhere(Arc::clone(&shared), feed));
        }
        tokio::spawn(purge_loop(Arc::clone(&shared), config));
        Ok(Self { shared })
    }

    /// Drives `rows` as [`start`](Self::start) resumes its store's: unfinished dispatches the
    /// store has handed to this node since (a cluster node taking over a lost node's work).
    /// One already driven here, and every one after [`shutdown`](Self::shutdown), is skipped.
    pub fn adopt(&self, rows: Vec<StoredDispatch>) {
        for row in rows {
            let id = &row.dispatch.id;
            if self.shared.stopping.is_cancelled() || self.shared.live.get(id).is_some() {
                continue;
            }
            let live = self.shared.live.insert(
                id.clone(),
                &row.dispatch.principal,
                &row.dispatch.namespace,
            );
            self.shared.spawn_driver(row, live, true);
        }
    }

    /// Records a durable dispatch and starts it; returns its id once the record is committed.
    ///
    /// The request passes the dispatcher's checks first ([`Dispatcher::check`]); its
    /// deadline is its timeout from now (clamped like any dispatch's). A repeated
    /// `idempotency_key` in the namespace returns the first dispatch's id and runs nothing.
    /// After [`shutdown`](Self::shutdown) a submission is still recorded; it runs at the
    /// next start. Nothing runs before the record commits, so a refused submission ran
    /// nothing (unlike [`dispatch`](Self::dispatch), which delivers while it records).
    pub async fn submit(
        &self,
        caller: &CallerIdentity,
        request: ActivityRequest,
        idempotency_key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        let dispatch = self.new_dispatch(caller, request, idempotency_key)?;
        let span = tracing::debug_span!("durable_submit", dispatch_id = %dispatch.id,
            namespace = %dispatch.namespace);
        // On its own task, which then drives it: a caller that goes away while the store
        // commits must not leave a recorded dispatch without its driver.
        let shared = Arc::clone(&self.shared);
        let (submitted, answer) = oneshot::channel();
        spawn_boxed(
            shared
                .record_and_drive(dispatch, submitted)
                .instrument(span),
        );
        heard_submitted(answer).await
    }

    /// Runs a durable dispatch without an idempotency key to its outcome, waiting up to
    /// `wait` for it (from this call: the record's commit counts in it): what a durable
    /// `Dispatch` does.
    ///
    /// The same as [`submit`](Self::submit) then [`await_outcome`](Self::await_outcome),
    /// except that with a store that [orders its writes](DispatchStore::orders_writes) the
    /// task is delivered while its record commits: nobody hears of the dispatch before its
    /// outcome, which is announced only once the record and the outcome are committed. A
    /// refused record is this call's error, and a worker already handed the task is sent a
    /// cancel. After [`shutdown`](Self::shutdown) it is recorded, not run (`outcome` `None`).
    pub async fn dispatch(
        &self,
        caller: &CallerIdentity,
        request: ActivityRequest,
        wait: Duration,
    ) -> Result<Awaited, SubmitError> {
        let dispatch = self.new_dispatch(caller, request, None)?;
        let shared = &self.shared;
        if shared.stopping.is_cancelled() {
            let submitted = self.submit_new(dispatch).await?;
            return Ok(Awaited {
                id: submitted.id,
                outcome: None,
            });
        }
        let (outcome, answer) = self.start_early(dispatch);
        // The outcome first: the driver answers the record before it announces an outcome (and
        // ends the wait without one when the record is refused), so a heard outcome finds the
        // answer there, and this call is woken once, not once for each.
        let outcome = self.wait_for(outcome, wait).await;
        let submitted = heard_submitted(answer).await?;
        Ok(Awaited {
            id: submitted.id,
            outcome,
        })
    }

    /// Starts `dispatch`'s driver, which records it and (with a store that
    /// [orders its writes](DispatchStore::orders_writes)) delivers it meanwhile: its outcome
    /// to watch, and the answer of its record.
    fn start_early(
        &self,
        dispatch: NewDispatch,
    ) -> (
        oneshot::Receiver<ActivityOutcome>,
        oneshot::Receiver<Result<Submitted, DispatchStoreError>>,
    ) {
        let shared = &self.shared;
        let span = tracing::debug_span!("durable_dispatch_early", dispatch_id = %dispatch.id,
            namespace = %dispatch.namespace);
        let live = shared.live.insert(
            dispatch.id.clone(),
            &dispatch.principal,
            &dispatch.namespace,
        );
        let outcome = live.outcome();
        let running = DriverRunning::start(shared);
        let (submitted, answer) = oneshot::channel();
        let early = shared.store.orders_writes();
        spawn_boxed(
            record_while_running(running, dispatch, live, early, submitted).instrument(span),
        );
        (outcome, answer)
    }

    /// `request` as a dispatch to record, once it passes the dispatcher's checks.
    fn new_dispatch(
        &self,
        caller: &CallerIdentity,
        mut request: ActivityRequest,
        idempotency_key: Option<String>,
    ) -> Result<NewDispatch, SubmitError> {
        request.activity_id = None;
        self.shared.dispatcher.check(caller, &request)?;
        let now = SystemTime::now();
        let timeout = request.timeout.min(self.shared.dispatcher.max_timeout());
        Ok(NewDispatch {
            id: DispatchId::generate(),
            namespace: request.namespace,
            task_queue: normalise_task_queue(&request.task_queue).to_owned(),
            activity_type: request.activity_type,
            node: request.node.filter(|node| !node.is_empty()),
            input: request.input,
            principal: caller.principal.clone(),
            idempotency_key,
            submitted_at: now,
            deadline: now + timeout,
        })
    }

    /// Records `dispatch` after a shutdown: it runs at the next start.
    async fn submit_new(&self, dispatch: NewDispatch) -> Result<Submitted, SubmitError> {
        let (submitted, answer) = oneshot::channel();
        spawn_boxed(Arc::clone(&self.shared).record_and_drive(dispatch, submitted));
        heard_submitted(answer).await
    }

    /// `id`'s row, if `caller` may see it.
    async fn visible(
        &self,
        caller: &CallerIdentity,
        id: &DispatchId,
    ) -> Result<StoredDispatch, LookupError> {
        match self.shared.store.get(id).await? {
            Some(row) if may_see(caller, &row.dispatch) => Ok(row),
            _ => Err(LookupError::NotFound { id: id.clone() }),
        }
    }

    /// `id`'s one outcome, waiting up to `wait` for it; `Ok(None)` when it has none yet
    /// (also when the gateway shuts down meanwhile).
    pub async fn await_outcome(
        &self,
        caller: &CallerIdentity,
        id: &DispatchId,
        wait: Duration,
    ) -> Result<Option<ActivityOutcome>, LookupError> {
        // A dispatch running here is waited on without reading the store: its driver announces
        // the outcome only once it is recorded.
        let live = match self.shared.live.get(id) {
            Some(live) if owns(caller, &live.principal, &live.namespace) => live,
            Some(_) => return Err(LookupError::NotFound { id: id.clone() }),
            None => {
                let row = self.visible(caller, id).await?;
                if let Some(outcome) = finished(&row)? {
                    return Ok(Some(outcome));
                }
                match self.shared.live.get(id) {
                    Some(live) => live,
                    // Its driver ended between the read and now, none runs (after a
                    // shutdown), or another process sharing the store drives it.
                    None => {
                        let heard = tokio::select! {
                            heard = self.shared.store.await_recorded(id, wait) => heard?,
                            () = self.shared.stopping.cancelled() => None,
                        };
                        if let Some(row) = heard {
                            return finished(&row);
                        }
                        let row = self.visible(caller, id).await?;
                        return finished(&row);
                    }
                }
            }
        };
        let outcome = live.outcome();
        drop(live);
        Ok(self.wait_for(outcome, wait).await)
    }

    /// The outcome `outcome` hears within `wait`; `None` also when the dispatch ended without
    /// one here or the dispatcher shut down ([`shutdown`](Self::shutdown) ends every wait).
    async fn wait_for(
        &self,
        outcome: oneshot::Receiver<ActivityOutcome>,
        wait: Duration,
    ) -> Option<ActivityOutcome> {
        // A wait that began after the shutdown's sweep of the waits.
        if self.shared.stopping.is_cancelled() {
            return None;
        }
        tokio::time::timeout(wait, outcome).await.ok()?.ok()
    }

    /// The outcomes of `caller`'s principal's durable dispatches, as they are recorded from
    /// now on; bounded by [`DurableConfig::watch_capacity`], a watcher that falls further
    /// behind is told how many it missed.
    pub fn watch(&self, caller: &CallerIdentity) -> OutcomeWatch {
        self.shared.watchers.subscribe(&caller.principal)
    }

    /// Where `id` stands; a dispatch running here reports the dispatcher's latest word
    /// (parked and why, running on which worker) even when the store's row lags.
    pub async fn get(
        &self,
        caller: &CallerIdentity,
        id: &DispatchId,
    ) -> Result<StoredDispatch, LookupError> {
        let row = self.visible(caller, id).await?;
        Ok(self.merge_live(row))
    }

    fn merge_live(&self, mut row: StoredDispatch) -> StoredDispatch {
        if matches!(row.state, DispatchState::Finished { .. }) {
            return row;
        }
        if let Some(state) = self
            .shared
            .live
            .get(&row.dispatch.id)
            .and_then(|live| live.state())
        {
            if let DispatchState::Running { attempt, .. } = &state {
                row.attempts = row.attempts.max(*attempt);
            }
            row.state = state;
        }
        row
    }

    /// Dispatches matching `filter` that `caller` may see: anyone sees its own principal's;
    /// an operator sees every principal's in the namespaces it operates.
    pub async fn list(
        &self,
        caller: &CallerIdentity,
        mut filter: DispatchFilter,
    ) -> Result<Vec<StoredDispatch>, LookupError> {
        let operator = caller.has_role(crate::Role::Operator);
        if !operator {
            if filter
                .principal
                .as_ref()
                .is_some_and(|p| *p != caller.principal)
            {
                return Ok(Vec::new());
            }
            filter.principal = Some(caller.principal.clone());
        }
        let rows = self.shared.store.list(&filter).await?;
        Ok(rows
            .into_iter()
            .filter(|row| may_see(caller, &row.dispatch))
            .map(|row| self.merge_live(row))
            .collect())
    }

    /// Cancels `id`: it ends `Cancelled` (its worker, if one holds it, is sent a cancel) and
    /// that outcome is recorded. A finished dispatch keeps its outcome.
    pub async fn cancel(
        &self,
        caller: &CallerIdentity,
        id: &DispatchId,
    ) -> Result<(), LookupError> {
        let row = self.visible(caller, id).await?;
        if matches!(row.state, DispatchState::Finished { .. }) {
            return Ok(());
        }
        if let Some(live) = self.shared.live.get(id) {
            live.cancel.cancel();
            return Ok(());
        }
        // No driver runs it here (submitted after a shutdown): record the cancel itself, once;
        // a failing store is the caller's answer rather than a wait.
        let cancelled = ActivityOutcome::Cancelled;
        let stored = OutcomeRecord::from(&cancelled);
        let outcome = match self
            .shared
            .store
            .complete(id, &stored, SystemTime::now())
            .await?
        {
            Completion::AlreadyFinished(first) => first.to_outcome(),
            Completion::Recorded | Completion::Unknown => Some(cancelled),
        };
        self.shared.announce(&row.dispatch.principal, id, outcome);
        Ok(())
    }

    /// The store's backlog per pool address.
    pub async fn census(&self) -> Result<Vec<BacklogCensus>, DispatchStoreError> {
        self.shared.store.census(SystemTime::now()).await
    }

    /// Stops: new submissions are recorded but not started, watchers end, waiters stop
    /// waiting, the retention loop ends, and drivers stop retrying a failing store. Drivers
    /// still record an outcome their dispatch reaches; a dispatch ended by the dispatcher's
    /// own shutdown is not recorded and runs again at the next start. Call it before
    /// [`Dispatcher::shutdown`].
    pub fn shutdown(&self) {
        // Cancelled first: a wait that begins after the sweep below sees it.
        self.shared.stopping.cancel();
        self.shared.live.close_waits();
        self.shared.watchers.close();
    }

    /// Waits until every driver has ended (after [`shutdown`](Self::shutdown) and the
    /// dispatcher's shutdown): nothing more will be written to the store.
    pub async fn drivers_ended(&self) {
        let shared = &self.shared;
        loop {
            let ended = shared.drivers_ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if shared.drivers.load(Ordering::Acquire) == 0 {
                return;
            }
            ended.await;
        }
    }
}

/// What the task recording a submission answered.
async fn heard_submitted(
    answer: oneshot::Receiver<Result<Submitted, DispatchStoreError>>,
) -> Result<Submitted, SubmitError> {
    match answer.await {
        Ok(submitted) => Ok(submitted?),
        Err(_) => Err(SubmitError::Store(DispatchStoreError::Unavailable {
            detail: "the submission ended before it was recorded".to_owned(),
        })),
    }
}

/// The recorded outcome of a finished row.
fn finished(row: &StoredDispatch) -> Result<Option<ActivityOutcome>, LookupError> {
    let DispatchState::Finished { outcome, .. } = &row.state else {
        return Ok(None);
    };
    match outcome.to_outcome() {
        Some(outcome) => Ok(Some(outcome)),
        None => Err(LookupError::Store(DispatchStoreError::Unavailable {
            detail: format!(
                "outcome kind {:?} of dispatch {} is unknown to this version",
                outcome.kind, row.dispatch.id
            ),
        })),
    }
}

/// Hands the outcomes other processes record in the store to this process's watchers, as
/// its own drivers' outcomes are (same channels, same bound), until shutdown.
async fn hear_elsewhere(shared: Arc<Shared>, mut feed: mpsc::Receiver<StoredDispatch>) {
    loop {
        let row = tokio::select! {
            row = feed.recv() => row,
            () = shared.stopping.cancelled() => return,
        };
        let Some(row) = row else { return };
        if let Ok(Some(outcome)) = finished(&row) {
            shared
                .watchers
                .announce(&row.dispatch.principal, &row.dispatch.id, &outcome);
        }
    }
}

/// Deletes finished dispatches past their retention, at start and every
/// `purge_interval`, until shutdown.
async fn purge_loop(shared: Arc<Shared>, config: DurableConfig) {
    let interval = config.purge_interval.max(Duration::from_millis(1));
    loop {
        let before = SystemTime::now()
            .checked_sub(config.outcome_retention)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        match shared.store.purge(before).await {
            Ok(0) => {}
            Ok(purged) => tracing::debug!(purged, "finished dispatches past retention deleted"),
            Err(error) => {
                tracing::warn!(%error, "finished dispatches not purged; trying again later")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shared.stopping.cancelled() => return,
        }
    }
}
