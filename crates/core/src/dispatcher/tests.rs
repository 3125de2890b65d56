//! The dispatcher's rules, each against scripted workers and paused time, one module per
//! behaviour over a shared fixture.

pub(crate) mod fixture;

mod cancel;
mod delivery;
mod fairness;
mod hooks;
mod in_flight;
mod local_batch;
mod outcomes;
mod overflow;
mod parking;
mod quota;
mod reclaim;
mod redelivery;
mod requests;
mod results;
mod sessions;
mod shutdown;
