//! `/metrics`: core's counters and histograms through the Prometheus exporter, plus gauges
//! computed from core at scrape time and the durable backlog from the store's last census.
//!
//! The per-pool, per-reason and per-namespace gauges are written at each scrape from the
//! registry and the dispatcher rather than kept as recorder gauges, so a pool that disappears
//! stops being reported instead of lingering at its last value, and a namespace whose workers
//! all left reads 0 until `registry.namespace_idle_expiry` passes, then is no longer named
//! (the recorder never drops a series; worker churn across fresh namespaces would grow it
//! without bound).

use std::fmt::Write;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use switchyard_core::{BacklogCensus, Core};

use super::backlog::Backlog;
use super::pools::{PoolStats, parked_by_reason, pool_stats};

/// Bucket bounds of `switchyard_dispatch_latency_seconds`, from sub-millisecond loopback
/// round trips to long activities.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process-wide Prometheus recorder, installed on first use; `None` when the embedding
/// program installed another recorder first (then only the scrape-time gauges are served).
pub(crate) fn recorder() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("switchyard_dispatch_latency_seconds".to_owned()),
                    LATENCY_BUCKETS,
                )
                .ok()?;
            match builder.install_recorder() {
                Ok(handle) => {
                    // Every series at zero from the start, so dashboards read 0, not "no data".
                    switchyard_core::register_metrics();
                    Some(handle)
                }
                Err(error) => {
                    tracing::warn!(%error, "metrics recorder not installed; /metrics serves \
                        only the scrape-time gauges");
                    None
                }
            }
        })
        .as_ref()
}

/// The whole `/metrics` body.
pub(crate) fn render(core: &Core, backlog: &Backlog) -> String {
    let mut text = recorder().map(PrometheusHandle::render).unwrap_or_default();
    scrape_gauges(core, &mut text);
    backlog_gauges(&backlog.snapshot(), &mut text);
    text
}

