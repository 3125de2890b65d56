//! The durable dispatcher's rules over the memory store, scripted workers and paused time.

mod fixture;

mod access;
mod early;
mod elsewhere;
mod lifecycle;
mod quota;
mod restart;
mod retention;
