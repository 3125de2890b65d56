//! Rate-limited logging of admission refusals, shared by every transport.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{AdmissionError, MAX_NAME_BYTES};
use crate::address::WorkerId;

/// Most distinct `(principal, identity, reason)` keys remembered; past it, expired keys are
/// forgotten first and then the table is cleared, so a peer cycling identities cannot grow it.
const MAX_KEYS: usize = 4096;

/// The longest prefix of `text` within [`MAX_NAME_BYTES`], cut on a character boundary.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(MAX_NAME_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// Logs a refusal the first time it is seen in a window; identical repeats (same principal,
/// identity and reason) within the window are only counted.
#[derive(Debug)]
pub struct AdmissionAudit {
    window: Duration,
    seen: Mutex<HashMap<String, Instant>>,
    refusals: AtomicU64,
    logged: AtomicU64,
}

impl AdmissionAudit {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            seen: Mutex::new(HashMap::new()),
            refusals: AtomicU64::new(0),
            logged: AtomicU64::new(0),
        }
    }

    /// Records a refused registration; returns true if it was logged (not suppressed).
    pub fn refused(&self, principal: &str, identity: &str, error: &AdmissionError) -> bool {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("switchyard_admission_refusals_total", "reason" => error.label())
            .increment(1);
        // The refused request's own strings are unvalidated (a too-long identity is one of the
        // reasons to refuse), so only a bounded prefix is remembered and logged.
        let principal = clip(principal);
        let identity = clip(identity);
        let key = format!("{principal}\u{0}{identity}\u{0}{error}");
        let now = Instant::now();
        let fresh = {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.len() >= MAX_KEYS {
                seen.retain(|_, at| now.saturating_duration_since(*at) < self.window);
                if seen.len() >= MAX_KEYS {
                    seen.clear();
                }
            }
            match seen.get(&key) {
                Some(at) if now.saturating_duration_since(*at) < self.window => false,
                _ => {
                    seen.insert(key, now);
                    true
                }
            }
        };
        if fresh {
            self.logged.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(principal, identity, reason = error.label(), %error, "registration refused");
        }
        fresh
    }

    pub(crate) fn refused_announcement(&self, worker: WorkerId, error: &AdmissionError) {
        self.refused("-", &worker.to_string(), error);
    }

    /// Refusals recorded so far.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Refusals actually logged so far.
    pub fn logged(&self) -> u64 {
        self.logged.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_identity_is_remembered_and_logged_by_a_bounded_prefix() {
        let audit = AdmissionAudit::new(Duration::from_secs(60));
        let error = AdmissionError::MissingCapacity;
        let huge = "é".repeat(1 << 20);
        assert!(audit.refused("peer", &huge, &error));
        let longest = audit.seen.lock().unwrap().keys().map(String::len).max();
        assert!(
            longest.is_some_and(|len| len < 2 * MAX_NAME_BYTES),
            "{longest:?}"
        );

        // Identities that differ only past the prefix count as the same refusal.
        assert!(!audit.refused("peer", &format!("{huge}x"), &error));
        assert_eq!((audit.refusals(), audit.logged()), (2, 1));
    }

    #[test]
    fn clipping_keeps_short_text_and_respects_character_boundaries() {
        assert_eq!(clip("worker-1"), "worker-1");
        let long = "é".repeat(200);
        let clipped = clip(&long);
        assert_eq!(
            clipped.len(),
            MAX_NAME_BYTES - 1,
            "254 bytes: 127 two-byte characters"
        );
    }
}
