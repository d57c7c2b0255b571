//! Splits a JSON document, as its bytes arrive, into the elements of one array (found by its key
//! path, e.g. `data.result`) and the rest. Each element comes out as one contiguous slice, to be
//! parsed on its own from memory, and the rest (with that array left empty) is kept to be
//! parsed last. A 10,000-workspace listing (42 MB) or a first Prometheus pass (14 MB per field)
//! is thus never held whole, yet parsed at slice speed: serde_json reading an `io::Read` goes
//! byte by byte through it, which took 40% of a pass's CPU.
//!
//! The splitter only tracks strings, escapes and nesting; it validates nothing. Inside an
//! element it only counts brackets and skips strings, copying whole runs. Whatever the bytes, it
//! never panics, and a malformed document fails when its pieces are parsed. A receiver may read an
//! element straight from the chunk (`OnElement::element_at_start`), so that most are read once (one
//! that runs past its chunk's end is read in part, then again once split off). It uses only
//! `json_read`'s byte tables and depth limit.

use crate::json_read::{BRACKETS_AND_QUOTE, MAX_DEPTH, table};

/// What receives the elements: each whole element's bytes, or, first, the bytes from where an
/// element begins to the end of the chunk, to read it there if it lies whole in them.
pub trait OnElement {
    /// One whole element.
    fn element(&mut self, bytes: &[u8]) -> Result<(), String>;
    /// `bytes` begin with an element and may end inside it: `Some(length)` when it was read
    /// whole from them, `None` to be handed it whole later (the bytes are then read again).
    fn element_at_start(&mut self, bytes: &[u8]) -> Result<Option<usize>, String> {
        let _ = bytes;
        Ok(None)
    }
}

impl<F: FnMut(&[u8]) -> Result<(), String> + ?Sized> OnElement for F {
    fn element(&mut self, bytes: &[u8]) -> Result<(), String> {
        self(bytes)
    }
}

/// One open container outside the elements.
#[derive(Debug, Clone, Copy)]
enum Frame {
    /// An object; `key_matches`: its current key is the path's key at this depth.
    Object {
        expect_key: bool,
        key_matches: bool,
    },
    Array {
        target: bool,
    },
}

/// The state of one split: feed it the chunks in order, then `finish`.
#[derive(Debug)]
pub struct Splitter {
    path: &'static [&'static str],
    /// An element, or the rest, larger than this is refused: each is held whole while read.
    max_piece: usize,
    /// Open containers outside the elements (the target array the innermost while it is open).
    stack: Vec<Frame>,
    in_string: bool,
    escaped: bool,
    /// The string being read is a key on the path's depth: its bytes are kept to compare.
    key: Option<Vec<u8>>,
    /// The document without the target array's elements.
    rest: Vec<u8>,
    /// The element being read.
    element: Vec<u8>,
    /// An element has begun and not ended.
    in_element: bool,
    /// Brackets open inside the current element.
    element_depth: usize,
    /// The target array is open.
    target_open: bool,
}

/// The bytes that may change the state outside strings.
static STRUCTURAL: [bool; 256] = table(b"\"\\{}[],:");

