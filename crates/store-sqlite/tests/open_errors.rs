//! A store that cannot be opened is refused with a message naming its path and what is
//! wrong, and the file found there is left as it was. (Read-only places, whose tests run
//! `mount`, are in `read_only.rs`.)
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::path::Path;

use rusqlite::Connection;
use switchyard_core::DispatchStore;
use switchyard_store_sqlite::{OpenError, SqliteOptions, SqliteStore};

fn open_error(path: &Path) -> String {
    match SqliteStore::open(path, SqliteOptions::default()) {
        Ok(store) => panic!("opened {store:?}"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixtures::store_path(dir.path());
    let text = "dispatch log, not a database\n".repeat(300);
    std::fs::write(&path, &text).expect("write");
    assert_eq!(
        open_error(&path),
        format!(
            "store {}: not an SQLite database, or corrupt (file is not a database)",
            path.display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(&path).expect("read"),
        text,
        "file changed"
    );
}

#[tokio::test]
async fn a_corrupt_store_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixtures::store_path(dir.path());
    let store = fixtures::open(dir.path());
    for i in 0..20 {
        store
            .record(fixtures::dispatch("ns", &format!("{i}")))
            .await
            .expect("record");
    }
    drop(store);
    // Control: intact, it opens.
    drop(fixtures::open(dir.path()));

    let mut bytes = std::fs::read(&path).expect("read");
    bytes[100..4096].fill(0xa5);
    std::fs::write(&path, &bytes).expect("write");
    assert_eq!(
        open_error(&path),
        format!(
            "store {}: not an SQLite database, or corrupt (database disk image is malformed)",
            path.display()
        )
    );
}

#[test]
fn another_applications_database_is_foreign_and_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixtures::store_path(dir.path());
    let other = Connection::open(&path).expect("create");
    other
        .execute_batch("PRAGMA application_id = 305419896; CREATE TABLE notes (body TEXT);")
        .expect("other application's schema");
    drop(other);
    assert_eq!(
        open_error(&path),
        format!(
            "store {}: an SQLite database of another application (application_id 0x12345678, \
             a Switchyard store has 0x53575944)",
            path.display()
        )
    );

    let untagged = dir.path().join("untagged.sqlite3");
    let other = Connection::open(&untagged).expect("create");
    other
        .execute_batch("CREATE TABLE notes (body TEXT);")
        .expect("schema");
    drop(other);
    assert_eq!(
        open_error(&untagged),
        format!(
            "store {}: an SQLite database of another application (application_id 0x00000000, \
             a Switchyard store has 0x53575944)",
            untagged.display()
        )
    );
    let tables: Vec<String> = Connection::open(&untagged)
        .expect("reopen")
        .prepare("SELECT name FROM sqlite_schema")
        .expect("prepare")
        .query_map([], |row| row.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(tables, ["notes"], "the foreign file was changed");
}

#[test]
fn a_store_of_a_newer_schema_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixtures::store_path(dir.path());
    drop(fixtures::open(dir.path()));
    let set_version = |version: i64| {
        Connection::open(&path)
            .expect("open")
            .pragma_update(None, "user_version", version)
            .expect("user_version");
    };
    set_version(4);
    assert_eq!(
        open_error(&path),
        format!(
            "store {}: written by a newer version of Switchyard (found schema 4, this build \
             reads up to 3)",
            path.display()
        )
    );
    // Control: the same file at schema 3 opens.
    set_version(3);
    let store = SqliteStore::open(&path, SqliteOptions::default());
    assert!(store.is_ok(), "{store:?}");
}

#[test]
fn a_second_gateway_is_refused_naming_the_lock_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixtures::store_path(dir.path());
    let first = fixtures::open(dir.path());
    let holder = first.lock_holder().clone();
    assert_eq!(holder.pid, std::process::id());
    let p = path.display();
    assert_eq!(
        open_error(&path),
        format!(
            "store {p}: locked by another gateway (pid {} on host {}, since {}); lock file \
             {p}.lock",
            holder.pid, holder.host, holder.started
        )
    );
    let second = SqliteStore::open(&path, SqliteOptions::default());
    assert!(
        matches!(second, Err(OpenError::Locked { .. })),
        "{second:?}"
    );

    // Control: once the first is closed, the store opens.
    drop(first);
    let again = SqliteStore::open(&path, SqliteOptions::default());
    assert!(again.is_ok(), "{again:?}");
}
