//! Reads on their own connections, off the async runtime: WAL lets them run beside the writer
//! and see only committed rows.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, ToSql, params, params_from_iter};
use switchyard_core::{
    BacklogCensus, DispatchFilter, DispatchId, DispatchStoreError, StoredDispatch,
};

use crate::codec::{COLUMNS, RawRow, from_nanos};
use crate::schema;
use crate::sync::Watermark;
use crate::writer::store_error;

/// Reading connections kept open between reads, at most.
const MAX_IDLE_READERS: usize = 4;

/// Reading connections, opened on demand and kept for the next read.
#[derive(Debug)]
pub(crate) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// With a syncer: what a read waits for before it returns what it saw.
    synced: Option<Arc<Watermark>>,
}

impl Readers {
    /// Readers of the store at `path`; with `synced`, a read returns only once every commit
    /// it may have seen is fsynced.
    pub(crate) fn new(path: PathBuf, synced: Option<Arc<Watermark>>) -> Self {
        Self {
            path,
            idle: Mutex::new(Vec::new()),
            synced,
        }
    }

    /// Runs `read` on a reading connection on tokio's blocking pool.
    pub(crate) async fn run<T, F>(self: &Arc<Self>, read: F) -> Result<T, DispatchStoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DispatchStoreError> + Send + 'static,
    {
        let readers = Arc::clone(self);
        tokio::task::spawn_blocking(move || readers.run_blocking(read))
            .await
            .map_err(|err| DispatchStoreError::Unavailable {
                detail: format!("a store read stopped: {err}"),
            })?
    }

    fn run_blocking<T>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, DispatchStoreError>,
    ) -> Result<T, DispatchStoreError> {
        let path = self.path.display().to_string();
        let taken = self.lock().pop();
        let conn = match taken {
            Some(conn) => conn,
            None => schema::open_reader(&self.path).map_err(|err| store_error(&path, &err))?,
        };
        let result = read(&conn);
        {
            let mut idle = self.lock();
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
        }
        let value = result?;
        if let Some(synced) = &self.synced {
            synced.wait_synced()?;
        }
        Ok(value)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        // A read that panicked leaves the list of idle connections intact.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A failed read: the store is unavailable, and SQLite says why.
fn sql(err: rusqlite::Error) -> DispatchStoreError {
    DispatchStoreError::Unavailable {
        detail: err.to_string(),
    }
}

/// One dispatch by id.
pub(crate) fn get(
    conn: &Connection,
    id: &DispatchId,
) -> Result<Option<StoredDispatch>, DispatchStoreError> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM dispatches WHERE id = ?1"))
        .map_err(sql)?
        .query_row(params![id.as_str()], RawRow::read)
        .optional()
        .map_err(sql)?
        .map(RawRow::into_stored)
        .transpose()
}

/// The query of [`unfinished`]: the pool index finds the rows (its `WHERE` is this one's),
/// then they are sorted.
fn unfinished_query() -> String {
    format!(
        "SELECT {COLUMNS} FROM dispatches WHERE state <> 'finished' \
         ORDER BY submitted_at_ns, seq"
    )
}

/// Every unfinished dispatch, oldest submission first.
pub(crate) fn unfinished(conn: &Connection) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
    rows(conn, &unfinished_query(), &[])
}

/// Dispatches matching `filter`, oldest submission first; `limit` 0 is no limit.
pub(crate) fn list(
    conn: &Connection,
    filter: &DispatchFilter,
) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
    let mut query = format!("SELECT {COLUMNS} FROM dispatches WHERE 1");
    let mut values: Vec<&dyn ToSql> = Vec::new();
    let equal_to = [
        ("namespace", &filter.namespace),
        ("task_queue", &filter.task_queue),
        ("activity_type", &filter.activity_type),
        ("state", &filter.state),
        ("principal", &filter.principal),
    ];
    for (column, wanted) in equal_to {
        if let Some(wanted) = wanted {
            query.push_str(&format!(" AND {column} = ?"));
            values.push(wanted);
        }
    }
    query.push_str(" ORDER BY submitted_at_ns, seq");
    let limit;
    if filter.limit > 0 {
        limit = filter.limit;
        query.push_str(" LIMIT ?");
        values.push(&limit);
    }
    rows(conn, &query, &values)
}

fn rows(
    conn: &Connection,
    query: &str,
    values: &[&dyn ToSql],
) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
    let mut statement = conn.prepare_cached(query).map_err(sql)?;
    let raw = statement
        .query_map(params_from_iter(values), RawRow::read)
        .map_err(sql)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql)?;
    raw.into_iter().map(RawRow::into_stored).collect()
}

/// The query of [`census`].
const CENSUS: &str = "SELECT namespace, task_queue, activity_type, \
    sum(state <> 'running'), sum(state = 'running'), \
    min(CASE WHEN state <> 'running' THEN submitted_at_ns END) \
    FROM dispatches WHERE state <> 'finished' \
    GROUP BY namespace, task_queue, activity_type \
    ORDER BY namespace, task_queue, activity_type";

/// Backlog per pool address at `now`.
pub(crate) fn census(
    conn: &Connection,
    now: SystemTime,
) -> Result<Vec<BacklogCensus>, DispatchStoreError> {
    let mut statement = conn.prepare_cached(CENSUS).map_err(sql)?;
    statement
        .query_map([], |row| {
            let oldest: Option<i64> = row.get(5)?;
            Ok(BacklogCensus {
                namespace: row.get(0)?,
                task_queue: row.get(1)?,
                activity_type: row.get(2)?,
                waiting: row.get(3)?,
                running: row.get(4)?,
                oldest_waiting: oldest.map(|submitted| {
                    now.duration_since(from_nanos(submitted))
                        .unwrap_or(Duration::ZERO)
                }),
            })
        })
        .map_err(sql)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Synchronous;

    /// SQLite's plan for `query`, its steps joined.
    fn plan(conn: &Connection, query: &str) -> String {
        let mut statement = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {query}"))
            .expect("explain");
        let steps: Vec<String> = statement
            .query_map([], |row| row.get(3))
            .expect("plan")
            .collect::<rusqlite::Result<_>>()
            .expect("steps");
        steps.join("; ")
    }

    #[test]
    fn reads_of_unfinished_rows_go_through_the_pool_index_not_the_whole_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn =
            schema::open_writer(&dir.path().join("s.sqlite3"), Synchronous::Full).expect("open");
        for query in [
            unfinished_query(),
            CENSUS.to_owned(),
            crate::backlog::LOAD.to_owned(),
        ] {
            let plan = plan(&conn, &query);
            assert!(plan.contains("INDEX dispatches_pool"), "{query}: {plan}");
        }
        // Control: the same read of every row, finished ones included, scans the table.
        let every = unfinished_query().replace("WHERE state <> 'finished'", "");
        let plan = plan(&conn, &every);
        assert!(!plan.contains("dispatches_pool"), "{plan}");
    }
}
