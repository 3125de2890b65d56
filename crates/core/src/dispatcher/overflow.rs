//! The seam a dispatch that misses locally consults: other gateway nodes that may take it.
//!
//! A dispatch selects locally first; only after that first miss, on the parked path, does the
//! dispatcher ask its [`Overflow`] (if one is installed with
//! [`Dispatcher::set_overflow`](super::Dispatcher::set_overflow)) to offer it elsewhere. A
//! dispatch a local worker takes never touches the overflow. An offer someone took is no
//! longer eligible for a local worker: the dispatch waits for the remote outcome only, so it
//! runs at most once at a time.

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;

use crate::outcome::{ActivityOutcome, ActivityRequest};

/// A boxed future the overflow returns; `'static` so it outlives the call that made it.
pub type OverflowFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a parked dispatch offers: its request (task queue normalised, empty node as none) and
/// when its caller stops waiting.
#[derive(Clone, Copy, Debug)]
pub struct OverflowOffer<'a> {
    /// The request as the caller made it (borrowed: the overflow copies what it keeps).
    pub request: &'a ActivityRequest,
    /// When the dispatch's deadline passes.
    pub deadline: Instant,
    /// Deliveries already made for this dispatch (the remote attempt is one more).
    pub attempt_offset: u32,
}

/// The answer to one offer.
pub enum Offered {
    /// Another node reserved a slot and delivered the task; this resolves with its end.
    /// Dropping it before it resolves cancels the remote task.
    Taken(OverflowFuture<Forwarded>),
    /// No node could take it now.
    NoTaker,
    /// No answer came in time (lost or late): a node may have taken the task and started it,
    /// and the overflow has asked every node to stop it. The dispatch parks as for
    /// [`Self::NoTaker`]; if its deadline passes, its outcome says a node may have started it.
    Unanswered,
}

impl std::fmt::Debug for Offered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Taken(_) => "Taken",
            Self::NoTaker => "NoTaker",
            Self::Unanswered => "Unanswered",
        })
    }
}

/// How a taken offer ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// The remote node's one outcome.
    Outcome(ActivityOutcome),
    /// The remote node was lost while it held the task: counted against the loss budget and
    /// offered again.
    Lost,
}

/// Other gateway nodes a dispatch may be offered to when no local worker takes it.
pub trait Overflow: Send + Sync + 'static {
    /// Offers a dispatch that found no local worker.
    fn offer(&self, offer: OverflowOffer<'_>) -> OverflowFuture<Offered>;

    /// Resolves when another node may have gained a free slot for `request`'s pool since this
    /// call (the parked dispatch then offers again). The dispatcher takes one as each offer
    /// leaves and waits on it only if that offer finds no taker, so a slot announced while
    /// the offer was out is not missed.
    fn capacity_hint(&self, request: &ActivityRequest) -> OverflowFuture<()>;

    /// True when durable dispatches may be offered too: every node reads the same dispatch
    /// store, so the origin records the outcome and another node resumes it if the origin
    /// dies. Default `false`: a durable dispatch stays on the node whose store holds it.
    fn carries_durable(&self) -> bool {
        false
    }
}
