//! A store written by the previous release (schema 1) opens, is migrated to this release's
//! schema, and keeps every dispatch: the unfinished ones resume, the finished ones keep their
//! outcome and their idempotency key.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, params};
use switchyard_core::{DispatchId, DispatchState, DispatchStore, Recorded};

/// Schema 1, as the previous release created it.
const SCHEMA_V1: &str = "
CREATE TABLE dispatches (
    seq               INTEGER PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE,
    namespace         TEXT    NOT NULL,
    task_queue        TEXT    NOT NULL,
    activity_type     TEXT    NOT NULL,
    node              TEXT,
    input             BLOB    NOT NULL,
    principal         TEXT    NOT NULL,
    idempotency_key   TEXT,
    submitted_at_ns   INTEGER NOT NULL,
    deadline_ns       INTEGER NOT NULL,
    state             TEXT    NOT NULL
        CHECK (state IN ('queued', 'parked', 'running', 'finished')),
    not_before_ns     INTEGER,
    parked_reason     TEXT,
    worker            INTEGER,
    attempts          INTEGER NOT NULL DEFAULT 0,
    finished_at_ns    INTEGER,
    outcome_kind      TEXT,
    outcome_output    BLOB,
    outcome_message   TEXT,
    outcome_retryable INTEGER,
    outcome_reason    TEXT,
    outcome_attempts  INTEGER
) STRICT;
CREATE INDEX dispatches_unfinished ON dispatches (submitted_at_ns)
    WHERE state <> 'finished';
CREATE INDEX dispatches_pool
    ON dispatches (namespace, task_queue, activity_type, state, submitted_at_ns)
    WHERE state <> 'finished';
CREATE UNIQUE INDEX dispatches_idempotency ON dispatches (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX dispatches_finished_at ON dispatches (finished_at_ns)
    WHERE finished_at_ns IS NOT NULL;
PRAGMA application_id = 1398233412;
PRAGMA user_version = 1;
";

fn nanos(t: SystemTime) -> i64 {
    i64::try_from(t.duration_since(UNIX_EPOCH).expect("after 1970").as_nanos()).expect("i64")
}

/// Writes a schema-1 store at `path` holding a queued, a running and a finished dispatch
/// (the finished one with idempotency key `k`); returns their ids.
fn write_v1_store(path: &Path) -> [DispatchId; 3] {
    let conn = Connection::open(path).expect("create");
    conn.pragma_update(None, "journal_mode", "wal")
        .expect("wal");
    conn.execute_batch(SCHEMA_V1).expect("schema 1");
    let now = SystemTime::now();
    let ids = [(); 3].map(|()| DispatchId::generate());
    let insert = "INSERT INTO dispatches (id, namespace, task_queue, activity_type, input, \
                  principal, idempotency_key, submitted_at_ns, deadline_ns, state, worker, \
                  attempts, finished_at_ns, outcome_kind, outcome_output, outcome_message, \
                  outcome_retryable, outcome_reason, outcome_attempts) \
                  VALUES (?1, 'ns', 'q', 'resize', x'00', 'producer', ?2, ?3, ?4, ?5, ?6, ?7, \
                  ?8, ?9, ?10, ?11, ?12, ?13, ?14)";
    let deadline = nanos(now + Duration::from_secs(600));
    let submitted = nanos(now);
    conn.execute(
        insert,
        params![
            ids[0].as_str(),
            None::<String>,
            submitted,
            deadline,
            "queued",
            None::<i64>,
            0,
            None::<i64>,
            None::<String>,
            None::<Vec<u8>>,
            None::<String>,
            None::<bool>,
            None::<String>,
            None::<i64>
        ],
    )
    .expect("queued");
    conn.execute(
        insert,
        params![
            ids[1].as_str(),
            None::<String>,
            submitted + 1,
            deadline,
            "running",
            7,
            2,
            None::<i64>,
            None::<String>,
            None::<Vec<u8>>,
            None::<String>,
            None::<bool>,
            None::<String>,
            None::<i64>
        ],
    )
    .expect("running");
    conn.execute(
        insert,
        params![
            ids[2].as_str(),
            "k",
            submitted + 2,
            deadline,
            "finished",
            None::<i64>,
            1,
            submitted + 3,
            "completed",
            b"out".to_vec(),
            "",
            false,
            "",
            1
        ],
    )
    .expect("finished");
    ids
}

fn indexes(path: &Path) -> Vec<String> {
    Connection::open(path)
        .expect("open")
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL ORDER BY name",
        )
        .expect("prepare")
        .query_map([], |row| row.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn user_version(path: &Path) -> i64 {
    Connection::open(path)
        .expect("open")
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .expect("user_version")
}

#[tokio::test]
async fn a_schema_1_store_is_migrated_and_keeps_its_dispatches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixtures::store_path(dir.path());
    let [queued, running, finished] = write_v1_store(&path);
    assert_eq!(user_version(&path), 1);
    assert!(
        indexes(&path).contains(&"dispatches_unfinished".to_owned()),
        "control: schema 1 has the index the migration drops"
    );

    let store = fixtures::open(dir.path());
    let unfinished: Vec<_> = store
        .unfinished()
        .await
        .expect("unfinished")
        .into_iter()
        .map(|row| (row.dispatch.id, row.state, row.attempts))
        .collect();
    assert_eq!(unfinished.len(), 2, "{unfinished:?}");
    assert_eq!(unfinished[0].0, queued, "oldest submission first");
    assert!(matches!(unfinished[0].1, DispatchState::Queued { .. }));
    assert_eq!(unfinished[1].0, running);
    assert!(matches!(
        unfinished[1].1,
        DispatchState::Running { attempt: 2, .. }
    ));
    let row = store.get(&finished).await.expect("get").expect("kept");
    match row.state {
        DispatchState::Finished { outcome, .. } => {
            assert_eq!(outcome.kind, "completed");
            assert_eq!(outcome.output.as_ref(), b"out");
        }
        other => panic!("not finished: {other:?}"),
    }
    // The key of the finished dispatch still answers with its id.
    let again = fixtures::keyed("ns", "k");
    assert_eq!(
        store.record(again).await.expect("record"),
        Recorded::Existing(finished.clone())
    );
    // The backlog bound counts the two unfinished rows found at open.
    drop(store);

    assert_eq!(user_version(&path), 3, "migrated");
    let migrated = indexes(&path);
    for dropped in ["dispatches_unfinished", "dispatches_finished_at"] {
        assert!(!migrated.contains(&dropped.to_owned()), "{migrated:?}");
    }
    // Control: a store created by this release has the same indexes as a migrated one.
    let fresh = tempfile::tempdir().expect("tempdir");
    drop(fixtures::open(fresh.path()));
    assert_eq!(indexes(&fixtures::store_path(fresh.path())), migrated);
}
