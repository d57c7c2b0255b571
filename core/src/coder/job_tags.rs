//! `JobTags`: a provisioner job's tags (`job.tags`) in one allocation, read and written as the
//! JSON object Coder sends.

use serde::{Deserialize, Serialize};

/// A job's provisioner tags (`job.tags`, a JSON object of strings), kept in one allocation: every
/// listed workspace has them (a map of two strings cost about 600 bytes each, 6 MB at 10,000
/// workspaces). Sorted by key; read and written as the JSON object.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobTags(Box<str>);

impl JobTags {
    /// From key-value pairs (a repeated key: the last value wins, as serde reads a map).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        let map: std::collections::BTreeMap<String, String> = pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        let mut text = String::new();
        for (k, v) in &map {
            text.push_str(&format!("{}:{k}{}:{v}", k.len(), v.len()));
        }
        JobTags(text.into_boxed_str())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut rest: &str = &self.0;
        std::iter::from_fn(move || {
            let mut take = || {
                let (len, tail) = rest.split_once(':')?;
                let len: usize = len.parse().ok()?;
                let (text, tail) = (tail.get(..len)?, tail.get(len..)?);
                rest = tail;
                Some(text)
            };
            Some((take()?, take()?))
        })
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

impl std::fmt::Display for JobTags {
    /// `{gpu=true, owner=, scope=organization}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner: Vec<String> = self.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{{{}}}", inner.join(", "))
    }
}

impl std::fmt::Debug for JobTags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for JobTags {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for JobTags {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = std::collections::BTreeMap::<String, String>::deserialize(d)?;
        Ok(JobTags::from_pairs(map))
    }
}
