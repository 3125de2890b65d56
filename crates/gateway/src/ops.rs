//! The operations HTTP listener: `/healthz`, `/readyz`, `/metrics` and read-only JSON under
//! `/v1/` (`workers`, `pools`, `unserved`).
//!
//! It carries no authentication and changes nothing; it binds loopback by default. Each
//! connection is counted against `ops.max_connections` at accept and closed when its headers
//! take longer than `ops.header_read_timeout` or it moves nothing for `ops.idle_timeout`.

mod backlog;
mod connections;
mod idle;
mod metrics;
mod pools;

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use switchyard_core::Core;
use switchyard_transport_grpc::{AcceptConfig, ConnectionLimits, limited_incoming};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) use backlog::{Backlog, REFRESH as BACKLOG_REFRESH};
pub(crate) use metrics::recorder as install_metrics_recorder;

use crate::config::OpsSection;
use crate::readiness::Readiness;
use crate::transport::TransportError;

#[derive(Clone)]
struct OpsState {
    core: Core,
    readiness: Readiness,
    backlog: Backlog,
}

/// Binds the operations listener.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, TransportError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| TransportError::Bind { addr, source })
}

/// Serves the operations endpoints on `listener`, within `section`'s limits, until `stop`
/// fires.
pub(crate) fn serve(
    listener: TcpListener,
    section: &OpsSection,
    core: Core,
    readiness: Readiness,
    backlog: Backlog,
    stop: CancellationToken,
) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/v1/workers", get(workers))
        .route("/v1/pools", get(pools_json))
        .route("/v1/unserved", get(unserved))
        .with_state(OpsState {
            core,
            readiness,
            backlog,
        });
    let incoming = limited_incoming(
        listener,
        AcceptConfig {
            name: "ops",
            limits: ConnectionLimits {
                max_connections: section.max_connections,
                // One operator's scraper is one address; the listener's limit is the one
                // that matters.
                max_connections_per_address: section.max_connections,
            },
            nodelay: true,
        },
    );
    let timeouts = connections::ConnectionTimeouts {
        header_read: section.header_read_timeout.get(),
        idle: section.idle_timeout.get(),
    };
    connections::serve(incoming, app, timeouts, stop)
}

/// Warns at start when the listener binds a non-loopback address: it serves every worker's
/// identity without a credential. (Configuration refuses that with principals unless
/// `ops.allow_remote` is set.)
pub(crate) fn warn_if_remote(section: &OpsSection) {
    if section.enabled && !section.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %section.listen,
            allow_remote = section.allow_remote,
            "ops.listen is not a loopback address: /metrics and /v1/workers answer anyone who \
             can reach it, without a credential"
        );
    }
}

async fn healthz(State(state): State<OpsState>) -> String {
    with_cluster_line("ok\n".to_owned(), &state)
}

async fn readyz(State(state): State<OpsState>) -> Response {
    match state.readiness.check() {
        Ok(()) => (
            StatusCode::OK,
            with_cluster_line("ready\n".to_owned(), &state),
        )
            .into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            with_cluster_line(format!("{why}\n"), &state),
        )
            .into_response(),
    }
}

/// `body` followed by the cluster standing line, in cluster mode.
fn with_cluster_line(mut body: String, state: &OpsState) -> String {
    if let Some(line) = state.readiness.cluster_line() {
        body.push_str(&line);
        body.push('\n');
    }
    body
}

async fn metrics_text(State(state): State<OpsState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        match state.readiness.cluster_node() {
            Some(node) => {
                metrics::with_node_label(&metrics::render(&state.core, &state.backlog), &node)
            }
            None => metrics::render(&state.core, &state.backlog),
        },
    )
        .into_response()
}

async fn workers(State(state): State<OpsState>) -> axum::Json<Value> {
    let workers: Vec<Value> = state
        .core
        .registry()
        .workers()
        .iter()
        .map(|s| {
            let w = &s.worker;
            json!({
                "worker_id": w.id().get(),
                "identity": w.identity(),
                "principal": w.principal(),
                "transport": w.transport().as_str(),
                "namespaces": w.namespaces(),
                "task_queue": w.task_queue(),
                "node": w.node().map(|n| n.as_str()),
                "activity_types": w.activity_types(),
                "capacity": s.capacity,
                "in_flight": s.in_flight,
                "unresponsive_tasks": s.unresponsive,
                "eligibility": s.eligibility.to_string(),
                "suspended_for_ms": s.suspended_for.map(|left| left.as_millis() as u64),
                "connected_since_unix_ms": crate::api::unix_ms(s.connected_at),
            })
        })
        .collect();
    axum::Json(json!({ "workers": workers }))
}

async fn pools_json(State(state): State<OpsState>) -> axum::Json<Value> {
    axum::Json(json!({ "pools": pools::pool_stats(&state.core) }))
}

async fn unserved(State(state): State<OpsState>) -> axum::Json<Value> {
    let queues: Vec<Value> = state
        .core
        .dispatcher()
        .unserved_queues()
        .iter()
        .map(|q| {
            json!({
                "namespace": q.address.namespace,
                "task_queue": q.address.task_queue,
                "activity_type": q.address.activity_type,
                "node": q.address.node,
                "reason": q.reason.as_str(),
                "detail": q.census.describe().unwrap_or_else(|| q.reason.as_str().to_owned()),
                "waiting": q.waiting,
                "oldest_wait_seconds": pools::seconds(q.oldest_wait),
                "eligible": q.census.eligible,
                "compatible": q.census.compatible,
                "pool_workers": q.census.pool_workers,
            })
        })
        .collect();
    axum::Json(json!({ "unserved": queues }))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Everything logged while `f` runs.
    fn logged(f: impl FnOnce()) -> String {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let buffer = Arc::clone(&buffer);
            move || Capture(Arc::clone(&buffer))
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_non_loopback_ops_listener_is_warned_about_at_start() {
        let remote = OpsSection {
            listen: "0.0.0.0:7702".parse().unwrap(),
            ..OpsSection::default()
        };
        let log = logged(|| warn_if_remote(&remote));
        assert!(log.contains("WARN") && log.contains("ops.listen"), "{log}");
        // Control: the loopback default says nothing.
        assert_eq!(logged(|| warn_if_remote(&OpsSection::default())), "");
    }
}
