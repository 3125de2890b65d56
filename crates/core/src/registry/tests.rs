//! The registry's behaviours, one module per concept.

mod announce;
mod arrival;
mod capacity;
mod census;
mod churn;
mod departure;
mod explain;
mod fairness;
mod lifecycle;
mod selection;
mod sessions;
