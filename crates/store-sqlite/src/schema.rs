//! The store's file: its schema, its identity (`application_id`, `user_version`) and how each
//! connection to it is set up.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use crate::open_error::OpenError;
use crate::options::Synchronous;

/// `application_id` of a Switchyard store: "SWYD".
pub(crate) const APPLICATION_ID: u32 = 0x5357_5944;

/// The schema this build writes, and the newest it reads; it opens every older one, migrating
/// it first ([`migrate`]).
pub(crate) const SCHEMA_VERSION: i64 = 3;

/// How long a connection waits for another's lock (a reader during a checkpoint) before it
/// reports busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The writer's page cache, in KiB: a batch touches the index pages of every pool it writes
/// to, and SQLite's default (2 MiB) makes a large backlog spill to the OS between batches.
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// Schema version 3. Times are nanoseconds since the Unix epoch; `seq` is the recording
/// order. The indexes a write maintains are kept few: the pool index covers only unfinished
/// rows (the census, the restart's `unfinished` and the backlog count at open read it, sorting
/// when they need another order), and the retention's purge walks the table in `seq` order
/// ([`crate::purge`]), so a finished row costs the table and the `id` index and nothing else.
const SCHEMA_V3: &str = "
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
CREATE INDEX dispatches_pool
    ON dispatches (namespace, task_queue, activity_type, state, submitted_at_ns)
    WHERE state <> 'finished';
CREATE UNIQUE INDEX dispatches_idempotency ON dispatches (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
";

/// From schema 1 to 2: schema 1 had a second index of unfinished rows by submission time,
/// which every unfinished write maintained and only a restart read.
const MIGRATE_1_TO_2: &str = "DROP INDEX IF EXISTS dispatches_unfinished;";

/// From schema 2 to 3: schema 2 indexed finished rows by finishing time, which every finished
/// row paid for and only the retention's purge read; the purge now walks the table instead.
const MIGRATE_2_TO_3: &str = "DROP INDEX IF EXISTS dispatches_finished_at;";

/// What a file's header and catalogue say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identity {
    /// Empty: make it a store.
    Fresh,
    /// A store this build reads, of schema `version` (older ones are migrated).
    Store { version: i64 },
    /// Another application's database.
    Foreign { found: u32 },
    /// A store of a newer schema.
    Newer { found: i64 },
}

/// Judges a file by its `application_id`, `user_version` and how many schema objects it has.
fn identify(application_id: u32, user_version: i64, objects: i64) -> Identity {
    match (application_id, user_version, objects) {
        (0, 0, 0) => Identity::Fresh,
        (APPLICATION_ID, version, _) if version > SCHEMA_VERSION => {
            Identity::Newer { found: version }
        }
        (APPLICATION_ID, version, _) => Identity::Store { version },
        (found, _, _) => Identity::Foreign { found },
    }
}

/// Opens the writer's connection: checks what the file is, switches to WAL, creates the
/// schema in a fresh file.
pub(crate) fn open_writer(path: &Path, synchronous: Synchronous) -> Result<Connection, OpenError> {
    let fail = |err| classify(path, err);
    let conn = Connection::open(path).map_err(fail)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
    let application_id: i64 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(fail)?;
    let user_version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(fail)?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .map_err(fail)?;
    // SQLite keeps `application_id` as a signed 32-bit integer; ours is its bit pattern.
    let application_id = application_id as u32;
    let identity = identify(application_id, user_version, objects);
    let display = path.display().to_string();
    match identity {
        Identity::Foreign { found } => {
            return Err(OpenError::Foreign {
                path: display,
                found,
                expected: APPLICATION_ID,
            });
        }
        Identity::Newer { found } => {
            return Err(OpenError::NewerSchema {
                path: display,
                found,
                supported: SCHEMA_VERSION,
            });
        }
        Identity::Fresh | Identity::Store { .. } => {}
    }
    // SQLite opens a file it may not write (read-only, or on a read-only mount) for reading
    // only, without an error; every write would fail later, so it is refused here, once the
    // reads above have said what the file is.
    if conn.is_readonly(rusqlite::MAIN_DB).map_err(fail)? {
        return Err(OpenError::NotWritable {
            path: display,
            detail: "the file can be opened for reading only".to_owned(),
        });
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
        .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::Failed {
            path: display,
            detail: format!("SQLite refused the WAL journal (journal_mode is {mode})"),
        });
    }
    conn.pragma_update(None, "synchronous", synchronous.label())
        .map_err(fail)?;
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
        .map_err(fail)?;
    match identity {
        Identity::Fresh => create_schema(&conn).map_err(fail)?,
        Identity::Store { version } if version < SCHEMA_VERSION => {
            migrate(&conn, version).map_err(fail)?;
        }
        _ => {}
    }
    Ok(conn)
}

fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch(SCHEMA_V3)?;
    // Bit pattern of the id as SQLite's signed 32-bit integer.
    tx.pragma_update(None, "application_id", APPLICATION_ID as i32)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()
}

