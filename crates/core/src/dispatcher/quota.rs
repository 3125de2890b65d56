//! Quotas per namespace and per principal: parked dispatches, and bytes of input held by
//! parked and in-flight dispatches.
//!
//! A dispatch holds its input's bytes from entry to exit ([`HeldInput`]) and, while it waits
//! for a worker, one parked place ([`ParkedPlace`]); both are guards, so every exit path
//! (outcome, refusal, cancel, the caller dropping the future) gives them back. Entries whose
//! last dispatch left are removed, and the maps shrink after a large drain, so a burst of
//! parked dispatches leaves nothing behind.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::DispatchConfig;
use crate::outcome::DispatchError;
use crate::registry::shrink_after_drain;
use crate::throttle::KeyedThrottle;

/// `switchyard_dispatch_refusals_total{limit}` label and configuration key of each quota.
pub(crate) const MAX_PARKED_PER_NAMESPACE: &str = "dispatch.max_parked_per_namespace";
/// See [`MAX_PARKED_PER_NAMESPACE`].
pub(crate) const MAX_PARKED_PER_PRINCIPAL: &str = "dispatch.max_parked_per_principal";
/// See [`MAX_PARKED_PER_NAMESPACE`].
pub(crate) const MAX_HELD_BYTES_PER_NAMESPACE: &str = "dispatch.max_held_input_bytes_per_namespace";
/// See [`MAX_PARKED_PER_NAMESPACE`].
pub(crate) const MAX_HELD_BYTES_PER_PRINCIPAL: &str = "dispatch.max_held_input_bytes_per_principal";

/// How long one quota's refusal stays quiet in the logs after it was logged.
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Usage {
    dispatches: usize,
    parked: usize,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Books {
    namespaces: HashMap<String, Usage>,
    principals: HashMap<String, Usage>,
}

/// The quota figures of every namespace and principal with a dispatch running.
#[derive(Debug)]
pub(crate) struct QuotaBook {
    books: Mutex<Books>,
    log: Mutex<KeyedThrottle>,
}

impl Default for QuotaBook {
    fn default() -> Self {
        Self {
            books: Mutex::default(),
            log: Mutex::new(KeyedThrottle::new(LOG_WINDOW)),
        }
    }
}

/// Which of a dispatch's two scopes a figure belongs to.
#[derive(Clone, Copy)]
enum Scope {
    Namespace,
    Principal,
}

impl QuotaBook {
    fn lock(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `bytes` of input for a dispatch of `principal` in `namespace`, or refuses naming
    /// the byte quota it would pass.
    pub(crate) fn hold<'a>(
        &'a self,
        config: &DispatchConfig,
        namespace: &'a str,
        principal: &'a str,
        bytes: usize,
    ) -> Result<HeldInput<'a>, DispatchError> {
        {
            let mut books = self.lock();
            let ns = books.namespaces.get(namespace).copied().unwrap_or_default();
            let pr = books.principals.get(principal).copied().unwrap_or_default();
            let refusal = if ns.bytes.saturating_add(bytes)
                > config.max_held_input_bytes_per_namespace
            {
                Some((
                    MAX_HELD_BYTES_PER_NAMESPACE,
                    config.max_held_input_bytes_per_namespace,
                    Scope::Namespace,
                ))
            } else if pr.bytes.saturating_add(bytes) > config.max_held_input_bytes_per_principal {
                Some((
                    MAX_HELD_BYTES_PER_PRINCIPAL,
                    config.max_held_input_bytes_per_principal,
                    Scope::Principal,
                ))
            } else {
                None
            };
            if let Some((limit, value, scope)) = refusal {
                drop(books);
                return Err(self.refuse(limit, value, scope, namespace, principal));
            }
            let Books {
                namespaces,
                principals,
            } = &mut *books;
            for (map, key) in [(namespaces, namespace), (principals, principal)] {
                // Looked up before inserting: the common case allocates no key.
                let usage = match map.get_mut(key) {
                    Some(usage) => usage,
                    None => map.entry(key.to_owned()).or_default(),
                };
                usage.dispatches += 1;
                usage.bytes += bytes;
            }
        }
        Ok(HeldInput {
            book: self,
            namespace,
            principal,
            bytes,
        })
    }

    /// Counts one more parked dispatch for `held`, or refuses naming the parked quota it would
    /// pass.
    pub(crate) fn park<'a>(
        &'a self,
        config: &DispatchConfig,
        held: &HeldInput<'a>,
    ) -> Result<ParkedPlace<'a>, DispatchError> {
        let mut books = self.lock();
        let ns = books.namespaces.get(held.namespace).map_or(0, |u| u.parked);
        let pr = books.principals.get(held.principal).map_or(0, |u| u.parked);
        let refusal = if ns >= config.max_parked_per_namespace {
            Some((
                MAX_PARKED_PER_NAMESPACE,
                config.max_parked_per_namespace,
                Scope::Namespace,
            ))
        } else if pr >= config.max_parked_per_principal {
            Some((
                MAX_PARKED_PER_PRINCIPAL,
                config.max_parked_per_principal,
                Scope::Principal,
            ))
        } else {
            None
        };
        if let Some((limit, value, scope)) = refusal {
            drop(books);
            return Err(self.refuse(limit, value, scope, held.namespace, held.principal));
        }
        count_parked(&mut books, held);
        Ok(ParkedPlace {
            book: self,
            namespace: held.namespace,
            principal: held.principal,
        })
    }

    /// Counts a parked dispatch that may not be refused (one already delivered once, parked
    /// again after losing its worker).
    pub(crate) fn park_unrefused<'a>(&'a self, held: &HeldInput<'a>) -> ParkedPlace<'a> {
        let mut books = self.lock();
        count_parked(&mut books, held);
        ParkedPlace {
            book: self,
            namespace: held.namespace,
            principal: held.principal,
        }
    }

    fn refuse(
        &self,
        limit: &'static str,
        value: usize,
        scope: Scope,
        namespace: &str,
        principal: &str,
    ) -> DispatchError {
        let scope = match scope {
            Scope::Namespace => format!("namespace {namespace:?}"),
            Scope::Principal => format!("principal {principal:?}"),
        };
        metrics::counter!(crate::metrics::DISPATCH_REFUSALS_TOTAL, "limit" => limit).increment(1);
        let suppressed = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .allow(limit, Instant::now().into_std());
        if let Some(suppressed) = suppressed {
            tracing::warn!(limit, value, %scope, suppressed,
                "dispatch refused: quota reached (repeats of this limit are logged once a minute)");
        }
        DispatchError::QuotaExceeded {
            limit,
            value: value as u64,
            scope,
        }
    }

    fn release(&self, namespace: &str, principal: &str, bytes: usize) {
        let mut books = self.lock();
        let Books {
            namespaces,
            principals,
        } = &mut *books;
        for (map, key) in [(namespaces, namespace), (principals, principal)] {
            if let Some(usage) = map.get_mut(key) {
                usage.dispatches = usage.dispatches.saturating_sub(1);
                usage.bytes = usage.bytes.saturating_sub(bytes);
                if usage.dispatches == 0 {
                    map.remove(key);
                    shrink_after_drain(map);
                }
            }
        }
    }

    fn unpark(&self, namespace: &str, principal: &str) {
        let mut books = self.lock();
        if let Some(usage) = books.namespaces.get_mut(namespace) {
            usage.parked = usage.parked.saturating_sub(1);
        }
        if let Some(usage) = books.principals.get_mut(principal) {
            usage.parked = usage.parked.saturating_sub(1);
        }
    }

    /// Namespaces and principals with a dispatch running (tests check nothing is left).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        let books = self.lock();
        books.namespaces.len() + books.principals.len()
    }
}

