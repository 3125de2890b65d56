//! The NATS baseline: request/reply through nats-server (started by `bench/baselines.sh`), W
//! workers each on its own connection in one queue group, each running at most C requests at
//! once and replying with the payload; the producer keeps P requests outstanding over one
//! connection (P callers, each requesting one after another).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::load::{self, Measured, Run};
use crate::{Args, Failure};

/// The subject requests go to.
const SUBJECT: &str = "switchyard.baseline.work";
/// The queue group every worker joins.
const QUEUE_GROUP: &str = "workers";

/// Connects the workers; each ends when its task is aborted.
async fn workers(args: &Args) -> Result<Vec<JoinHandle<()>>, Failure> {
    let capacity = usize::try_from(args.capacity)?;
    let service_time = Duration::from_micros(args.service_time_us);
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let client = async_nats::connect(&args.server).await?;
        let requests = client
            .queue_subscribe(SUBJECT, QUEUE_GROUP.to_owned())
            .await?;
        // The subscription is registered once the server has seen this round trip.
        client.flush().await?;
        workers.push(tokio::spawn(async move {
            requests
                .for_each_concurrent(capacity, |request| {
                    let client = client.clone();
                    async move {
                        if !service_time.is_zero() {
                            tokio::time::sleep(service_time).await;
                        }
                        if let Some(reply) = request.reply {
                            let _ = client.publish(reply, request.payload).await;
                        }
                    }
                })
                .await;
        }));
    }
    Ok(workers)
}

/// `nats`: P callers over one producer connection.
pub(crate) async fn run(args: &Args, deadline: Instant) -> Result<Measured, Failure> {
    let fleet = workers(args).await?;
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(load::patience(deadline)))
        .connect(&args.server)
        .await?;
    let next = Arc::new(AtomicU64::new(0));
    let (tasks, size) = (u64::from(args.tasks), args.payload);
    let measured = load::measure(async {
        let outstanding = usize::try_from(args.outstanding)?;
        let callers = (0..outstanding).map(|_| {
            let (client, next) = (client.clone(), Arc::clone(&next));
            tokio::spawn(async move {
                let mut run = Run::new()?;
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= tasks {
                        break;
                    }
                    let sent = Instant::now();
                    let reply = client.request(SUBJECT, load::payload(id, size)).await?;
                    if load::id_of(&reply.payload) != Some(id) {
                        return Err(format!("the reply to task {id} is another task's").into());
                    }
                    run.record(sent.elapsed());
                }
                Ok::<_, Failure>(run)
            })
        });
        load::collect(callers.collect()).await
    })
    .await;
    for worker in &fleet {
        worker.abort();
    }
    measured
}
