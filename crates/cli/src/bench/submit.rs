//! `--durable --via submit`: durable submission, then the outcome. P tasks call `Submit`, each
//! keeping one dispatch outstanding; every outcome comes back on one `WatchOutcomes` stream,
//! opened before the first submission. A dispatch's latency runs from its `Submit` call to its
//! outcome on the watch.
//!
//! Why the watch and not `AwaitOutcome`: one call per dispatch instead of two, and a producer
//! that submits at volume reads outcomes the way a JetStream consumer of replies does (the
//! baseline the durable figures sit beside). An outcome can overtake its `Submit` reply, so
//! whichever of the two arrives second completes the dispatch. A watcher that falls behind is
//! told how many outcomes it missed; the bench never has more than P outcomes unread, so that
//! ends the run with an error rather than a wrong figure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::watch_outcomes_reply::Event;
use tokio::sync::{Semaphore, mpsc};

use super::args::BenchArgs;
use super::drive::{self, Run};
use super::target::Target;
use crate::cmd::Failure;

/// A dispatch whose id or outcome has arrived, waiting for the other half.
#[derive(Default)]
struct Halves {
    /// Submitted, outcome not yet seen: when the `Submit` call was sent.
    submitted: HashMap<String, Instant>,
    /// Outcome seen before the `Submit` reply: when, and its label.
    early: HashMap<String, (Instant, &'static str)>,
}

/// One dispatch ended: its latency and label, or the run's failure.
type Ended = Result<(Duration, &'static str), Failure>;

impl Halves {
    /// The `Submit` reply for `id`, sent at `sent`; the dispatch if its outcome is already in.
    fn on_submitted(&mut self, id: String, sent: Instant) -> Option<(Duration, &'static str)> {
        match self.early.remove(&id) {
            Some((at, label)) => Some((at.saturating_duration_since(sent), label)),
            None => {
                self.submitted.insert(id, sent);
                None
            }
        }
    }

    /// The outcome of `id`, seen `now`; the dispatch if its `Submit` reply is already in.
    fn on_outcome(
        &mut self,
        id: String,
        label: &'static str,
        now: Instant,
    ) -> Option<(Duration, &'static str)> {
        match self.submitted.remove(&id) {
            Some(sent) => Some((now.saturating_duration_since(sent), label)),
            None => {
                self.early.insert(id, (now, label));
                None
            }
        }
    }
}

/// Runs `--tasks` durable submissions with at most `--outstanding` unfinished.
pub(crate) async fn run(args: &BenchArgs, target: &Target) -> Result<Run, Failure> {
    let api = target.api().await?;
    let mut watch = api
        .clone()
        .watch_outcomes(pb::WatchOutcomesRequest::default())
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    let halves = Arc::new(Mutex::new(Halves::default()));
    let outstanding = usize::try_from(args.outstanding).unwrap_or(usize::MAX);
    let slots = Arc::new(Semaphore::new(outstanding));
    let (ended, mut ends) = mpsc::unbounded_channel::<Ended>();
    let next = Arc::new(AtomicU64::new(0));
    let (tasks, input, timeout) = (
        u64::from(args.tasks),
        drive::payload(args),
        drive::dispatch_timeout(args),
    );
    let submitters: Vec<_> = (0..args.outstanding)
        .map(|_| {
            let (mut api, halves, slots, ended, next, input, args) = (
                api.clone(),
                Arc::clone(&halves),
                Arc::clone(&slots),
                ended.clone(),
                Arc::clone(&next),
                input.clone(),
                args.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let Ok(permit) = slots.acquire().await else {
                        return;
                    };
                    permit.forget();
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= tasks {
                        return;
                    }
                    let request =
                        drive::wire_request(&drive::input_of(&args, &input, id), timeout, true);
                    let sent = Instant::now();
                    let done = match api.submit(request).await {
                        Ok(reply) => halves
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .on_submitted(reply.into_inner().dispatch_id, sent),
                        Err(_) => Some((sent.elapsed(), "refused")),
                    };
                    if let Some(done) = done {
                        let _ = ended.send(Ok(done));
                    }
                }
            })
        })
        .collect();
    let watcher = {
        let (halves, ended) = (Arc::clone(&halves), ended.clone());
        tokio::spawn(async move {
            while let Some(event) = watch.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(status) => {
                        let _ = ended.send(Err(Failure::status(&status)));
                        return;
                    }
                };
                let outcome = match event.event {
                    Some(Event::Outcome(outcome)) => outcome,
                    Some(Event::Missed(missed)) => {
                        let _ = ended.send(Err(Failure::runtime(format!(
                            "the outcome watch missed {} outcomes",
                            missed.count
                        ))));
                        return;
                    }
                    None => continue,
                };
                let label = drive::wire_label(Some(&outcome));
                let done = halves
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .on_outcome(event.dispatch_id, label, Instant::now());
                if let Some(done) = done {
                    let _ = ended.send(Ok(done));
                }
            }
            let _ = ended.send(Err(Failure::runtime("the outcome watch ended early")));
        })
    };
    drop(ended);
    let mut run = Run::new()?;
    let deadline = drive::reply_deadline(args);
    let result = async {
        for _ in 0..tasks {
            let (latency, label) = tokio::time::timeout(deadline, ends.recv())
                .await
                .map_err(|_| Failure::runtime(format!("no durable outcome for {deadline:?}")))?
                .ok_or_else(|| Failure::runtime("every submitter ended early"))??;
            run.record(latency, label);
            slots.add_permits(1);
        }
        Ok::<_, Failure>(())
    }
    .await;
    slots.close();
    watcher.abort();
    for submitter in submitters {
        submitter.abort();
    }
    result.map(|()| run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_half_to_arrive_ends_the_dispatch_with_the_latency_from_submit() {
        let sent = Instant::now();
        let mut halves = Halves::default();
        // Submit reply first, outcome later.
        assert_eq!(halves.on_submitted("a".into(), sent), None);
        let later = sent + Duration::from_millis(5);
        assert_eq!(
            halves.on_outcome("a".into(), "completed", later),
            Some((Duration::from_millis(5), "completed"))
        );
        // Outcome first (it overtook the Submit reply), reply later.
        let seen = sent + Duration::from_millis(3);
        assert_eq!(halves.on_outcome("b".into(), "failed", seen), None);
        assert_eq!(
            halves.on_submitted("b".into(), sent),
            Some((Duration::from_millis(3), "failed"))
        );
        // Control: nothing is left half-done, and an unknown outcome waits for its reply.
        assert!(halves.submitted.is_empty() && halves.early.is_empty());
        assert_eq!(halves.on_outcome("c".into(), "completed", seen), None);
    }
}
