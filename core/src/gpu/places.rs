//! `SeriesPlaces`: where each GPU's series is in a list of them, by its key, holding only the
//! places (eight bytes a series). The series hold their keys; a map of keys would hold a second
//! copy of each (two strings and a slot of 80 bytes, about 2 MB a fetch at 10,000 GPUs).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::{GpuKey, GpuSeries};

/// The places of the series in one list, by key. The keys come from a peer's labels, so they are
/// hashed with std's SipHash under this process's own keys (`reclaimer_core::ids`' rule).
#[derive(Debug, Default)]
pub struct SeriesPlaces {
    hasher: std::hash::RandomState,
    places: HashTable<usize>,
}

impl SeriesPlaces {
    /// The place of the series with this key in `series` (the list the places were given for).
    pub fn get(&self, series: &[GpuSeries], key: &GpuKey) -> Option<usize> {
        self.places.find(self.hasher.hash_one(key), |&i| series.get(i).is_some_and(|s| s.key == *key)).copied()
    }

    /// Notes `series[place]`, whose key no noted series has (`get` said so).
    pub fn insert(&mut self, series: &[GpuSeries], place: usize) {
        let Some(new) = series.get(place) else { return };
        let hasher = &self.hasher;
        let rehash = |i: &usize| series.get(*i).map_or(0, |s| hasher.hash_one(&s.key));
        self.places.insert_unique(hasher.hash_one(&new.key), place, rehash);
    }

    /// How many series are noted.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn series(uuid: &str, pod: Option<&str>) -> GpuSeries {
        let key = GpuKey { uuid: uuid.into(), gpu_instance: None, pod: pod.map(str::to_string) };
        GpuSeries::with_key(key, (None, None), |_| None, &Arc::from("test"))
    }

    #[test]
    fn finds_each_series_by_its_key_and_nothing_else() {
        let mut list = Vec::new();
        let mut places = SeriesPlaces::default();
        for i in 0..1_000 {
            let s = series(&format!("GPU-{i}"), (i % 2 == 0).then_some("coder-pod"));
            assert_eq!(places.get(&list, &s.key), None);
            list.push(s);
            places.insert(&list, i);
        }
        assert_eq!(places.len(), 1_000);
        for (i, s) in list.iter().enumerate() {
            assert_eq!(places.get(&list, &s.key), Some(i));
        }
        // The pod is part of the key: the same UUID under another pod is another series.
        assert_eq!(places.get(&list, &series("GPU-0", None).key), None);
        assert_eq!(places.get(&list, &series("GPU-1", Some("coder-pod")).key), None);
        assert_eq!(places.get(&list, &series("GPU-1000", None).key), None);
    }
}
