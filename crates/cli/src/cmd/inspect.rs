//! Client subcommands: `dispatch`, `workers`, `pool`, `unserved`, `drain`, `events` (the
//! durable-dispatch ones are in `durable.rs`).

use bytes::Bytes;
use clap::Args;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;

use super::Failure;
use super::client::{ClientArgs, connect};
use super::table::render;

/// `switchyard dispatch`.
#[derive(Args, Debug)]
pub(crate) struct DispatchArgs {
    /// Namespace to dispatch in.
    pub(crate) namespace: String,
    /// Activity type to run.
    pub(crate) activity_type: String,
    /// Input handed to the activity, as UTF-8 text.
    #[arg(long, default_value = "")]
    pub(crate) input: String,
    /// Task queue [default: default]
    #[arg(long, default_value = "")]
    pub(crate) task_queue: String,
    /// Run only on workers advertising this node label.
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// Activity id, so the dispatch can be cancelled.
    #[arg(long)]
    pub(crate) activity_id: Option<String>,
    /// How long to wait for the outcome (`250ms`, `10s`, `5m`) [default: the gateway's]
    #[arg(long)]
    pub(crate) timeout: Option<ConfigDuration>,
    /// Record the dispatch in the gateway's dispatch store first, so it survives a gateway
    /// restart [default: the namespace's durability]
    #[arg(long)]
    pub(crate) durable: bool,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// `switchyard workers`.
#[derive(Args, Debug)]
pub(crate) struct WorkersArgs {
    /// Only workers serving this namespace.
    #[arg(long)]
    pub(crate) namespace: Option<String>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// `switchyard pool`.
#[derive(Args, Debug)]
pub(crate) struct PoolArgs {
    /// Namespace.
    pub(crate) namespace: String,
    /// Task queue (`default` for the default queue).
    pub(crate) task_queue: String,
    /// Activity type to take the census for.
    pub(crate) activity_type: String,
    /// Count only workers on this node label.
    #[arg(long)]
    pub(crate) node: Option<String>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// `switchyard unserved`.
#[derive(Args, Debug)]
pub(crate) struct UnservedArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// `switchyard drain`.
#[derive(Args, Debug)]
pub(crate) struct DrainArgs {
    /// Id of the worker to drain (as `switchyard workers` lists it; a leading `w` is allowed).
    #[arg(required_unless_present = "node")]
    pub(crate) worker_id: Option<String>,
    /// Drain every worker advertising this node label instead.
    #[arg(long, conflicts_with = "worker_id")]
    pub(crate) node: Option<String>,
    /// Remove the workers still connected after this long (`30s`, `5m`); their tasks are
    /// dispatched again elsewhere [default: wait until they leave]
    #[arg(long)]
    pub(crate) deadline: Option<ConfigDuration>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// `switchyard events`.
#[derive(Args, Debug)]
pub(crate) struct EventsArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

pub(crate) fn millis(duration: Option<ConfigDuration>) -> u64 {
    duration.map_or(0, |d| {
        u64::try_from(d.get().as_millis()).unwrap_or(u64::MAX)
    })
}

pub(crate) async fn dispatch(args: DispatchArgs) -> Result<(), Failure> {
    let mut client = connect(&args.client).await?;
    let reply = client
        .dispatch(pb::DispatchRequest {
            namespace: args.namespace,
            task_queue: args.task_queue,
            activity_type: args.activity_type,
            node: args.node.unwrap_or_default(),
            input: Bytes::from(args.input),
            activity_id: args.activity_id.unwrap_or_default(),
            timeout_ms: millis(args.timeout),
            durable: args.durable.then_some(true),
            idempotency_key: String::new(),
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    report(reply.outcome.and_then(|o| o.outcome))
}

/// Prints a dispatch's outcome: `completed: OUTPUT` on stdout and success, anything else a
/// [`Failure::not_completed`] saying how it ended.
pub(crate) fn report(outcome: Option<Outcome>) -> Result<(), Failure> {
    match outcome {
        Some(Outcome::Completed(done)) => {
            println!("completed: {}", String::from_utf8_lossy(&done.output));
            Ok(())
        }
        Some(Outcome::Failed(failure)) => Err(Failure::not_completed(format!(
            "failed (retryable: {}): {}",
            failure.retryable, failure.message
        ))),
        Some(Outcome::TimedOut(_)) => Err(Failure::not_completed("timed out")),
        Some(Outcome::Cancelled(_)) => Err(Failure::not_completed("cancelled")),
        Some(Outcome::Unserved(unserved)) => Err(Failure::not_completed(format!(
            "unserved: {}",
            unserved.detail
        ))),
        Some(Outcome::TransportLost(lost)) => Err(Failure::not_completed(format!(
            "transport lost: {} worker lost {} time(s)",
            lost.transport, lost.attempts
        ))),
        Some(Outcome::ShuttingDown(_)) => Err(Failure::not_completed("gateway shutting down")),
        Some(Outcome::Other(other)) => Err(Failure::not_completed(other.label)),
        None => Err(Failure::runtime(
            "the gateway sent a reply without an outcome",
        )),
    }
}

fn eligibility_name(code: i32) -> String {
    pb::Eligibility::try_from(code)
        .map(|e| {
            e.as_str_name()
                .trim_start_matches("ELIGIBILITY_")
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| code.to_string())
}

fn worker_row(worker: &pb::WorkerInfo) -> Vec<String> {
    vec![
        format!("w{}", worker.worker_id),
        worker.transport.clone(),
        worker.namespaces.join(","),
        worker.task_queue.clone(),
        if worker.node.is_empty() {
            "-".to_owned()
        } else {
            worker.node.clone()
        },
        worker.activity_types.join(","),
        format!(
            "{}/{}",
            worker.in_flight,
            worker
                .capacity
                .map_or_else(|| "?".to_owned(), |c| c.to_string())
        ),
        match worker.suspended_for_ms {
            Some(left) => format!(
                "{} ({:.1}s left)",
                eligibility_name(worker.eligibility),
                left as f64 / 1000.0
            ),
            None => eligibility_name(worker.eligibility),
        },
        worker.identity.clone(),
    ]
}

const WORKER_HEADER: [&str; 9] = [
    "ID",
    "TRANSPORT",
    "NAMESPACES",
    "QUEUE",
    "NODE",
    "ACTIVITIES",
    "IN-FLIGHT",
    "STANDING",
    "IDENTITY",
];

pub(crate) async fn workers(args: WorkersArgs) -> Result<(), Failure> {
    let mut client = connect(&args.client).await?;
    let reply = client
        .list_workers(pb::ListWorkersRequest {
            namespace: args.namespace.unwrap_or_default(),
            task_queue: String::new(),
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    let mut rows: Vec<Vec<String>> = reply.workers.iter().map(worker_row).collect();
    let gateways: Vec<&str> = reply
        .workers
        .iter()
        .map(|w| w.gateway_node.as_str())
        .collect();
    let header = with_gateway(&WORKER_HEADER, &mut rows, &gateways);
    print!("{}", render(&header, &rows));
    warn_silent(&reply.silent_nodes);
    Ok(())
}

/// In a cluster (some row has a gateway node) a first `GATEWAY` column naming the node each
/// row is on; otherwise `header` as it is.
fn with_gateway<'h>(
    header: &[&'h str],
    rows: &mut [Vec<String>],
    gateways: &[&str],
) -> Vec<&'h str> {
    if gateways.iter().all(|g| g.is_empty()) {
        return header.to_vec();
    }
    for (row, gateway) in rows.iter_mut().zip(gateways) {
        row.insert(0, (*gateway).to_owned());
    }
    std::iter::once("GATEWAY")
        .chain(header.iter().copied())
        .collect()
}

/// A warning line on stderr per cluster node that did not answer (its part is missing).
fn warn_silent(silent: &[pb::SilentNode]) {
    for node in silent {
        eprintln!(
            "warning: cluster node {} did not answer ({}); its workers are not listed",
            node.node, node.reason
        );
    }
}

pub(crate) async fn pool(args: PoolArgs) -> Result<(), Failure> {
    let mut client = connect(&args.client).await?;
    let node = args.node.unwrap_or_default();
    let described = client
        .describe_pool(pb::DescribePoolRequest {
            namespace: args.namespace.clone(),
            task_queue: args.task_queue.clone(),
            activity_type: args.activity_type.clone(),
            node: node.clone(),
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    let explained = client
        .explain_pool(pb::ExplainPoolRequest {
            namespace: args.namespace.clone(),
            task_queue: args.task_queue.clone(),
            activity_type: args.activity_type.clone(),
            node,
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    println!(
        "pool {}/{} activity {}",
        args.namespace, args.task_queue, args.activity_type
    );
    if described.served {
        println!("served: a worker can take a dispatch now");
    } else {
        println!("unserved: {}", described.detail);
    }
    if let Some(c) = described.census {
        println!(
            "census: {} in pool, {} serve the activity, {} compatible: {} eligible, {} at \
             capacity, {} capacity unannounced, {} on probation, {} unreachable, {} draining",
            c.pool_workers,
            c.activity_workers,
            c.compatible,
            c.eligible,
            c.at_capacity,
            c.capacity_unannounced,
            c.on_probation,
            c.reachability_lost,
            c.draining
        );
    }
    for part in &described.nodes {
        let c = part.census.unwrap_or_default();
        println!(
            "node {}: {} in pool, {} eligible, capacity {}, {} in flight, {} parked",
            part.gateway_node,
            c.pool_workers,
            c.eligible,
            part.capacity,
            part.in_flight,
            part.parked
        );
    }
    warn_silent(&described.silent_nodes);
    if described.parked > 0 {
        println!(
            "parked: {} dispatch(es), oldest waiting {} ms",
            described.parked, described.oldest_parked_ms
        );
    }
    if described.backlog_waiting > 0 || described.backlog_running > 0 {
        println!(
            "durable backlog: {} waiting, {} running, oldest waiting {} ms",
            described.backlog_waiting,
            described.backlog_running,
            described.backlog_oldest_waiting_ms
        );
    }
    let rows: Vec<Vec<String>> = explained
        .workers
        .iter()
        .map(|w| {
            let info = w.worker.clone().unwrap_or_default();
            vec![
                format!("w{}", info.worker_id),
                info.transport,
                if info.node.is_empty() {
                    "-".to_owned()
                } else {
                    info.node
                },
                w.explanation.clone(),
            ]
        })
        .collect();
    println!();
    print!("{}", render(&["ID", "TRANSPORT", "NODE", "WHY"], &rows));
    Ok(())
}

pub(crate) async fn unserved(args: UnservedArgs) -> Result<(), Failure> {
    let mut client = connect(&args.client).await?;
    let reply = client
        .unserved_queues(pb::UnservedQueuesRequest {})
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    let mut rows: Vec<Vec<String>> = reply
        .queues
        .iter()
        .map(|q| {
            vec![
                q.namespace.clone(),
                q.task_queue.clone(),
                q.activity_type.clone(),
                if q.node.is_empty() {
                    "-".to_owned()
                } else {
                    q.node.clone()
                },
                q.waiting.to_string(),
                format!("{}ms", q.oldest_wait_ms),
                q.detail.clone(),
            ]
        })
        .collect();
    let gateways: Vec<&str> = reply
        .queues
        .iter()
        .map(|q| q.gateway_node.as_str())
        .collect();
    let header = with_gateway(
        &[
            "NAMESPACE",
            "QUEUE",
            "ACTIVITY",
            "NODE",
            "WAITING",
            "OLDEST",
            "WHY",
        ],
        &mut rows,
        &gateways,
    );
    print!("{}", render(&header, &rows));
    warn_silent(&reply.silent_nodes);
    if !reply.backlog.is_empty() {
        let rows: Vec<Vec<String>> = reply
            .backlog
            .iter()
            .map(|b| {
                vec![
                    b.namespace.clone(),
                    b.task_queue.clone(),
                    b.activity_type.clone(),
                    b.waiting.to_string(),
                    b.running.to_string(),
                    format!("{}ms", b.oldest_waiting_ms),
                ]
            })
            .collect();
        println!();
        println!("durable backlog (dispatch store):");
        print!(
            "{}",
            render(
                &[
                    "NAMESPACE",
                    "QUEUE",
                    "ACTIVITY",
                    "WAITING",
                    "RUNNING",
                    "OLDEST"
                ],
                &rows
            )
        );
    }
    Ok(())
}

pub(crate) async fn drain(args: DrainArgs) -> Result<(), Failure> {
    use pb::drain_workers_request::Target;
    let target = match (&args.worker_id, &args.node) {
        (Some(id), _) => {
            let raw = id.trim_start_matches('w');
            Target::WorkerId(raw.parse().map_err(|_| {
                Failure::usage(format!("worker id {id:?} is not a number (like 7 or w7)"))
            })?)
        }
        (None, Some(node)) => Target::Node(node.clone()),
        (None, None) => return Err(Failure::usage("give a WORKER_ID or --node")),
    };
    let mut client = connect(&args.client).await?;
    let mut progress = client
        .drain(pb::DrainWorkersRequest {
            target: Some(target),
            deadline_ms: millis(args.deadline),
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    while let Some(step) = progress
        .message()
        .await
        .map_err(|status| Failure::status(&status))?
    {
        let holding: Vec<String> = step
            .workers
            .iter()
            .map(|w| {
                if w.gateway_node.is_empty() {
                    format!("w{} holds {}", w.worker_id, w.in_flight)
                } else {
                    format!("{}/w{} holds {}", w.gateway_node, w.worker_id, w.in_flight)
                }
            })
            .collect();
        println!(
            "{} task(s) remaining, {} worker(s) left{}{}",
            step.tasks_remaining,
            step.workers_left,
            if holding.is_empty() {
                String::new()
            } else {
                format!("; {}", holding.join(", "))
            },
            if step.cancelled_at_deadline == 0 {
                String::new()
            } else {
                format!(
                    "; {} task(s) cancelled at the deadline",
                    step.cancelled_at_deadline
                )
            }
        );
        if step.done {
            println!("drain finished");
            return Ok(());
        }
    }
    Err(Failure::runtime(
        "the drain stream ended before the drain finished",
    ))
}

pub(crate) async fn events(args: EventsArgs) -> Result<(), Failure> {
    use pb::gateway_event::Event;
    let mut client = connect(&args.client).await?;
    let mut stream = client
        .watch_events(pb::WatchEventsRequest {})
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    while let Some(event) = stream
        .message()
        .await
        .map_err(|status| Failure::status(&status))?
    {
        let what = match event.event {
            Some(Event::Connected(c)) => format!(
                "connected over {} to {} queue {}{}",
                c.transport,
                c.namespaces.join(","),
                c.task_queue,
                if c.node.is_empty() {
                    String::new()
                } else {
                    format!(" node {}", c.node)
                }
            ),
            Some(Event::Disconnected(d)) => format!("disconnected ({})", d.reason),
            Some(Event::Excluded(e)) => format!("excluded ({})", e.exclusion),
            Some(Event::Recovered(_)) => "recovered".to_owned(),
            Some(Event::Capacity(c)) => format!("announced capacity {}", c.capacity),
            Some(Event::Missed(m)) => format!("(missed {} events)", m.count),
            Some(Event::Suspended(s)) => format!(
                "suspended (connection lost; may resume within {} ms)",
                s.grace_ms
            ),
            Some(Event::Resumed(_)) => "resumed its session".to_owned(),
            None => continue,
        };
        println!("{} w{} {what}", event.at_unix_ms, event.worker_id);
    }
    Ok(())
}
