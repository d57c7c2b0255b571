//! A pull reader over the bytes of one JSON value: the caller walks the objects it knows and
//! takes the members it wants as typed values; every other member is skipped by its quotes and
//! brackets, without being decoded. A Coder workspace is about 4 KB of JSON of which this service
//! reads a fifth; 10,000 of them are 42 MB per pass, and serde_json, even ignoring a field, reads
//! every byte of it as JSON (strings checked, numbers parsed) and builds each value through its
//! visitors: reading the listing this way is 1.8-1.9 times as fast (benches/parse.rs), and most of it is
//! read once, where it begins in a chunk, instead of split first.
//!
//! What is read is checked as serde_json checks it (strings with their escapes and no control
//! characters, integers as JSON writes them, `true`/`false`/`null`); what is skipped is not: a
//! member no one reads may be malformed. Bytes that end inside the value are `Incomplete`, not
//! malformed, so that a caller reading from a chunk can wait for the rest. Never panics, whatever
//! the bytes; nesting is bounded. A leaf module: it uses nothing of this crate.

use std::borrow::Cow;

/// Objects and arrays nested deeper than this are refused (here and by the splitter): nothing
/// the service reads nests past a dozen levels, and no stack may grow with what a peer sends.
pub const MAX_DEPTH: usize = 128;

/// Why a value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The bytes end inside the value: more may come.
    Incomplete,
    /// The value is malformed, or not of the shape asked for.
    Malformed(String),
}

impl From<ReadError> for String {
    fn from(e: ReadError) -> String {
        match e {
            ReadError::Incomplete => "the JSON value ends early".into(),
            ReadError::Malformed(why) => why,
        }
    }
}

pub fn malformed<T>(why: impl Into<String>) -> Result<T, ReadError> {
    Err(ReadError::Malformed(why.into()))
}

/// The bytes that matter in a skipped container (or a split element's), outside strings.
pub static BRACKETS_AND_QUOTE: [bool; 256] = table(b"\"{}[]");
/// The bytes that end a number or literal.
static VALUE_END: [bool; 256] = table(b",}] \t\n\r");
/// The bytes that end a run of plain string text.
static STRING_SPECIAL: [bool; 256] = {
    let mut t = table(b"\"\\");
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t
};

/// A lookup table: `true` for each of `bytes`.
pub const fn table(bytes: &[u8]) -> [bool; 256] {
    let mut t = [false; 256];
    let mut i = 0;
    while i < bytes.len() {
        t[bytes[i] as usize] = true;
        i += 1;
    }
    t
}

/// A token in a message: its first bytes only (it is a peer's text, and may be megabytes).
fn shown(token: &[u8]) -> String {
    const SHOWN: usize = 32;
    let more = if token.len() > SHOWN { "..." } else { "" };
    format!("{:?}{more}", String::from_utf8_lossy(token.get(..SHOWN).unwrap_or(token)))
}

fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// In a word, each byte equal to `c` marked by its high bit, and maybe some bytes above the
/// lowest such: `(v - 0x01..) & !v` marks the zero bytes of `v = word ^ c`, and a borrow only
/// marks bytes above a true one. So the lowest mark of any union of these is a true one.
fn marks_of(word: u64, c: u8) -> u64 {
    let v = word ^ (ONES * u64::from(c));
    v.wrapping_sub(ONES) & !v & HIGHS
}

