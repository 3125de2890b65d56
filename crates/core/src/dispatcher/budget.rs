//! The transport-loss budget of one dispatch: how many lost workers it may outlive.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Counts the worker losses of one dispatch inside a sliding window.
#[derive(Debug)]
pub(crate) struct LossBudget {
    budget: u32,
    window: Duration,
    losses: VecDeque<Instant>,
}

impl LossBudget {
    pub(crate) fn new(budget: u32, window: Duration) -> Self {
        Self {
            budget,
            window,
            losses: VecDeque::new(),
        }
    }

    /// Records a loss at `now`; true while the losses inside the window stay within budget
    /// (the dispatch is delivered again), false once they exceed it.
    pub(crate) fn record(&mut self, now: Instant) -> bool {
        while self
            .losses
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= self.window)
        {
            self.losses.pop_front();
        }
        self.losses.push_back(now);
        self.losses.len() <= self.budget as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_within_the_budget_are_forgiven_and_one_more_is_not() {
        let t0 = Instant::now();
        let mut budget = LossBudget::new(3, Duration::from_secs(60));
        for i in 0..3 {
            assert!(budget.record(t0 + Duration::from_secs(i)), "loss {i}");
        }
        assert!(!budget.record(t0 + Duration::from_secs(3)));
    }

    #[test]
    fn losses_older_than_the_window_no_longer_count() {
        let t0 = Instant::now();
        let mut budget = LossBudget::new(1, Duration::from_secs(10));
        assert!(budget.record(t0));
        assert!(budget.record(t0 + Duration::from_secs(10)));
        assert!(budget.record(t0 + Duration::from_secs(20)));
        // Control: two losses inside one window exceed a budget of one.
        assert!(!budget.record(t0 + Duration::from_secs(21)));
    }

    #[test]
    fn a_zero_budget_ends_at_the_first_loss() {
        let mut budget = LossBudget::new(0, Duration::from_secs(10));
        assert!(!budget.record(Instant::now()));
    }
}
