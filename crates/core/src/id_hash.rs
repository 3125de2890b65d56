//! A cheap hasher for maps keyed by ids the gateway numbers itself.
//!
//! Task ids and lane ids are counters the gateway assigns, looked up several times per
//! dispatch; the standard library's SipHash is built to resist keys a peer chooses, which
//! these are not, and costs several times more per lookup. [`IdHasher`] multiplies each word
//! by an odd constant (the Fx hash of rustc): a bijection on the low bits, so consecutive
//! ids never share a bucket, and well spread in the high bits the table's tag byte is taken
//! from. Never key an [`IdMap`] by a value a peer can choose freely.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// Hashes integer ids by multiplication; see the module documentation for where it is safe.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher {
    hash: u64,
}

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

/// Builds [`IdHasher`]s; the hasher parameter of [`IdMap`] and [`IdSet`].
pub type IdBuildHasher = BuildHasherDefault<IdHasher>;

/// A `HashMap` keyed by gateway-assigned ids, hashed with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, IdBuildHasher>;

/// A `HashSet` of gateway-assigned ids, hashed with [`IdHasher`].
pub type IdSet<K> = HashSet<K, IdBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TaskId;
    use std::collections::HashSet as StdSet;
    use std::hash::{BuildHasher, Hash};

    fn hash_of<H: Hasher + Default>(id: TaskId) -> u64 {
        let mut hasher = H::default();
        id.hash(&mut hasher);
        hasher.finish()
    }

    /// Whether 1,024 consecutive ids fill 1,024 buckets (low bits) and most of the 128 tag
    /// values (top 7 bits), the two parts of a hash the standard table uses.
    fn spreads_consecutive_ids<H: Hasher + Default>() -> bool {
        let hashes: Vec<u64> = (5_000..6_024)
            .map(|n| hash_of::<H>(TaskId::from_raw(n)))
            .collect();
        let buckets: StdSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        let tags: StdSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        buckets.len() == 1_024 && tags.len() >= 120
    }

    /// The identity hash: a control that keeps the low bits but puts every id under one tag.
    #[derive(Default)]
    struct Identity(u64);

    impl Hasher for Identity {
        fn write(&mut self, _: &[u8]) {}
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
        fn finish(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn consecutive_task_ids_spread_over_buckets_and_tags() {
        assert!(spreads_consecutive_ids::<IdHasher>());
        assert!(
            !spreads_consecutive_ids::<Identity>(),
            "control: identity hashing clusters tags"
        );
    }

    #[test]
    fn an_id_map_finds_what_it_holds_and_nothing_else() {
        let mut map: IdMap<TaskId, u64> = IdMap::default();
        for n in 0..10_000 {
            map.insert(TaskId::from_raw(n * 7), n);
        }
        assert_eq!(map.len(), 10_000);
        assert!((0..10_000).all(|n| map.get(&TaskId::from_raw(n * 7)) == Some(&n)));
        assert_eq!(map.get(&TaskId::from_raw(1)), None);
    }

    #[test]
    fn byte_writes_depend_on_every_byte() {
        let build = IdBuildHasher::default();
        assert_ne!(build.hash_one("lane-1"), build.hash_one("lane-2"));
        assert_ne!(
            build.hash_one([0u8; 9].as_slice()),
            build.hash_one([0u8; 10].as_slice())
        );
    }
}