/// Where the first byte of `bytes` is that `marks` marks in its word (as `marks_of` does: the
/// lowest mark true) or, in the last few bytes, that `special` holds for: eight bytes at a time.
fn find_by_word(bytes: &[u8], marks: impl Fn(u64) -> u64, special: impl Fn(u8) -> bool) -> Option<usize> {
    let mut at = 0;
    while let Some(word) = bytes.get(at..at + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
        let found = marks(u64::from_le_bytes(word));
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    bytes.get(at..).unwrap_or_default().iter().position(|&b| special(b)).map(|p| at + p)
}

/// Where the first byte that ends a run of string text is in `bytes`: a quote or a backslash,
/// and with `controls` a control character (below 0x20).
fn find_in_string(bytes: &[u8], controls: bool) -> Option<usize> {
    if controls {
        // A byte below 0x20 is one that borrows when 0x20 is taken from it.
        let below_space = |x: u64| x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        find_by_word(bytes, |x| marks_of(x, b'"') | marks_of(x, b'\\') | below_space(x), |b| STRING_SPECIAL[usize::from(b)])
    } else {
        find_by_word(bytes, |x| marks_of(x, b'"') | marks_of(x, b'\\'), |b| b == b'"' || b == b'\\')
    }
}

/// Where the first quote or bracket is in `bytes` (what matters in a skipped container). `[`
/// and `]` differ from `{` and `}` only in bit 0x20, and no other byte becomes `{` or `}` when
/// it is set.
fn find_bracket_or_quote(bytes: &[u8]) -> Option<usize> {
    find_by_word(
        bytes,
        |x| marks_of(x, b'"') | marks_of(x | (ONES * 0x20), b'{') | marks_of(x | (ONES * 0x20), b'}'),
        |b| BRACKETS_AND_QUOTE[usize::from(b)],
    )
}

/// Reads one value that `bytes` hold whole (only blanks may follow it) with `read`.
pub fn read_whole<'a, T>(bytes: &'a [u8], read: impl FnOnce(&mut Reader<'a>) -> Result<T, ReadError>) -> Result<T, ReadError> {
    let mut r = Reader::new(bytes, true);
    let value = read(&mut r)?;
    r.end()?;
    Ok(value)
}

/// Reads one value at the start of `bytes` with `read`: with the bytes it took, or `None` when
/// `bytes` end inside it (more may come).
pub fn read_at_start<'a, T>(
    bytes: &'a [u8],
    read: impl FnOnce(&mut Reader<'a>) -> Result<T, ReadError>,
) -> Result<Option<(T, usize)>, ReadError> {
    let mut r = Reader::new(bytes, false);
    match read(&mut r) {
        Ok(value) => Ok(Some((value, r.position()))),
        Err(ReadError::Incomplete) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A position in one JSON value's bytes.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The bytes hold the whole value: a number may run to their end.
    whole: bool,
    depth: usize,
}

impl<'a> Reader<'a> {
    /// `whole`: the bytes are the whole value (else they may be cut short, or go on past it).
    pub fn new(bytes: &'a [u8], whole: bool) -> Self {
        Reader { bytes, at: 0, whole, depth: 0 }
    }

    /// How many bytes have been read.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Only blanks are left.
    pub fn end(&mut self) -> Result<(), ReadError> {
        self.skip_blanks();
        match self.bytes.get(self.at) {
            None => Ok(()),
            Some(_) => malformed(format!("unexpected bytes after the JSON value at byte {}", self.at)),
        }
    }

    fn skip_blanks(&mut self) {
        while self.bytes.get(self.at).copied().is_some_and(is_blank) {
            self.at += 1;
        }
    }

    /// The next byte after blanks, not read; `Incomplete` at the end.
    fn peek(&mut self) -> Result<u8, ReadError> {
        self.skip_blanks();
        self.bytes.get(self.at).copied().ok_or(ReadError::Incomplete)
    }

    fn expected<T>(&self, what: &str) -> Result<T, ReadError> {
        malformed(format!("expected {what} at byte {}", self.at))
    }

    fn enter(&mut self) -> Result<(), ReadError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH { malformed(format!("nested deeper than {MAX_DEPTH} levels")) } else { Ok(()) }
    }

    /// Reads an object, calling `member` with each key (unescaped, as bytes: most are compared,
    /// not kept) and the reader on its value, which `member` must read or `skip`.
    pub fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Result<(), ReadError>) -> Result<(), ReadError> {
        if self.peek()? != b'{' {
            return self.expected("an object");
        }
        self.at += 1;
        self.enter()?;
        if self.peek()? == b'}' {
            self.at += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            if self.peek()? != b'"' {
                return self.expected("a key");
            }
            let start = self.at;
            let plain = self.skip_string()?;
            let raw = self.bytes.get(start..self.at).unwrap_or_default();
            let key: Cow<'a, [u8]> = if plain {
                Cow::Borrowed(raw.get(1..raw.len().saturating_sub(1)).unwrap_or_default())
            } else {
                Cow::Owned(serde_json::from_slice::<String>(raw).map_err(|e| ReadError::Malformed(e.to_string()))?.into_bytes())
            };
            if self.peek()? != b':' {
                return self.expected("':'");
            }
            self.at += 1;
            member(self, &key)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => return self.expected("',' or '}'"),
            }
        }
    }

    /// Reads an array, calling `element` with the reader on each element.
    pub fn array(&mut self, mut element: impl FnMut(&mut Self) -> Result<(), ReadError>) -> Result<(), ReadError> {
        if self.peek()? != b'[' {
            return self.expected("an array");
        }
        self.at += 1;
        self.enter()?;
        if self.peek()? == b']' {
            self.at += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => return self.expected("',' or ']'"),
            }
        }
    }

    /// `null` is next: it is read and `true`; otherwise nothing is read.
    pub fn null(&mut self) -> Result<bool, ReadError> {
        if self.peek()? != b'n' {
            return Ok(false);
        }
        match self.literal()? {
            b"null" => Ok(true),
            _ => self.expected("a JSON value"),
        }
    }

    /// A string, unescaped (borrowed when it had no escapes).
    pub fn string(&mut self) -> Result<Cow<'a, str>, ReadError> {
        if self.peek()? != b'"' {
            return self.expected("a string");
        }
        let start = self.at;
        let plain = self.skip_string()?;
        let raw = self.bytes.get(start..self.at).unwrap_or_default();
        if plain {
            let text = raw.get(1..raw.len().saturating_sub(1)).unwrap_or_default();
            return std::str::from_utf8(text).map(Cow::Borrowed).map_err(|_| ReadError::Malformed("a string that is not UTF-8".into()));
        }
        // Escapes or control characters: serde_json decodes them, or says what is wrong.
        serde_json::from_slice::<String>(raw).map(Cow::Owned).map_err(|e| ReadError::Malformed(e.to_string()))
    }

    /// An integer, as JSON writes one (no fraction, exponent, `+` or leading zero).
    pub fn i64(&mut self) -> Result<i64, ReadError> {
        let first = self.peek()?;
        if first != b'-' && !first.is_ascii_digit() {
            return self.expected("an integer");
        }
        let token = self.literal()?;
        let digits = token.strip_prefix(b"-").unwrap_or(token);
        // `-0` is a float to serde_json (-0.0), not an integer.
        let plain =
            !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) && (digits.len() == 1 || digits[0] != b'0') && token != b"-0";
        match std::str::from_utf8(token).ok().filter(|_| plain).and_then(|t| t.parse().ok()) {
            Some(n) => Ok(n),
            None => malformed(format!("{} is not an integer", shown(token))),
        }
    }

    /// A number, as JSON writes one (no `NaN`, `Infinity` or `+`).
    pub fn f64(&mut self) -> Result<f64, ReadError> {
        let first = self.peek()?;
        if first != b'-' && !first.is_ascii_digit() {
            return self.expected("a number");
        }
        let token = self.literal()?;
        // Most are whole numbers (a Prometheus step's time): read without the float parser.
        if token.len() < 16 && token.iter().all(u8::is_ascii_digit) && (token.len() == 1 || token[0] != b'0') {
            return Ok(token.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')) as f64);
        }
        // The rest as serde_json reads them (Rust's float parser takes `01`, `1.` and `1e400`).
        serde_json::from_slice::<f64>(token).or_else(|_| malformed(format!("{} is not a number", shown(token))))
    }

    /// The bytes of the next value, skipped undecoded (to be read later, or compared).
    pub fn raw(&mut self) -> Result<&'a [u8], ReadError> {
        self.skip_blanks();
        let start = self.at;
        self.skip()?;
        Ok(self.bytes.get(start..self.at).unwrap_or_default())
    }

    pub fn bool(&mut self) -> Result<bool, ReadError> {
        if !matches!(self.peek()?, b't' | b'f') {
            return self.expected("a boolean");
        }
        match self.literal()? {
            b"true" => Ok(true),
            b"false" => Ok(false),
            _ => self.expected("a boolean"),
        }
    }

    /// A number or literal's bytes, up to what ends it.
    fn literal(&mut self) -> Result<&'a [u8], ReadError> {
        let bytes: &'a [u8] = self.bytes;
        let rest = bytes.get(self.at..).unwrap_or_default();
        let len = match rest.iter().position(|&b| VALUE_END[usize::from(b)]) {
            Some(p) => p,
            None if self.whole => rest.len(),
            None => return Err(ReadError::Incomplete),
        };
        if len == 0 {
            return self.expected("a JSON value");
        }
        self.at += len;
        Ok(rest.get(..len).unwrap_or_default())
    }

    /// Past one string, its quotes included (the reader is on its opening quote); `true` when
    /// it holds no escape and no control character.
    fn skip_string(&mut self) -> Result<bool, ReadError> {
        self.at += 1;
        let mut plain = true;
        loop {
            let rest = self.bytes.get(self.at..).unwrap_or_default();
            let Some(p) = find_in_string(rest, true) else { return Err(ReadError::Incomplete) };
            match rest.get(p) {
                Some(b'"') => {
                    self.at += p + 1;
                    return Ok(plain);
                }
                Some(b'\\') => {
                    if p + 1 >= rest.len() {
                        return Err(ReadError::Incomplete);
                    }
                    self.at += p + 2;
                }
                _ => self.at += p + 1, // a control character: an error once decoded
            }
            plain = false;
        }
    }

    /// Past one string that is skipped, not read (so not checked for control characters).
    fn skip_text(&mut self) -> Result<(), ReadError> {
        self.at += 1;
        loop {
            let rest = self.bytes.get(self.at..).unwrap_or_default();
            match find_in_string(rest, false).map(|p| (p, rest.get(p))) {
                Some((p, Some(b'"'))) => {
                    self.at += p + 1;
                    return Ok(());
                }
                Some((p, _)) if p + 1 < rest.len() => self.at += p + 2,
                _ => return Err(ReadError::Incomplete),
            }
        }
    }

    /// Past one value of any kind, decoding nothing: strings by their quotes, containers by
    /// their brackets, anything else to the next separator or blank.
    pub fn skip(&mut self) -> Result<(), ReadError> {
        match self.peek()? {
            b'"' => self.skip_text(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    let rest = self.bytes.get(self.at..).unwrap_or_default();
                    let Some(p) = find_bracket_or_quote(rest) else {
                        return Err(ReadError::Incomplete);
                    };
                    self.at += p;
                    match rest.get(p) {
                        Some(b'"') => {
                            self.skip_text()?;
                            continue;
                        }
                        Some(b'{' | b'[') => {
                            depth += 1;
                            if self.depth + depth > MAX_DEPTH {
                                return malformed(format!("nested deeper than {MAX_DEPTH} levels"));
                            }
                        }
                        _ => depth = depth.saturating_sub(1),
                    }
                    self.at += 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
            }
            _ => self.literal().map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `{"a": <string>, "n": <int>, "o": {"b": <bool>}, "list": [<string|null>]}`,
    /// skipping anything else: (a, n, b, list).
    type Read = (String, i64, bool, Vec<Option<String>>);

    fn read(r: &mut Reader<'_>) -> Result<Read, ReadError> {
        let mut out = Read::default();
        r.object(|r, key| match key {
            b"a" => r.string().map(|s| out.0 = s.into_owned()),
            b"n" => r.i64().map(|n| out.1 = n),
            b"o" => r.object(|r, key| if key == b"b" { r.bool().map(|b| out.2 = b) } else { r.skip() }),
            b"list" => r.array(|r| {
                let item = if r.null()? { None } else { Some(r.string()?.into_owned()) };
                out.3.push(item);
                Ok(())
            }),
            _ => r.skip(),
        })?;
        Ok(out)
    }

    fn whole(text: &str) -> Result<Read, ReadError> {
        let mut r = Reader::new(text.as_bytes(), true);
        let out = read(&mut r)?;
        r.end()?;
        Ok(out)
    }

    #[test]
    fn reads_what_is_asked_and_skips_the_rest() {
        let text = r#" {"skip": {"deep": ["}", "]\"", {"z": [1, -2.5e3, true, null]}]}, "a": "x\u00e9\"y", "n": -42,
            "o": {"c": [], "b": true}, "list": ["p", null, "q"], "d": false} "#;
        assert_eq!(whole(text).unwrap(), ("xé\"y".to_string(), -42, true, vec![Some("p".into()), None, Some("q".into())]));
        let expected: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(expected["a"], "xé\"y", "the same as serde_json reads it");
    }

    #[test]
    fn a_value_cut_anywhere_is_incomplete_and_whole_is_read_to_its_end() {
        let text = r#"{"x": [1, {"y": "z\"w"}], "a": "s", "n": 7, "o": {"b": false}} , "next""#;
        let end = text.find(" ,").unwrap();
        for cut in 0..end {
            let mut r = Reader::new(&text.as_bytes()[..cut], false);
            assert_eq!(read(&mut r), Err(ReadError::Incomplete), "cut at {cut}: {:?}", &text[..cut]);
        }
        let mut r = Reader::new(text.as_bytes(), false);
        assert!(read(&mut r).is_ok());
        assert_eq!(r.position(), end);
        // A number is whole only once something ends it, or the bytes are the whole value.
        assert_eq!(Reader::new(b"123", false).i64(), Err(ReadError::Incomplete));
        assert_eq!(Reader::new(b"123", true).i64(), Ok(123));
    }

    #[test]
    fn what_is_read_is_checked_as_serde_json_checks_it() {
        for bad in [
            r#"{"a": 1}"#,
            r#"{"a": "tab	inside"}"#,
            r#"{"a": "\x"}"#,
            r#"{"n": 1.5}"#,
            r#"{"n": 1e3}"#,
            r#"{"n": +1}"#,
            r#"{"n": 01}"#,
            r#"{"n": 99999999999999999999}"#,
            r#"{"n": "1"}"#,
            r#"{"o": {"b": tru}}"#,
            r#"{"list": [nul]}"#,
            r#"{"a": "x" "n": 1}"#,
            r#"{"a" "x"}"#,
            r#"{"a": "x"} tail"#,
            "[]",
            "",
        ] {
            assert!(whole(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn numbers_are_read_as_serde_json_reads_them() {
        let tokens = [
            "0",
            "-0",
            "7",
            "01",
            "-01",
            "1.",
            "-.5",
            "1.e5",
            "1e400",
            "1.5",
            "-2.5e-3",
            "1E2",
            "123456789012345678",
            "99999999999999999999",
        ];
        for token in tokens {
            let mut r = Reader::new(token.as_bytes(), true);
            let read = r.f64().ok().map(|n| format!("{n:?}"));
            let want = serde_json::from_str::<f64>(token).ok().map(|n| format!("{n:?}"));
            assert_eq!(read, want, "f64 {token}");
            let mut r = Reader::new(token.as_bytes(), true);
            assert_eq!(r.i64().ok(), serde_json::from_str::<i64>(token).ok(), "i64 {token}");
        }
        let long = "1".repeat(10_000) + "x";
        let Err(ReadError::Malformed(why)) = Reader::new(long.as_bytes(), true).f64() else { panic!("{long}") };
        assert!(why.len() < 100, "a message shows the start of a token, not all of it: {why}");
    }

    #[test]
    fn the_word_at_a_time_searches_find_what_a_byte_at_a_time_search_finds() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        const BYTES: &[u8] = b"ab\"\\\x00\x1f\x20\x7f\x80\xff!#[]{}YZ_yz;=\xdb\xfb";
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            // Mostly plain text, a special byte now and then, anywhere in a word.
            let text: Vec<u8> =
                (0..len).map(|_| if next() % 6 == 0 { BYTES[(next() % BYTES.len() as u64) as usize] } else { b'x' }).collect();
            for controls in [false, true] {
                let slow = text.iter().position(|&b| b == b'"' || b == b'\\' || (controls && b < 0x20));
                assert_eq!(find_in_string(&text, controls), slow, "{text:?} controls={controls}");
            }
            let slow = text.iter().position(|&b| BRACKETS_AND_QUOTE[usize::from(b)]);
            assert_eq!(find_bracket_or_quote(&text), slow, "{text:?}");
        }
    }

    #[test]
    fn nesting_is_bounded_and_nothing_panics() {
        let nested = |levels: usize| "[".repeat(levels) + &"]".repeat(levels);
        let too_deep = |e: Result<(), ReadError>| matches!(e, Err(ReadError::Malformed(why)) if why.contains("nested deeper"));
        assert!(too_deep(whole(&format!(r#"{{"skip": {}}}"#, nested(500))).map(drop)));
        assert!(too_deep(Reader::new(nested(500).as_bytes(), true).skip()));
        assert!(whole(&format!(r#"{{"skip": {}, "a": "x", "n": 1, "o": {{"b": true}}, "list": []}}"#, nested(100))).is_ok());
        assert_eq!(Reader::new(nested(100).as_bytes(), true).skip(), Ok(()));
        // Arbitrary bytes: an error or a value, never a panic.
        const ALPHABET: &[u8] = b"{}[]\",:\\an1 -elrtu";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..50_000 {
            let len = (seed % 24) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    ALPHABET[(seed % ALPHABET.len() as u64) as usize]
                })
                .collect();
            for whole in [true, false] {
                let _ = read(&mut Reader::new(&bytes, whole));
            }
        }
    }
}
