//! The in-memory transport passes the whole conformance kit, with capacity carried in the
//! registration and with capacity announced after it.
#![cfg(feature = "testkit")]

use switchyard_core::testkit::{self, ConformanceFailures, memory::MemoryHarness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_transport_conforms() -> Result<(), ConformanceFailures> {
    testkit::run_conformance(&MemoryHarness::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_transport_announcing_capacity_conforms() -> Result<(), ConformanceFailures> {
    testkit::run_conformance(&MemoryHarness::announcing_capacity()).await
}
