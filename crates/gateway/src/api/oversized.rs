//! Wraps the producer API so a request tonic refuses to decode as too large answers
//! `RESOURCE_EXHAUSTED` (with the input limit) instead of tonic's `OUT_OF_RANGE`.
//!
//! Tonic checks a message's declared length before our handlers run and answers a unary call
//! with a trailers-only response; this wrapper rewrites that status. A stream's item arrives
//! in the handler instead, which applies the same [`super::outcome::oversized_request`].

use std::convert::Infallible;

use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::server::NamedService;

use super::outcome;

/// `inner` with tonic's decode-size refusal restated as `RESOURCE_EXHAUSTED`.
#[derive(Clone, Debug)]
pub(crate) struct OversizedAsExhausted<S> {
    inner: S,
    max_input: usize,
}

impl<S> OversizedAsExhausted<S> {
    /// Wraps `inner`; refusals name `max_input`, the dispatch input limit.
    pub(crate) fn new(inner: S, max_input: usize) -> Self {
        Self { inner, max_input }
    }
}

impl<S: NamedService> NamedService for OversizedAsExhausted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for OversizedAsExhausted<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let response = self.inner.call(request);
        let max_input = self.max_input;
        Box::pin(async move {
            let response = response.await?;
            let restated = Status::from_header_map(response.headers())
                .and_then(|status| outcome::oversized_request(&status, max_input));
            Ok(match restated {
                Some(status) => status.into_http(),
                None => response,
            })
        })
    }
}
