//! The baseline's workers: W connections sharing the durable pull consumer, each running up to
//! C tasks at once: hold the task for the service time, ack it, reply with its payload.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::PullConsumer;
use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::{Args, CONSUMER, Failure, REPLY_SUBJECT, STREAM};

/// The running workers and their summed handler runs.
pub(crate) struct Fleet {
    workers: Vec<JoinHandle<()>>,
    executions: Arc<AtomicU64>,
}

impl Fleet {
    /// Connects `--workers` workers and starts them consuming.
    pub(crate) async fn start(args: &Args) -> Result<Self, Failure> {
        let executions = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        let capacity = usize::try_from(args.capacity)?;
        let service_time = Duration::from_micros(args.service_time_us);
        for _ in 0..args.workers {
            let client = async_nats::connect(&args.server).await?;
            let consumer: PullConsumer = jetstream::new(client.clone())
                .get_stream(STREAM)
                .await?
                .get_consumer(CONSUMER)
                .await?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(capacity)
                .messages()
                .await?;
            let executions = Arc::clone(&executions);
            workers.push(tokio::spawn(async move {
                messages
                    .for_each_concurrent(capacity, |message| {
                        let (client, executions) = (client.clone(), Arc::clone(&executions));
                        async move {
                            let Ok(message) = message else { return };
                            executions.fetch_add(1, Ordering::Relaxed);
                            if !service_time.is_zero() {
                                tokio::time::sleep(service_time).await;
                            }
                            if message.ack().await.is_err() {
                                return;
                            }
                            let _ = client.publish(REPLY_SUBJECT, message.payload.clone()).await;
                        }
                    })
                    .await;
            }));
        }
        Ok(Self {
            workers,
            executions,
        })
    }

    /// Stops every worker; returns the handler runs.
    pub(crate) async fn stop(self) -> u64 {
        for worker in &self.workers {
            worker.abort();
        }
        for worker in self.workers {
            let _ = worker.await;
        }
        self.executions.load(Ordering::Relaxed)
    }
}