/// Brings a store of schema `from` to [`SCHEMA_VERSION`] in one transaction: a crash during
/// it leaves the store as it was.
fn migrate(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    migrate_then_commit(conn, from, || {})
}

/// [`migrate`], running `before_commit` once every change is made and none is committed
/// (where the tests crash it).
fn migrate_then_commit(
    conn: &Connection,
    from: i64,
    before_commit: impl FnOnce(),
) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    if from <= 1 {
        tx.execute_batch(MIGRATE_1_TO_2)?;
    }
    if from <= 2 {
        tx.execute_batch(MIGRATE_2_TO_3)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    before_commit();
    tx.commit()?;
    tracing::info!(from, to = SCHEMA_VERSION, "dispatch store migrated");
    Ok(())
}

/// Opens a reading connection to a store the writer has opened.
pub(crate) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// Begins the writer's batch transaction.
pub(crate) fn begin_batch(conn: &mut Connection) -> rusqlite::Result<rusqlite::Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
}

/// Maps SQLite's failure at open to the refusal that names what is wrong.
pub(crate) fn classify(path: &Path, err: rusqlite::Error) -> OpenError {
    let path = path.display().to_string();
    let detail = err.to_string();
    match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            OpenError::NotADatabase { path, detail }
        }
        Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => {
            OpenError::NotWritable { path, detail }
        }
        _ => OpenError::Failed { path, detail },
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn the_columns_durability_md_lists_are_the_tables_columns_in_order() {
        const PAGE: &str = include_str!("../../../docs/durability.md");
        let start = PAGE.find("Columns: `seq`").expect("the columns paragraph");
        let end = start + PAGE[start..].find("Do not write").expect("its end");
        // Every backticked word of the paragraph that names a column, in order (state values
        // and outcome kinds are not columns and drop out).
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&dir.path().join("s.sqlite3"), Synchronous::Full).expect("open");
        let columns: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info('dispatches') ORDER BY cid")
            .expect("prepare")
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("names");
        let listed: Vec<&str> = PAGE[start..end]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|name| columns.iter().any(|column| column == name))
            .collect();
        // A column missing from the page, misspelt, or out of order fails here.
        assert_eq!(listed, columns, "docs/durability.md's column list");
    }

    fn pragma(conn: &Connection, name: &str) -> String {
        conn.pragma_query_value(None, name, |row| row.get::<_, rusqlite::types::Value>(0))
            .map(|value| match value {
                rusqlite::types::Value::Integer(n) => n.to_string(),
                rusqlite::types::Value::Text(text) => text,
                other => format!("{other:?}"),
            })
            .expect("pragma")
    }

    #[test]
    fn a_fresh_store_is_tagged_in_wal_mode_with_the_chosen_synchronous() {
        let dir = tempfile::tempdir().expect("tempdir");
        let full = open_writer(&dir.path().join("full.sqlite3"), Synchronous::Full).expect("open");
        assert_eq!(pragma(&full, "journal_mode"), "wal");
        assert_eq!(pragma(&full, "synchronous"), "2", "FULL");
        assert_eq!(pragma(&full, "application_id"), APPLICATION_ID.to_string());
        assert_eq!(pragma(&full, "user_version"), "3");
        let normal =
            open_writer(&dir.path().join("normal.sqlite3"), Synchronous::Normal).expect("open");
        assert_eq!(pragma(&normal, "synchronous"), "1", "NORMAL");
    }

    #[test]
    fn files_are_judged_by_application_id_version_and_contents() {
        assert_eq!(identify(0, 0, 0), Identity::Fresh);
        assert_eq!(
            identify(APPLICATION_ID, 1, 5),
            Identity::Store { version: 1 }
        );
        assert_eq!(
            identify(APPLICATION_ID, 2, 5),
            Identity::Store { version: 2 }
        );
        assert_eq!(
            identify(APPLICATION_ID, 3, 5),
            Identity::Store { version: 3 }
        );
        assert_eq!(identify(APPLICATION_ID, 4, 5), Identity::Newer { found: 4 });
        assert_eq!(identify(7, 0, 1), Identity::Foreign { found: 7 });
        assert_eq!(
            identify(0, 0, 1),
            Identity::Foreign { found: 0 },
            "another application's tables without an application_id"
        );
        assert_eq!(
            identify(0, 3, 0),
            Identity::Foreign { found: 0 },
            "a user_version set by someone else"
        );
    }

    /// The store the migration child works on; set only in the child.
    const CHILD_STORE: &str = "SWITCHYARD_MIGRATION_CHILD_STORE";
    /// Whether the child stops before its commit until it is killed (else it commits).
    const CHILD_STALLS: &str = "SWITCHYARD_MIGRATION_CHILD_STALLS";

    /// Schema 2's index that schema 3 dropped.
    const SCHEMA_2_INDEX: &str = "CREATE INDEX dispatches_finished_at ON dispatches
        (finished_at_ns) WHERE finished_at_ns IS NOT NULL;";

    /// A schema-2 store at `path`: this schema with the index schema 2 had beside it.
    fn write_schema_2(path: &Path) {
        let conn = open_writer(path, Synchronous::Full).expect("open");
        conn.execute_batch(&format!("{SCHEMA_2_INDEX} PRAGMA user_version = 2;"))
            .expect("schema 2");
    }

    /// A schema-1 store at `path`: this schema with the indexes schema 1 had beside it.
    fn write_schema_1(path: &Path) {
        let conn = open_writer(path, Synchronous::Full).expect("open");
        conn.execute_batch(&format!(
            "CREATE INDEX dispatches_unfinished ON dispatches (submitted_at_ns)
                 WHERE state <> 'finished';
             {SCHEMA_2_INDEX}
             PRAGMA user_version = 1;"
        ))
        .expect("schema 1");
    }

    /// `(user_version, the indexes older schemas had that are there)` of the store at `path`.
    fn version_and_old_indexes(path: &Path) -> (String, Vec<String>) {
        let conn = Connection::open(path).expect("open");
        let old: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE name IN \
                 ('dispatches_unfinished', 'dispatches_finished_at') ORDER BY name",
            )
            .expect("prepare")
            .query_map([], |row| row.get(0))
            .expect("catalogue")
            .collect::<Result<_, _>>()
            .expect("names");
        (pragma(&conn, "user_version"), old)
    }

    /// What a schema-1 store has before its migration.
    fn schema_1() -> (String, Vec<String>) {
        let old = ["dispatches_finished_at", "dispatches_unfinished"];
        ("1".to_owned(), old.map(str::to_owned).to_vec())
    }

    /// What a migrated store has.
    fn migrated() -> (String, Vec<String>) {
        (SCHEMA_VERSION.to_string(), Vec::new())
    }

    #[test]
    fn a_schema_2_store_opens_as_schema_3_without_its_finishing_time_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.sqlite3");
        write_schema_2(&path);
        let before = version_and_old_indexes(&path);
        assert_eq!(
            before,
            ("2".to_owned(), vec!["dispatches_finished_at".to_owned()])
        );
        drop(open_writer(&path, Synchronous::Full).expect("open and migrate"));
        assert_eq!(version_and_old_indexes(&path), migrated());
    }

    /// The child: migrates the schema-1 store it is given, printing `migrating` once every
    /// change is made; when told to stall, it then waits (a minute at most) to be killed
    /// before committing. Run only by `a_migration_cut_short_by_a_crash_leaves_the_store_as_it_was`.
    #[test]
    #[ignore = "the child process of a_migration_cut_short_by_a_crash_leaves_the_store_as_it_was"]
    fn child_migrates() {
        let Some(path) = std::env::var_os(CHILD_STORE) else {
            return;
        };
        let stalls = std::env::var_os(CHILD_STALLS).is_some();
        let conn = Connection::open(Path::new(&path)).expect("open");
        migrate_then_commit(&conn, 1, || {
            println!("migrating");
            if stalls {
                std::thread::sleep(Duration::from_secs(60));
            }
        })
        .expect("migrate");
        println!("migrated");
    }

    /// Runs the migration child on `path` (stalling before its commit if `stall`), kills it
    /// with SIGKILL once it says it is migrating, and returns whether it had said `migrated`.
    fn run_child(path: &Path, stall: bool) -> bool {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args([
                "schema::tests::child_migrates",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_STORE, path)
            .stdout(Stdio::piped());
        if stall {
            command.env(CHILD_STALLS, "1");
        }
        let mut child = command.spawn().expect("spawn the child");
        let stdout = child.stdout.take().expect("child stdout");
        let mut lines = BufReader::new(stdout).lines().map(|l| l.expect("read"));
        // libtest's `test <name> ... ` starts the first line, without a newline.
        assert!(
            lines.any(|line| line.ends_with("migrating")),
            "the child ended before migrating"
        );
        if stall {
            child.kill().expect("SIGKILL the child");
        }
        let migrated = lines.any(|line| line.ends_with("migrated"));
        let status = child.wait().expect("wait for the child");
        assert_eq!(status.success(), !stall, "{status}");
        migrated
    }

    #[test]
    fn a_migration_cut_short_by_a_crash_leaves_the_store_as_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.sqlite3");
        write_schema_1(&path);
        assert_eq!(version_and_old_indexes(&path), schema_1());

        // Killed with every change made and none committed: schema 1, whole.
        assert!(!run_child(&path, true), "killed before its commit");
        assert_eq!(version_and_old_indexes(&path), schema_1());
        // The next start migrates it.
        drop(open_writer(&path, Synchronous::Full).expect("reopen after the crash"));
        assert_eq!(version_and_old_indexes(&path), migrated());

        // Control: the same child left to commit migrates the store.
        let control = dir.path().join("control.sqlite3");
        write_schema_1(&control);
        assert!(run_child(&control, false));
        assert_eq!(version_and_old_indexes(&control), migrated());
    }
}
