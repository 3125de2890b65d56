//! Admission refusals reach the worker by name, and a refused worker is never registered.

use std::collections::BTreeSet;

use crate::admission::RefusalKind;
use crate::registration::{CallerIdentity, Registration};
use crate::testkit::fixture::{Fixture, Verdict, ensure, registration};
use crate::testkit::handler::Handler;
use crate::testkit::harness::{ConformanceWorker, HarnessError, TransportHarness};

const GRANTED: &str = "conformance";
const FORBIDDEN: &str = "conformance-forbidden";

/// A caller granted only the kit's namespace.
pub(crate) fn refused_caller() -> CallerIdentity {
    CallerIdentity::granted("conformance-tenant", [GRANTED])
}

pub(super) async fn refusals<H: TransportHarness>(mut fixture: Fixture<'_, H>) -> Verdict {
    let caller = refused_caller();
    let cases: [(&str, RefusalKind, &str, Registration); 4] = [
        (
            "no namespaces",
            RefusalKind::Invalid,
            "namespaces",
            Registration {
                namespaces: BTreeSet::new(),
                ..registration(1)
            },
        ),
        (
            "no activity types",
            RefusalKind::Invalid,
            "activity_types",
            Registration {
                activity_types: BTreeSet::new(),
                ..registration(1)
            },
        ),
        (
            "capacity zero",
            RefusalKind::Invalid,
            "max_concurrency",
            Registration {
                max_concurrency: Some(0),
                ..registration(1)
            },
        ),
        (
            "a namespace outside the caller's grant",
            RefusalKind::Unauthorised,
            FORBIDDEN,
            Registration {
                namespaces: BTreeSet::from([GRANTED.to_owned(), FORBIDDEN.to_owned()]),
                ..registration(1)
            },
        ),
    ];
    for (case, kind, named, refused) in cases {
        match fixture
            .try_connect(caller.clone(), refused, Handler::echo())
            .await
        {
            Ok(worker) => {
                return Err(format!(
                    "a registration with {case} was admitted as worker {}",
                    worker.worker_id()
                ));
            }
            Err(HarnessError::Refused { kind: got, message }) => {
                ensure!(
                    got == kind,
                    "a registration with {case} was refused as {got:?}, expected {kind:?}"
                );
                ensure!(
                    message.contains(named),
                    "the refusal of a registration with {case} does not name `{named}`: {message:?}"
                );
            }
            Err(error @ HarnessError::Transport(_)) => {
                return Err(format!("a registration with {case} failed: {error}"));
            }
        }
        ensure!(
            fixture.wait_empty().await,
            "a refused registration ({case}) left a worker in the registry"
        );
    }
    // Control: the same caller with a valid registration is admitted.
    let admitted = fixture
        .try_connect(caller, registration(1), Handler::echo())
        .await
        .map_err(|error| format!("a valid registration was not admitted: {error}"))?;
    ensure!(
        fixture.registry().is_registered(admitted.worker_id()),
        "worker {} was reported admitted but is not in the registry",
        admitted.worker_id()
    );
    Ok(())
}
