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
use crate::registry::{Registry, shrink_after_drain};
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

/// A namespace's figures, and whether the registry's namespace ledger counts it as in use.
#[derive(Debug, Default)]
struct NamespaceUsage {
    usage: Usage,
    /// The ledger counts one dispatch for the namespace while this entry lives; false while
    /// the ledger does not list the namespace (each new dispatch asks again).
    in_ledger: bool,
}

#[derive(Debug, Default)]
struct Books {
    namespaces: HashMap<String, NamespaceUsage>,
    principals: HashMap<String, Usage>,
}

/// The quota figures of every namespace and principal with a dispatch running.
///
/// It also tells the registry's namespace ledger that a namespace is in use while any dispatch
/// runs in it (the rule of [`Registry::namespace_in_use`]), counted once per namespace rather
/// than once per dispatch: the ledger's lock is taken when a namespace's first dispatch starts
/// and when its last one ends, not on every dispatch.
pub(crate) struct QuotaBook {
    books: Mutex<Books>,
    log: Mutex<KeyedThrottle>,
    registry: Registry,
}

impl std::fmt::Debug for QuotaBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaBook").finish_non_exhaustive()
    }
}

/// Which of a dispatch's two scopes a figure belongs to.
#[derive(Clone, Copy)]
enum Scope {
    Namespace,
    Principal,
}

