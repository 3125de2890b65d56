//! Size limits derived from the configuration, in one place: the largest task input a worker
//! leg can carry, and the producer API's decode limit that lets that check run first.
//!
//! A task reaches a worker inside a frame that adds the names, ids and deadline around the
//! input. The framing is bounded by encoding the frame with every name at
//! [`MAX_NAME_BYTES`] and every number at its widest, then adding the input field's own tag and
//! length prefix for an input as large as the frame itself, so an input under the computed
//! limit always fits whatever names the dispatch carries.

use prost::Message;
use prost::encoding::encoded_len_varint;
use switchyard_core::MAX_NAME_BYTES;
use switchyard_proto::v1 as pb;

use crate::config::GatewayConfig;

/// Largest task input every enabled built-in worker leg can carry, in bytes: the smallest of
/// the gRPC worker stream's `grpc.max_message_size` (when `grpc.workers`) and QUIC's
/// `quic.max_lane_frame` (when `quic.enabled`), each less its task framing. `None` when no
/// built-in worker leg is enabled (core's default then applies).
pub(crate) fn max_input_bytes(config: &GatewayConfig) -> Option<usize> {
    let grpc = config
        .grpc
        .workers
        .then(|| input_room(config.grpc.max_message_size, grpc_task_framing));
    let quic = config.quic.enabled.then(|| {
        input_room(
            usize::try_from(config.quic.max_lane_frame).unwrap_or(usize::MAX),
            quic_task_framing,
        )
    });
    grpc.into_iter().chain(quic).min()
}

/// The producer API's decode limit: `grpc.max_message_size`, raised when needed so that a
/// `DispatchRequest` (or a stream item) carrying an input of `max_input` bytes with every name
/// at its longest still decodes, and reaches the dispatcher's own, named, size check.
pub(crate) fn api_decode_limit(max_message_size: usize, max_input: usize) -> usize {
    let request = pb::DispatchStreamRequest {
        correlation_id: u64::MAX,
        request: Some(pb::DispatchRequest {
            namespace: longest_name(),
            task_queue: longest_name(),
            activity_type: longest_name(),
            node: longest_name(),
            input: bytes::Bytes::new(),
            activity_id: longest_name(),
            timeout_ms: u64::MAX,
            durable: Some(true),
            idempotency_key: "k".repeat(switchyard_core::MAX_IDEMPOTENCY_KEY_BYTES),
        }),
    };
    let framing = request.encoded_len() + input_field_bound(max_input);
    max_message_size.max(max_input.saturating_add(framing))
}

/// Input bytes left in a frame of `limit` bytes once `framing` has taken its share.
fn input_room(limit: usize, framing: fn(usize) -> usize) -> usize {
    limit.saturating_sub(framing(limit))
}

fn longest_name() -> String {
    "n".repeat(MAX_NAME_BYTES)
}

/// Tag and length prefix of an input field of up to `limit` bytes, plus what the enclosing
/// message's own length prefix can grow by (from one byte for the empty input).
fn input_field_bound(limit: usize) -> usize {
    let len = encoded_len_varint(limit as u64);
    1 + len + (len - 1)
}

/// Bytes a gRPC `GatewayFrame` carrying a task adds around an input of up to `limit` bytes.
fn grpc_task_framing(limit: usize) -> usize {
    let frame = pb::GatewayFrame {
        frame: Some(pb::gateway_frame::Frame::Task(pb::ActivityTask {
            task_id: u64::MAX,
            namespace: longest_name(),
            task_queue: longest_name(),
            activity_type: longest_name(),
            input: bytes::Bytes::new(),
            attempt: u32::MAX,
            deadline_unix_ms: u64::MAX,
        })),
    };
    frame.encoded_len() + input_field_bound(limit)
}

