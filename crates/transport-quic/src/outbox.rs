//! One writer per connection for the frames of all its lanes.
//!
//! Frames are queued here, and a single task writes every frame queued at the same moment
//! before yielding, so they leave in the same packets: the connection's driver is woken once
//! per batch instead of once per frame (on loopback this cuts the packets, and the CPU, per
//! task by several times). Writes never wait: a stream that cannot take its frame at once
//! (stream or connection flow control) gets that frame and the ones after it from its own
//! flusher task, so a slow lane never holds up the others and head-of-line blocking between
//! lanes stays impossible.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use quinn::SendStream;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::fault::Fault;

/// Most entries written between two yields.
const BATCH: usize = 256;

/// What to do with a stream.
#[derive(Debug)]
pub(crate) enum Item {
    /// Write this encoded frame.
    Frame(Bytes),
    /// Finish the stream (FIN) after every frame queued before.
    Finish,
}

/// Called with the fault that ended a stream's writes (the caller closes the connection).
pub(crate) type OnFault = Arc<dyn Fn(Fault) + Send + Sync>;

/// The write side of one lane.
pub(crate) struct StreamOut {
    index: u64,
    state: Mutex<OutState>,
    /// True once the stream is finished and the peer acknowledged all of its data, or it
    /// failed: nothing queued on it is left to lose by closing the connection.
    settled: watch::Sender<bool>,
}

struct OutState {
    /// `None` while a flusher owns the stream.
    stream: Option<SendStream>,
    /// Items waiting for the flusher, in order.
    backlog: VecDeque<Item>,
    failed: bool,
}

impl StreamOut {
    pub(crate) fn new(stream: SendStream) -> Arc<Self> {
        Arc::new(Self {
            index: stream.id().index(),
            state: Mutex::new(OutState {
                stream: Some(stream),
                backlog: VecDeque::new(),
                failed: false,
            }),
            settled: watch::Sender::new(false),
        })
    }

    /// Resolves once the stream was finished and the peer acknowledged every byte of it (or
    /// the stream failed). Quinn discards unsent stream data when the connection closes, so a
    /// close waits for this first.
    pub(crate) async fn settled(&self) {
        let mut settled = self.settled.subscribe();
        // The sender lives in `self`, so the wait can only end by the value turning true.
        let _ = settled.wait_for(|settled| *settled).await;
    }

    /// Finishes `send` and marks the stream settled once the peer acknowledged all of it.
    fn finish(self: &Arc<Self>, mut send: SendStream) {
        // Already finished or reset: nothing left to tell the peer.
        let _ = send.finish();
        let out = Arc::clone(self);
        tokio::spawn(async move {
            let _ = send.stopped().await;
            out.settled.send_replace(true);
        });
    }

    /// Items held back by flow control, waiting for the flusher.
    pub(crate) fn held_back(&self) -> usize {
        self.lock().backlog.len()
    }

    fn lock(&self) -> MutexGuard<'_, OutState> {
        // Nothing panics while the lock is held.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn name(&self) -> String {
        format!("lane {}", self.index)
    }

    /// Writes `item` without waiting; hands the stream to a flusher when it cannot.
    fn write_now(self: &Arc<Self>, item: Item, outbox: &OutboxState) -> Result<(), Fault> {
        let mut state = self.lock();
        if state.failed {
            return Ok(());
        }
        let OutState {
            stream, backlog, ..
        } = &mut *state;
        let Some(send) = stream.as_mut().filter(|_| backlog.is_empty()) else {
            backlog.push_back(item);
            return Ok(());
        };
        let frame = match item {
            Item::Finish => {
                if let Some(send) = stream.take() {
                    self.finish(send);
                }
                return Ok(());
            }
            Item::Frame(frame) => frame,
        };
        let mut chunks = [frame];
        match poll_once(send.write_chunks(&mut chunks)) {
            Poll::Ready(Ok(_)) if chunks[0].is_empty() => Ok(()),
            Poll::Ready(Err(error)) => {
                state.failed = true;
                self.settled.send_replace(true);
                Err(Fault::write(error, &self.name()))
            }
            // Blocked, or only part written: the rest goes through a flusher, in order.
            Poll::Ready(Ok(_)) | Poll::Pending => {
                let [rest] = chunks;
                state.backlog.push_back(Item::Frame(rest));
                if let Some(send) = state.stream.take() {
                    tokio::spawn(flush(Arc::clone(self), send, outbox.clone()));
                }
                Ok(())
            }
        }
    }
}

/// Polls `future` once with a waker that does nothing; for futures that are cancellation
/// safe when dropped unfinished (quinn's `write_chunks` writes nothing unless it resolves).
fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut context = Context::from_waker(Waker::noop());
    pin!(future).poll(&mut context)
}

/// Writes a blocked stream's backlog, waiting as long as flow control requires, then gives
/// the stream back to the batch writer.
async fn flush(out: Arc<StreamOut>, mut send: SendStream, outbox: OutboxState) {
    loop {
        let item = {
            let mut state = out.lock();
            match state.backlog.pop_front() {
                Some(item) => item,
                None => {
                    state.stream = Some(send);
                    return;
                }
            }
        };
        let written = match item {
            Item::Finish => {
                out.finish(send);
                return;
            }
            Item::Frame(frame) => tokio::select! {
                written = send.write_chunk(frame) => written,
                () = outbox.stop.cancelled() => return,
            },
        };
        if let Err(error) = written {
            out.lock().failed = true;
            out.settled.send_replace(true);
            (outbox.on_fault)(Fault::write(error, &out.name()));
            return;
        }
    }
}

#[derive(Clone)]
struct OutboxState {
    on_fault: OnFault,
    /// Fired when the outbox is dropped, so flushers blocked on flow control let go of their
    /// streams (and with them the connection).
    stop: CancellationToken,
}

/// The queue of one connection's writer task; dropping every clone stops it.
#[derive(Clone)]
pub(crate) struct Outbox {
    queue: mpsc::UnboundedSender<(Arc<StreamOut>, Item)>,
    _stop: Arc<tokio_util::sync::DropGuard>,
}

impl Outbox {
    /// Starts the writer task of one connection.
    pub(crate) fn spawn(on_fault: OnFault) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let shared = OutboxState {
            on_fault,
            stop: stop.clone(),
        };
        tokio::spawn(write_batches(rx, shared));
        Self {
            queue,
            _stop: Arc::new(stop.drop_guard()),
        }
    }

    /// Queues `item` for `out`; false once the writer has stopped.
    ///
    /// The queue itself is unbounded; callers bound what they queue per lane (one task and a
    /// few control frames at a time).
    pub(crate) fn push(&self, out: &Arc<StreamOut>, item: Item) -> bool {
        self.queue.send((Arc::clone(out), item)).is_ok()
    }
}

async fn write_batches(
    mut rx: mpsc::UnboundedReceiver<(Arc<StreamOut>, Item)>,
    shared: OutboxState,
) {
    // Grown on demand and freed once the queue runs dry: an idle connection (most of them, in
    // a fleet of idle workers) holds no batch buffer, where a preallocated one cost 10 KiB.
    let mut batch = Vec::new();
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        // Let the tasks woken in this scheduler tick queue their frames too, so they leave
        // in the same packets.
        tokio::task::yield_now().await;
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(entry) => batch.push(entry),
                Err(_) => break,
            }
        }
        for (out, item) in batch.drain(..) {
            if let Err(fault) = out.write_now(item, &shared) {
                (shared.on_fault)(fault);
            }
        }
        if rx.is_empty() {
            batch = Vec::new();
        }
    }
}
