//! End-to-end tests of the gRPC transport over real TLS loopback sockets.

mod conformance;
mod keepalive;
mod registration;
mod sdk;
mod stream_endings;
mod support;
mod task_flow;
mod worker_requests;
