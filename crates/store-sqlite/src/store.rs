//! [`SqliteStore`]: the [`DispatchStore`] on one SQLite file.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use switchyard_core::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchStore, DispatchStoreError,
    NewDispatch, OutcomeRecord, Recorded, StoredDispatch, WorkerId,
};
use tokio::sync::oneshot;

use crate::backlog::Backlog;
use crate::inbox::Inbox;
use crate::lock::{LockHolder, StoreLock};
use crate::open_error::OpenError;
use crate::ops::{Answer, Limits, Op};
use crate::options::{SqliteOptions, Synchronous};
use crate::reads::{self, Readers};
use crate::schema;
use crate::sync::Syncer;
use crate::writer::{BatchPolicy, Command, Writer};

/// Commands the writer's channel holds, in batches: senders wait beyond that.
const QUEUED_BATCHES: usize = 4;

/// Rows one purge transaction reads at most (and so deletes at most), so records interleave
/// with a long purge.
const PURGE_WINDOW: u64 = 4096;

/// The embedded durable-dispatch store: one SQLite file in WAL mode, one writer thread that
/// group-commits every write, reads on their own connections on tokio's blocking pool.
///
/// Opening takes `<path>.lock` (held until the store is dropped or the process dies), so a
/// second gateway on the same file is refused with the first one's pid, host and start time.
/// `record` and `complete` return after their batch committed, fsynced as
/// [`SqliteOptions::synchronous`] says; `park`, `claim` and `release` are notes that return
/// once queued on the same writer (committed in order with the writes sent before and after
/// them, lost only by a crash, as [`DispatchStore`] allows). A read first waits for every
/// write sent before it to be committed, so it sees them. `extend` does nothing: a claim here lasts until its dispatch is completed or
/// released, and a restart is what ends the claims of a dead gateway.
///
/// Dropping the store waits for the writer to commit what it holds. Commits happen on the
/// writer's own thread, which tokio's paused test clock does not see: a test with paused time
/// may find its clock advanced while it waits for a commit.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use switchyard_core::{DispatchId, DispatchStore, NewDispatch, Recorded};
/// use switchyard_store_sqlite::{SqliteOptions, SqliteStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("dispatches.sqlite3"), SqliteOptions::default())?;
/// let id = DispatchId::generate();
/// let now = SystemTime::now();
/// let recorded = store
///     .record(NewDispatch {
///         id: id.clone(),
///         namespace: "default".into(),
///         task_queue: "default".into(),
///         activity_type: "resize".into(),
///         node: None,
///         input: "img-1".into(),
///         principal: "producer".into(),
///         idempotency_key: Some("img-1".into()),
///         submitted_at: now,
///         deadline: now + Duration::from_secs(60),
///     })
///     .await?;
/// assert_eq!(recorded, Recorded::New(id.clone()));
/// assert_eq!(store.unfinished().await?.len(), 1);
/// # Ok(())
/// # }
/// ```
pub struct SqliteStore {
    path: PathBuf,
    /// The writer's commands; closing it stops the writer.
    inbox: Arc<Inbox>,
    writer: Option<JoinHandle<()>>,
    readers: Arc<Readers>,
    commits: Arc<AtomicU64>,
    lock: StoreLock,
    /// [`SqliteOptions::hold_for_outcome`].
    hold_for_outcome: Duration,
}

