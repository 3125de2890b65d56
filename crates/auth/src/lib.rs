//! Who is calling: a caller's [`Credentials`] to the [`CallerIdentity`] core's admission gate
//! checks, through one trait, [`Authenticate`].
//!
//! Every transport and the producer API gather what the caller presented (the verified client
//! certificate, a bearer token, the remote address) and ask an [`Authenticate`]; none of them
//! reads a certificate or an `authorization` value its own way. The rules live here once:
//! [`certificate_principal`] names the principal of a certificate, [`bearer_token`] reads an
//! `authorization` value, and [`CallerTable`] applies the precedence (the certificate wins over a
//! token, an unrecognised credential is refused, never downgraded). An [`AuthError`] always
//! means "not authenticated" (gRPC `UNAUTHENTICATED`, QUIC `UNAUTHENTICATED`, WebSocket 4401);
//! a namespace outside the grant is the gate's refusal, not this crate's.

#![forbid(unsafe_code)]

mod authenticate;
mod bearer;
mod certificate;
mod credentials;
mod error;
mod table;

pub use authenticate::{AllowAll, Authenticate};
pub use bearer::bearer_token;
pub use certificate::certificate_principal;
pub use credentials::Credentials;
pub use error::AuthError;
pub use switchyard_core::{CallerIdentity, NamespaceGrant};
pub use table::CallerTable;
