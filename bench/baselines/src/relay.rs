//! The two-hop baseline: producer → relay → worker → relay → producer over long-lived tonic
//! bidi streams, with no gateway logic. The relay hands each task to the next worker in turn
//! (a queue of at most C tasks per worker, so a slow worker holds the producer back) and sends
//! each echo back on the producer stream it came from (the relay's `route`, which the worker
//! copies). Relay, workers and producers share this process, as `switchyard bench` shares one
//! with its in-process gateway.

use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::echo::{connect, serve};
use crate::load::{self, Ids, Measured, SendTimes, share};
use crate::wire::Task;
use crate::wire::relay_client::RelayClient;
use crate::wire::relay_server::{Relay, RelayServer};
use crate::{Args, Failure};

/// The way to one stream's reply half.
type Outbox = mpsc::Sender<Result<Task, Status>>;
/// A reply stream tonic sends from.
type Replies = Pin<Box<dyn Stream<Item = Result<Task, Status>> + Send>>;

/// The relay: workers' and producers' reply halves, in the order they came.
struct RelayService {
    workers: Arc<RwLock<Vec<Outbox>>>,
    producers: Arc<RwLock<Vec<Outbox>>>,
    capacity: usize,
}

fn snapshot(table: &RwLock<Vec<Outbox>>) -> Vec<Outbox> {
    table.read().unwrap_or_else(PoisonError::into_inner).clone()
}

fn join(table: &RwLock<Vec<Outbox>>, outbox: Outbox) -> u64 {
    let mut table = table.write().unwrap_or_else(PoisonError::into_inner);
    table.push(outbox);
    u64::try_from(table.len() - 1).unwrap_or(u64::MAX)
}

#[tonic::async_trait]
impl Relay for RelayService {
    type ProduceStream = Replies;
    type WorkStream = Replies;

    async fn produce(
        &self,
        request: Request<Streaming<Task>>,
    ) -> Result<Response<Replies>, Status> {
        let workers = snapshot(&self.workers);
        if workers.is_empty() {
            return Err(Status::unavailable("no worker connected"));
        }
        let (outbox, replies) = mpsc::channel(self.capacity.max(1));
        let route = join(&self.producers, outbox);
        let mut tasks = request.into_inner();
        tokio::spawn(async move {
            let mut next = 0;
            while let Some(Ok(mut task)) = tasks.next().await {
                task.route = route;
                let worker = &workers[next % workers.len()];
                next = next.wrapping_add(1);
                if worker.send(Ok(task)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(replies))))
    }

    async fn work(&self, request: Request<Streaming<Task>>) -> Result<Response<Replies>, Status> {
        let (outbox, tasks) = mpsc::channel(self.capacity.max(1));
        join(&self.workers, outbox);
        let producers = Arc::clone(&self.producers);
        let mut echoes = request.into_inner();
        tokio::spawn(async move {
            let mut known = snapshot(&producers);
            while let Some(Ok(echo)) = echoes.next().await {
                let Ok(route) = usize::try_from(echo.route) else {
                    continue;
                };
                if route >= known.len() {
                    known = snapshot(&producers);
                }
                let Some(producer) = known.get(route) else {
                    continue;
                };
                // A producer that went away loses its echoes; the others keep theirs.
                let _ = producer.send(Ok(echo)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(tasks))))
    }
}

/// One worker: echoes each task (after the service time, at most C at once).
async fn worker(
    mut client: RelayClient<tonic::transport::Channel>,
    capacity: usize,
    service_time: Duration,
) -> Result<JoinHandle<()>, Failure> {
    let (echoes, outbound) = mpsc::channel::<Task>(capacity.max(1));
    let mut tasks = client
        .work(ReceiverStream::new(outbound))
        .await?
        .into_inner();
    let slots = Arc::new(Semaphore::new(capacity.max(1)));
    Ok(tokio::spawn(async move {
        while let Some(Ok(task)) = tasks.next().await {
            if service_time.is_zero() {
                if echoes.send(task).await.is_err() {
                    return;
                }
                continue;
            }
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let echoes = echoes.clone();
            tokio::spawn(async move {
                tokio::time::sleep(service_time).await;
                let _ = echoes.send(task).await;
                drop(slot);
            });
        }
    }))
}

/// `relay`: W workers connect to the relay, then one producer stream per connection runs.
pub(crate) async fn run(args: &Args, deadline: Instant) -> Result<Measured, Failure> {
    let capacity = usize::try_from(args.capacity)?;
    let relay = RelayService {
        workers: Arc::default(),
        producers: Arc::default(),
        capacity,
    };
    let served = serve(
        tonic::service::Routes::new(RelayServer::new(relay)),
        args.connections.max(1),
    )?;
    let service_time = Duration::from_micros(args.service_time_us);
    let mut workers = Vec::new();
    for channel in connect(served.addr, args.workers).await? {
        workers.push(worker(RelayClient::new(channel), capacity, service_time).await?);
    }
    let channels = connect(served.addr, args.connections).await?;
    let times = Arc::new(SendTimes::new(args.tasks));
    let parts = u64::from(args.connections);
    let measured = load::measure(async {
        let producers = channels.into_iter().zip(0..).map(|(channel, index)| {
            let ids = Ids::of_stream(args, index);
            let outstanding = share(u64::from(args.outstanding), parts, u64::from(index));
            let (times, size) = (Arc::clone(&times), args.payload);
            tokio::spawn(async move {
                let mut client = RelayClient::new(channel);
                let open =
                    |outbound| async move { Ok(client.produce(outbound).await?.into_inner()) };
                load::one_stream(open, ids, outstanding, size, times, deadline).await
            })
        });
        load::collect(producers.collect()).await
    })
    .await;
    for worker in &workers {
        worker.abort();
    }
    drop(served);
    measured
}
