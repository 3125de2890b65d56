//! `DispatchStream`: many dispatches over one bidirectional stream, correlated by id, with a
//! bound on how many run at once.
//!
//! One driver task per stream reads requests only while fewer than the limit are in flight,
//! so a producer that outruns its workers is pushed back by HTTP/2 flow control rather than
//! buffered. Replies go out in completion order through a channel of the same bound. When the
//! producer goes away the driver ends and drops its dispatches, which core cancels as
//! `CallerGone`. When the server closes, the driver stops reading and sends the replies of the
//! dispatches still running before it ends, so every accepted request gets exactly one reply.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use switchyard_core::{CallerIdentity, Dispatcher};
use switchyard_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming};
use tracing::Instrument;

use super::outcome;

/// Replies of one `DispatchStream`.
pub(crate) type ReplyStream = ReceiverStream<Result<pb::DispatchStreamReply, Status>>;

/// Limits of one stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamLimits {
    /// Dispatches run at once.
    pub(crate) max_in_flight: usize,
    /// Timeout of a request that asks for none.
    pub(crate) default_timeout: Duration,
}

/// Starts the driver of one stream and returns its replies.
pub(crate) fn start(
    dispatcher: Dispatcher,
    caller: CallerIdentity,
    inbound: Streaming<pb::DispatchStreamRequest>,
    limits: StreamLimits,
    closing: CancellationToken,
) -> ReplyStream {
    let (replies, receiver) = mpsc::channel(limits.max_in_flight.max(1));
    let span = tracing::debug_span!("dispatch_stream", principal = %caller.principal);
    tokio::spawn(
        drive(
            dispatcher,
            Arc::new(caller),
            inbound,
            limits,
            replies,
            closing,
        )
        .instrument(span),
    );
    ReceiverStream::new(receiver)
}

async fn drive(
    dispatcher: Dispatcher,
    caller: Arc<CallerIdentity>,
    mut inbound: Streaming<pb::DispatchStreamRequest>,
    limits: StreamLimits,
    replies: mpsc::Sender<Result<pb::DispatchStreamReply, Status>>,
    closing: CancellationToken,
) {
    let mut running = FuturesUnordered::new();
    let mut correlation_ids = HashSet::new();
    let mut reading = true;
    while reading || !running.is_empty() {
        let reply = tokio::select! {
            next = inbound.message(), if reading && running.len() < limits.max_in_flight => {
                match next {
                    Ok(Some(item)) => {
                        let pb::DispatchStreamRequest { correlation_id, request } = item;
                        let refusal = match request {
                            None => Some(Status::invalid_argument("request is required")),
                            Some(_) if correlation_ids.contains(&correlation_id) => Some(
                                Status::already_exists(format!(
                                    "correlation_id {correlation_id} is already in flight on \
                                     this stream"
                                )),
                            ),
                            Some(request) => {
                                correlation_ids.insert(correlation_id);
                                let dispatcher = dispatcher.clone();
                                let caller = Arc::clone(&caller);
                                let request = outcome::request(request, limits.default_timeout);
                                running.push(async move {
                                    (correlation_id, dispatcher.dispatch(&caller, request).await)
                                });
                                None
                            }
                        };
                        match refusal {
                            Some(status) => refused(correlation_id, &status),
                            None => continue,
                        }
                    }
                    Ok(None) => {
                        reading = false;
                        continue;
                    }
                    Err(status) => {
                        match outcome::oversized_request(&status, dispatcher.max_input_bytes()) {
                            Some(refusal) => {
                                let _ = replies.send(Err(refusal)).await;
                            }
                            None => tracing::debug!(%status, "dispatch stream ended by the producer"),
                        }
                        return;
                    }
                }
            }
            Some((correlation_id, result)) = running.next(), if !running.is_empty() => {
                correlation_ids.remove(&correlation_id);
                match result {
                    Ok(ended) => pb::DispatchStreamReply {
                        correlation_id,
                        result: Some(pb::dispatch_stream_reply::Result::Outcome(
                            outcome::outcome(ended),
                        )),
                    },
                    Err(error) => refused(correlation_id, &outcome::refusal(&error)),
                }
            }
            () = replies.closed() => return,
            // The server is closing: read no more, but every dispatch already running still
            // sends its one reply (core has ended them all by now).
            () = closing.cancelled(), if reading => {
                reading = false;
                continue;
            }
        };
        if replies.send(Ok(reply)).await.is_err() {
            return;
        }
    }
}

fn refused(correlation_id: u64, status: &Status) -> pb::DispatchStreamReply {
    let code: Code = status.code();
    pb::DispatchStreamReply {
        correlation_id,
        result: Some(pb::dispatch_stream_reply::Result::Refused(
            pb::DispatchRefusal {
                code: code as i32,
                message: status.message().to_owned(),
            },
        )),
    }
}
