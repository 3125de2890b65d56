//! Client subcommands for durable dispatches: `submit`, `outcome`, `dispatches`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::await_outcome_reply::Result as Awaited;
use switchyard_proto::v1::dispatch_info::State;
use switchyard_proto::v1::dispatch_outcome::Outcome;

use super::client::{ClientArgs, connect};
use super::inspect::{millis, report};
use super::table::render;
use super::{EXIT_PENDING, Failure};

/// `switchyard submit`.
#[derive(Args, Debug)]
pub(crate) struct SubmitArgs {
    /// Namespace to dispatch in.
    #[arg(long)]
    pub(crate) namespace: String,
    /// Activity type to run.
    #[arg(long)]
    pub(crate) activity: String,
    /// Task queue [default: default]
    #[arg(long, default_value = "")]
    pub(crate) queue: String,
    /// Input handed to the activity, as UTF-8 text.
    #[arg(long, default_value = "")]
    pub(crate) input: String,
    /// Run only on workers advertising this node label.
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// Key making the submission idempotent: the same key in the namespace returns the first
    /// dispatch's id and runs nothing new.
    #[arg(long)]
    pub(crate) idempotency_key: Option<String>,
    /// Deadline of the dispatch from now (`10s`, `5m`, `1h`) [default: the gateway's]
    #[arg(long)]
    pub(crate) timeout: Option<ConfigDuration>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// `switchyard outcome`.
#[derive(Args, Debug)]
pub(crate) struct OutcomeArgs {
    /// The dispatch id `switchyard submit` printed.
    pub(crate) id: String,
    /// How long to wait for the outcome (`250ms`, `30s`) [default: answer at once]
    #[arg(long)]
    pub(crate) wait: Option<ConfigDuration>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// `switchyard dispatches`.
#[derive(Args, Debug)]
pub(crate) struct DispatchesArgs {
    /// Only this pool: `NAMESPACE` or `NAMESPACE/QUEUE`.
    #[arg(long)]
    pub(crate) pool: Option<String>,
    /// Only this activity type.
    #[arg(long)]
    pub(crate) activity: Option<String>,
    /// Only dispatches in this state: queued, parked, running or finished.
    #[arg(long)]
    pub(crate) state: Option<String>,
    /// At most this many, oldest first.
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: u32,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

pub(crate) async fn submit(args: SubmitArgs) -> Result<(), Failure> {
    let mut client = connect(&args.client).await?;
    let reply = client
        .submit(pb::DispatchRequest {
            namespace: args.namespace,
            task_queue: args.queue,
            activity_type: args.activity,
            node: args.node.unwrap_or_default(),
            input: Bytes::from(args.input),
            timeout_ms: millis(args.timeout),
            durable: Some(true),
            idempotency_key: args.idempotency_key.unwrap_or_default(),
            ..pb::DispatchRequest::default()
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    println!("{}", reply.dispatch_id);
    if reply.existing {
        eprintln!("switchyard: the idempotency key was already used; this is the first id");
    }
    Ok(())
}

pub(crate) async fn outcome(args: OutcomeArgs) -> Result<(), Failure> {
    let mut client = connect(&args.client).await?;
    let reply = client
        .await_outcome(pb::AwaitOutcomeRequest {
            dispatch_id: args.id.clone(),
            wait_ms: millis(args.wait),
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    match reply.result {
        Some(Awaited::Outcome(outcome)) => report(outcome.outcome),
        Some(Awaited::Pending(pending)) => Err(Failure {
            code: EXIT_PENDING,
            message: format!("{} has no outcome yet: {}", args.id, pending.state),
        }),
        None => Err(Failure::runtime(
            "the gateway sent a reply without an outcome",
        )),
    }
}

/// `--pool NS/QUEUE` as (namespace, task queue); the queue may be left out.
fn pool(text: &str) -> Result<(String, String), Failure> {
    let (namespace, queue) = text.split_once('/').unwrap_or((text, ""));
    if namespace.is_empty() || queue.contains('/') {
        return Err(Failure::usage(format!(
            "--pool {text:?}: write NAMESPACE or NAMESPACE/QUEUE"
        )));
    }
    Ok((namespace.to_owned(), queue.to_owned()))
}

pub(crate) async fn dispatches(args: DispatchesArgs) -> Result<(), Failure> {
    let (namespace, task_queue) = match &args.pool {
        Some(text) => pool(text)?,
        None => (String::new(), String::new()),
    };
    let mut client = connect(&args.client).await?;
    let reply = client
        .list_dispatches(pb::ListDispatchesRequest {
            namespace,
            task_queue,
            activity_type: args.activity.unwrap_or_default(),
            state: args.state.unwrap_or_default(),
            limit: args.limit,
        })
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    let now = SystemTime::now();
    let rows: Vec<Vec<String>> = reply
        .dispatches
        .iter()
        .map(|d| {
            let (state, detail) = state(d);
            vec![
                d.dispatch_id.clone(),
                d.namespace.clone(),
                d.task_queue.clone(),
                d.activity_type.clone(),
                state,
                d.attempts.to_string(),
                age(now, d.submitted_at_unix_ms),
                detail,
            ]
        })
        .collect();
    print!(
        "{}",
        render(
            &[
                "ID",
                "NAMESPACE",
                "QUEUE",
                "ACTIVITY",
                "STATE",
                "ATTEMPTS",
                "AGE",
                "DETAIL"
            ],
            &rows
        )
    );
    Ok(())
}

/// The state column and its detail (reason, worker, outcome).
fn state(dispatch: &pb::DispatchInfo) -> (String, String) {
    match &dispatch.state {
        Some(State::Queued(_)) => ("queued".to_owned(), String::new()),
        Some(State::Parked(parked)) => ("parked".to_owned(), reason_name(parked.reason)),
        Some(State::Running(running)) => (
            "running".to_owned(),
            format!("w{} attempt {}", running.worker_id, running.attempt),
        ),
        Some(State::Finished(finished)) => (
            "finished".to_owned(),
            finished
                .outcome
                .as_ref()
                .and_then(|o| o.outcome.as_ref())
                .map_or_else(String::new, outcome_label),
        ),
        None => ("?".to_owned(), String::new()),
    }
}

fn reason_name(code: i32) -> String {
    pb::UnservedReason::try_from(code)
        .map(|r| {
            r.as_str_name()
                .trim_start_matches("UNSERVED_REASON_")
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| code.to_string())
}

fn outcome_label(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Completed(_) => "completed".to_owned(),
        Outcome::Failed(failure) => format!("failed: {}", failure.message),
        Outcome::TimedOut(_) => "timed out".to_owned(),
        Outcome::Cancelled(_) => "cancelled".to_owned(),
        Outcome::Unserved(unserved) => format!("unserved: {}", reason_name(unserved.reason)),
        Outcome::TransportLost(lost) => format!("transport lost ({})", lost.transport),
        Outcome::ShuttingDown(_) => "shutting down".to_owned(),
        Outcome::Other(other) => other.label.clone(),
    }
}

/// How long ago `unix_ms` was, rounded for a table (`850ms`, `12s`, `3m`).
fn age(now: SystemTime, unix_ms: u64) -> String {
    let then = UNIX_EPOCH + Duration::from_millis(unix_ms);
    let elapsed = now.duration_since(then).unwrap_or_default();
    let millis = elapsed.as_millis();
    if millis < 1_000 {
        format!("{millis}ms")
    } else if millis < 120_000 {
        format!("{}s", millis / 1_000)
    } else if millis < 7_200_000 {
        format!("{}m", millis / 60_000)
    } else {
        format!("{}h", millis / 3_600_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_a_namespace_with_an_optional_queue() {
        assert_eq!(
            pool("billing/high").unwrap(),
            ("billing".to_owned(), "high".to_owned())
        );
        assert_eq!(
            pool("billing").unwrap(),
            ("billing".to_owned(), String::new())
        );
        // Controls: no namespace, or a second slash, is a usage error naming the flag.
        for bad in ["/high", "a/b/c", ""] {
            let failure = pool(bad).unwrap_err();
            assert_eq!(failure.code, super::super::EXIT_USAGE);
            assert!(failure.message.starts_with("--pool"), "{}", failure.message);
        }
    }

    #[test]
    fn ages_are_rounded_to_one_unit() {
        let now = UNIX_EPOCH + Duration::from_secs(10_000);
        let at = |ago_ms: u64| 10_000_000 - ago_ms;
        assert_eq!(age(now, at(850)), "850ms");
        assert_eq!(age(now, at(12_400)), "12s");
        assert_eq!(age(now, at(180_000)), "3m");
        assert_eq!(age(now, at(7_200_000)), "2h");
        // Control: a clock behind the submission reads 0, not a wrapped huge age.
        assert_eq!(age(now, 10_000_500), "0ms");
    }
}
