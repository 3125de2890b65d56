//! The one authentication seam every transport and the producer API call.

use std::sync::Arc;

use switchyard_core::CallerIdentity;

use crate::{AuthError, Credentials};

/// Turns a caller's [`Credentials`] into the [`CallerIdentity`] core's admission gate checks.
///
/// Transports hold an `Arc<dyn Authenticate>` and call it once per connection (or per call),
/// after TLS has verified any client certificate and before admission; an error closes the
/// connection or fails the call as unauthenticated. It must not block: it runs on the
/// connection's task. Which namespaces the identity may use is the gate's decision, from the
/// grant returned here.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use switchyard_auth::{AuthError, Authenticate, CallerIdentity, CallerTable, Credentials};
///
/// let auth: Arc<dyn Authenticate> = Arc::new(
///     CallerTable::new()
///         .with_token("s3cret", CallerIdentity::granted("billing-workers", ["billing"])),
/// );
/// let caller = auth.authenticate(&Credentials::new().bearer_token(Some("s3cret")))?;
/// assert_eq!(caller.principal, "billing-workers");
/// assert_eq!(
///     auth.authenticate(&Credentials::new().bearer_token(Some("guess"))),
///     Err(AuthError::TokenNotRecognised)
/// );
/// assert_eq!(auth.authenticate(&Credentials::new()), Err(AuthError::NoCredential));
/// # Ok::<(), AuthError>(())
/// ```
pub trait Authenticate: Send + Sync + 'static {
    /// The identity behind `credentials`, or why they are refused.
    fn authenticate(&self, credentials: &Credentials<'_>) -> Result<CallerIdentity, AuthError>;
}

impl<T: Authenticate + ?Sized> Authenticate for Arc<T> {
    fn authenticate(&self, credentials: &Credentials<'_>) -> Result<CallerIdentity, AuthError> {
        (**self).authenticate(credentials)
    }
}

/// Accepts every caller as principal `anonymous` granted every namespace, whatever it presents
/// (development, or a deployment where mutual TLS alone decides who may connect).
#[derive(Clone, Copy, Debug, Default)]
pub struct AllowAll;

impl Authenticate for AllowAll {
    fn authenticate(&self, _credentials: &Credentials<'_>) -> Result<CallerIdentity, AuthError> {
        Ok(CallerIdentity::trusted("anonymous"))
    }
}
