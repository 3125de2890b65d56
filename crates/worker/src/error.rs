//! The one error a worker reports, whatever its transport.

use std::error::Error;
use std::time::Duration;

/// A transport link's own failure, classified for the reconnect loop.
pub trait LinkError: Error + Send + Sync + 'static {
    /// True when trying again unchanged cannot succeed (bad settings, a final refusal).
    fn is_permanent(&self) -> bool;

    /// True when the gateway refused a resume: the worker registers afresh at once.
    fn is_resume_refused(&self) -> bool {
        false
    }
}

/// Why a worker could not start, or stopped for good.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A worker option is unusable.
    #[error("worker option {field}: {reason}")]
    Invalid {
        /// The option.
        field: &'static str,
        /// The rule it broke.
        reason: &'static str,
    },
    /// The operation needs a frame this transport's protocol does not have.
    #[error("{operation} is not supported by the {transport} transport")]
    Unsupported {
        /// The operation asked for.
        operation: &'static str,
        /// The transport.
        transport: &'static str,
    },
    /// Connecting and registering took longer than the connect timeout.
    #[error("no registration within {0:?}")]
    Timeout(Duration),
    /// The transport link failed; [`WorkerError::link_error`] recovers its typed error.
    #[error("{source}")]
    Link {
        /// The transport.
        transport: &'static str,
        /// Whether the link marked it permanent.
        permanent: bool,
        /// The link's error.
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
}

impl WorkerError {
    /// Wraps a link's error, keeping its classification.
    pub fn link(transport: &'static str, error: impl LinkError) -> Self {
        Self::Link {
            transport,
            permanent: error.is_permanent(),
            source: Box::new(error),
        }
    }

    /// True when trying again unchanged cannot succeed: invalid options, an unsupported
    /// operation, or a link failure its transport marks permanent.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Invalid { .. } | Self::Unsupported { .. } => true,
            Self::Timeout(_) => false,
            Self::Link { permanent, .. } => *permanent,
        }
    }

    /// The transport's typed error, when this is a link failure of type `E`.
    pub fn link_error<E: Error + 'static>(&self) -> Option<&E> {
        match self {
            Self::Link { source, .. } => source.downcast_ref::<E>(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Refused(bool);

    impl LinkError for Refused {
        fn is_permanent(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn a_link_error_keeps_its_classification_and_its_type() {
        let permanent = WorkerError::link("test", Refused(true));
        assert!(permanent.is_permanent());
        assert!(permanent.link_error::<Refused>().is_some_and(|e| e.0));
        // Control: a transient link error stays transient.
        assert!(!WorkerError::link("test", Refused(false)).is_permanent());
        assert!(!WorkerError::Timeout(Duration::from_secs(1)).is_permanent());
    }
}
