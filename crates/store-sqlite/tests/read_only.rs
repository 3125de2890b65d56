//! A store in a place that cannot be written is refused at open, naming the path: a read-only
//! directory, and a read-only file in a writable directory (which SQLite would otherwise open
//! for reading only). The tests mount (the tests run as root, in CI too), so they live in a
//! binary of their own and run one at a time: a child process spawned between a store's drop
//! and its reopen holds a copy of the store's lock descriptor until it execs, and the reopen
//! would meet its own lock.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/tmpfs.rs"]
mod tmpfs;

use std::path::Path;
use std::sync::{Mutex, PoisonError};

use switchyard_store_sqlite::{SqliteOptions, SqliteStore};

/// Held by each test for its whole run (see the module comment).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn open_error(path: &Path) -> String {
    match SqliteStore::open(path, SqliteOptions::default()) {
        Ok(store) => panic!("opened {store:?}"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn a_read_only_directory_is_not_writable() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("tempdir");
    let mount = tmpfs::Tmpfs::mount(&dir.path().join("ro"), "ro,size=1m");
    let path = fixtures::store_path(mount.path());
    let p = path.display();
    assert_eq!(
        open_error(&path),
        format!(
            "store {p}: not writable: cannot create {p}.lock: Read-only file system (os error 30)"
        )
    );
    let nested = mount.path().join("data").join("dispatches.sqlite3");
    assert_eq!(
        open_error(&nested),
        format!(
            "store {}: not writable: cannot create directory {}: Read-only file system \
             (os error 30)",
            nested.display(),
            mount.path().join("data").display()
        )
    );

    // Control: the same directory made writable opens.
    mount.remount("remount,rw");
    let store = SqliteStore::open(&path, SqliteOptions::default());
    assert!(store.is_ok(), "{store:?}");
}

/// The store file bound read-only onto itself, unbound when dropped.
struct ReadOnlyFile(std::path::PathBuf);

impl ReadOnlyFile {
    fn bind(path: &Path) -> Self {
        let mount = |args: &[&str]| {
            let status = std::process::Command::new("mount")
                .args(args)
                .arg(path)
                .arg(path)
                .status()
                .expect("run mount");
            assert!(status.success(), "mount {args:?} failed: {status}");
        };
        mount(&["--bind"]);
        // From here on the bind is undone on drop, also when the remount fails.
        let guard = Self(path.to_owned());
        mount(&["-o", "remount,ro,bind"]);
        guard
    }
}

impl Drop for ReadOnlyFile {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_read_only_store_file_in_a_writable_directory_is_not_writable() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixtures::store_path(dir.path());
    drop(SqliteStore::open(&path, SqliteOptions::default()).expect("a fresh store"));
    let before = std::fs::read(&path).expect("read");
    {
        let _read_only = ReadOnlyFile::bind(&path);
        assert_eq!(
            open_error(&path),
            format!(
                "store {}: not writable: the file can be opened for reading only",
                path.display()
            )
        );
        assert_eq!(
            std::fs::read(&path).expect("read"),
            before,
            "left as it was"
        );
    }
    // Control: the same file, writable again, opens.
    let store = SqliteStore::open(&path, SqliteOptions::default());
    assert!(store.is_ok(), "{store:?}");
    drop(store);

    // What the file is comes first: a read-only file that is no database says so.
    let text = dir.path().join("notes.sqlite3");
    std::fs::write(&text, "dispatch log, not a database\n".repeat(300)).expect("write");
    let _read_only = ReadOnlyFile::bind(&text);
    assert_eq!(
        open_error(&text),
        format!(
            "store {}: not an SQLite database, or corrupt (file is not a database)",
            text.display()
        )
    );
}
