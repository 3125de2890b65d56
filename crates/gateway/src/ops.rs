//! The operations HTTP listener: `/healthz`, `/readyz`, `/metrics`, read-only JSON under
//! `/v1/` (`workers`, `pools`, `unserved`, `history`, `explain`, `about`), the worker events
//! as server-sent events (`/v1/events`) and the console that shows them all at `/`.
//!
//! It carries no authentication and changes nothing; it binds loopback by default. Each
//! connection is counted against `ops.max_connections` at accept and closed when its headers
//! take longer than `ops.header_read_timeout` or it moves nothing for `ops.idle_timeout`.

mod backlog;
mod cluster_events;
mod cluster_views;
mod connections;
mod console;
mod events;
mod history;
mod idle;
mod metrics;
mod pools;
mod query;
mod workers;

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use switchyard_core::Core;
use switchyard_transport_grpc::{AcceptConfig, ConnectionLimits, limited_incoming};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) use backlog::{Backlog, REFRESH as BACKLOG_REFRESH};
pub(crate) use events::EventFeed;
pub(crate) use history::{PoolCell, PoolHandles};
pub(crate) use metrics::recorder as install_metrics_recorder;

use crate::config::OpsSection;
use crate::readiness::Readiness;
use crate::transport::TransportError;

#[derive(Clone)]
struct OpsState {
    core: Core,
    readiness: Readiness,
    backlog: Backlog,
    events: events::EventFeed,
    about: console::About,
    idle_timeout: std::time::Duration,
    stop: CancellationToken,
    /// In a cluster: the other nodes, whose views `/v1/workers`, `/v1/pools` and
    /// `/v1/unserved` merge in.
    cluster: Option<std::sync::Arc<crate::api::ClusterViews>>,
    /// In a cluster: the other nodes' events, which `/v1/events` merges in.
    cluster_events: Option<std::sync::Arc<cluster_events::ClusterEvents>>,
}

/// Binds the operations listener.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, TransportError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| TransportError::Bind { addr, source })
}

