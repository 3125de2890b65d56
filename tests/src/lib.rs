//! End-to-end tests of Switchyard over real sockets; the tests live in `tests/`.
#![forbid(unsafe_code)]
