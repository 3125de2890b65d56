//! The overflow seam: local first at no cost, offers only after a local miss, a remote outcome
//! ends the dispatch, no taker parks with `no capacity in cluster` until a capacity hint, a
//! lost taker is offered again, an offer out is not listed as unserved while a local worker
//! freed meanwhile still takes the dispatch, and `local_only` never parks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use crate::dispatcher::*;
use crate::outcome::ActivityOutcome;
use crate::registry::UnservedReason;

use super::fixture::*;
use crate::dispatcher::acquire::OFFERED_UNLISTED;

/// A scripted overflow: each offer takes the next scripted answer (none left → no taker);
/// hints fire on `hint.notify_waiters()` (the hints waiting at that moment), and on an
/// announcement (`announce`: every hint taken before it, as the cluster's are).
#[derive(Default)]
struct Scripted {
    answers: Mutex<Vec<Answer>>,
    offers: Mutex<Vec<String>>,
    hint: Arc<Notify>,
    announced: Arc<AtomicU64>,
    carries_durable: bool,
}

impl Scripted {
    fn announce(&self) {
        self.announced.fetch_add(1, Ordering::SeqCst);
        self.hint.notify_waiters();
    }
}

enum Answer {
    NoTaker,
    /// No answer in time: a node may have taken it.
    Unanswered,
    /// No taker, and a capacity announcement arrives while the offer is out (before its
    /// answer).
    NoTakerAfterAnnouncement(Arc<Scripted>),
    Ends(Forwarded),
    /// Taken, and runs until the returned future is dropped (reported on the channel).
    Runs(mpsc::UnboundedSender<()>),
    /// Never answered: the offer stays out until dropped (reported on the channel).
    Out(mpsc::UnboundedSender<()>),
}

