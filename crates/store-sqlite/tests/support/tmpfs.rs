//! A tmpfs mounted for one test (the tests run as root, in CI too), unmounted when dropped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs; dropping it unmounts it.
pub(crate) struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs with `options` (`size=3m`, `ro,size=1m`) on `dir`, creating it.
    pub(crate) fn mount(dir: &Path, options: &str) -> Self {
        std::fs::create_dir_all(dir).expect("create the mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount -t tmpfs -o {options} failed: {status}"
        );
        Self {
            dir: dir.to_owned(),
        }
    }

    /// Changes its options in place (`remount,rw`).
    pub(crate) fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", options])
            .arg(&self.dir)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -o {options} failed: {status}");
    }

    /// Where it is mounted.
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a store still open in a failing test must not leave the mount behind.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
