//! A transport living in the test process, plugged into the gateway through its `Transport`
//! trait, whose workers do exactly what the test tells them (answer pings or not, announce
//! capacity or not, hold tasks or complete them).

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use switchyard_core::{
    ActivityTask, AdmissionError, CallerIdentity, Core, DeliveryError, Registration,
    RegistrationToken, TaskId, TaskResult, TransportName, WorkerDelivery, WorkerId, WorkerMessage,
};
use switchyard_gateway::{Listening, Transport, TransportContext, TransportError};
use tokio::sync::mpsc;

/// The transport's name as workers and metrics show it.
pub(crate) const SCRIPTED: &str = "scripted";

/// The transport handed to the gateway builder; clones share the started core.
#[derive(Clone, Debug, Default)]
pub struct ScriptedTransport {
    core: Arc<OnceLock<Core>>,
}

#[async_trait]
impl Transport for ScriptedTransport {
    fn name(&self) -> &str {
        SCRIPTED
    }

    async fn start(
        self: Box<Self>,
        context: TransportContext,
    ) -> Result<Listening, TransportError> {
        let _ = self.core.set(context.core.clone());
        Ok(Listening {
            addrs: Vec::new(),
            serving: Box::pin(async move {
                context.close.cancelled().await;
                Ok(())
            }),
        })
    }
}

/// A registration of `namespaces` on the default queue running `activities`, capacity
/// `capacity`.
pub fn registration(
    namespaces: &[&str],
    activities: &[&str],
    capacity: Option<u32>,
) -> Registration {
    Registration {
        namespaces: namespaces
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<_>>(),
        activity_types: activities.iter().map(|s| (*s).to_owned()).collect(),
        identity: "scripted-worker".to_owned(),
        max_concurrency: capacity,
        ..Registration::default()
    }
}

struct Leg {
    outbox: mpsc::Sender<WorkerMessage>,
    carries_capacity: bool,
}

impl WorkerDelivery for Leg {
    fn transport(&self) -> TransportName {
        TransportName::from_static(SCRIPTED)
    }

    fn is_connected(&self) -> bool {
        !self.outbox.is_closed()
    }

    fn registration_carries_capacity(&self) -> bool {
        self.carries_capacity
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        self.outbox.try_send(message).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
        })
    }
}

/// One worker of the scripted transport; dropping it disconnects it.
#[derive(Debug)]
pub struct ScriptedWorker {
    core: Core,
    token: Option<RegistrationToken>,
    inbox: mpsc::Receiver<WorkerMessage>,
}

impl ScriptedTransport {
    /// Registers a worker through the gateway's admission gate. With `carries_capacity` false
    /// the registration's capacity is ignored and the worker must announce it.
    pub async fn connect(
        &self,
        caller: &CallerIdentity,
        registration: Registration,
        carries_capacity: bool,
    ) -> Result<ScriptedWorker, AdmissionError> {
        let core = self
            .core
            .get()
            .expect("the gateway started this transport")
            .clone();
        let (outbox, inbox) = mpsc::channel(256);
        let leg = Arc::new(Leg {
            outbox,
            carries_capacity,
        });
        let token = core.registry().admit(caller, registration, leg).await?;
        Ok(ScriptedWorker {
            core,
            token: Some(token),
            inbox,
        })
    }
}

impl ScriptedWorker {
    /// Its id.
    pub fn id(&self) -> WorkerId {
        self.token.as_ref().expect("connected").worker_id()
    }

    /// The next message the gateway pushed, `None` once disconnected.
    pub async fn next(&mut self) -> Option<WorkerMessage> {
        self.inbox.recv().await
    }

    /// Answers a ping.
    pub fn pong(&self, seq: u64) {
        self.core.record_pong(self.id(), seq);
    }

    /// Announces capacity (for workers whose registration does not carry it).
    pub fn announce(&self, capacity: u32) -> Result<(), AdmissionError> {
        self.core
            .registry()
            .set_advertised_capacity(self.id(), capacity)
    }

    /// Reports a task's result.
    pub fn complete(&self, task: TaskId, output: bytes::Bytes) {
        let _ = self
            .core
            .complete(self.id(), task, TaskResult::Success(output));
    }

    /// Answers pings until it has answered `count`, and returns the other messages it saw.
    pub async fn answer_pings(&mut self, count: usize) -> Vec<WorkerMessage> {
        let mut others = Vec::new();
        let mut answered = 0;
        while answered < count {
            match self.next().await {
                Some(WorkerMessage::Ping { seq }) => {
                    self.pong(seq);
                    answered += 1;
                }
                Some(other) => others.push(other),
                None => break,
            }
        }
        others
    }

    /// Hands the worker to a task that answers every ping and completes every task with its
    /// input, until the gateway lets go of the worker.
    pub fn serve_echo(mut self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while let Some(message) = self.next().await {
                match message {
                    WorkerMessage::Ping { seq } => self.pong(seq),
                    WorkerMessage::Task(task) => self.complete(task.task_id, task.input),
                    _ => {}
                }
            }
        })
    }

    /// Hands the worker to a background task that answers every ping and forwards every task
    /// it receives (without completing it); the returned control reaches the worker, and
    /// aborting the handle disconnects it.
    pub fn answer_pings_in_background(
        mut self,
    ) -> (
        WorkerControl,
        mpsc::Receiver<ActivityTask>,
        tokio::task::JoinHandle<()>,
    ) {
        let control = WorkerControl {
            core: self.core.clone(),
            id: self.id(),
        };
        let (tasks, received) = mpsc::channel(256);
        let handle = tokio::spawn(async move {
            while let Some(message) = self.next().await {
                match message {
                    WorkerMessage::Ping { seq } => self.pong(seq),
                    WorkerMessage::Task(task) => {
                        let _ = tasks.try_send(task);
                    }
                    _ => {}
                }
            }
        });
        (control, received, handle)
    }
}

/// Reaches a worker whose messages a background task handles.
#[derive(Clone, Debug)]
pub struct WorkerControl {
    core: Core,
    id: WorkerId,
}

impl WorkerControl {
    /// The worker's id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Announces capacity (for workers whose registration does not carry it).
    pub fn announce(&self, capacity: u32) -> Result<(), AdmissionError> {
        self.core
            .registry()
            .set_advertised_capacity(self.id, capacity)
    }

    /// Reports a task's result.
    pub fn complete(&self, task: TaskId, output: bytes::Bytes) {
        let _ = self
            .core
            .complete(self.id, task, TaskResult::Success(output));
    }
}
