//! QUIC push transport for Switchyard (work in progress).
#![forbid(unsafe_code)]