/// `text` with a `node` label first on every sample, so the series of a cluster's nodes can
/// be told apart once scraped together. `node` is a cluster node name (letters, digits, `-`,
/// `_`: nothing to escape).
pub(crate) fn with_node_label(text: &str, node: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for line in text.lines() {
        let name_end = line.find(['{', ' ']);
        match name_end {
            Some(at) if !line.starts_with('#') => {
                let (name, rest) = line.split_at(at);
                out.push_str(name);
                match rest.strip_prefix('{') {
                    Some(labels) if labels.starts_with('}') => {
                        out.push_str(&format!("{{node=\"{node}\""));
                        out.push_str(labels);
                    }
                    Some(labels) => {
                        out.push_str(&format!("{{node=\"{node}\","));
                        out.push_str(labels);
                    }
                    None => {
                        out.push_str(&format!("{{node=\"{node}\"}}"));
                        out.push_str(rest);
                    }
                }
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The durable backlog per pool address, from the store's last census: a pool whose durable
/// dispatches have all finished is no longer named.
fn backlog_gauges(census: &[BacklogCensus], out: &mut String) {
    header(
        out,
        "switchyard_backlog_dispatches",
        "Unfinished durable dispatches in the dispatch store, by pool address and state \
         (waiting: queued or parked; running: delivered to a worker).",
    );
    for pool in census {
        for (state, count) in [("waiting", pool.waiting), ("running", pool.running)] {
            let labels = [
                ("namespace", pool.namespace.as_str()),
                ("task_queue", pool.task_queue.as_str()),
                ("activity_type", pool.activity_type.as_str()),
                ("state", state),
            ];
            sample(out, "switchyard_backlog_dispatches", &labels, count as f64);
        }
    }
    header(
        out,
        "switchyard_backlog_oldest_seconds",
        "Age of the pool address's oldest waiting durable dispatch since its submission (0 \
         when none waits).",
    );
    for pool in census {
        let labels = [
            ("namespace", pool.namespace.as_str()),
            ("task_queue", pool.task_queue.as_str()),
            ("activity_type", pool.activity_type.as_str()),
        ];
        let age = pool.oldest_waiting.map_or(0.0, |age| age.as_secs_f64());
        sample(out, "switchyard_backlog_oldest_seconds", &labels, age);
    }
}

fn scrape_gauges(core: &Core, out: &mut String) {
    header(
        out,
        "switchyard_workers_connected",
        "Workers serving the namespace, by transport.",
    );
    for series in core
        .registry()
        .namespace_series(tokio::time::Instant::now())
    {
        sample(
            out,
            "switchyard_workers_connected",
            &[
                ("transport", series.transport.as_str()),
                ("namespace", series.namespace.as_str()),
            ],
            series.workers as f64,
        );
    }
    let by_reason = parked_by_reason(core);
    header(
        out,
        "switchyard_parked_dispatches",
        "Dispatches waiting for a worker, by unserved reason.",
    );
    for (reason, count) in by_reason {
        sample(
            out,
            "switchyard_parked_dispatches",
            &[("reason", reason)],
            count as f64,
        );
    }
    let pools = pool_stats(core);
    let gauges: [(&str, &str, PoolGauge); 5] = [
        (
            "switchyard_pool_workers",
            "Workers registered in the pool.",
            |p| p.workers as f64,
        ),
        (
            "switchyard_pool_capacity",
            "Sum of the announced capacities of the pool's workers.",
            |p| p.capacity as f64,
        ),
        (
            "switchyard_pool_in_flight",
            "Tasks held by the pool's workers.",
            |p| p.in_flight as f64,
        ),
        (
            "switchyard_pool_parked_dispatches",
            "Dispatches parked waiting for a worker of the pool.",
            |p| p.parked as f64,
        ),
        (
            "switchyard_pool_oldest_parked_seconds",
            "Age of the pool's oldest parked dispatch (0 when none waits).",
            |p| p.oldest_parked_seconds,
        ),
    ];
    for (name, help, value) in gauges {
        header(out, name, help);
        for pool in &pools {
            let labels = [
                ("namespace", pool.namespace.as_str()),
                ("task_queue", pool.task_queue.as_str()),
            ];
            sample(out, name, &labels, value(pool));
        }
    }
}

/// Reads one pool figure for a gauge.
type PoolGauge = fn(&PoolStats) -> f64;

fn header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    let _ = write!(out, "{name}{{");
    for (i, (label, text)) in labels.iter().enumerate() {
        let separator = if i == 0 { "" } else { "," };
        let _ = write!(out, "{separator}{label}=\"{}\"", escape(text));
    }
    let _ = writeln!(out, "}} {value}");
}

/// Escapes a label value as the Prometheus text format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use std::time::Duration;

    use switchyard_core::{
        CallerIdentity, CoreConfig, DeliveryError, Registration, Registry, TransportName,
        WorkerDelivery, WorkerMessage,
    };

    struct Leg;

    impl WorkerDelivery for Leg {
        fn transport(&self) -> TransportName {
            TransportName::from_static("churn")
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

    #[tokio::test(start_paused = true)]
    async fn namespaces_whose_workers_left_are_no_longer_named_after_the_idle_expiry() {
        let registry = Registry::builder().namespace_idle_expiry(Duration::from_secs(600));
        let core = Core::start(registry, CoreConfig::default());
        let caller = CallerIdentity::trusted("churn");
        for i in 0..64 {
            let registration = Registration {
                namespaces: [format!("churn-{i}")].into(),
                activity_types: ["work".to_owned()].into(),
                max_concurrency: Some(1),
                ..Registration::default()
            };
            let token = core
                .registry()
                .admit(&caller, registration, Arc::new(Leg))
                .await
                .expect("admitted");
            drop(token);
        }
        assert!(core.registry().is_empty(), "every worker left");
        let named = |text: &str| {
            (0..64)
                .filter(|i| text.contains(&format!("\"churn-{i}\"")))
                .count()
        };

        // Control: before the expiry each namespace is still named, at 0.
        tokio::time::advance(Duration::from_secs(599)).await;
        let before = render(&core, &Backlog::default());
        assert_eq!(named(&before), 64, "{before}");
        assert!(
            before.contains(
                "switchyard_workers_connected{transport=\"churn\",namespace=\"churn-0\"} 0"
            )
        );

        tokio::time::advance(Duration::from_secs(1)).await;
        let after = render(&core, &Backlog::default());
        assert_eq!(named(&after), 0, "{after}");
    }

    #[test]
    fn a_cluster_node_labels_every_sample_and_nothing_else() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total 3\n\
                    b{reason=\"x\"} 1\nc{} 2\n";
        let labelled = with_node_label(text, "node-a");
        assert_eq!(
            labelled,
            "# HELP a_total A.\n# TYPE a_total counter\na_total{node=\"node-a\"} 3\n\
             b{node=\"node-a\",reason=\"x\"} 1\nc{node=\"node-a\"} 2\n"
        );
        // Control: the unlabelled text has no node label.
        assert!(!text.contains("node="));
    }

    #[test]
    fn the_backlog_is_reported_per_pool_address_and_state() {
        let census = [BacklogCensus {
            namespace: "billing".to_owned(),
            task_queue: "default".to_owned(),
            activity_type: "charge".to_owned(),
            waiting: 3,
            running: 1,
            oldest_waiting: Some(Duration::from_millis(2_500)),
        }];
        let mut out = String::new();
        backlog_gauges(&census, &mut out);
        let pool = "namespace=\"billing\",task_queue=\"default\",activity_type=\"charge\"";
        for line in [
            format!("switchyard_backlog_dispatches{{{pool},state=\"waiting\"}} 3"),
            format!("switchyard_backlog_dispatches{{{pool},state=\"running\"}} 1"),
            format!("switchyard_backlog_oldest_seconds{{{pool}}} 2.5"),
        ] {
            assert!(out.contains(&line), "{line} not in\n{out}");
        }
        // Control: with no unfinished durable dispatch, no pool is named (only the headers).
        let mut empty = String::new();
        backlog_gauges(&[], &mut empty);
        assert!(!empty.contains("billing"));
        assert!(empty.contains("# TYPE switchyard_backlog_dispatches gauge"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("ns", "a\"b\\c\nd"), ("q", "x")], 2.0);
        assert_eq!(out, "m{ns=\"a\\\"b\\\\c\\nd\",q=\"x\"} 2\n");
    }
}
