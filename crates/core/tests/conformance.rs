//! The in-memory transport passes the whole conformance kit, with capacity carried in the
//! registration and with capacity announced after it; without sessions it passes the resume
//! check's fallback.
#![cfg(feature = "testkit")]

use switchyard_core::testkit::{
    self, Check, CheckFailure, ConformanceFailures, memory::MemoryHarness,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_transport_conforms() -> Result<(), ConformanceFailures> {
    testkit::run_conformance(&MemoryHarness::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_transport_announcing_capacity_conforms() -> Result<(), ConformanceFailures> {
    testkit::run_conformance(&MemoryHarness::announcing_capacity()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_transport_without_sessions_falls_back() -> Result<(), CheckFailure> {
    let harness = MemoryHarness::new().without_sessions();
    Check::ResumeKeepsTasks.run(&harness).await?;
    // Control: the same transport and check with sessions take the resume branch.
    Check::ResumeKeepsTasks.run(&MemoryHarness::new()).await
}
