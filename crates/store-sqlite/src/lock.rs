//! The lock file beside a store: one gateway per store, and the refusal names the holder.

use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::open_error::OpenError;

/// Who holds a store: written into its lock file, named by a second opener's refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolder {
    /// The holding process.
    pub pid: u32,
    /// The machine it runs on.
    pub host: String,
    /// When it took the lock, UTC (`2026-12-01T22:16:19Z`).
    pub started: String,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} on host {}, since {}",
            self.pid, self.host, self.started
        )
    }
}

impl LockHolder {
    /// This process, now.
    fn this_process(now: SystemTime) -> Self {
        Self {
            pid: std::process::id(),
            host: host_name(),
            started: utc_timestamp(now),
        }
    }

    fn to_file_text(&self) -> String {
        format!(
            "pid={}\nhost={}\nstarted={}\n",
            self.pid, self.host, self.started
        )
    }

    /// Reads what [`to_file_text`](Self::to_file_text) wrote; `None` for anything else (a
    /// holder that died between taking the lock and writing it).
    fn from_file_text(text: &str) -> Option<Self> {
        let (mut pid, mut host, mut started) = (None, None, None);
        for line in text.lines() {
            match line.split_once('=') {
                Some(("pid", value)) => pid = value.parse().ok(),
                Some(("host", value)) => host = Some(value.to_owned()),
                Some(("started", value)) => started = Some(value.to_owned()),
                _ => {}
            }
        }
        Some(Self {
            pid: pid?,
            host: host?,
            started: started?,
        })
    }
}

/// The held lock file; dropping it releases the lock (so does the death of the process).
#[derive(Debug)]
pub(crate) struct StoreLock {
    /// Held open: the lock lives as long as this descriptor.
    _file: File,
    holder: LockHolder,
}

impl StoreLock {
    /// Takes `<store>.lock` without waiting, and writes this process into it.
    pub(crate) fn acquire(store: &Path, now: SystemTime) -> Result<Self, OpenError> {
        let lock_path = lock_path(store);
        let path = store.display().to_string();
        let not_writable = |what: &str, err: std::io::Error| OpenError::NotWritable {
            path: path.clone(),
            detail: format!("cannot {what} {}: {err}", lock_path.display()),
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|err| not_writable("create", err))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder = match file.read_to_string(&mut text) {
                    Ok(_) => LockHolder::from_file_text(&text).map_or_else(
                        || "an unknown holder: the lock file names none".to_owned(),
                        |holder| holder.to_string(),
                    ),
                    Err(err) => format!("an unknown holder: the lock file is unreadable: {err}"),
                };
                return Err(OpenError::Locked {
                    path,
                    lock_path: lock_path.display().to_string(),
                    holder,
                });
            }
            Err(TryLockError::Error(err)) => return Err(not_writable("lock", err)),
        }
        let holder = LockHolder::this_process(now);
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(holder.to_file_text().as_bytes()))
            .map_err(|err| not_writable("write", err))?;
        Ok(Self {
            _file: file,
            holder,
        })
    }

    /// This process, as written in the lock file.
    pub(crate) fn holder(&self) -> &LockHolder {
        &self.holder
    }
}

/// `<store>.lock`, beside the store.
pub(crate) fn lock_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|file| {
            let name = std::fs::read_to_string(file).ok()?;
            let name = name.trim();
            (!name.is_empty()).then(|| name.to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `t` as `YYYY-MM-DDTHH:MM:SSZ` (UTC; times before 1970 print as the epoch).
fn utc_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        let at = |secs| utc_timestamp(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn the_holder_round_trips_through_its_file_text() {
        let holder = LockHolder {
            pid: 4242,
            host: "gw-1".into(),
            started: "2026-12-01T22:16:19Z".into(),
        };
        assert_eq!(
            LockHolder::from_file_text(&holder.to_file_text()),
            Some(holder.clone())
        );
        assert_eq!(LockHolder::from_file_text(""), None, "an empty lock file");
        assert_eq!(
            holder.to_string(),
            "pid 4242 on host gw-1, since 2026-12-01T22:16:19Z"
        );
    }

    #[test]
    fn a_second_lock_on_one_store_is_refused_naming_the_first_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("s.sqlite3");
        let first = StoreLock::acquire(&store, UNIX_EPOCH).expect("first lock");
        let Err(OpenError::Locked { holder, .. }) = StoreLock::acquire(&store, SystemTime::now())
        else {
            panic!("a second lock was granted");
        };
        assert_eq!(holder, first.holder().to_string());
        drop(first);
        let again = StoreLock::acquire(&store, SystemTime::now());
        assert!(again.is_ok(), "released lock still held: {again:?}");
    }
}
