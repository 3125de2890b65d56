//! What every worker is configured with, whatever its transport, and its one validation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{ActivityHandler, Backoff};

use crate::WorkerError;

/// A worker's transport-independent options; each SDK builder sets them through the same
/// calls with the same meaning.
///
/// [`WorkerOptions::namespaces`] and [`WorkerOptions::activity`] add to what was given
/// before; the other setters replace.
#[derive(Clone)]
pub struct WorkerOptions {
    /// Namespaces served (at least one).
    pub namespaces: Vec<String>,
    /// Task queue within each namespace (empty: the gateway's default queue).
    pub task_queue: String,
    /// Locality label (empty: none).
    pub node: String,
    /// Free-form process description shown to operators.
    pub identity: String,
    /// Handler of each activity type served (at least one).
    pub activities: BTreeMap<String, Arc<dyn ActivityHandler>>,
    /// Most tasks run at once, and the capacity advertised to the gateway (at least 1).
    pub max_concurrency: u32,
    /// Bearer token presented at registration.
    pub token: Option<String>,
    /// Waits between reconnection attempts.
    pub backoff: Backoff,
    /// Longest time to connect and register, per attempt.
    pub connect_timeout: Duration,
    /// Asks for a session, and resumes it after a lost connection (default true): running
    /// tasks keep running and unacknowledged results are sent again.
    pub resume: bool,
}

impl std::fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("namespaces", &self.namespaces)
            .field("task_queue", &self.task_queue)
            .field("activities", &self.activities.keys().collect::<Vec<_>>())
            .field("max_concurrency", &self.max_concurrency)
            .field("resume", &self.resume)
            .finish_non_exhaustive()
    }
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            namespaces: Vec::new(),
            task_queue: String::new(),
            node: String::new(),
            identity: format!("rust-sdk pid {}", std::process::id()),
            activities: BTreeMap::new(),
            max_concurrency: 16,
            token: None,
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(10),
            resume: true,
        }
    }
}

impl WorkerOptions {
    /// Adds namespaces to serve.
    pub fn namespaces<I, S>(&mut self, namespaces: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.namespaces
            .extend(namespaces.into_iter().map(Into::into));
    }

    /// Serves activity type `name` with `handler`; a later handler for the same name
    /// replaces the earlier one.
    pub fn activity(&mut self, name: impl Into<String>, handler: impl ActivityHandler) {
        self.activities.insert(name.into(), Arc::new(handler));
    }

    /// Checks what a worker needs before it dials: a namespace, a handler, a capacity.
    pub fn validate(&self) -> Result<(), WorkerError> {
        if self.namespaces.is_empty() {
            return Err(WorkerError::Invalid {
                field: "namespaces",
                reason: "empty: serve at least one namespace",
            });
        }
        if self.activities.is_empty() {
            return Err(WorkerError::Invalid {
                field: "activity_types",
                reason: "empty: register at least one activity handler",
            });
        }
        validate_max_concurrency(self.max_concurrency)
    }
}

/// The capacity rule, shared by the options and by a resize.
pub(crate) fn validate_max_concurrency(max_concurrency: u32) -> Result<(), WorkerError> {
    if max_concurrency == 0 {
        return Err(WorkerError::Invalid {
            field: "max_concurrency",
            reason: "0: a worker must accept at least one task",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use switchyard_core::{ActivityContext, ActivityError};

    use super::*;

    async fn echo(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
        Ok(input)
    }

    fn field(options: &WorkerOptions) -> Option<&'static str> {
        match options.validate() {
            Err(WorkerError::Invalid { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn validation_names_the_missing_option_and_namespaces_add() {
        let mut options = WorkerOptions::default();
        assert_eq!(field(&options), Some("namespaces"));
        options.namespaces(["a"]);
        options.namespaces(["b"]);
        assert_eq!(options.namespaces, ["a", "b"], "namespaces() adds");
        assert_eq!(field(&options), Some("activity_types"));
        options.activity("echo", echo);
        options.max_concurrency = 0;
        assert_eq!(field(&options), Some("max_concurrency"));
        // Control: a complete set of options passes.
        options.max_concurrency = 1;
        assert!(options.validate().is_ok());
    }
}
