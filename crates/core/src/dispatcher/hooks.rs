//! What a caller of the dispatcher hears about one dispatch while it runs, and the rules it
//! asks to be exempt from.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::address::WorkerId;
use crate::registry::UnservedReason;

/// Called with the worker and the attempt number of each delivery.
pub type DeliveredHook = Arc<dyn Fn(WorkerId, u32) + Send + Sync>;
/// Called with the reason each time a dispatch parks, or its parked reason changes.
pub type ParkedHook = Arc<dyn Fn(UnservedReason) + Send + Sync>;

/// What a caller of [`Dispatcher::dispatch_with`](super::Dispatcher::dispatch_with) wants to
/// hear about one dispatch, and how it runs.
///
/// The default is what [`Dispatcher::dispatch`](super::Dispatcher::dispatch) uses: nothing to
/// call, attempts from 1, every quota applied. Hooks run on the dispatch's own task, inside
/// the dispatcher: they must return at once (hand slow work to another task).
#[derive(Clone, Default)]
pub struct DispatchHooks {
    /// Deliveries made before this dispatch started (by a gateway that has since restarted):
    /// the first delivery is attempt `attempt_offset + 1`.
    pub attempt_offset: u32,
    /// Called right after each successful delivery with `(worker, attempt)`; `attempt` is the
    /// one the worker sees in its [`ActivityTask`](crate::ActivityTask).
    pub on_delivered: Option<DeliveredHook>,
    /// Called when the dispatch parks with the reason no worker takes it, and again whenever
    /// that reason changes.
    pub on_parked: Option<ParkedHook>,
    /// A durable dispatch: exempt from the parked-count and held-bytes quotas (the dispatch
    /// store bounds those).
    pub durable: bool,
    /// Cancels the dispatch when fired (it ends `Cancelled`, its worker is sent a cancel); a
    /// dispatch with an activity id is also cancelled through that id.
    pub cancel: Option<CancellationToken>,
    /// Take a local worker now or not at all: a miss ends the dispatch `Unserved` at once,
    /// without parking or offering it to other nodes (a node taking another node's offer).
    pub local_only: bool,
}

impl std::fmt::Debug for DispatchHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchHooks")
            .field("attempt_offset", &self.attempt_offset)
            .field("on_delivered", &self.on_delivered.is_some())
            .field("on_parked", &self.on_parked.is_some())
            .field("durable", &self.durable)
            .field("cancel", &self.cancel.is_some())
            .field("local_only", &self.local_only)
            .finish()
    }
}
