//! The operations HTTP listener: `/healthz`, `/readyz`, `/metrics` and read-only JSON under
//! `/v1/` (`workers`, `pools`, `unserved`).
//!
//! It carries no authentication and changes nothing; it binds loopback by default.

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
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) use metrics::recorder as install_metrics_recorder;

use crate::readiness::Readiness;
use crate::transport::TransportError;

#[derive(Clone)]
struct OpsState {
    core: Core,
    readiness: Readiness,
}

/// Binds the operations listener.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, TransportError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| TransportError::Bind { addr, source })
}

/// Serves the operations endpoints on `listener` until `stop` fires.
pub(crate) fn serve(
    listener: TcpListener,
    core: Core,
    readiness: Readiness,
    stop: CancellationToken,
) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/v1/workers", get(workers))
        .route("/v1/pools", get(pools_json))
        .route("/v1/unserved", get(unserved))
        .with_state(OpsState { core, readiness });
    async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    }
}

async fn readyz(State(state): State<OpsState>) -> Response {
    match state.readiness.check() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics_text(State(state): State<OpsState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&state.core),
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
