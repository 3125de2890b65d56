//! The embeddable Switchyard gateway (work in progress).
#![forbid(unsafe_code)]