/// Bytes a QUIC `QuicLaneDown` frame body carrying a task adds around an input of up to
/// `limit` bytes (the lane limit counts the body; the length prefix is outside it).
fn quic_task_framing(limit: usize) -> usize {
    let frame = pb::QuicLaneDown {
        frame: Some(pb::quic_lane_down::Frame::Task(pb::QuicTask {
            task_id: u64::MAX,
            namespace: longest_name(),
            task_queue: longest_name(),
            activity_type: longest_name(),
            input: bytes::Bytes::new(),
            attempt: u32::MAX,
            deadline_unix_ms: u64::MAX,
        })),
    };
    frame.encoded_len() + input_field_bound(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc_task(input: usize) -> usize {
        pb::GatewayFrame {
            frame: Some(pb::gateway_frame::Frame::Task(pb::ActivityTask {
                task_id: u64::MAX,
                namespace: longest_name(),
                task_queue: longest_name(),
                activity_type: longest_name(),
                input: vec![7; input].into(),
                attempt: u32::MAX,
                deadline_unix_ms: u64::MAX,
            })),
        }
        .encoded_len()
    }

    fn quic_task(input: usize) -> usize {
        pb::QuicLaneDown {
            frame: Some(pb::quic_lane_down::Frame::Task(pb::QuicTask {
                task_id: u64::MAX,
                namespace: longest_name(),
                task_queue: longest_name(),
                activity_type: longest_name(),
                input: vec![7; input].into(),
                attempt: u32::MAX,
                deadline_unix_ms: u64::MAX,
            })),
        }
        .encoded_len()
    }

    #[test]
    fn an_input_at_the_limit_fits_the_worst_case_task_frame_on_each_leg() {
        for limit in [200_000_usize, 4 * 1024 * 1024, 16 * 1024 * 1024] {
            let grpc = input_room(limit, grpc_task_framing);
            assert!(grpc_task(grpc) <= limit, "gRPC frame for {limit}");
            let quic = input_room(limit, quic_task_framing);
            assert!(quic_task(quic) <= limit, "QUIC frame for {limit}");
            // Control: the bound is tight, a few bytes, not a guessed margin.
            assert!(
                grpc_task(grpc + 8) > limit,
                "gRPC bound is loose for {limit}"
            );
            assert!(
                quic_task(quic + 8) > limit,
                "QUIC bound is loose for {limit}"
            );
        }
    }

    #[test]
    fn the_smallest_enabled_leg_sets_the_limit() {
        let mut config = GatewayConfig::default();
        config.grpc.max_message_size = 1024 * 1024;
        config.quic.max_lane_frame = 4 * 1024 * 1024;
        let both = max_input_bytes(&config).expect("legs enabled");
        assert_eq!(both, input_room(1024 * 1024, grpc_task_framing));
        config.grpc.workers = false;
        let quic_only = max_input_bytes(&config).expect("QUIC enabled");
        assert_eq!(quic_only, input_room(4 * 1024 * 1024, quic_task_framing));
        config.quic.enabled = false;
        assert_eq!(max_input_bytes(&config), None, "no built-in worker leg");
        // `docs/configuration.md`: then the limit is 4 MiB less 64 KiB.
        assert_eq!(
            crate::gateway::core_config(&config)
                .dispatch
                .max_input_bytes,
            4 * 1024 * 1024 - 64 * 1024
        );
    }

    #[test]
    fn the_api_decodes_a_request_carrying_the_largest_input_with_the_longest_names() {
        let max_input = 4 * 1024 * 1024 - 900;
        let limit = api_decode_limit(4 * 1024 * 1024, max_input);
        let request = pb::DispatchStreamRequest {
            correlation_id: u64::MAX,
            request: Some(pb::DispatchRequest {
                namespace: longest_name(),
                task_queue: longest_name(),
                activity_type: longest_name(),
                node: longest_name(),
                input: vec![7; max_input].into(),
                activity_id: longest_name(),
                timeout_ms: u64::MAX,
                durable: Some(true),
                idempotency_key: "k".repeat(switchyard_core::MAX_IDEMPOTENCY_KEY_BYTES),
            }),
        };
        assert!(request.encoded_len() <= limit);
        assert!(limit > 4 * 1024 * 1024, "raised above max_message_size");
        // Control: a small input keeps the configured limit.
        assert_eq!(api_decode_limit(4 * 1024 * 1024, 1024), 4 * 1024 * 1024);
    }
}
