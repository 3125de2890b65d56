//! A raw gRPC worker stream that sends arbitrary bytes as `WorkerFrame` messages (malformed
//! protobuf, invalid UTF-8, oversized messages) and reads `GatewayFrame`s back: what a broken
//! or hostile worker can put on the wire, below any SDK.

use std::time::Duration;

use bytes::{BufMut, Bytes};
use prost::Message;
use switchyard_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;

use crate::TestGateway;

/// Sends messages as given, decodes replies as `GatewayFrame`.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

#[derive(Clone, Copy, Debug, Default)]
struct RawEncoder;

#[derive(Clone, Copy, Debug, Default)]
struct FrameDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = pb::GatewayFrame;
    type Encoder = RawEncoder;
    type Decoder = FrameDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> FrameDecoder {
        FrameDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for FrameDecoder {
    type Item = pb::GatewayFrame;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<pb::GatewayFrame>, Status> {
        pb::GatewayFrame::decode(src)
            .map(Some)
            .map_err(|error| Status::internal(error.to_string()))
    }
}

/// How a raw stream ended, as the worker saw it.
#[derive(Debug)]
pub enum RawEnd {
    /// The call ended with this status (OK included).
    Status(Status),
    /// Nothing ended within the wait.
    StillOpen,
}

/// One raw `ConnectWorker` call.
#[derive(Debug)]
pub struct RawGrpcWorker {
    send: mpsc::Sender<Bytes>,
    replies: tonic::Streaming<pb::GatewayFrame>,
}

impl RawGrpcWorker {
    /// Opens a call to the gateway's worker service over TLS, anonymously.
    pub async fn open(gateway: &TestGateway) -> Result<Self, Status> {
        let addr = gateway.gateway().addr("grpc").expect("grpc listens");
        Self::open_at(addr, &gateway.ca_pem()).await
    }

    /// Like [`RawGrpcWorker::open`], for a gateway at `addr` whose CA is `ca_pem`.
    pub async fn open_at(addr: std::net::SocketAddr, ca_pem: &str) -> Result<Self, Status> {
        let channel = crate::tls_channel(addr, ca_pem).await.expect("connects");
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("channel ready");
        let (send, outbound) = mpsc::channel(16);
        let path = PathAndQuery::from_static("/switchyard.v1.WorkerGateway/ConnectWorker");
        let replies = grpc
            .streaming(
                tonic::Request::new(ReceiverStream::new(outbound)),
                path,
                RawCodec,
            )
            .await?
            .into_inner();
        Ok(Self { send, replies })
    }

    /// Sends one message's bytes as they are.
    pub async fn send_raw(&self, message: Bytes) {
        self.send.send(message).await.expect("call still sending");
    }

    /// Sends a well-formed frame.
    pub async fn send(&self, frame: pb::WorkerFrame) {
        self.send_raw(Bytes::from(frame.encode_to_vec())).await;
    }

    /// The next frame that is not a ping (pings are answered with their own sequence).
    pub async fn next_frame(&mut self) -> Result<Option<pb::gateway_frame::Frame>, Status> {
        loop {
            match self.replies.message().await? {
                Some(pb::GatewayFrame {
                    frame: Some(pb::gateway_frame::Frame::Ping(ping)),
                }) => {
                    // The call may be over already; its end is read next.
                    let _ = self
                        .send
                        .send(Bytes::from(pong(ping.seq).encode_to_vec()))
                        .await;
                }
                Some(frame) => return Ok(frame.frame),
                None => return Ok(None),
            }
        }
    }

    /// The next frame, pings included, answered or not.
    pub async fn next_any(&mut self) -> Result<Option<pb::gateway_frame::Frame>, Status> {
        Ok(self.replies.message().await?.and_then(|frame| frame.frame))
    }

    /// Sends `frame` and returns how the gateway answered it: the acknowledgement, or the
    /// status the call ended with.
    pub async fn try_register(
        &mut self,
        frame: pb::WorkerFrame,
    ) -> Result<pb::RegisterAck, Status> {
        self.send(frame).await;
        match self.next_frame().await? {
            Some(pb::gateway_frame::Frame::RegisterAck(ack)) => Ok(ack),
            other => Err(Status::internal(format!(
                "expected an acknowledgement, got {other:?}"
            ))),
        }
    }

    /// Registers with `frame` and returns the worker id from the acknowledgement.
    pub async fn register(&mut self, frame: pb::WorkerFrame) -> u64 {
        self.send(frame).await;
        match self.next_frame().await {
            Ok(Some(pb::gateway_frame::Frame::RegisterAck(ack))) => ack.worker_id,
            other => panic!("expected a registration acknowledgement, got {other:?}"),
        }
    }

    /// Reads (answering pings) until the call ends or `wait` passes; frames are dropped.
    pub async fn end(&mut self, wait: Duration) -> RawEnd {
        let ended = tokio::time::timeout(wait, async {
            loop {
                match self.next_frame().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return Status::ok(""),
                    Err(status) => return status,
                }
            }
        })
        .await;
        ended.map_or(RawEnd::StillOpen, RawEnd::Status)
    }
}

/// A registration frame for `namespace`, one activity type, capacity `capacity`.
pub fn raw_registration(namespace: &str, activity: &str, capacity: u32) -> pb::WorkerFrame {
    pb::WorkerFrame {
        frame: Some(pb::worker_frame::Frame::Register(pb::RegisterWorker {
            namespaces: vec![namespace.to_owned()],
            task_queue: String::new(),
            node: String::new(),
            activity_types: vec![activity.to_owned()],
            identity: "raw worker".to_owned(),
            max_concurrency: Some(capacity),
            resumable: false,
        })),
    }
}

/// A pong frame.
pub fn pong(seq: u64) -> pb::WorkerFrame {
    pb::WorkerFrame {
        frame: Some(pb::worker_frame::Frame::Pong(pb::Pong { seq })),
    }
}

/// A successful result frame.
pub fn success(task_id: u64, output: &'static [u8]) -> pb::WorkerFrame {
    pb::WorkerFrame {
        frame: Some(pb::worker_frame::Frame::Result(pb::ActivityResult {
            task_id,
            outcome: Some(pb::activity_result::Outcome::Output(Bytes::from_static(
                output,
            ))),
        })),
    }
}
