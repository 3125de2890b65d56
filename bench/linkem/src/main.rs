//! The `linkem` command line.
#![forbid(unsafe_code)]

fn main() {}