impl SqliteStore {
    /// Opens the store at `path` (created with its directory if missing), blocking: call it
    /// at startup or on a blocking thread.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, OpenError> {
        let path = path.as_ref().to_path_buf();
        let display = path.display().to_string();
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|err| OpenError::NotWritable {
                path: display.clone(),
                detail: format!("cannot create directory {}: {err}", dir.display()),
            })?;
        }
        let lock = StoreLock::acquire(&path, SystemTime::now())?;
        // `Full`: the connection commits without syncing and the syncer fsyncs the WAL before
        // anything is answered, so the writer applies a batch while the last one syncs.
        let pipelined = options.synchronous == Synchronous::Full;
        let on_connection = if pipelined {
            Synchronous::Normal
        } else {
            options.synchronous
        };
        let conn = schema::open_writer(&path, on_connection)?;
        let backlog = Backlog::load(&conn).map_err(|err| schema::classify(&path, err))?;
        let syncer = if pipelined {
            Some(start_syncer(&path)?)
        } else {
            None
        };
        let commits = Arc::new(AtomicU64::new(0));
        let policy = BatchPolicy {
            max_batch: options.max_batch.max(1),
            max_delay: options.max_delay,
        };
        let synced = syncer.as_ref().map(Syncer::watermark);
        let writer = Writer {
            conn,
            backlog,
            limits: Limits {
                max_queued_per_namespace: options.max_queued_per_namespace,
                max_bytes: options.max_bytes,
            },
            path: display.clone(),
            commits: Arc::clone(&commits),
            syncer,
        };
        let inbox = Arc::new(Inbox::new(
            policy.max_batch.saturating_mul(QUEUED_BATCHES),
            policy,
        ));
        let taken = Arc::clone(&inbox);
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(&taken))
            .map_err(|err| OpenError::Failed {
                path: display,
                detail: format!("cannot start the writer thread: {err}"),
            })?;
        Ok(Self {
            readers: Arc::new(Readers::new(path.clone(), synced)),
            path,
            inbox,
            writer: Some(writer),
            commits,
            lock,
            hold_for_outcome: options.hold_for_outcome,
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This process, as the store's lock file names it to a second opener.
    pub fn lock_holder(&self) -> &LockHolder {
        self.lock.holder()
    }

    /// Write transactions committed since open: with group commit, fewer than the writes.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    fn stopped(&self) -> DispatchStoreError {
        DispatchStoreError::Unavailable {
            detail: format!("the writer of store {} has stopped", self.path.display()),
        }
    }

    /// Until when a write sent at `now` may be held back for its dispatch's outcome.
    fn hold_until(&self, now: Instant) -> Option<Instant> {
        (!self.hold_for_outcome.is_zero()).then(|| now + self.hold_for_outcome)
    }

    /// Sends `op` to the writer and waits for its reply, which comes after its batch commits.
    async fn write(&self, op: Op) -> Result<Answer, DispatchStoreError> {
        self.write_held(op, false).await
    }

    /// [`write`](Self::write), the writer allowed to hold `op` back (`may_wait`) for its
    /// dispatch's outcome.
    async fn write_held(&self, op: Op, may_wait: bool) -> Result<Answer, DispatchStoreError> {
        let (reply, answer) = oneshot::channel();
        let sent = Instant::now();
        let command = Command {
            op,
            reply: Some(reply),
            sent,
            hold_until: if may_wait {
                self.hold_until(sent)
            } else {
                None
            },
        };
        self.inbox.send(command).await.map_err(|_| self.stopped())?;
        answer.await.map_err(|_| self.stopped())?
    }

    /// Queues the state note `op` for the writer without waiting for its commit; with
    /// `may_wait`, the writer may hold it back for its dispatch's outcome.
    async fn note(&self, op: Op, may_wait: bool) -> Result<(), DispatchStoreError> {
        let sent = Instant::now();
        let command = Command {
            op,
            reply: None,
            sent,
            hold_until: if may_wait {
                self.hold_until(sent)
            } else {
                None
            },
        };
        self.inbox.send(command).await.map_err(|_| self.stopped())
    }

    /// Waits until every write sent before this call is committed.
    async fn settled(&self) -> Result<(), DispatchStoreError> {
        self.write_done(Op::Barrier).await
    }

    async fn write_done(&self, op: Op) -> Result<(), DispatchStoreError> {
        match self.write(op).await? {
            Answer::Done => Ok(()),
            other => Err(mismatched(&other)),
        }
    }
}

/// The syncer on the WAL file of the store at `path`, which the writer's connection has opened
/// (in WAL mode the file lasts while a connection is open, and the writer's is open until the
/// store is dropped).
fn start_syncer(path: &Path) -> Result<Syncer, OpenError> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let failed = |what: &str, err: std::io::Error| OpenError::Failed {
        path: path.display().to_string(),
        detail: format!("{what}: {err}"),
    };
    let file = std::fs::File::open(&wal)
        .map_err(|err| failed(&format!("cannot open the WAL file {}", wal.display()), err))?;
    Syncer::start(file).map_err(|err| failed("cannot start the sync thread", err))
}

/// The writer answered a command with another command's kind of answer: a bug, reported
/// rather than panicked on.
fn mismatched(answer: &Answer) -> DispatchStoreError {
    DispatchStoreError::Unavailable {
        detail: format!("the store's writer gave a mismatched answer: {answer:?}"),
    }
}

