//! A hasher for the `u64` keys a node derives itself (the forward ids it counts, the pool keys
//! it hashes from names): one multiply where SipHash runs a dozen rounds, for maps whose keys
//! no peer chooses.

use std::hash::{BuildHasherDefault, Hasher};

/// An odd constant whose product spreads consecutive ids over the high bits as well as the low
/// ones (the table's control bytes are the top 7 bits, its bucket the low ones).
const SPREAD: u64 = 0xf135_7aea_2e62_a9c5;

/// Hashes `u64` keys with one multiply; other input is folded in a word at a time.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(SPREAD);
    }
}

/// The [`IdHasher`] for a `HashMap`'s third parameter.
pub(crate) type IdHash = BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    use super::*;

    /// Consecutive forward ids differ in the top 7 bits the table filters on, not only in the
    /// low bits that pick a bucket; the control, the ids themselves as their hash, share one
    /// top-7-bit value across the whole run.
    #[test]
    fn consecutive_ids_spread_over_the_top_bits() {
        let top = |hash: u64| hash >> 57;
        let hashed: HashSet<u64> = (1..=128u64)
            .map(|id| top(IdHash::default().hash_one(id)))
            .collect();
        assert!(
            hashed.len() >= 64,
            "{} distinct top-7-bit values",
            hashed.len()
        );
        let identity: HashSet<u64> = (1..=128u64).map(top).collect();
        assert_eq!(identity.len(), 1);
    }
}
