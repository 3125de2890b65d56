//! `docs/quic-protocol.md` stays true: its hex examples decode to the messages they describe
//! and those messages encode to exactly its bytes; its tables name every code and limit.

use std::collections::BTreeMap;

use prost::Message;
use switchyard_proto::v1::{
    Failure, QuicCancel, QuicCancelAck, QuicCancelReason, QuicCapabilities, QuicControlDown,
    QuicControlUp, QuicDatagramDown, QuicDatagramUp, QuicDrain, QuicDrainReason, QuicDrainRequest,
    QuicHeld, QuicLaneDown, QuicLaneUp, QuicPing, QuicPong, QuicRedundancy, QuicRegister,
    QuicRegistered, QuicResult, QuicResultsAck, QuicResume, QuicTask, quic_control_down,
    quic_control_up, quic_lane_down, quic_lane_up, quic_result,
};
use switchyard_transport_quic::frame::{FrameDecoder, decode, encode_frame};
use switchyard_transport_quic::{
    ALPN, DEFAULT_MAX_CONTROL_FRAME, DEFAULT_MAX_LANE_FRAME, ErrorCode, QuicServerConfig,
};

const SPEC: &str = include_str!("../../../../docs/quic-protocol.md");

/// `(envelope, name)` → frame bytes, from every ```` ```hex ENVELOPE NAME ```` block.
fn examples() -> BTreeMap<(String, String), Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut lines = SPEC.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```hex ") else {
            continue;
        };
        let mut words = info.split_whitespace();
        let key = (
            words.next().unwrap().to_owned(),
            words.next().unwrap().to_owned(),
        );
        let mut bytes = Vec::new();
        for line in lines.by_ref().take_while(|l| !l.starts_with("```")) {
            for byte in line.split_whitespace() {
                bytes.push(u8::from_str_radix(byte, 16).unwrap());
            }
        }
        assert!(found.insert(key.clone(), bytes).is_none(), "{key:?} twice");
    }
    found
}

fn control_up(frame: quic_control_up::Frame) -> QuicControlUp {
    QuicControlUp { frame: Some(frame) }
}

fn control_down(frame: quic_control_down::Frame) -> QuicControlDown {
    QuicControlDown { frame: Some(frame) }
}

fn lane_down(frame: quic_lane_down::Frame) -> QuicLaneDown {
    QuicLaneDown { frame: Some(frame) }
}

fn lane_up(frame: quic_lane_up::Frame) -> QuicLaneUp {
    QuicLaneUp { frame: Some(frame) }
}

/// Checks one example both ways: the bytes decode to `expected`, which encodes to the bytes.
fn check<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8], expected: M) {
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_LANE_FRAME);
    decoder.push(bytes);
    let body = decoder.next_frame().unwrap().expect("a whole frame");
    assert_eq!(decoder.buffered(), 0, "one frame exactly");
    assert_eq!(decode::<M>(body).unwrap(), expected);
    assert_eq!(
        &encode_frame(&expected, DEFAULT_MAX_LANE_FRAME).unwrap()[..],
        bytes
    );
}

/// Checks one datagram example both ways: a datagram has no length prefix, its payload is
/// the message.
fn check_datagram<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8], expected: M) {
    assert_eq!(
        decode::<M>(bytes::Bytes::copy_from_slice(bytes)).unwrap(),
        expected
    );
    assert_eq!(expected.encode_to_vec(), bytes);
}

