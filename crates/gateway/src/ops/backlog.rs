//! The durable backlog `/metrics` reports: one task reads the dispatch store's census every
//! [`REFRESH`] and keeps the last one, so a scrape never waits on the store.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use switchyard_core::{BacklogCensus, DurableDispatcher};
use tokio_util::sync::CancellationToken;

/// How often the census is read.
pub(crate) const REFRESH: Duration = Duration::from_secs(5);

/// The last census read from the store; empty until the first read.
#[derive(Clone, Debug, Default)]
pub(crate) struct Backlog(Arc<Mutex<Vec<BacklogCensus>>>);

impl Backlog {
    /// The last census.
    pub(crate) fn snapshot(&self) -> Vec<BacklogCensus> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, census: Vec<BacklogCensus>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = census;
    }

    /// Reads `durable`'s census now and every `every` until `stop` fires. A failed read keeps
    /// the last census and is logged.
    pub(crate) async fn refresh(
        self,
        durable: DurableDispatcher,
        every: Duration,
        stop: CancellationToken,
    ) {
        loop {
            match durable.census().await {
                Ok(census) => self.set(census),
                Err(error) => tracing::debug!(%error, "backlog census not read; keeping the last"),
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/durability.md`: the backlog metrics are refreshed every 5 seconds.
    #[test]
    fn the_backlog_is_read_every_documented_5_s() {
        assert_eq!(REFRESH, Duration::from_secs(5));
        let doc = include_str!("../../../../docs/durability.md");
        assert!(doc.contains("from the store, refreshed every 5 seconds"));
    }
}