impl Splitter {
    /// `path`: the object keys from the root to the array, e.g. `&["workspaces"]`; `max_piece`:
    /// the most bytes one element, or the rest of the document, may take.
    pub fn new(path: &'static [&'static str], max_piece: usize) -> Self {
        Splitter {
            path,
            max_piece,
            stack: Vec::new(),
            in_string: false,
            escaped: false,
            key: None,
            rest: Vec::new(),
            element: Vec::new(),
            in_element: false,
            element_depth: 0,
            target_open: false,
        }
    }

    /// Reads one chunk, handing each element completed in it to `on_element`; stops at the
    /// first error `on_element` returns.
    pub fn feed(&mut self, chunk: &[u8], on_element: &mut dyn OnElement) -> Result<(), String> {
        let mut i = 0;
        while let Some(&b) = chunk.get(i) {
            if self.in_element {
                i = self.element_run(chunk, i, on_element)?;
            } else if self.target_open {
                // Between elements: separators and whitespace belong to no one.
                match b {
                    b',' => {}
                    b']' => {
                        self.rest.push(b);
                        self.structural_byte(b)?;
                    }
                    b if b.is_ascii_whitespace() => {}
                    _ => {
                        // Most elements lie whole in the chunk: read there, they are read once.
                        match on_element.element_at_start(chunk.get(i..).unwrap_or_default())? {
                            Some(read) if read > self.max_piece => return Err(self.too_large()),
                            Some(read) if read > 0 => i += read,
                            // Not read here (nothing read is not an element): split off first.
                            _ => self.in_element = true, // the element starts with this byte
                        }
                        continue;
                    }
                }
                i += 1;
            } else {
                i = self.envelope_run(chunk, i)?;
            }
            if self.rest.len() > self.max_piece {
                return Err(self.too_large());
            }
        }
        Ok(())
    }

    /// Bytes held now (the element being read and the rest of the document): never more than
    /// about twice `max_piece` plus the nesting, whatever a peer sends (property-tested).
    pub fn held(&self) -> usize {
        self.element.len() + self.rest.len() + self.stack.len() + self.key.as_ref().map_or(0, Vec::len)
    }

    /// The document without the target array's elements; a document cut short is an error.
    pub fn finish(self) -> Result<Vec<u8>, String> {
        if self.in_element || self.in_string || !self.stack.is_empty() {
            return Err("the JSON document ends early".into());
        }
        Ok(self.rest)
    }

    /// Reads an element's bytes from `i`: to its end (then hands it on) or the chunk's. Only
    /// strings and brackets matter here: string text is skipped with `memchr`, other bytes by a
    /// table, and the bytes are copied as one run.
    fn element_run(&mut self, chunk: &[u8], i: usize, on_element: &mut dyn OnElement) -> Result<usize, String> {
        let mut j = i;
        let mut ended = false;
        while let Some(&b) = chunk.get(j) {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    j += 1;
                    continue;
                }
                let text = chunk.get(j..).unwrap_or_default();
                match memchr::memchr2(b'"', b'\\', text) {
                    None => j = chunk.len(),
                    Some(p) => {
                        j += p + 1;
                        if text.get(p) == Some(&b'\\') {
                            self.escaped = true;
                        } else {
                            self.in_string = false;
                            if self.element_depth == 0 {
                                ended = true; // a string element
                                break;
                            }
                        }
                    }
                }
                continue;
            }
            if self.element_depth > 0 && !BRACKETS_AND_QUOTE[usize::from(b)] {
                j += 1;
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.element_depth += 1;
                    if self.element_depth + self.stack.len() > MAX_DEPTH {
                        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                    }
                }
                b'}' | b']' if self.element_depth > 0 => {
                    self.element_depth -= 1;
                    if self.element_depth == 0 {
                        j += 1;
                        ended = true; // an object or array element
                        break;
                    }
                }
                // A number or literal ends where a separator, the array's end or a space begins.
                b',' | b']' | b'}' if self.element_depth == 0 => {
                    ended = true;
                    break;
                }
                b if self.element_depth == 0 && b.is_ascii_whitespace() => {
                    ended = true;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        self.element.extend_from_slice(chunk.get(i..j).unwrap_or_default());
        if self.element.len() > self.max_piece {
            return Err(self.too_large());
        }
        if ended && self.element.is_empty() {
            return Err("an array element that is no JSON value".into());
        }
        if ended {
            self.in_element = false;
            on_element.element(&self.element)?;
            self.element.clear();
        }
        Ok(j)
    }

    /// Reads the document outside the elements from `i`: a run of string text at once, or one
    /// byte that may change the state. Returns where it stopped.
    fn envelope_run(&mut self, chunk: &[u8], i: usize) -> Result<usize, String> {
        let rest = chunk.get(i..).unwrap_or_default();
        let run = match (self.in_string, self.escaped) {
            (true, false) => rest.iter().position(|&c| c == b'"' || c == b'\\').unwrap_or(rest.len()),
            _ => 0,
        };
        if run > 0 {
            let text = rest.get(..run).unwrap_or_default();
            self.rest.extend_from_slice(text);
            if let Some(key) = &mut self.key {
                // Keys on the path are short; a long one cannot match and stops being kept.
                key.extend_from_slice(text.get(..64usize.saturating_sub(key.len())).unwrap_or(text));
            }
            return Ok(i + run);
        }
        let Some(&b) = rest.first() else { return Ok(i) };
        self.rest.push(b);
        if self.in_string {
            self.string_byte(b);
        } else if STRUCTURAL[usize::from(b)] {
            self.structural_byte(b)?;
        }
        Ok(i + 1)
    }

    fn too_large(&self) -> String {
        format!("one element, or what is not in the array, is larger than {} bytes", self.max_piece)
    }

    fn string_byte(&mut self, b: u8) {
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' {
            self.escaped = true;
        } else if b == b'"' {
            self.in_string = false;
            if let Some(key) = self.key.take() {
                let depth = self.stack.len().saturating_sub(1);
                let matches = self.path.get(depth).is_some_and(|want| want.as_bytes() == key.as_slice());
                if let Some(Frame::Object { key_matches, .. }) = self.stack.last_mut() {
                    *key_matches = matches;
                }
            }
            return;
        }
        if let Some(key) = self.key.as_mut().filter(|k| k.len() < 64) {
            key.push(b);
        }
    }

    fn structural_byte(&mut self, b: u8) -> Result<(), String> {
        match b {
            b'"' => {
                self.in_string = true;
                if let Some(Frame::Object { expect_key: true, .. }) = self.stack.last() {
                    if self.stack.len() <= self.path.len() {
                        self.key = Some(Vec::new());
                    }
                }
            }
            b':' => {
                if let Some(Frame::Object { expect_key, .. }) = self.stack.last_mut() {
                    *expect_key = false;
                }
            }
            b',' => {
                if let Some(Frame::Object { expect_key, key_matches }) = self.stack.last_mut() {
                    *expect_key = true;
                    *key_matches = false;
                }
            }
            b'{' | b'[' => {
                if self.stack.len() >= MAX_DEPTH {
                    return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                }
                let on_path = b == b'['
                    && !self.target_open
                    && self.stack.len() == self.path.len()
                    && self.stack.iter().all(|f| matches!(f, Frame::Object { key_matches: true, expect_key: false }));
                self.stack.push(if b == b'{' {
                    Frame::Object { expect_key: true, key_matches: false }
                } else {
                    Frame::Array { target: on_path }
                });
                self.target_open |= on_path;
            }
            b'}' | b']' => {
                if let Some(Frame::Array { target: true }) = self.stack.pop() {
                    self.target_open = false;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `doc` fed in chunks of `chunk` bytes: (elements, rest).
    fn split(path: &'static [&'static str], doc: &str, chunk: usize) -> Result<(Vec<String>, String), String> {
        let mut s = Splitter::new(path, 1 << 20);
        let mut elements = Vec::new();
        for piece in doc.as_bytes().chunks(chunk.max(1)) {
            s.feed(piece, &mut |e: &[u8]| {
                elements.push(String::from_utf8_lossy(e).into_owned());
                Ok(())
            })?;
        }
        Ok((elements, String::from_utf8_lossy(&s.finish()?).into_owned()))
    }

    #[test]
    fn splits_the_array_at_the_path_from_the_rest() {
        let doc = r#"{"workspaces": [ {"a":1,"t":"x,]}\"{["} ,{"b":[2,{"c":[]}]}
        ],"count":2}"#;
        for chunk in [1, 2, 7, doc.len()] {
            let (elements, rest) = split(&["workspaces"], doc, chunk).unwrap();
            assert_eq!(elements, [r#"{"a":1,"t":"x,]}\"{["}"#, r#"{"b":[2,{"c":[]}]}"#], "chunks of {chunk}");
            assert_eq!(rest, r#"{"workspaces": [],"count":2}"#);
        }
    }

    #[test]
    fn follows_a_nested_path_and_ignores_the_same_key_elsewhere() {
        let doc = r#"{"result":[9],"data":{"resultType":"matrix","x":{"result":[8]},"result":[1, "two" ,true,null,{"metric":{}}]},"status":"success"}"#;
        let (elements, rest) = split(&["data", "result"], doc, 3).unwrap();
        assert_eq!(elements, ["1", "\"two\"", "true", "null", r#"{"metric":{}}"#]);
        assert_eq!(rest, r#"{"result":[9],"data":{"resultType":"matrix","x":{"result":[8]},"result":[]},"status":"success"}"#);
        let (none, rest) = split(&["data", "result"], r#"{"data":{"result":[]}}"#, 1).unwrap();
        assert!(none.is_empty());
        assert_eq!(rest, r#"{"data":{"result":[]}}"#);
        let (elements, _) = split(&["data", "result"], r#"{"status":"error","error":"\"data\":{\"result\":[1]}"}"#, 4).unwrap();
        assert!(elements.is_empty(), "keys inside strings are text");
    }

    #[test]
    fn a_document_cut_short_or_nested_too_deep_is_refused() {
        assert!(split(&["workspaces"], r#"{"workspaces":[{"a":1},{"b"#, 5).is_err());
        assert!(split(&["workspaces"], r#"{"workspaces":[1,2"#, 5).is_err());
        assert!(split(&["workspaces"], r#"{"workspaces":"abc"#, 5).is_err());
        let deep = format!(r#"{{"workspaces":[{}]}}"#, "[".repeat(MAX_DEPTH + 1));
        assert!(split(&["workspaces"], &deep, 64).is_err());
    }

    #[test]
    fn a_piece_over_the_limit_is_refused() {
        let mut s = Splitter::new(&["w"], 20);
        assert!(s.feed(br#"{"w":[{"a":"0123456789"},"#, &mut |_: &[u8]| Ok(())).is_ok());
        assert!(s.feed(br#"{"a":"0123456789abcdef"}"#, &mut |_: &[u8]| Ok(())).is_err(), "an element over 20 bytes");
        let mut s = Splitter::new(&["w"], 20);
        assert!(s.feed(br#"{"x":"0123456789abcdef","w":[]}"#, &mut |_: &[u8]| Ok(())).is_err(), "the rest over 20 bytes");
    }

    #[test]
    fn stray_bytes_in_the_array_are_an_error_not_a_hang() {
        assert!(split(&["w"], r#"{"w":[}]}"#, 3).is_err());
        assert!(split(&["w"], r#"{"w":[1,}"#, 1).is_err());
    }

    /// Reads elements where they begin when it can (a number must be followed by something).
    #[derive(Default)]
    struct Eager {
        at_start: Vec<String>,
        whole: Vec<String>,
    }

    impl OnElement for Eager {
        fn element(&mut self, bytes: &[u8]) -> Result<(), String> {
            self.whole.push(String::from_utf8_lossy(bytes).into_owned());
            Ok(())
        }
        fn element_at_start(&mut self, bytes: &[u8]) -> Result<Option<usize>, String> {
            let mut r = crate::json_read::Reader::new(bytes, false);
            match r.skip() {
                Ok(()) => {
                    self.at_start.push(String::from_utf8_lossy(&bytes[..r.position()]).into_owned());
                    Ok(Some(r.position()))
                }
                Err(crate::json_read::ReadError::Incomplete) => Ok(None),
                Err(e) => Err(e.into()),
            }
        }
    }

    #[test]
    fn elements_read_where_they_begin_are_the_same_whatever_the_chunks() {
        let doc = r#"{"w": [{"id": 1, "x": "a\"}"}, {"y": []}, 7, "s"], "n": 2}"#;
        let want = [r#"{"id": 1, "x": "a\"}"}"#, r#"{"y": []}"#, "7", r#""s""#];
        for chunk in 1..=doc.len() {
            let mut s = Splitter::new(&["w"], 1 << 20);
            let mut eager = Eager::default();
            for piece in doc.as_bytes().chunks(chunk) {
                s.feed(piece, &mut eager).unwrap();
            }
            let mut all = eager.at_start.clone();
            all.extend(eager.whole.clone());
            all.sort();
            let mut sorted = want.map(String::from).to_vec();
            sorted.sort();
            assert_eq!(all, sorted, "chunks of {chunk}");
            assert_eq!(String::from_utf8_lossy(&s.finish().unwrap()), r#"{"w": [], "n": 2}"#);
            if chunk == doc.len() {
                assert_eq!(eager.at_start.len(), 4, "in one chunk, every element is read where it begins");
            }
        }
        let mut s = Splitter::new(&["w"], 8);
        assert!(s.feed(br#"{"w": [{"x": "0123456789"}]}"#, &mut Eager::default()).is_err(), "over the limit in one chunk");
    }

    #[test]
    fn an_element_handler_error_stops_the_split() {
        let mut s = Splitter::new(&["w"], 1 << 20);
        let mut seen = 0;
        let result = s.feed(br#"{"w":[1,2,3]}"#, &mut |_: &[u8]| {
            seen += 1;
            Err("no".into())
        });
        assert_eq!((result, seen), (Err("no".into()), 1));
    }
}
