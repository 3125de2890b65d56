//! The console at `/`: one page, its script and its styles, compiled into the binary (no
//! asset from elsewhere, no build step), and the JSON only it needs: `/v1/about` (which
//! gateway the page shows) and `/v1/explain` (why each worker of a pool can or cannot take an
//! activity).
//!
//! The page is read-only like the rest of the listener: it polls the `/v1/` endpoints and
//! follows `/v1/events`; it offers no action.

use std::time::SystemTime;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use switchyard_core::Registry;

use super::query::Query;
use super::workers::standing;

const INDEX_HTML: &str = include_str!("console/index.html");
const CONSOLE_JS: &str = include_str!("console/console.js");
const CONSOLE_CSS: &str = include_str!("console/console.css");

/// Headers every console asset carries: never framed by another site, no script or style
/// but its own.
const SECURITY: [(header::HeaderName, &str); 3] = [
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    ),
];

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let [a, b, c] = SECURITY;
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            a,
            b,
            c,
        ],
        body,
    )
        .into_response()
}

/// `/`: the page.
pub(crate) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `/console.js`.
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

/// `/console.css`.
pub(crate) async fn styles() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}

/// What the page says about the gateway it shows.
#[derive(Clone, Debug)]
pub(crate) struct About {
    /// The host the gateway runs on.
    pub(crate) host: String,
    /// The address the operations listener is bound to.
    pub(crate) ops_addr: String,
    /// When the listener started.
    pub(crate) started: SystemTime,
}

impl About {
    /// This process, its listener bound to `ops_addr`.
    pub(crate) fn here(ops_addr: String) -> Self {
        Self {
            host: host_name(),
            ops_addr,
            started: SystemTime::now(),
        }
    }

    /// The `/v1/about` body.
    pub(crate) fn json(&self) -> Value {
        json!({
            "service": "switchyard",
            "version": env!("CARGO_PKG_VERSION"),
            "host": self.host,
            "pid": std::process::id(),
            "ops_addr": self.ops_addr,
            "started_unix_ms": crate::api::unix_ms(self.started),
            "read_only": true,
        })
    }
}