#[test]
fn spec_examples_decode_to_what_they_describe_and_back() {
    let task = QuicTask {
        task_id: 42,
        namespace: "billing".into(),
        task_queue: "default".into(),
        activity_type: "charge".into(),
        input: "hi".into(),
        attempt: 1,
        deadline_unix_ms: 1_700_000_000_000,
    };
    let registered = QuicRegistered {
        worker_id: 7,
        ping_interval_ms: 2000,
        ping_timeout_ms: 5000,
        max_concurrency_limit: 1024,
        max_control_frame_bytes: DEFAULT_MAX_CONTROL_FRAME,
        max_lane_frame_bytes: DEFAULT_MAX_LANE_FRAME,
        task_queue: "default".into(),
        ..QuicRegistered::default()
    };
    let secret: bytes::Bytes = (0..32_u8).collect::<Vec<u8>>().into();
    let mut seen = Vec::new();
    for ((envelope, name), bytes) in examples() {
        let bytes = &bytes[..];
        match (envelope.as_str(), name.as_str()) {
            ("QuicControlUp", "register") => check(
                bytes,
                control_up(quic_control_up::Frame::Register(QuicRegister {
                    protocol_version: 1,
                    namespaces: vec!["billing".into()],
                    task_queue: String::new(),
                    node: String::new(),
                    activity_types: vec!["charge".into()],
                    identity: "w1".into(),
                    auth_token: "s3cret".into(),
                    redundancy: QuicRedundancy::Off.into(),
                    resumable: false,
                })),
            ),
            ("QuicControlUp", "register_redundancy") => check(
                bytes,
                control_up(quic_control_up::Frame::Register(QuicRegister {
                    protocol_version: 1,
                    namespaces: vec!["billing".into()],
                    task_queue: String::new(),
                    node: String::new(),
                    activity_types: vec!["charge".into()],
                    identity: "w1".into(),
                    auth_token: "s3cret".into(),
                    redundancy: QuicRedundancy::Datagram.into(),
                    resumable: false,
                })),
            ),
            ("QuicControlDown", "registered_redundancy") => check(
                bytes,
                control_down(quic_control_down::Frame::Registered(QuicRegistered {
                    worker_id: 7,
                    ping_interval_ms: 2000,
                    ping_timeout_ms: 5000,
                    max_concurrency_limit: 1024,
                    max_control_frame_bytes: DEFAULT_MAX_CONTROL_FRAME,
                    max_lane_frame_bytes: DEFAULT_MAX_LANE_FRAME,
                    task_queue: "default".into(),
                    redundancy: QuicRedundancy::Datagram.into(),
                    ..QuicRegistered::default()
                })),
            ),
            ("QuicDatagramDown", "task_copy") => check_datagram(
                bytes,
                QuicDatagramDown {
                    lane: 3,
                    seq: 2,
                    task: Some(task.clone()),
                },
            ),
            ("QuicDatagramUp", "result_copy") => check_datagram(
                bytes,
                QuicDatagramUp {
                    lane: 3,
                    seq: 2,
                    result: Some(QuicResult {
                        task_id: 42,
                        outcome: Some(quic_result::Outcome::Output("ok".into())),
                    }),
                },
            ),
            ("QuicControlDown", "registered") => check(
                bytes,
                control_down(quic_control_down::Frame::Registered(QuicRegistered {
                    worker_id: 7,
                    ping_interval_ms: 2000,
                    ping_timeout_ms: 5000,
                    max_concurrency_limit: 1024,
                    max_control_frame_bytes: DEFAULT_MAX_CONTROL_FRAME,
                    max_lane_frame_bytes: DEFAULT_MAX_LANE_FRAME,
                    task_queue: "default".into(),
                    redundancy: QuicRedundancy::Off.into(),
                    ..QuicRegistered::default()
                })),
            ),
            ("QuicControlUp", "capabilities") => check(
                bytes,
                control_up(quic_control_up::Frame::Capabilities(QuicCapabilities {
                    max_concurrency: 64,
                })),
            ),
            ("QuicControlUp", "drain_request") => check(
                bytes,
                control_up(quic_control_up::Frame::DrainRequest(QuicDrainRequest {})),
            ),
            ("QuicControlDown", "drain_requested") => check(
                bytes,
                control_down(quic_control_down::Frame::Drain(QuicDrain {
                    reason: QuicDrainReason::Requested.into(),
                })),
            ),
            ("QuicControlDown", "drain_shutting_down") => check(
                bytes,
                control_down(quic_control_down::Frame::Drain(QuicDrain {
                    reason: QuicDrainReason::ShuttingDown.into(),
                })),
            ),
            ("QuicLaneDown", "cancel_drain_deadline") => check(
                bytes,
                lane_down(quic_lane_down::Frame::Cancel(QuicCancel {
                    task_id: 42,
                    reason: QuicCancelReason::DrainDeadline.into(),
                })),
            ),
            ("QuicLaneDown", "task") => {
                check(bytes, lane_down(quic_lane_down::Frame::Task(task.clone())));
            }
            ("QuicLaneDown", "ping") => {
                check(
                    bytes,
                    lane_down(quic_lane_down::Frame::Ping(QuicPing { seq: 7 })),
                );
            }
            ("QuicLaneDown", "cancel") => check(
                bytes,
                lane_down(quic_lane_down::Frame::Cancel(QuicCancel {
                    task_id: 42,
                    reason: QuicCancelReason::Requested.into(),
                })),
            ),
            ("QuicLaneUp", "result_output") => check(
                bytes,
                lane_up(quic_lane_up::Frame::Result(QuicResult {
                    task_id: 42,
                    outcome: Some(quic_result::Outcome::Output("ok".into())),
                })),
            ),
            ("QuicLaneUp", "result_failure") => check(
                bytes,
                lane_up(quic_lane_up::Frame::Result(QuicResult {
                    task_id: 42,
                    outcome: Some(quic_result::Outcome::Failure(Failure {
                        message: "card declined".into(),
                        retryable: false,
                    })),
                })),
            ),
            ("QuicLaneUp", "pong") => {
                check(
                    bytes,
                    lane_up(quic_lane_up::Frame::Pong(QuicPong { seq: 7 })),
                );
            }
            ("QuicLaneUp", "cancel_ack") => check(
                bytes,
                lane_up(quic_lane_up::Frame::CancelAck(QuicCancelAck {
                    task_id: 42,
                })),
            ),
            ("QuicControlUp", "register_resumable") => check(
                bytes,
                control_up(quic_control_up::Frame::Register(QuicRegister {
                    protocol_version: 1,
                    namespaces: vec!["billing".into()],
                    activity_types: vec!["charge".into()],
                    identity: "w1".into(),
                    auth_token: "s3cret".into(),
                    resumable: true,
                    ..QuicRegister::default()
                })),
            ),
            ("QuicControlDown", "registered_session") => check(
                bytes,
                control_down(quic_control_down::Frame::Registered(QuicRegistered {
                    session_id: 7,
                    resume_secret: secret.clone(),
                    reconnect_grace_ms: 15_000,
                    ..registered.clone()
                })),
            ),
            ("QuicControlUp", "resume") => check(
                bytes,
                control_up(quic_control_up::Frame::Resume(QuicResume {
                    protocol_version: 1,
                    auth_token: "s3cret".into(),
                    session_id: 7,
                    resume_secret: secret.clone(),
                    running_task_ids: vec![42],
                    unacked_task_ids: vec![43],
                    redundancy: QuicRedundancy::Off.into(),
                })),
            ),
            ("QuicControlDown", "registered_resumed") => check(
                bytes,
                control_down(quic_control_down::Frame::Registered(QuicRegistered {
                    session_id: 7,
                    resume_secret: secret.clone(),
                    reconnect_grace_ms: 15_000,
                    resumed: true,
                    held_task_ids: vec![42],
                    ..registered.clone()
                })),
            ),
            ("QuicLaneDown", "held") => check(
                bytes,
                lane_down(quic_lane_down::Frame::Held(QuicHeld { task_id: 42 })),
            ),
            ("QuicControlDown", "results_ack") => check(
                bytes,
                control_down(quic_control_down::Frame::ResultsAck(QuicResultsAck {
                    task_ids: vec![42, 43],
                })),
            ),
            other => panic!("the spec has an example this test does not know: {other:?}"),
        }
        seen.push(name);
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "cancel",
            "cancel_ack",
            "cancel_drain_deadline",
            "capabilities",
            "drain_request",
            "drain_requested",
            "drain_shutting_down",
            "held",
            "ping",
            "pong",
            "register",
            "register_redundancy",
            "register_resumable",
            "registered",
            "registered_redundancy",
            "registered_resumed",
            "registered_session",
            "result_copy",
            "result_failure",
            "result_output",
            "results_ack",
            "resume",
            "task",
            "task_copy"
        ],
        "every frame kind has an example"
    );
}

