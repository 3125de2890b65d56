//! The builder calls every SDK shares, written once.

/// Writes the [`WorkerOptions`](crate::WorkerOptions) setters into an SDK builder's `impl`
/// block, so the same call means the same thing on every transport.
///
/// The builder must have a field `options: WorkerOptions`. `worker_option_setters!()` writes
/// `options`, `namespaces`, `task_queue`, `node`, `identity`, `activity`, `max_concurrency` and
/// `token`; `worker_option_setters!(reconnect)` adds `backoff` and `connect_timeout` for SDKs
/// that reconnect.
///
/// ```
/// use switchyard_worker::{WorkerOptions, worker_option_setters};
///
/// #[derive(Default)]
/// struct MyBuilder {
///     options: WorkerOptions,
/// }
///
/// impl MyBuilder {
///     worker_option_setters!(reconnect);
/// }
///
/// let builder = MyBuilder::default().namespaces(["a"]).namespaces(["b"]).max_concurrency(4);
/// assert_eq!(builder.options.namespaces, ["a", "b"]);
/// assert_eq!(builder.options.max_concurrency, 4);
/// ```
#[macro_export]
macro_rules! worker_option_setters {
    () => {
        /// Replaces every option the SDKs share with `options`, so one
        /// [`WorkerOptions`]($crate::WorkerOptions) can configure a worker of any transport.
        pub fn options(mut self, options: $crate::WorkerOptions) -> Self {
            self.options = options;
            self
        }

        /// Adds namespaces to serve (at least one is required).
        pub fn namespaces<I, S>(mut self, namespaces: I) -> Self
        where
            I: IntoIterator<Item = S>,
            S: Into<String>,
        {
            self.options.namespaces(namespaces);
            self
        }

        /// The task queue to serve in each namespace (default: the gateway's default queue).
        pub fn task_queue(mut self, task_queue: impl Into<String>) -> Self {
            self.options.task_queue = task_queue.into();
            self
        }

        /// The locality label to advertise (default: none).
        pub fn node(mut self, node: impl Into<String>) -> Self {
            self.options.node = node.into();
            self
        }

        /// The free-form process description operators see (default: the SDK and the process id).
        pub fn identity(mut self, identity: impl Into<String>) -> Self {
            self.options.identity = identity.into();
            self
        }

        /// Serves activity type `name` with `handler` (at least one is required); a later
        /// handler for the same name replaces the earlier one.
        pub fn activity(
            mut self,
            name: impl Into<String>,
            handler: impl $crate::ActivityHandler,
        ) -> Self {
            self.options.activity(name, handler);
            self
        }

        /// Most handlers running at once, and the capacity advertised to the gateway
        /// (default 16).
        pub fn max_concurrency(mut self, max_concurrency: u32) -> Self {
            self.options.max_concurrency = max_concurrency;
            self
        }

        /// The bearer token presented at registration.
        pub fn token(mut self, token: impl Into<String>) -> Self {
            self.options.token = Some(token.into());
            self
        }
    };
    (reconnect) => {
        $crate::worker_option_setters!();

        /// Waits between reconnection attempts (default: 100 ms doubling to 30 s, jittered).
        pub fn backoff(mut self, backoff: $crate::Backoff) -> Self {
            self.options.backoff = backoff;
            self
        }

        /// Longest wait to connect and register, per attempt (default 10 s).
        pub fn connect_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.options.connect_timeout = timeout;
            self
        }

        /// Whether to ask for a session and resume it after a lost connection, keeping
        /// running tasks and unacknowledged results (default true).
        pub fn resume(mut self, resume: bool) -> Self {
            self.options.resume = resume;
            self
        }
    };
}
