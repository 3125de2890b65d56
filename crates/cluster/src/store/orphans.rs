//! Which nodes' durable dispatches to take over: plain data, fed one scan at a time.
//!
//! A node's membership entry can be missing for a moment that is no loss (a node restarting
//! under the same name has opened its store and resumed its dispatches before it claims its
//! name again), so an owner counts as lost only when it was missing from two scans in a row.

use std::collections::HashSet;

/// Owners missing from the membership bucket, scan after scan.
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    missing_last_scan: HashSet<String>,
}

impl Orphans {
    /// One scan: `live` are the nodes with a membership entry, `owners` the owners of the
    /// unfinished dispatches seen. Returns the owners whose dispatches `me` may take over now:
    /// missing from this scan and the one before, and not `me`.
    pub(crate) fn scan<'a>(
        &mut self,
        me: &str,
        live: &HashSet<String>,
        owners: impl IntoIterator<Item = &'a str>,
    ) -> HashSet<String> {
        let missing: HashSet<String> = owners
            .into_iter()
            .filter(|owner| *owner != me && !live.contains(*owner))
            .map(str::to_owned)
            .collect();
        let lost = missing
            .intersection(&self.missing_last_scan)
            .cloned()
            .collect();
        self.missing_last_scan = missing;
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn an_owner_is_lost_only_when_missing_from_two_scans_in_a_row() {
        let mut orphans = Orphans::default();
        let live = set(&["b", "c"]);
        assert_eq!(orphans.scan("b", &live, ["a", "b", "c"]), set(&[]));
        assert_eq!(orphans.scan("b", &live, ["a", "c"]), set(&["a"]));
        // Control: an owner back in the membership bucket between two scans is not lost.
        let mut orphans = Orphans::default();
        assert_eq!(orphans.scan("b", &live, ["a"]), set(&[]));
        assert_eq!(orphans.scan("b", &set(&["a", "b"]), ["a"]), set(&[]));
        assert_eq!(orphans.scan("b", &live, ["a"]), set(&[]));
    }

    #[test]
    fn a_node_never_takes_over_its_own_dispatches() {
        let mut orphans = Orphans::default();
        let nobody = set(&[]);
        orphans.scan("a", &nobody, ["a"]);
        assert_eq!(orphans.scan("a", &nobody, ["a"]), set(&[]));
        // Control: another node sees "a" lost.
        let mut other = Orphans::default();
        other.scan("b", &nobody, ["a"]);
        assert_eq!(other.scan("b", &nobody, ["a"]), set(&["a"]));
    }
}
