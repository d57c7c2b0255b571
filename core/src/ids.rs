//! The hasher of the maps keyed by ids Coder made (workspace and build ids, timeline indices):
//! the maps every pass reads once or more per listed workspace (the judge's sessions, warnings
//! and windows, the ledger's stops and countdowns, a backtest chunk's series by workspace).
//!
//! std's default, SipHash-1-3, costs about as much as the rest of a lookup for a 36-byte id, and
//! those lookups were the replay's largest single cost (10,000 workspaces x 10,081 passes, about
//! fifteen lookups each). `IdHash` mixes eight bytes at a time with one folded 64x64-bit multiply
//! under two keys drawn once per process from `RandomState`, so nobody outside knows the keys.
//!
//! **Use it only where the keys inserted are Coder's own ids** (or indices, or digests keyed
//! with this process's secret keys, as a Prometheus fetch's label sets are remembered): a peer
//! may make any lookup (a Prometheus label naming a workspace), and a lookup costs the length of
//! the chain those keys form, whatever it is asked. Maps whose keys a peer writes (label sets,
//! template names, GPU keys) keep std's SipHash, or key the map by a keyed digest of the key
//! (`Digests`, `DigestMap`): 16 bytes a key instead of a copy, for maps a fetch fills with
//! thousands of peer-written keys.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// A map keyed by Coder's ids (see the module's rule).
pub type IdMap<K, V> = HashMap<K, V, IdHash>;
/// A set of Coder's ids (see the module's rule).
pub type IdSet<K> = HashSet<K, IdHash>;

/// Builds `IdHasher`s under this process's two keys.
#[derive(Debug, Clone, Copy)]
pub struct IdHash {
    seed: u64,
    multiplier: u64,
}

impl Default for IdHash {
    fn default() -> Self {
        static KEYS: OnceLock<(u64, u64)> = OnceLock::new();
        let &(seed, multiplier) = KEYS.get_or_init(|| {
            let random = std::collections::hash_map::RandomState::new();
            (random.hash_one(0x5eed_u64), random.hash_one(0x6d75_6c74_u64) | 1)
        });
        IdHash { seed, multiplier }
    }
}

impl BuildHasher for IdHash {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher { state: self.seed, multiplier: self.multiplier }
    }
}

/// 128-bit digests of what a peer wrote (label sets, GPU keys, pod names), under keys this
/// process drew: a SipHash value (`RandomState`) and `IdHash`'s. Two different inputs share one by
/// chance about once in 2^64 maps of 10,000 keys; on purpose it takes the SipHash key, which never
/// leaves the process (a peer who cannot see the digests has one chance in 2^64 a try). A map
/// keyed by these digests may use `IdHash` (nobody outside chooses them), and holds 16 bytes a key
/// instead of the key.
#[derive(Debug, Default)]
pub struct Digests {
    sip: std::collections::hash_map::RandomState,
    id: IdHash,
}

impl Digests {
    pub fn of<T: std::hash::Hash + ?Sized>(&self, value: &T) -> (u64, u64) {
        (self.sip.hash_one(value), self.id.hash_one(value))
    }
}

/// A map keyed by what a peer wrote (a GPU's key, a pod's name), holding 16 bytes of digest a key
/// (`Digests`) instead of a copy of it: a fetch's index of 10,000 GPU keys held two strings and an
/// 80-byte slot each, about 2 MB.
#[derive(Debug, Default)]
pub struct DigestMap<V> {
    digests: Digests,
    map: IdMap<(u64, u64), V>,
}

impl<V> DigestMap<V> {
    pub fn get<K: std::hash::Hash + ?Sized>(&self, key: &K) -> Option<&V> {
        self.map.get(&self.digests.of(key))
    }

    pub fn contains<K: std::hash::Hash + ?Sized>(&self, key: &K) -> bool {
        self.map.contains_key(&self.digests.of(key))
    }

    pub fn insert<K: std::hash::Hash + ?Sized>(&mut self, key: &K, value: V) -> Option<V> {
        self.map.insert(self.digests.of(key), value)
    }

