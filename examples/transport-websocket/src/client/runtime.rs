//! One registered socket on the worker side: run tasks, answer pings, honour cancels and drain.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use switchyard_core::{ActivityTask, TaskId};
use switchyard_worker::{TaskReply, TaskRunner};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use super::DialConfig;
use super::dial::{RegisteredSocket, Socket};
use super::error::RunError;
use crate::protocol::{self, CloseCode, GatewayFrame, ResultFrame, WorkerFrame};
use crate::socket::{Incoming, close_frame, finish_close, next_message};

/// How the serving loop ended: what `run` returns, and how to close the socket (`None`: the
/// socket is gone; `Some(None)`: answer the gateway's close; `Some(frame)`: send `frame`).
struct End {
    result: Result<(), RunError>,
    close: Option<Option<CloseFrame>>,
}

impl End {
    fn leave(code: CloseCode, reason: &str) -> Self {
        Self {
            result: Ok(()),
            close: Some(Some(close_frame(code, reason))),
        }
    }

    fn violation(code: CloseCode, detail: String) -> Self {
        Self {
            close: Some(Some(close_frame(code, &detail))),
            result: Err(RunError::Protocol(detail)),
        }
    }

    fn lost(detail: impl Into<String>) -> Self {
        Self {
            result: Err(RunError::Lost(detail.into())),
            close: None,
        }
    }
}

/// Serves one registered socket until it ends.
///
/// Handlers run on their own tasks, started by the worker's [`TaskRunner`] (which holds the
/// `max_concurrency` permits); their replies travel back through this loop, which therefore
/// knows when a drain is complete. A separate task writes, so a slow socket never stops pings being read.
pub(super) async fn serve(
    registered: RegisteredSocket,
    settings: &Arc<DialConfig>,
    runner: &TaskRunner,
    outbound_queue: usize,
    stop: &CancellationToken,
) -> Result<(), RunError> {
    let worker = registered.worker_id;
    let (sink, mut stream) = registered.socket.split();
    let (outbound, queued) = mpsc::channel(outbound_queue);
    let mut writer = tokio::spawn(write(sink, queued));
    let mut serving = Serving {
        runner,
        outbound,
        running: HashMap::new(),
        handlers: JoinSet::new(),
        draining: false,
    };
    let end = loop {
        if serving.draining && serving.handlers.is_empty() {
            tracing::info!(%worker, "drained");
            break End::leave(CloseCode::Normal, "drained");
        }
        tokio::select! {
            () = stop.cancelled() => break End::leave(CloseCode::GoingAway, "worker shutting down"),
            incoming = next_message(&mut stream) => match incoming {
                Incoming::Text(text) => match protocol::decode_gateway(&text) {
                    Ok(frame) => {
                        if let Err(end) = serving.on_frame(frame).await {
                            break end;
                        }
                    }
                    Err(error) => break End::violation(CloseCode::InvalidPayload, error.to_string()),
                },
                Incoming::Closed(_) if serving.draining && serving.handlers.is_empty() => {
                    // Asked to drain with nothing left to finish: the drain is done, whoever
                    // closed first.
                    break End { result: Ok(()), close: Some(None) };
                }
                Incoming::Closed(frame) => {
                    let (code, reason) = frame.map_or((1005, String::new()), |frame| {
                        (u16::from(frame.code), frame.reason.to_string())
                    });
                    break End { result: Err(RunError::Closed { code, reason }), close: Some(None) };
                }
                Incoming::Binary => break End::violation(
                    CloseCode::UnsupportedData,
                    "the gateway sent a binary message".to_owned(),
                ),
                Incoming::TooBig(detail) => break End::violation(CloseCode::TooBig, detail),
                Incoming::Lost(detail) => break End::lost(detail),
            },
            Some(joined) = serving.handlers.join_next(), if !serving.handlers.is_empty() => {
                // Handlers never panic out (they are caught) and are aborted only with the
                // set, so a join error cannot happen while the set is alive.
                let Ok(reply) = joined else { continue };
                if !serving.report(reply).await {
                    break End::lost("the socket writer stopped");
                }
            }
        }
    };
    serving.abandon();
    // Dropping the serving's sender lets the writer send what is queued (a drained worker's
    // last results) and hand the sink back.
    drop(serving);
    let close_timeout = settings.close_timeout;
    let sink = match tokio::time::timeout(close_timeout, &mut writer).await {
        Ok(Ok((sink, Ok(())))) => Some(sink),
        Ok(Ok((_, Err(error)))) => {
            tracing::debug!(%error, "writing to the gateway failed");
            None
        }
        Ok(Err(_)) | Err(_) => {
            writer.abort();
            None
        }
    };
    if let (Some(frame), Some(sink)) = (end.close, sink) {
        if let Ok(mut socket) = stream.reunite(sink) {
            finish_close(&mut socket, frame, close_timeout).await;
        }
    }
    end.result
}

