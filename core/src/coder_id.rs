//! `CoderId`: an id Coder made (a UUID: 36 bytes of text), held inline instead of in a
//! `String`. A listed workspace names eight of them besides its own id (its owner, template,
//! organization, build, build's job, initiator, template version, and each agent); as `String`s
//! each cost 24 bytes and a 48-byte heap block: 5.8 MB and 80,000 allocations a listing of
//! 10,000 workspaces. Inline, each is 40 bytes and no allocation: 3.2 MB. A GPU series names its
//! workspace with one, and the windows and the status document key theirs by one. Text longer than 36 bytes
//! (never a Coder id, but a peer may send anything) is kept on the heap as it came: nothing is
//! cut or refused. It reads, compares, hashes, prints and serializes as its text.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest text held inline: a UUID's.
const INLINE: usize = 36;

/// An id Coder made, as text (see the module).
#[derive(Clone)]
pub struct CoderId(Repr);

#[derive(Clone)]
enum Repr {
    /// `len` bytes of UTF-8 text (copied from a `&str`, so always valid).
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Heap(Box<str>),
}

impl CoderId {
    pub fn new(text: &str) -> Self {
        if text.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..text.len()].copy_from_slice(text.as_bytes());
            CoderId(Repr::Inline { len: text.len() as u8, bytes })
        } else {
            CoderId(Repr::Heap(text.into()))
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Copied whole from a `&str` of at most `INLINE` bytes: always valid UTF-8.
            Repr::Inline { len, bytes } => std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default(),
            Repr::Heap(text) => text,
        }
    }
}

impl Default for CoderId {
    fn default() -> Self {
        CoderId::new("")
    }
}

impl Deref for CoderId {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for CoderId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for CoderId {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for CoderId {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for CoderId {}

/// As its text hashes (`Borrow<str>`: a map keyed by ids is looked up by `&str`).
impl Hash for CoderId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for CoderId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CoderId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialEq<str> for CoderId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for CoderId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for CoderId {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<CoderId> for String {
    fn eq(&self, other: &CoderId) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<CoderId> for str {
    fn eq(&self, other: &CoderId) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<CoderId> for &str {
    fn eq(&self, other: &CoderId) -> bool {
        *self == other.as_str()
    }
}

impl From<&str> for CoderId {
    fn from(text: &str) -> Self {
        CoderId::new(text)
    }
}

impl From<String> for CoderId {
    fn from(text: String) -> Self {
        CoderId::new(&text)
    }
}

impl From<&String> for CoderId {
    fn from(text: &String) -> Self {
        CoderId::new(text)
    }
}

impl From<CoderId> for String {
    fn from(id: CoderId) -> Self {
        id.as_str().to_string()
    }
}

impl From<&CoderId> for String {
    fn from(id: &CoderId) -> Self {
        id.as_str().to_string()
    }
}

impl fmt::Display for CoderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// As its text's (`"…"`), so that what prints it reads as before.
impl fmt::Debug for CoderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for CoderId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CoderId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = CoderId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an id (a string)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CoderId, E> {
                Ok(CoderId::new(v))
            }
        }
        d.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0fbd8bcd-1c0b-4a46-8a5e-7b1c4d2e9f10";

    #[test]
    fn a_uuid_is_held_inline_in_40_bytes_and_reads_back_as_it_came() {
        assert_eq!(std::mem::size_of::<CoderId>(), 40);
        assert_eq!(std::mem::size_of::<Option<CoderId>>(), 40, "the tag's spare values mark None");
        let id = CoderId::new(UUID);
        assert!(matches!(id.0, Repr::Inline { .. }));
        assert_eq!(id.as_str(), UUID);
        assert_eq!(id, UUID);
        assert_eq!(format!("{id} {id:?}"), format!("{UUID} {UUID:?}"));
        assert_eq!(CoderId::default().as_str(), "");
    }

    #[test]
    fn longer_text_and_multibyte_text_are_kept_whole() {
        let long = format!("{UUID}-and-more");
        let id = CoderId::new(&long);
        assert!(matches!(id.0, Repr::Heap(_)));
        assert_eq!(id, long);
        // 36 bytes of multibyte text: inline, and still whole.
        let wide = "é".repeat(18);
        assert_eq!(CoderId::new(&wide), wide);
    }

    #[test]
    fn it_hashes_compares_and_serializes_as_its_text() {
        let mut map = std::collections::HashMap::new();
        map.insert(CoderId::new(UUID), 1);
        assert_eq!(map.get(UUID), Some(&1), "looked up by &str");
        assert!(CoderId::new("a") < CoderId::new("b"));
        let json = serde_json::to_string(&CoderId::new(UUID)).unwrap();
        assert_eq!(json, format!("\"{UUID}\""));
        let back: CoderId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, UUID);
        let escaped: CoderId = serde_json::from_str(r#""a\"b""#).unwrap();
        assert_eq!(escaped, "a\"b");
    }
}