/// Serves the operations endpoints and the console on `listener`, within `section`'s limits,
/// until `stop` fires; `/v1/events` serves `feed`.
// The gateway's parts the listener reads; a struct would only name them a second time.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    listener: TcpListener,
    section: &OpsSection,
    core: Core,
    readiness: Readiness,
    backlog: Backlog,
    feed: EventFeed,
    cluster: Option<switchyard_cluster::Admin>,
    stop: CancellationToken,
) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
    let ops_addr = listener
        .local_addr()
        .map_or_else(|_| section.listen.to_string(), |a| a.to_string());
    feed.start(core.registry(), stop.clone());
    let cluster = cluster.map(|admin| std::sync::Arc::new(crate::api::ClusterViews::new(admin)));
    let cluster_events = cluster.as_ref().map(|views| {
        cluster_events::ClusterEvents::start(std::sync::Arc::clone(views), stop.clone())
    });
    let app = Router::new()
        .route("/", get(console::index))
        .route("/console.js", get(console::script))
        .route("/console.css", get(console::styles))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/v1/workers", get(workers))
        .route("/v1/pools", get(pools_json))
        .route("/v1/unserved", get(unserved))
        .route("/v1/history", get(history_json))
        .route("/v1/explain", get(explain))
        .route("/v1/about", get(about))
        .route("/v1/events", get(events_sse))
        .with_state(OpsState {
            core,
            readiness,
            backlog,
            events: feed,
            about: console::About::here(ops_addr),
            idle_timeout: section.idle_timeout.get(),
            stop: stop.clone(),
            cluster,
            cluster_events,
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

async fn workers(State(state): State<OpsState>, uri: Uri) -> axum::Json<Value> {
    let all = state.core.registry().workers();
    let query = query::Query::of(&uri);
    let Some(views) = &state.cluster else {
        return axum::Json(workers::page(&all, &query));
    };
    let unpaged = query.without_paging();
    let mut parts = vec![(views.node().to_owned(), workers::page(&all, &unpaged))];
    let (answers, silent) = views.ops("workers", &unpaged.encode()).await;
    parts.extend(answers);
    axum::Json(cluster_views::merge_workers(parts, &silent, &query))
}

async fn history_json(State(state): State<OpsState>) -> axum::Json<Value> {
    axum::Json(cluster_views::history(state.cluster.as_deref()).await)
}

async fn explain(State(state): State<OpsState>, uri: Uri) -> Response {
    let query = query::Query::of(&uri);
    let Some(views) = state.cluster.as_deref() else {
        return console::explain(state.core.registry(), &query);
    };
    match console::explain_json(state.core.registry(), &query) {
        Ok(local) => {
            let asked = uri.query().unwrap_or("");
            let body = cluster_views::merged(Some(views), "explain", "workers", asked, local).await;
            axum::Json(body).into_response()
        }
        Err(refusal) => refusal.into_response(),
    }
}

async fn about(State(state): State<OpsState>) -> axum::Json<Value> {
    let mut about = state.about.json();
    // In cluster mode the page names the node it shows, not only the host.
    if let (Some(node), Some(object)) = (state.readiness.cluster_node(), about.as_object_mut()) {
        object.insert("cluster_node".to_owned(), Value::String(node));
    }
    axum::Json(about)
}

async fn events_sse(State(state): State<OpsState>, headers: HeaderMap) -> Response {
    let stop = state.stop.clone();
    match &state.cluster_events {
        Some(cluster) => cluster.serve(&state.events, &headers, state.idle_timeout, stop),
        None => state.events.serve(&headers, state.idle_timeout, stop),
    }
}

async fn pools_json(State(state): State<OpsState>) -> axum::Json<Value> {
    let local = json!({ "pools": pools::pool_stats(&state.core) });
    axum::Json(cluster_views::listed(state.cluster.as_deref(), "pools", local).await)
}

async fn unserved(State(state): State<OpsState>) -> axum::Json<Value> {
    let local = unserved_json(&state.core);
    axum::Json(cluster_views::listed(state.cluster.as_deref(), "unserved", local).await)
}

/// This node's (`node`'s) answer to another node's `ops.<view>` call (`query` its query
/// string, or for `events` the asker's cursor).
fn remote_view(
    core: &Core,
    feed: &EventFeed,
    node: &str,
    view: &str,
    query: &str,
) -> Option<Value> {
    match view {
        "workers" => Some(workers::page(
            &core.registry().workers(),
            &query::Query::parse(query),
        )),
        "pools" => Some(json!({ "pools": pools::pool_stats(core) })),
        "unserved" => Some(unserved_json(core)),
        "explain" => console::explain_json(core.registry(), &query::Query::parse(query)).ok(),
        "history" => serde_json::to_value(history::recorded()).ok(),
        cluster_events::VIEW => Some(cluster_events::answer(feed, node, query)),
        _ => None,
    }
}

/// Answers the other nodes' cluster-wide views and drains, over this node's own API,
/// operations views and worker events (`feed`, collected from now on), until the gateway
/// closes.
pub(crate) fn answer_cluster_views(
    admin: &switchyard_cluster::Admin,
    core: &Core,
    feed: &EventFeed,
    durable: &switchyard_core::DurableDispatcher,
    principals: &std::sync::Arc<crate::auth::Principals>,
    close: &CancellationToken,
) {
    let api = crate::api::GatewayApi::new(
        core.clone(),
        durable.clone(),
        std::sync::Arc::clone(principals),
        crate::api::ApiConfig::default(),
    )
    .ending_on(close.clone());
    let views_core = core.clone();
    feed.start(core.registry(), close.clone());
    let (views_feed, node) = (feed.clone(), admin.node().to_owned());
    admin.serve(std::sync::Arc::new(crate::api::ViewsHandler::new(
        api,
        admin.node().to_owned(),
        move |view, query| remote_view(&views_core, &views_feed, &node, view, query),
    )));
}

fn unserved_json(core: &Core) -> Value {
    let queues: Vec<Value> = core
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
    json!({ "unserved": queues })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_log::logged;

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
