//! The standard health service with a ceiling on `Watch` streams: health needs no credential,
//! so the streams a caller may hold open must cost little and be counted.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use switchyard_core::Throttle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// Counter of health `Watch` streams refused, labelled `limit`.
pub(crate) const HEALTH_WATCH_REFUSED_TOTAL: &str = "switchyard_health_watch_refused_total";

/// The configuration key of the ceiling, as refusals name it.
const LIMIT_KEY: &str = "grpc.max_health_watchers";

/// `Check` as the stock service answers it; `Watch` only while fewer than the ceiling are open.
pub(crate) struct CappedHealth {
    inner: HealthService,
    watchers: Arc<Semaphore>,
    limit: usize,
    refusals: Mutex<Throttle>,
}

impl CappedHealth {
    /// The service reporting what `reporter` is told, with at most `limit` `Watch` streams.
    pub(crate) fn new(reporter: HealthReporter, limit: usize) -> Self {
        Self {
            inner: HealthService::from_health_reporter(reporter),
            watchers: Arc::new(Semaphore::new(limit.min(Semaphore::MAX_PERMITS))),
            limit,
            refusals: Mutex::new(Throttle::default()),
        }
    }

    /// The tonic server for it.
    pub(crate) fn into_server(self) -> HealthServer<Self> {
        HealthServer::new(self)
    }

    fn refuse(&self) -> Status {
        metrics::counter!(HEALTH_WATCH_REFUSED_TOTAL, "limit" => LIMIT_KEY).increment(1);
        let now = std::time::Instant::now();
        let logged = self
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .allow(now);
        if let Some(suppressed) = logged {
            tracing::warn!(
                suppressed,
                "health watch refused: {LIMIT_KEY} ({}) reached",
                self.limit
            );
        }
        Status::resource_exhausted(format!("{LIMIT_KEY} ({}) reached", self.limit))
    }
}

#[tonic::async_trait]
impl Health for CappedHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = Watch;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let Ok(permit) = Arc::clone(&self.watchers).try_acquire_owned() else {
            return Err(self.refuse());
        };
        let inner = self.inner.watch(request).await?.into_inner();
        Ok(Response::new(Watch {
            inner,
            _permit: permit,
        }))
    }
}

/// A `Watch` stream holding its place under the ceiling until it ends.
pub(crate) struct Watch {
    inner: <HealthService as Health>::WatchStream,
    _permit: OwnedSemaphorePermit,
}

impl Stream for Watch {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    fn request() -> Request<HealthCheckRequest> {
        Request::new(HealthCheckRequest {
            service: String::new(),
        })
    }

    #[tokio::test]
    async fn watch_streams_beyond_the_ceiling_are_refused_naming_it() {
        let reporter = HealthReporter::new();
        let service = CappedHealth::new(reporter, 2);
        let first = service.watch(request()).await.unwrap().into_inner();
        let mut second = service.watch(request()).await.unwrap().into_inner();
        let refused = service.watch(request()).await.err().unwrap();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("grpc.max_health_watchers (2)"),
            "{}",
            refused.message()
        );
        assert!(second.next().await.is_some(), "an admitted watch answers");
        // Control: a stream that ends gives its place back.
        drop(first);
        assert!(service.watch(request()).await.is_ok());
    }
}
