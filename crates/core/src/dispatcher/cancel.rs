//! [`Cancel`]: what can cancel a dispatch, if anything.

use tokio_util::sync::CancellationToken;

/// A dispatch's cancellation: the caller's token, or one of its own when it has an activity id
/// to be cancelled by, or none at all. Without one, waiting for a cancel costs nothing; a token
/// made for every dispatch would be allocated, locked and registered on at each of its waits
/// though nothing could ever fire it.
#[derive(Debug, Default)]
pub(super) struct Cancel(Option<CancellationToken>);

impl Cancel {
    /// Cancelled through `token`, or never.
    pub(super) fn new(token: Option<CancellationToken>) -> Self {
        Self(token)
    }

    /// Resolves once cancelled; never without a token.
    pub(super) async fn cancelled(&self) {
        match &self.0 {
            Some(token) => token.cancelled().await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[test]
    fn a_cancel_with_a_token_fires_with_it_and_one_without_never_does() {
        let token = CancellationToken::new();
        let given = Cancel::new(Some(token.clone()));
        let none = Cancel::default();
        assert!(
            given.cancelled().now_or_never().is_none(),
            "not before the token fires"
        );
        token.cancel();
        assert!(
            given.cancelled().now_or_never().is_some(),
            "fires with its token"
        );
        assert!(
            none.cancelled().now_or_never().is_none(),
            "nothing can fire it"
        );
    }
}