struct Serving<'a> {
    runner: &'a TaskRunner,
    outbound: mpsc::Sender<Message>,
    /// Cancellation of each task not yet reported.
    running: HashMap<TaskId, CancellationToken>,
    handlers: JoinSet<TaskReply>,
    draining: bool,
}

impl Serving<'_> {
    /// Acts on one gateway frame; `Err` ends the serving.
    async fn on_frame(&mut self, frame: GatewayFrame) -> Result<(), End> {
        match frame {
            GatewayFrame::Task(task) => match ActivityTask::try_from(task) {
                Ok(task) => self.start(task),
                Err(error) => {
                    return Err(End::violation(CloseCode::InvalidPayload, error.to_string()));
                }
            },
            GatewayFrame::Ping { seq } => {
                if !self.send(&WorkerFrame::Pong { seq }).await {
                    return Err(End::lost("the socket writer stopped"));
                }
            }
            GatewayFrame::Cancel { task_id, reason } => {
                let task = TaskId::from_raw(task_id);
                tracing::debug!(%task, %reason, "task cancelled by the gateway");
                if let Some(token) = self.running.get(&task) {
                    token.cancel();
                }
            }
            GatewayFrame::Drain { reason } => {
                tracing::info!(
                    in_flight = self.handlers.len(),
                    %reason,
                    "drain requested; finishing in-flight tasks"
                );
                self.draining = true;
            }
            GatewayFrame::Registered { .. }
            | GatewayFrame::Refused { .. }
            | GatewayFrame::Unknown => {
                tracing::debug!("ignoring an unexpected gateway frame");
            }
        }
        Ok(())
    }

    fn start(&mut self, task: ActivityTask) {
        let running = self.runner.start(task);
        self.running.insert(running.task_id(), running.canceller());
        self.handlers.spawn(running);
    }

    /// Sends a finished task's result, or its cancel acknowledgement. Returns false when the
    /// writer is gone.
    async fn report(&mut self, reply: TaskReply) -> bool {
        let frame = match reply {
            TaskReply::Result { task_id, result } => {
                self.running.remove(&task_id);
                WorkerFrame::Result(ResultFrame::new(task_id, result))
            }
            TaskReply::CancelAck { task_id } => {
                self.running.remove(&task_id);
                WorkerFrame::CancelAck {
                    task_id: task_id.get(),
                }
            }
        };
        self.send(&frame).await
    }

    async fn send(&self, frame: &WorkerFrame) -> bool {
        match protocol::encode(frame) {
            Ok(text) => self.outbound.send(Message::text(text)).await.is_ok(),
            Err(error) => {
                tracing::error!(%error, "a worker frame failed to encode; dropped");
                true
            }
        }
    }

    /// The serving is over: stop every handler, since nobody will read their results.
    fn abandon(&mut self) {
        for token in self.running.values() {
            token.cancel();
        }
        self.handlers.abort_all();
    }
}

/// Writes queued messages until the queue closes or a write fails, then hands the sink back.
async fn write(
    mut sink: SplitSink<Socket, Message>,
    mut queue: mpsc::Receiver<Message>,
) -> (SplitSink<Socket, Message>, Result<(), WsError>) {
    while let Some(message) = queue.recv().await {
        let written = if queue.is_empty() {
            sink.send(message).await
        } else {
            sink.feed(message).await
        };
        if let Err(error) = written {
            return (sink, Err(error));
        }
    }
    // Nothing may stay in the split sink's own slot, which reuniting the halves would drop.
    let flushed = sink.flush().await;
    (sink, flushed)
}