#[test]
fn spec_tables_match_the_code() {
    for code in ErrorCode::ALL {
        let row = format!("| 0x{:02x} | `{}` |", code.value(), code.name());
        let line = SPEC
            .lines()
            .find(|line| line.starts_with(&row))
            .unwrap_or_else(|| panic!("no row for {code}"));
        assert_eq!(
            line.trim_end().ends_with("| yes |"),
            code.is_final(),
            "finality of {code}"
        );
    }
    assert!(SPEC.contains(&format!("`{}`", std::str::from_utf8(ALPN).unwrap())));
    let defaults = QuicServerConfig::default();
    assert_eq!(defaults.frames.control, 65_536);
    assert!(SPEC.contains("65,536 bytes (64 KiB)"));
    assert_eq!(defaults.frames.lane, 4_194_304);
    assert!(SPEC.contains("4,194,304 bytes (4 MiB)"));
    assert!(SPEC.contains(&format!(
        "| `max_concurrency_limit` (lanes per worker) | {} |",
        switchyard_core::DEFAULT_MAX_CONCURRENCY_LIMIT
    )));
    assert!(SPEC.contains(&format!(
        "at most {} bytes each",
        switchyard_core::MAX_NAME_BYTES
    )));
}

#[test]
fn spec_reason_tables_name_every_wire_value() {
    for reason in (0..=5).map(|v| QuicCancelReason::try_from(v).unwrap()) {
        let row = format!("| {} | `{}` |", reason as i32, reason.as_str_name());
        assert!(SPEC.contains(&row), "no row {row}");
    }
    assert!(
        QuicCancelReason::try_from(6).is_err(),
        "a new cancel reason needs a row"
    );
    for reason in (0..=2).map(|v| QuicDrainReason::try_from(v).unwrap()) {
        let row = format!("| {} | `{}` |", reason as i32, reason.as_str_name());
        assert!(SPEC.contains(&row), "no row {row}");
    }
    assert!(
        QuicDrainReason::try_from(3).is_err(),
        "a new drain reason needs a row"
    );
    // The drain table names the close each reason ends with.
    let close_of = |name: &str| {
        SPEC.lines()
            .find(|line| line.contains(&format!("`{name}`")) && line.starts_with("| "))
            .unwrap_or_else(|| panic!("no row for {name}"))
            .to_owned()
    };
    assert!(close_of("QUIC_DRAIN_REASON_REQUESTED").contains("`DRAINED`"));
    assert!(close_of("QUIC_DRAIN_REASON_SHUTTING_DOWN").contains("`SHUTTING_DOWN`"));
    // The ends decided by the QUIC layer are listed too.
    for end in [
        "`CRYPTO_ERROR` `0x178`",
        "`CONNECTION_REFUSED` (0x02)",
        "`STREAM_LIMIT_ERROR` (0x04)",
        "| idle timeout",
        "| stateless reset",
    ] {
        assert!(SPEC.contains(end), "the spec does not list {end}");
    }
}

#[test]
fn spec_quotes_the_sentences_the_code_says() {
    let flat = SPEC.split_whitespace().collect::<Vec<_>>().join(" ");
    let awaiting = switchyard_core::Eligibility::AwaitingStreams { announced: 7 }
        .to_string()
        .replace('7', "N");
    assert!(flat.contains(&awaiting), "{awaiting}");
    let ceiling = switchyard_core::AdmissionError::CapacityAboveLimit {
        max_concurrency: 7,
        limit: 9,
    }
    .to_string()
    .replace('7', "N")
    .replace('9', "L");
    assert!(flat.contains(&format!("`{ceiling}`")), "{ceiling}");
    for sentence in [
        "`cancel_ack: task N was not cancelled`",
        "`result of N bytes exceeds the gateway's frame limit of L bytes`",
    ] {
        assert!(flat.contains(sentence), "{sentence}");
    }
}
