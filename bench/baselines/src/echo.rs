//! The one-hop baselines: a tonic echo server on loopback, driven through bidi streams
//! (`echo`: one stream per producer connection, each task echoed straight back) or unary
//! calls (`unary`: P calls at once, round-robin over the producer connections).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures::Stream;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

use crate::load::{self, Ids, Measured, Run, SendTimes, share};
use crate::wire::Task;
use crate::wire::echo_client::EchoClient;
use crate::wire::echo_server::{Echo, EchoServer};
use crate::{Args, Failure};

/// Echoes every task it gets.
struct EchoService;

#[tonic::async_trait]
impl Echo for EchoService {
    type StreamStream = Pin<Box<dyn Stream<Item = Result<Task, Status>> + Send>>;

    async fn stream(
        &self,
        request: Request<Streaming<Task>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        // The reply stream is the request stream: each task goes back as it is decoded.
        Ok(Response::new(Box::pin(request.into_inner())))
    }

    async fn unary(&self, request: Request<Task>) -> Result<Response<Task>, Status> {
        Ok(Response::new(request.into_inner()))
    }
}

/// A tonic server on a loopback port, serving until its task is aborted.
pub(crate) struct Served {
    pub(crate) addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `router`'s services on a free loopback port, TCP_NODELAY on, `streams` concurrent
/// streams allowed per connection.
pub(crate) fn serve(router: tonic::service::Routes, streams: u32) -> Result<Served, Failure> {
    let incoming =
        TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?.with_nodelay(Some(true));
    let addr = incoming.local_addr()?;
    let server = Server::builder()
        .max_concurrent_streams(streams)
        .add_routes(router);
    let task = tokio::spawn(async move {
        if let Err(error) = server.serve_with_incoming(incoming).await {
            eprintln!("baseline server: {error}");
        }
    });
    Ok(Served { addr, task })
}

/// `count` plaintext HTTP/2 connections to `addr`.
pub(crate) async fn connect(addr: SocketAddr, count: u32) -> Result<Vec<Channel>, Failure> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true);
    let mut channels = Vec::new();
    for _ in 0..count {
        channels.push(endpoint.connect().await?);
    }
    Ok(channels)
}

fn echo_server(args: &Args) -> Result<Served, Failure> {
    serve(
        tonic::service::Routes::new(EchoServer::new(EchoService)),
        args.outstanding.max(args.connections),
    )
}

/// `echo`: one bidi stream per producer connection.
pub(crate) async fn stream(args: &Args, deadline: Instant) -> Result<Measured, Failure> {
    let served = echo_server(args)?;
    let channels = connect(served.addr, args.connections).await?;
    let times = Arc::new(SendTimes::new(args.tasks));
    let parts = u64::from(args.connections);
    let measured = load::measure(async {
        let producers = channels.into_iter().zip(0..).map(|(channel, index)| {
            let ids = Ids::of_stream(args, index);
            let outstanding = share(u64::from(args.outstanding), parts, u64::from(index));
            let (times, size) = (Arc::clone(&times), args.payload);
            tokio::spawn(async move {
                let mut client = EchoClient::new(channel);
                let open =
                    |outbound| async move { Ok(client.stream(outbound).await?.into_inner()) };
                load::one_stream(open, ids, outstanding, size, times, deadline).await
            })
        });
        load::collect(producers.collect()).await
    })
    .await;
    drop(served);
    measured
}

/// `unary`: P callers, caller `i` on connection `i mod K`, each calling one after another.
pub(crate) async fn unary(args: &Args, deadline: Instant) -> Result<Measured, Failure> {
    let served = echo_server(args)?;
    let channels = connect(served.addr, args.connections).await?;
    let next = Arc::new(AtomicU64::new(0));
    let tasks = u64::from(args.tasks);
    let size = args.payload;
    let measured = load::measure(async {
        let outstanding = usize::try_from(args.outstanding)?;
        let callers = channels.iter().cycle().take(outstanding).map(|channel| {
            let (mut client, next) = (EchoClient::new(channel.clone()), Arc::clone(&next));
            tokio::spawn(async move {
                let mut run = Run::new()?;
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= tasks {
                        break;
                    }
                    let task = Task {
                        id,
                        payload: load::payload(id, size),
                        route: 0,
                    };
                    let sent = Instant::now();
                    let wait = load::patience(deadline);
                    tokio::time::timeout(wait, client.unary(task))
                        .await
                        .map_err(|_| format!("no unary echo for {wait:?}"))??;
                    run.record(sent.elapsed());
                }
                Ok::<_, Failure>(run)
            })
        });
        load::collect(callers.collect()).await
    })
    .await;
    drop(served);
    measured
}
