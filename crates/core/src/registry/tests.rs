//! The registry's behaviours, one module per concept.

mod arrival;
mod capacity;
mod announce;
mod census;
mod departure;
mod explain;
mod lifecycle;
mod selection;