#[async_trait]
impl DispatchStore for SqliteStore {
    async fn record(&self, dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError> {
        match self.write(Op::Record(Arc::new(dispatch))).await? {
            Answer::Recorded(recorded) => Ok(recorded),
            other => Err(mismatched(&other)),
        }
    }

    /// Held back by the writer up to [`SqliteOptions::hold_for_outcome`] for the outcome to
    /// be written with it.
    async fn record_before_outcome(
        &self,
        dispatch: Arc<NewDispatch>,
    ) -> Result<Recorded, DispatchStoreError> {
        match self.write_held(Op::Record(dispatch), true).await? {
            Answer::Recorded(recorded) => Ok(recorded),
            other => Err(mismatched(&other)),
        }
    }

    async fn park(&self, id: &DispatchId, reason: &str) -> Result<(), DispatchStoreError> {
        self.note(
            Op::Park {
                id: id.clone(),
                reason: reason.to_owned(),
            },
            false,
        )
        .await
    }

    /// Held back by the writer up to [`SqliteOptions::hold_for_outcome`]: a claim that its
    /// outcome follows within the hold is not written (its attempt goes into the outcome's row).
    async fn claim(
        &self,
        id: &DispatchId,
        worker: WorkerId,
        attempt: u32,
    ) -> Result<(), DispatchStoreError> {
        self.note(
            Op::Claim {
                id: id.clone(),
                worker,
                attempt,
            },
            true,
        )
        .await
    }

    async fn extend(&self, _id: &DispatchId) -> Result<(), DispatchStoreError> {
        Ok(())
    }

    async fn complete(
        &self,
        id: &DispatchId,
        outcome: &OutcomeRecord,
        at: SystemTime,
    ) -> Result<Completion, DispatchStoreError> {
        let op = Op::Complete {
            id: id.clone(),
            outcome: outcome.clone(),
            at,
        };
        match self.write(op).await? {
            Answer::Completion(completion) => Ok(completion),
            other => Err(mismatched(&other)),
        }
    }

    async fn release(&self, id: &DispatchId, delay: Duration) -> Result<(), DispatchStoreError> {
        let not_before = (!delay.is_zero()).then(|| SystemTime::now() + delay);
        self.note(
            Op::Release {
                id: id.clone(),
                not_before,
            },
            false,
        )
        .await
    }

    async fn unfinished(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        self.settled().await?;
        self.readers.run(reads::unfinished).await
    }

    async fn get(&self, id: &DispatchId) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        self.settled().await?;
        let id = id.clone();
        self.readers.run(move |conn| reads::get(conn, &id)).await
    }

    async fn list(
        &self,
        filter: &DispatchFilter,
    ) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        self.settled().await?;
        let filter = filter.clone();
        self.readers
            .run(move |conn| reads::list(conn, &filter))
            .await
    }

    async fn census(&self, now: SystemTime) -> Result<Vec<BacklogCensus>, DispatchStoreError> {
        self.settled().await?;
        self.readers.run(move |conn| reads::census(conn, now)).await
    }

    async fn purge(&self, finished_before: SystemTime) -> Result<u64, DispatchStoreError> {
        let mut deleted = 0;
        // The walk starts before the first row.
        let mut after_seq = i64::MIN;
        loop {
            let op = Op::Purge {
                finished_before,
                after_seq,
                window: PURGE_WINDOW,
            };
            match self.write(op).await? {
                Answer::Purged(step) => {
                    deleted += step.deleted;
                    match step.resume_after {
                        Some(seq) => after_seq = seq,
                        None => return Ok(deleted),
                    }
                }
                other => return Err(mismatched(&other)),
            }
        }
    }

    /// Commands enter the writer's inbox as they are sent, and batches commit in that order;
    /// a sender that finds the inbox full waits for room in turn (a fair semaphore), so of one
    /// task's sends the one polled first is queued first.
    fn orders_writes(&self) -> bool {
        true
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("commits", &self.commits())
            .finish_non_exhaustive()
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.inbox.close();
        if let Some(writer) = self.writer.take() {
            // The writer drains the closed channel, commits and closes its connection; the
            // lock is released only after, so a next opener never meets a live writer.
            let _ = writer.join();
        }
    }
}