fn count_parked(books: &mut Books, held: &HeldInput<'_>) {
    if let Some(usage) = books.namespaces.get_mut(held.namespace) {
        usage.parked += 1;
    }
    if let Some(usage) = books.principals.get_mut(held.principal) {
        usage.parked += 1;
    }
}

/// A dispatch's input bytes, counted against its namespace and principal until dropped.
#[derive(Debug)]
pub(crate) struct HeldInput<'a> {
    book: &'a QuotaBook,
    namespace: &'a str,
    principal: &'a str,
    bytes: usize,
}

impl Drop for HeldInput<'_> {
    fn drop(&mut self) {
        self.book
            .release(self.namespace, self.principal, self.bytes);
    }
}

/// One parked dispatch, counted until dropped.
#[derive(Debug)]
pub(crate) struct ParkedPlace<'a> {
    book: &'a QuotaBook,
    namespace: &'a str,
    principal: &'a str,
}

impl Drop for ParkedPlace<'_> {
    fn drop(&mut self) {
        self.book.unpark(self.namespace, self.principal);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn held_bytes_are_refused_past_the_quota_and_given_back_on_drop() {
        let book = Arc::new(QuotaBook::default());
        let config = DispatchConfig {
            max_held_input_bytes_per_namespace: 100,
            ..DispatchConfig::default()
        };
        let first = book.hold(&config, "ns", "p", 60).expect("within quota");
        let refused = book
            .hold(&config, "ns", "p", 41)
            .expect_err("past the quota");
        assert!(
            matches!(&refused, DispatchError::QuotaExceeded { limit, value: 100, .. }
                if *limit == MAX_HELD_BYTES_PER_NAMESPACE),
            "{refused:?}"
        );
        assert!(refused.to_string().contains(MAX_HELD_BYTES_PER_NAMESPACE));
        drop(first);
        // Control: the same input fits once the first dispatch let go of its bytes.
        let again = book
            .hold(&config, "ns", "p", 41)
            .expect("bytes were given back");
        drop(again);
        assert_eq!(
            book.entries(),
            0,
            "nothing is left once every dispatch left"
        );
    }

    #[test]
    fn a_principals_held_bytes_are_counted_across_its_namespaces() {
        let book = Arc::new(QuotaBook::default());
        let config = DispatchConfig {
            max_held_input_bytes_per_principal: 100,
            ..DispatchConfig::default()
        };
        let _a = book.hold(&config, "a", "p", 60).expect("within quota");
        let refused = book
            .hold(&config, "b", "p", 41)
            .expect_err("past p's quota");
        assert!(
            refused
                .to_string()
                .contains("`dispatch.max_held_input_bytes_per_principal` (100)"),
            "{refused}"
        );
        assert!(refused.to_string().contains("principal \"p\""), "{refused}");
        // Control: another principal in the same namespace is not held to p's quota.
        let _q = book
            .hold(&config, "b", "q", 41)
            .expect("q has its own quota");
    }
}
