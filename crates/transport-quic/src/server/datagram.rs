//! The gateway's reader of a worker's datagram copies: a result that arrives by datagram
//! before its lane copy ends its task at once (see [`crate::redundancy`]).

use std::sync::Arc;

use switchyard_core::{Core, WorkerId};
use switchyard_proto::v1::QuicDatagramUp;
use tracing::Instrument;

use super::delivery::QuicDelivery;
use super::lanes::LaneId;
use crate::convert;
use crate::fault::Fault;
use crate::frame::decode;
use crate::protocol::ErrorCode;

const DATAGRAM: &str = "datagram";

/// Reads the worker's datagrams on their own task until the connection ends; a malformed one
/// closes the connection as a malformed lane frame would.
pub(crate) fn spawn(delivery: Arc<QuicDelivery>, core: Core, worker: WorkerId) {
    let span = tracing::debug_span!("datagrams", worker = %worker);
    tokio::spawn(
        async move {
            while let Ok(payload) = delivery.connection().read_datagram().await {
                if let Err(Fault::Close { code, reason }) = take(payload, &delivery, &core, worker)
                {
                    tracing::warn!(%code, %reason, "closing worker connection");
                    delivery.close(code, &reason);
                    return;
                }
            }
        }
        .instrument(span),
    );
}

/// Handles one datagram: a result copy for the task its lane holds goes to core, any other
/// (its lane copy came first, or it names a task the lane no longer holds) is dropped.
fn take(
    payload: bytes::Bytes,
    delivery: &QuicDelivery,
    core: &Core,
    worker: WorkerId,
) -> Result<(), Fault> {
    let copy: QuicDatagramUp = decode(payload)
        .map_err(|error| Fault::close(ErrorCode::MalformedFrame, format!("{DATAGRAM}: {error}")))?;
    let QuicDatagramUp { lane, seq, result } = copy;
    let Some((task, outcome)) = result.and_then(convert::result) else {
        return Err(Fault::close(
            ErrorCode::MalformedFrame,
            format!("{DATAGRAM}: a copy of lane {lane} carries no result with an outcome"),
        ));
    };
    let Some(copies) = delivery.copies() else {
        return Ok(());
    };
    if delivery.finish_copy(LaneId::new(lane), seq, task).is_none() {
        copies.dropped();
        return Ok(());
    }
    copies.used();
    if let Err(refusal) = core.complete(worker, task, outcome) {
        tracing::debug!(task = %task, %refusal, "result not taken");
    }
    delivery.processed(task);
    Ok(())
}