impl QuotaBook {
    /// An empty book whose namespaces count as in use in `registry`'s namespace ledger.
    pub(crate) fn new(registry: Registry) -> Self {
        Self {
            books: Mutex::default(),
            log: Mutex::new(KeyedThrottle::new(LOG_WINDOW)),
            registry,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `bytes` of input for a dispatch of `principal` in `namespace`, or refuses naming
    /// the byte quota it would pass. An `exempt` (durable) dispatch counts as running in its
    /// namespace but holds no bytes against either quota: the dispatch store bounds it.
    pub(crate) fn hold<'a>(
        &'a self,
        config: &DispatchConfig,
        namespace: &'a str,
        principal: &'a str,
        bytes: usize,
        exempt: bool,
    ) -> Result<HeldInput<'a>, DispatchError> {
        let bytes = if exempt { 0 } else { bytes };
        {
            let mut books = self.lock();
            let Books {
                namespaces,
                principals,
            } = &mut *books;
            // One lookup per map: the entries are read, checked and updated in place.
            let ns = namespaces.get_mut(namespace);
            let pr = principals.get_mut(principal);
            let ns_bytes = ns.as_ref().map_or(0, |entry| entry.usage.bytes);
            let pr_bytes = pr.as_ref().map_or(0, |usage| usage.bytes);
            let refusal = if ns_bytes.saturating_add(bytes)
                > config.max_held_input_bytes_per_namespace
            {
                Some((
                    MAX_HELD_BYTES_PER_NAMESPACE,
                    config.max_held_input_bytes_per_namespace,
                    Scope::Namespace,
                ))
            } else if pr_bytes.saturating_add(bytes) > config.max_held_input_bytes_per_principal {
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
            let ns = match ns {
                Some(entry) => entry,
                None => namespaces.entry(namespace.to_owned()).or_default(),
            };
            ns.usage.dispatches += 1;
            ns.usage.bytes += bytes;
            if !ns.in_ledger {
                // Lock order: quota book, then ledger; the ledger never calls back.
                ns.in_ledger = self.registry.inner.ledger().dispatch_started(namespace);
            }
            let pr = match pr {
                Some(usage) => usage,
                None => principals.entry(principal.to_owned()).or_default(),
            };
            pr.dispatches += 1;
            pr.bytes += bytes;
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
        let Books {
            namespaces,
            principals,
        } = &mut *books;
        // Each count looked up once: checked, then raised in place.
        let ns = namespaces
            .get_mut(held.namespace)
            .map(|entry| &mut entry.usage.parked);
        let pr = principals.get_mut(held.principal).map(|u| &mut u.parked);
        let refusal = if ns.as_deref().map_or(0, |n| *n) >= config.max_parked_per_namespace {
            Some((
                MAX_PARKED_PER_NAMESPACE,
                config.max_parked_per_namespace,
                Scope::Namespace,
            ))
        } else if pr.as_deref().map_or(0, |n| *n) >= config.max_parked_per_principal {
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
        for count in [ns, pr].into_iter().flatten() {
            *count += 1;
        }
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

    /// Gives back a hold of `bytes` taken by [`QuotaBook::hold`] and kept past its
    /// [`HeldInput`] ([`HeldInput::keep`]).
    pub(super) fn release(&self, namespace: &str, principal: &str, bytes: usize) {
        let mut books = self.lock();
        let Books {
            namespaces,
            principals,
        } = &mut *books;
        if let Some(entry) = namespaces.get_mut(namespace) {
            let usage = &mut entry.usage;
            usage.dispatches = usage.dispatches.saturating_sub(1);
            usage.bytes = usage.bytes.saturating_sub(bytes);
            if usage.dispatches == 0 {
                if entry.in_ledger {
                    self.registry
                        .inner
                        .ledger()
                        .dispatch_ended(namespace, Instant::now());
                }
                namespaces.remove(namespace);
                shrink_after_drain(namespaces);
            }
        }
        if let Some(usage) = principals.get_mut(principal) {
            usage.dispatches = usage.dispatches.saturating_sub(1);
            usage.bytes = usage.bytes.saturating_sub(bytes);
            if usage.dispatches == 0 {
                principals.remove(principal);
                shrink_after_drain(principals);
            }
        }
    }

    fn unpark(&self, namespace: &str, principal: &str) {
        let mut books = self.lock();
        if let Some(entry) = books.namespaces.get_mut(namespace) {
            entry.usage.parked = entry.usage.parked.saturating_sub(1);
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
    if let Some(entry) = books.namespaces.get_mut(held.namespace) {
        entry.usage.parked += 1;
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

impl HeldInput<'_> {
    /// Keeps the hold past this value, for an owner that outlives the borrow (a batch):
    /// returns the bytes it holds, which that owner gives back with [`QuotaBook::release`].
    pub(super) fn keep(self) -> usize {
        let bytes = self.bytes;
        std::mem::forget(self);
        bytes
    }
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
        let book = Arc::new(QuotaBook::new(Registry::default()));
        let config = DispatchConfig {
            max_held_input_bytes_per_namespace: 100,
            ..DispatchConfig::default()
        };
        let first = book
            .hold(&config, "ns", "p", 60, false)
            .expect("within quota");
        let refused = book
            .hold(&config, "ns", "p", 41, false)
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
            .hold(&config, "ns", "p", 41, false)
            .expect("bytes were given back");
        drop(again);
        assert_eq!(
            book.entries(),
            0,
            "nothing is left once every dispatch left"
        );
    }

    fn listed_then_idle(registry: &Registry, namespace: &str) {
        let grpc = crate::delivery::TransportName::from_static("grpc");
        let names = [namespace.to_owned()].into();
        let mut ledger = registry.inner.ledger();
        ledger.joined(&names, &grpc);
        ledger.left(&names, &grpc, Instant::now());
    }

    /// Forgets what the ledger lets expire at `now`; returns how many it forgot.
    fn expire(registry: &Registry, now: Instant) -> usize {
        registry.inner.ledger().expire(now).len()
    }

    #[tokio::test(start_paused = true)]
    async fn a_namespace_stays_in_use_in_the_ledger_until_its_last_dispatch_leaves() {
        let expiry = Duration::from_secs(60);
        let registry = Registry::builder().namespace_idle_expiry(expiry).build();
        listed_then_idle(&registry, "ns");
        let book = QuotaBook::new(registry.clone());
        let config = DispatchConfig::default();
        let first = book
            .hold(&config, "ns", "p", 1, false)
            .expect("within quota");
        let second = book
            .hold(&config, "ns", "q", 1, false)
            .expect("within quota");
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(expire(&registry, Instant::now()), 0, "two dispatches run");
        drop(first);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(
            expire(&registry, Instant::now()),
            0,
            "one dispatch still runs"
        );
        drop(second);
        // Control: idle from the last dispatch's end, it expires one window later.
        let ended = Instant::now();
        assert_eq!(
            expire(&registry, ended + expiry - Duration::from_secs(1)),
            0
        );
        assert_eq!(expire(&registry, ended + expiry), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_namespace_listed_after_its_first_dispatch_is_counted_by_the_next() {
        let expiry = Duration::from_secs(60);
        let registry = Registry::builder().namespace_idle_expiry(expiry).build();
        let book = QuotaBook::new(registry.clone());
        let config = DispatchConfig::default();
        let _early = book
            .hold(&config, "ns", "p", 1, false)
            .expect("within quota");
        assert_eq!(
            registry.namespaces_listed(),
            0,
            "dispatches add no namespace"
        );
        listed_then_idle(&registry, "ns");
        let later = Instant::now();
        // Control: no dispatch counted yet, the listed namespace expires.
        assert_eq!(expire(&registry, later + expiry), 1);
        listed_then_idle(&registry, "ns");
        let _next = book
            .hold(&config, "ns", "p", 1, false)
            .expect("within quota");
        assert_eq!(expire(&registry, later + expiry * 10), 0, "counted in use");
    }

    #[test]
    fn a_principals_held_bytes_are_counted_across_its_namespaces() {
        let book = Arc::new(QuotaBook::new(Registry::default()));
        let config = DispatchConfig {
            max_held_input_bytes_per_principal: 100,
            ..DispatchConfig::default()
        };
        let _a = book
            .hold(&config, "a", "p", 60, false)
            .expect("within quota");
        let refused = book
            .hold(&config, "b", "p", 41, false)
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
            .hold(&config, "b", "q", 41, false)
            .expect("q has its own quota");
    }
}