struct DropSignal(mpsc::UnboundedSender<()>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

impl Overflow for Scripted {
    fn offer(&self, offer: OverflowOffer<'_>) -> OverflowFuture<Offered> {
        self.offers
            .lock()
            .expect("test lock")
            .push(String::from_utf8_lossy(&offer.request.input).into_owned());
        let answer = {
            let mut answers = self.answers.lock().expect("test lock");
            (!answers.is_empty()).then(|| answers.remove(0))
        };
        Box::pin(async move {
            match answer {
                None | Some(Answer::NoTaker) => Offered::NoTaker,
                Some(Answer::Unanswered) => Offered::Unanswered,
                Some(Answer::NoTakerAfterAnnouncement(scripted)) => {
                    scripted.announce();
                    Offered::NoTaker
                }
                Some(Answer::Ends(ended)) => Offered::Taken(Box::pin(async move { ended })),
                Some(Answer::Runs(dropped)) => Offered::Taken(Box::pin(async move {
                    let _signal = DropSignal(dropped);
                    std::future::pending::<Forwarded>().await
                })),
                Some(Answer::Out(dropped)) => {
                    let _signal = DropSignal(dropped);
                    std::future::pending::<Offered>().await
                }
            }
        })
    }

    fn capacity_hint(&self, _request: &crate::ActivityRequest) -> OverflowFuture<()> {
        let (hint, announced) = (Arc::clone(&self.hint), Arc::clone(&self.announced));
        let seen = announced.load(Ordering::SeqCst);
        Box::pin(async move {
            let notified = hint.notified();
            if announced.load(Ordering::SeqCst) == seen {
                notified.await;
            }
        })
    }

    fn carries_durable(&self) -> bool {
        self.carries_durable
    }
}

fn install(s: &Setup, answers: Vec<Answer>) -> Arc<Scripted> {
    let scripted = Arc::new(Scripted {
        answers: Mutex::new(answers),
        ..Scripted::default()
    });
    assert!(s.dispatcher.set_overflow(scripted.clone()));
    scripted
}

fn offers(scripted: &Scripted) -> Vec<String> {
    scripted.offers.lock().expect("test lock").clone()
}

#[tokio::test(start_paused = true)]
async fn a_local_worker_takes_the_dispatch_without_an_offer() {
    let s = setup();
    let scripted = install(&s, vec![]);
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("local", Duration::from_secs(60)));
    let task = worker.task().await;
    s.dispatcher
        .complete(worker.id, task.task_id, success("local"))
        .expect("pending");
    assert_eq!(running.await.expect("dispatch"), completed("local"));
    assert!(offers(&scripted).is_empty(), "{:?}", offers(&scripted));
    // Control: with no free local slot the same dispatch is offered.
    let _held = s.spawn(request("holds the slot", Duration::from_secs(60)));
    let _ = worker.task().await;
    let missed = s.spawn(request("missed", Duration::from_secs(1)));
    let _ = missed.await.expect("dispatch");
    assert_eq!(offers(&scripted), vec!["missed".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_remote_outcome_ends_the_dispatch() {
    let s = setup();
    let remote = ActivityOutcome::Completed("far".into());
    let _scripted = install(&s, vec![Answer::Ends(Forwarded::Outcome(remote.clone()))]);
    let outcome = s
        .spawn(request("x", Duration::from_secs(60)))
        .await
        .expect("dispatch");
    assert_eq!(outcome, remote);
}

#[tokio::test(start_paused = true)]
async fn no_taker_parks_as_no_capacity_in_cluster_until_a_hint_offers_again() {
    let s = setup();
    let remote = ActivityOutcome::Completed("second offer".into());
    let scripted = install(
        &s,
        vec![
            Answer::NoTaker,
            Answer::Ends(Forwarded::Outcome(remote.clone())),
        ],
    );
    let running = s.spawn(request("x", Duration::from_secs(60)));
    s.parked(1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unserved = s.dispatcher.unserved_queues();
    assert_eq!(unserved[0].reason, UnservedReason::NoCapacityInCluster);
    assert_eq!(offers(&scripted).len(), 1, "no second offer before a hint");
    scripted.hint.notify_waiters();
    assert_eq!(running.await.expect("dispatch"), remote);
    assert_eq!(offers(&scripted).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_capacity_announcement_heard_while_the_offer_is_out_offers_again_at_once() {
    let s = setup();
    let remote = ActivityOutcome::Completed("second offer".into());
    let scripted = install(&s, vec![]);
    scripted.answers.lock().expect("test lock").extend([
        Answer::NoTakerAfterAnnouncement(Arc::clone(&scripted)),
        Answer::Ends(Forwarded::Outcome(remote.clone())),
    ]);
    // The announcement lands between the offer and its "no taker": the hint taken as the
    // offer left has seen it, so the dispatch offers again without waiting for another.
    let outcome = s
        .spawn(request("x", Duration::from_secs(60)))
        .await
        .expect("dispatch");
    assert_eq!(outcome, remote);
    assert_eq!(offers(&scripted).len(), 2);
    // Control: an announcement before the offer leaves says nothing about the offer's
    // answer; the dispatch waits for the next one (none comes: its deadline ends it).
    let s = setup();
    let scripted = install(&s, vec![Answer::NoTaker]);
    scripted.announce();
    let outcome = s
        .spawn(request("y", Duration::from_secs(60)))
        .await
        .expect("dispatch");
    assert!(
        matches!(
            outcome,
            ActivityOutcome::Unserved {
                reason: UnservedReason::NoCapacityInCluster,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(offers(&scripted).len(), 1);
}

/// The reason and detail of a dispatch whose one offer got `answer` and that then reached its
/// deadline unserved.
async fn unserved_after_one_offer(answer: Answer) -> (UnservedReason, String) {
    let s = setup();
    let _scripted = install(&s, vec![answer]);
    let outcome = s
        .spawn(request("x", Duration::from_secs(5)))
        .await
        .expect("dispatch");
    let ActivityOutcome::Unserved { reason, detail } = outcome else {
        panic!("not unserved: {outcome:?}");
    };
    (reason, detail)
}

#[tokio::test(start_paused = true)]
async fn the_deadline_of_an_offer_nobody_took_says_no_capacity_in_cluster() {
    let (reason, detail) = unserved_after_one_offer(Answer::NoTaker).await;
    assert_eq!(reason, UnservedReason::NoCapacityInCluster);
    assert!(detail.contains("no other node"), "{detail}");
    // Control: without an overflow the local reason stands.
    let plain = setup();
    let outcome = plain
        .spawn(request("x", Duration::from_secs(5)))
        .await
        .expect("dispatch");
    assert!(
        matches!(
            outcome,
            ActivityOutcome::Unserved {
                reason: UnservedReason::NoWorkers,
                ..
            }
        ),
        "{outcome:?}"
    );
}

/// An offer whose answer was lost or late parks the dispatch as "no taker" does, but its
/// outcome at the deadline does not claim that no node took it: one may have started it.
#[tokio::test(start_paused = true)]
async fn the_deadline_after_an_unanswered_offer_says_a_node_may_have_started_the_task() {
    let (reason, detail) = unserved_after_one_offer(Answer::Unanswered).await;
    assert_eq!(reason, UnservedReason::NoCapacityInCluster);
    assert!(
        detail.contains("a node may have started the task"),
        "{detail}"
    );
    assert!(!detail.contains("took the offer"), "{detail}");
    // Control: an offer answered "no taker" says no node took it.
    let (_, detail) = unserved_after_one_offer(Answer::NoTaker).await;
    assert!(!detail.contains("may have started"), "{detail}");
}

#[tokio::test(start_paused = true)]
async fn a_lost_taker_is_offered_again_within_the_loss_budget() {
    let s = setup();
    let remote = ActivityOutcome::Completed("after a loss".into());
    let scripted = install(
        &s,
        vec![
            Answer::Ends(Forwarded::Lost),
            Answer::Ends(Forwarded::Outcome(remote.clone())),
        ],
    );
    let outcome = s
        .spawn(request("x", Duration::from_secs(60)))
        .await
        .expect("dispatch");
    assert_eq!(outcome, remote);
    assert_eq!(offers(&scripted).len(), 2);
    // Control: losses past the budget end the dispatch.
    let s = setup_with(DispatchConfig {
        loss_budget: 1,
        ..DispatchConfig::default()
    });
    let _scripted = install(
        &s,
        vec![Answer::Ends(Forwarded::Lost), Answer::Ends(Forwarded::Lost)],
    );
    let outcome = s
        .spawn(request("x", Duration::from_secs(60)))
        .await
        .expect("dispatch");
    assert!(
        matches!(outcome, ActivityOutcome::TransportLost { .. }),
        "{outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_forwarded_dispatch_drops_the_remote_wait() {
    let s = setup();
    let (dropped, mut heard) = mpsc::unbounded_channel();
    let _scripted = install(&s, vec![Answer::Runs(dropped)]);
    let running = s.spawn(with_id(request("x", Duration::from_secs(60)), "a1"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(heard.try_recv().is_err(), "still running remotely");
    s.dispatcher.cancel(&caller(), NS, "a1").expect("in flight");
    assert_eq!(running.await.expect("dispatch"), ActivityOutcome::Cancelled);
    assert!(heard.recv().await.is_some(), "the remote wait was dropped");
}

#[tokio::test(start_paused = true)]
async fn local_only_misses_at_once_without_parking_or_offering() {
    let s = setup();
    let scripted = install(&s, vec![]);
    let hooks = DispatchHooks {
        local_only: true,
        ..DispatchHooks::default()
    };
    let outcome = s
        .dispatcher
        .dispatch_with(&caller(), request("x", Duration::from_secs(60)), hooks)
        .await
        .expect("dispatch");
    assert!(
        matches!(
            outcome,
            ActivityOutcome::Unserved {
                reason: UnservedReason::NoWorkers,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(offers(&scripted).is_empty());
    assert!(s.dispatcher.unserved_queues().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_durable_dispatch_is_offered_only_by_an_overflow_that_carries_durable() {
    let durable = || DispatchHooks {
        durable: true,
        ..DispatchHooks::default()
    };
    for carries_durable in [false, true] {
        let s = setup();
        let remote = ActivityOutcome::Completed("far".into());
        let scripted = Arc::new(Scripted {
            answers: Mutex::new(vec![Answer::Ends(Forwarded::Outcome(remote.clone()))]),
            carries_durable,
            ..Scripted::default()
        });
        assert!(s.dispatcher.set_overflow(scripted.clone()));
        let outcome = s
            .dispatcher
            .dispatch_with(&caller(), request("d", Duration::from_secs(1)), durable())
            .await
            .expect("dispatch");
        if carries_durable {
            assert_eq!(outcome, remote);
            assert_eq!(offers(&scripted), vec!["d".to_owned()]);
        } else {
            // Control: the default keeps a durable dispatch on its node: it parks unoffered.
            assert!(
                matches!(outcome, ActivityOutcome::Unserved { .. }),
                "{outcome:?}"
            );
            assert!(offers(&scripted).is_empty(), "{:?}", offers(&scripted));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_miss_while_its_offer_is_out_takes_no_unserved_ticket_until_the_offer_lasts() {
    let s = setup();
    let (dropped, _heard) = mpsc::unbounded_channel();
    let scripted = install(&s, vec![Answer::Out(dropped)]);
    let running = s.spawn(request("x", Duration::from_secs(60)));
    while offers(&scripted).is_empty() {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(OFFERED_UNLISTED / 2).await;
    assert!(
        s.dispatcher.unserved_queues().is_empty(),
        "{:?}",
        s.dispatcher.unserved_queues()
    );
    assert_eq!(s.dispatcher.unserved_warnings(), 0);
    assert!(!running.is_finished());
    // An offer out longer than a round trip should be: listed with the local reason.
    tokio::time::sleep(OFFERED_UNLISTED).await;
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::NoWorkers
    );
    // Control: without an overflow the same miss is listed at once.
    let plain = setup();
    let _parked = plain.spawn(request("x", Duration::from_secs(60)));
    plain.parked(1).await;
    assert_eq!(plain.dispatcher.unserved_warnings(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_local_worker_freed_while_the_offer_is_out_still_gets_the_dispatch() {
    let s = setup();
    let (dropped, mut heard) = mpsc::unbounded_channel();
    let scripted = install(&s, vec![Answer::Out(dropped)]);
    let mut worker = s.worker(1).await;
    let held = s.spawn(request("holds the slot", Duration::from_secs(60)));
    let first = worker.task().await;
    let running = s.spawn(request("x", Duration::from_secs(60)));
    while offers(&scripted).is_empty() {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Control: while the slot is held the dispatch is not delivered here.
    assert!(worker.sent().is_empty(), "the slot is held");
    s.dispatcher
        .complete(worker.id, first.task_id, success("held"))
        .expect("pending");
    assert_eq!(held.await.expect("dispatch"), completed("held"));
    let task = worker.task().await;
    assert_eq!(&task.input[..], b"x");
    assert!(heard.recv().await.is_some(), "the offer was withdrawn");
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("pending");
    assert_eq!(running.await.expect("dispatch"), completed("x"));
    assert_eq!(offers(&scripted), vec!["x".to_owned()], "offered once");
}

#[tokio::test(start_paused = true)]
async fn a_miss_in_a_pool_without_local_workers_waits_on_its_offer_alone() {
    let s = setup();
    let (dropped, mut heard) = mpsc::unbounded_channel();
    let scripted = install(&s, vec![Answer::Out(dropped)]);
    let running = s.spawn(request("x", Duration::from_secs(60)));
    while offers(&scripted).is_empty() {
        tokio::task::yield_now().await;
    }
    let offered_at = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        s.dispatcher.selections(),
        1,
        "no second selection, no waiter"
    );
    // A worker arriving while the offer is out still gets the dispatch: by the time the offer
    // has been out `OFFERED_UNLISTED`, the dispatch queues in its pool and selects again.
    let mut worker = s.worker(1).await;
    let task = worker.task().await;
    assert_eq!(&task.input[..], b"x");
    assert_eq!(offered_at.elapsed(), OFFERED_UNLISTED);
    assert!(heard.recv().await.is_some(), "the offer was withdrawn");
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("pending");
    assert_eq!(running.await.expect("dispatch"), completed("x"));
    // Control: in a pool with a local worker (its slot held) the miss queues and selects
    // again at once, for a slot freed meanwhile.
    let s = setup();
    let (dropped, _heard) = mpsc::unbounded_channel();
    let scripted = install(&s, vec![Answer::Out(dropped)]);
    let mut worker = s.worker(1).await;
    let _held = s.spawn(request("holds the slot", Duration::from_secs(60)));
    let _ = worker.task().await;
    let _running = s.spawn(request("x", Duration::from_secs(60)));
    while offers(&scripted).is_empty() {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        s.dispatcher.selections(),
        3,
        "the holder's, and the miss's two"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_arriving_after_an_untaken_offer_in_a_pool_without_workers_gets_the_dispatch() {
    let s = setup();
    let _scripted = install(&s, vec![Answer::NoTaker]);
    let running = s.spawn(request("x", Duration::from_secs(60)));
    s.parked(1).await;
    // Control: parked, not served, before the arrival.
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::NoCapacityInCluster
    );
    assert!(!running.is_finished());
    let mut worker = s.worker(1).await;
    let task = worker.task().await;
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("pending");
    assert_eq!(running.await.expect("dispatch"), completed("x"));
    assert_eq!(task.attempt, 1, "the first delivery anywhere");
}

/// `docs/cluster.md`: a forwarded dispatch whose remote outcome never arrives (lost between
/// taker and origin) ends `timed_out` 2 s after its deadline, not at it (the taker's own
/// `timed_out` may still be on its way) and not never; the remote wait is dropped then.
#[tokio::test(start_paused = true)]
async fn a_forwarded_dispatch_whose_outcome_is_lost_times_out_two_seconds_past_its_deadline() {
    let s = setup();
    let (dropped, mut heard) = mpsc::unbounded_channel();
    let _scripted = install(&s, vec![Answer::Runs(dropped)]);
    let start = tokio::time::Instant::now();
    let running = s.spawn(request("lost", Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_millis(2_900)).await;
    assert!(!running.is_finished(), "ended before its deadline's grace");
    assert!(heard.try_recv().is_err(), "the remote wait is still held");
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the dispatch ends after the grace")
        .expect("dispatch");
    assert_eq!(outcome, ActivityOutcome::TimedOut);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(3),
        "deadline 1 s + grace 2 s"
    );
    assert!(heard.recv().await.is_some(), "the remote wait was dropped");
}