    /// The value of `key`, made with `make` when there is none.
    pub fn get_or_insert_with<K: std::hash::Hash + ?Sized>(&mut self, key: &K, make: impl FnOnce() -> V) -> &mut V {
        self.map.entry(self.digests.of(key)).or_insert_with(make)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// One hash in progress (`IdHash`).
#[derive(Debug, Clone, Copy)]
pub struct IdHasher {
    state: u64,
    multiplier: u64,
}

/// The 128-bit product folded to 64 bits: every input bit reaches every output bit.
fn folded_multiply(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl IdHasher {
    fn mix(&mut self, word: u64) {
        self.state = folded_multiply(self.state ^ word, self.multiplier);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(word);
            self.mix(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            // The length in the top byte: a short tail of zeros differs from no tail.
            self.mix(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n) | 1 << 63);
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        folded_multiply(self.state, self.multiplier.rotate_left(32) | 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(s: &str) -> u64 {
        IdHash::default().hash_one(s)
    }

    #[test]
    fn a_digest_map_finds_each_key_it_was_given_and_no_other() {
        let mut map = DigestMap::default();
        let key = |i: usize| (format!("GPU-{i}"), (i % 2 == 0).then(|| "coder-pod".to_string()));
        for i in 0..1_000 {
            assert_eq!(map.insert(&key(i), i), None);
        }
        assert_eq!(map.len(), 1_000);
        assert!((0..1_000).all(|i| map.get(&key(i)) == Some(&i)));
        // Part of a key differing is another key.
        assert_eq!(map.get(&("GPU-1".to_string(), Some("coder-pod".to_string()))), None);
        assert_eq!(map.get(&("GPU-0".to_string(), None::<String>)), None);
        *map.get_or_insert_with(&key(7), || 0) += 10;
        *map.get_or_insert_with(&key(1_000), || 0) += 1;
        assert_eq!((map.get(&key(7)), map.get(&key(1_000)), map.len()), (Some(&17), Some(&1), 1_001));
    }

    #[test]
    fn one_process_hashes_an_id_the_same_way_every_time() {
        let id = "3f1e8f4a-9c4b-4c1e-8d5e-0a9b7c6d5e4f";
        let copy = String::from(id);
        assert_eq!(hash(id), hash(&copy), "a copy elsewhere in memory");
        assert_eq!(IdHash::default().hash_one(7usize), IdHash::default().hash_one(7usize));
    }

    #[test]
    fn ids_that_differ_in_one_character_anywhere_hash_apart() {
        let id = "3f1e8f4a-9c4b-4c1e-8d5e-0a9b7c6d5e4f";
        let mut seen = HashSet::new();
        seen.insert(hash(id));
        for i in 0..id.len() {
            let mut b = id.as_bytes().to_vec();
            b[i] ^= 1;
            let other = String::from_utf8(b).unwrap_or_default();
            assert!(seen.insert(hash(&other)), "a change at byte {i} collided");
        }
        // A prefix, a tail of zero bytes and the empty id are other ids.
        for other in ["", "3f1e8f4a", "3f1e8f4a\0", "3f1e8f4a\0\0\0\0\0\0\0\0"] {
            assert!(seen.insert(hash(other)), "{other:?} collided");
        }
    }

    /// hashbrown picks the bucket from the low bits and a tag from the top seven: ids that
    /// differ only in their last characters (Coder's ids are random, but a fleet's workspace
    /// names are not) must spread over both.
    #[test]
    fn sequential_ids_spread_over_the_low_and_the_high_bits() {
        let n = 4096u64;
        let hashes: Vec<u64> = (0..n).map(|i| hash(&format!("00000000-0000-4000-8000-{i:012}"))).collect();
        let low: HashSet<u64> = hashes.iter().map(|h| h & 0xfff).collect();
        let high: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        // 4,096 balls in 4,096 bins fill about 63% of them at random; in 128 bins, all.
        assert!(low.len() > 2400, "low 12 bits took {} values of 4096", low.len());
        assert_eq!(high.len(), 128, "the top 7 bits");
    }
}