/// The machine's host name, as the kernel reports it; `$HOSTNAME`, else `unknown`, elsewhere.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `/v1/explain?namespace=&task_queue=&activity_type=&node=`: every worker of the pool and
/// its standing for that activity; 400 naming the missing parameter.
pub(crate) fn explain(registry: &Registry, query: &Query) -> Response {
    match explain_json(registry, query) {
        Ok(body) => axum::Json(body).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// The body of [`explain`], or the 400 naming the missing parameter.
pub(crate) fn explain_json(
    registry: &Registry,
    query: &Query,
) -> Result<Value, (StatusCode, String)> {
    let (Some(namespace), Some(activity_type)) =
        (query.get("namespace"), query.get("activity_type"))
    else {
        let missing = if query.get("namespace").is_none() {
            "namespace"
        } else {
            "activity_type"
        };
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "{missing} is required (namespace, activity_type; task_queue and node are optional)\n"
            ),
        ));
    };
    let task_queue = query.get("task_queue").unwrap_or("");
    let node = query.get("node");
    let workers: Vec<Value> = registry
        .explain(namespace, task_queue, activity_type, node)
        .into_iter()
        .map(|explained| {
            let live = registry.worker(explained.worker.id());
            let w = &explained.worker;
            json!({
                "worker_id": w.id().get(),
                "identity": w.identity(),
                "transport": w.transport().as_str(),
                "node": w.node().map(|n| n.as_str()),
                "capacity": live.as_ref().and_then(|s| s.capacity),
                "in_flight": live.as_ref().map_or(0, |s| s.in_flight),
                "eligible": explained.eligibility.is_eligible(),
                "standing": standing(&explained.eligibility),
                "explanation": explained.eligibility.to_string(),
            })
        })
        .collect();
    Ok(json!({
        "namespace": namespace,
        "task_queue": switchyard_core::normalise_task_queue(task_queue),
        "activity_type": activity_type,
        "node": node,
        "workers": workers,
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use switchyard_core::{
        CallerIdentity, DeliveryError, Registration, TransportName, WorkerDelivery, WorkerMessage,
    };

    use super::*;

    struct Leg;

    impl WorkerDelivery for Leg {
        fn transport(&self) -> TransportName {
            TransportName::from_static("grpc")
        }
        fn is_connected(&self) -> bool {
            true
        }
        fn registration_carries_capacity(&self) -> bool {
            true
        }
        fn deliver(&self, _: WorkerMessage) -> Result<(), DeliveryError> {
            Ok(())
        }
    }

    async fn body(response: Response) -> (StatusCode, String) {
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_explanation_names_each_workers_standing_for_the_activity() {
        let registry = Registry::builder().build();
        let registration = Registration {
            namespaces: ["billing".to_owned()].into(),
            activity_types: ["charge".to_owned()].into(),
            max_concurrency: Some(1),
            identity: "w-1".to_owned(),
            ..Registration::default()
        };
        let _token = registry
            .admit(&CallerIdentity::trusted("ops"), registration, Arc::new(Leg))
            .await
            .unwrap();

        let query = Query::parse("namespace=billing&activity_type=refund");
        let (status, text) = body(explain(&registry, &query)).await;
        assert_eq!(status, StatusCode::OK);
        let json: Value = serde_json::from_str(&text).unwrap();
        let worker = &json["workers"][0];
        assert_eq!(worker["identity"], "w-1");
        assert_eq!(worker["standing"], "serves_other_activity");
        assert_eq!(worker["eligible"], false);

        // Control: for an activity it serves, its standing is its own (here, probation or
        // eligible), not "serves other activity".
        let query = Query::parse("namespace=billing&activity_type=charge");
        let (_, text) = body(explain(&registry, &query)).await;
        let json: Value = serde_json::from_str(&text).unwrap();
        assert_ne!(json["workers"][0]["standing"], "serves_other_activity");
    }

    #[tokio::test]
    async fn a_missing_parameter_is_named() {
        let registry = Registry::builder().build();
        let (status, text) = body(explain(&registry, &Query::parse("namespace=billing"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.starts_with("activity_type is required"), "{text}");
        let (_, text) = body(explain(&registry, &Query::parse("activity_type=x"))).await;
        assert!(text.starts_with("namespace is required"), "{text}");
    }

    /// `docs/operations.md`: workers 50 a page, the last 200 events, a refresh every 2 s.
    #[test]
    fn the_pages_bounds_are_the_documented_ones() {
        for (constant, value) in [
            ("PAGE_SIZE", "50"),
            ("MAX_EVENTS", "200"),
            ("REFRESH_MS", "2000"),
        ] {
            assert!(
                CONSOLE_JS.contains(&format!("const {constant} = {value};")),
                "{constant} is not {value}"
            );
        }
        // Control: the constants are what the page uses, for the workers' page and the
        // events' list.
        assert!(CONSOLE_JS.contains("offset: state.page * PAGE_SIZE, limit: PAGE_SIZE"));
        assert!(CONSOLE_JS.contains("list.children.length > MAX_EVENTS"));
    }

    #[tokio::test]
    async fn the_page_and_its_assets_are_served_from_the_binary() {
        let (status, html) = body(index().await).await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("/console.js") && html.contains("/console.css"));
        // Nothing is fetched from another origin.
        for text in [html.as_str(), CONSOLE_JS, CONSOLE_CSS] {
            let text = text.replace("http://www.w3.org/2000/svg", "svg-namespace");
            assert!(
                !text.contains("http://") && !text.contains("https://") && !text.contains("//cdn")
            );
        }
        let (_, js) = body(script().await).await;
        assert!(js.contains("/v1/events"));
    }
}
