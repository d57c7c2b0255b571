//! A Prometheus text-format (0.0.4) parser, written by hand for speed and safety: no regex, no
//! allocation for lines without escapes, never panics. It reads a whole document or a body as it
//! arrives (`LineReader`), parsing each line where it lies (only a line that spans two chunks is
//! copied); bytes are checked as UTF-8 only in the label sets it parses, and the lines of a
//! family the caller does not want are skipped by their name alone. Malformed lines are reported
//! with their line number and skipped; the rest of the document still parses.

use std::borrow::Cow;
use std::fmt;

/// One sample line. Borrowed from the input; label values are owned only when they had escapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, Cow<'a, str>)>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

/// The value of the label `key` in a parsed label set.
pub fn label<'l>(labels: &'l [(&str, Cow<'_, str>)], key: &str) -> Option<&'l str> {
    labels.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_ref())
}

/// The bad lines of one body: the first few (`KEPT`) and how many in all. A body of nothing but
/// bad lines costs a count, not a string per line (a 15 MiB body of short bad lines once held
/// 1.26 GB of messages).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParseErrors {
    kept: Vec<ParseError>,
    count: usize,
}

impl ParseErrors {
    /// Bad lines kept with their message.
    pub const KEPT: usize = 8;

    pub fn push(&mut self, e: ParseError) {
        self.count += 1;
        if self.kept.len() < Self::KEPT {
            self.kept.push(e);
        }
    }

    /// Adds `more`, keeping the first lines in line order.
    pub fn merge(&mut self, more: ParseErrors) {
        self.count += more.count;
        self.kept.extend(more.kept);
        self.kept.sort_by_key(|e| e.line);
        self.kept.truncate(Self::KEPT);
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many bad lines in all.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn first(&self) -> Option<&ParseError> {
        self.kept.first()
    }

    /// The first bad lines, in line order.
    pub fn kept(&self) -> &[ParseError] {
        &self.kept
    }
}

impl std::ops::Index<usize> for ParseErrors {
    type Output = ParseError;
    fn index(&self, i: usize) -> &ParseError {
        &self.kept[i]
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// One sample line with its label set left as bytes (what follows its `{`, up to and including
/// its `}`), for `parse_label_set`: an exporter repeats each GPU's label set in every family, so
/// a caller that has read a set once need not parse it again, nor check that it is UTF-8.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    /// 1-based.
    pub number: usize,
    /// The name's bytes (ASCII by its grammar); `name()` reads them as text, once a family where
    /// it is needed, never on every line.
    name_bytes: &'a [u8],
    pub labels_text: &'a [u8],
    pub value: f64,
    /// The value was written as an integer (no `.`, exponent or `NaN`): dcgm-exporter prints an
    /// integer field bare and a double with six decimals (`gpu_collector.go` `toString`).
    pub integer: bool,
    pub timestamp_ms: Option<i64>,
    /// Its name is not the previous sample line's: a family begins (a family's lines come together).
    pub new_name: bool,
}

impl<'a> Line<'a> {
    /// The metric's name.
    pub fn name(&self) -> &'a str {
        ascii(self.name_bytes)
    }
}

/// What reading lines carries from one line to the next: the last line's name and whether it
/// was wanted (so a family's name is asked for once), and the bad lines.
#[derive(Debug, Default)]
struct LineState {
    /// The last line's name, and whether it was wanted.
    kept: String,
    kept_wanted: bool,
    errors: ParseErrors,
    /// A line held something besides blanks (a comment counts).
    text: bool,
}

impl LineState {
    fn line<'l>(&mut self, raw: &'l [u8], number: usize, wanted: &mut impl FnMut(&str) -> bool, on_line: &mut impl FnMut(&Line<'l>)) {
        let line = trim_blanks(raw);
        let Some(&first) = line.first() else { return };
        self.text = true;
        if first == b'#' {
            return;
        }
        // A family's lines share their name: a line that begins with the last line's name is
        // that family's, read without scanning its name or asking for it again (and skipped
        // whole when the family is not wanted).
        let kept = self.kept.len();
        let same_family = kept > 0 && line.starts_with(self.kept.as_bytes()) && line.get(kept).is_some_and(|&b| !is_name_char(b));
        if same_family && !self.kept_wanted {
            return;
        }
        // The length of a name refused (its bytes begin the line).
        let mut refused = 0;
        let mut ask = |name: &str| {
            let yes = wanted(name);
            if !yes {
                refused = name.len();
            }
            yes
        };
        match parse_line(line, number, same_family.then_some(kept), &mut ask) {
            Ok(Some(mut parsed)) => {
                // A name that is not the last line's (which would have been `same_family`).
                parsed.new_name = !same_family;
                if parsed.new_name {
                    self.kept.clear();
                    self.kept.push_str(parsed.name());
                }
                self.kept_wanted = true;
                on_line(&parsed)
            }
            // Not wanted (a line is not wanted only when its name was asked for and refused).
            Ok(None) => {
                self.kept.clear();
                self.kept.push_str(ascii(line.get(..refused).unwrap_or_default()));
                self.kept_wanted = false;
            }
            Err(message) => self.errors.push(ParseError { line: number, message }),
        }
    }
}

/// Reads sample lines from a body as it arrives, chunk by chunk: a line is parsed where it lies
/// in its chunk, and only a line that spans two chunks is joined first, in a buffer of its own
/// (the only bytes copied). No byte is looked at before its line: the name, value and timestamp
/// are ASCII by their grammar, and a label set is checked to be UTF-8 when it is parsed
/// (`parse_label_set`), so lines skipped (comments, names not wanted) are never checked.
#[derive(Debug, Default)]
pub struct LineReader {
    /// The start of a line whose end has not arrived yet.
    carry: Vec<u8>,
    /// Lines begun so far.
    number: usize,
    state: LineState,
}

impl LineReader {
    /// Reads the complete lines `chunk` ends, calling `wanted(name)` first (asked once per family)
    /// and `on_line` for each line kept; the start of an unfinished line waits for the next chunk.
    pub fn feed(&mut self, chunk: &[u8], wanted: &mut impl FnMut(&str) -> bool, on_line: &mut impl FnMut(&Line<'_>)) {
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', chunk) {
            self.number += 1;
            let piece = chunk.get(start..end).unwrap_or_default();
            start = end + 1;
            if self.carry.is_empty() {
                self.state.line(piece, self.number, wanted, on_line);
            } else {
                self.carry.extend_from_slice(piece);
                self.state.line(&self.carry, self.number, wanted, on_line);
                self.carry.clear();
            }
        }
        self.carry.extend_from_slice(chunk.get(start..).unwrap_or_default());
    }

    /// Reads the last line (one without a newline) and returns the bad lines.
    pub fn finish(mut self, wanted: &mut impl FnMut(&str) -> bool, on_line: &mut impl FnMut(&Line<'_>)) -> ParseErrors {
        self.number += 1;
        self.state.line(&self.carry, self.number, wanted, on_line);
        self.state.errors
    }

    /// Whether any line so far held more than blanks (a comment counts): an empty body is an
    /// exporter reloading, not a bad one.
    pub fn any_text(&self) -> bool {
        self.state.text || !trim_blanks(&self.carry).is_empty()
    }
}

/// Parses every sample line of a whole document but its labels, calling `wanted(name)` first so
/// callers can skip series they do not use, then `on_line` for each kept line. Returns the bad
/// lines (a bad label set shows when it is parsed). `LineReader` reads the same lines as they
/// arrive.
pub fn parse_lines<'a>(text: &'a str, mut wanted: impl FnMut(&str) -> bool, mut on_line: impl FnMut(&Line<'a>)) -> ParseErrors {
    let mut state = LineState::default();
    let bytes = text.as_bytes();
    let mut start = 0;
    for (index, end) in memchr::memchr_iter(b'\n', bytes).chain([bytes.len()]).enumerate() {
        let raw = bytes.get(start..end).unwrap_or_default();
        start = end + 1;
        state.line(raw, index + 1, &mut wanted, &mut on_line);
    }
    state.errors
}

/// The line without the blanks around it (spaces, tabs, a `\r` of a CRLF ending).
fn trim_blanks(line: &[u8]) -> &[u8] {
    let blank = |b: &u8| matches!(b, b' ' | b'\t' | b'\r');
    let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
    let end = line.iter().rposition(|b| !blank(b)).map_or(start, |e| e + 1);
    line.get(start..end).unwrap_or_default()
}

/// Parses a `Line`'s label set into `labels` (cleared first).
pub fn parse_label_set<'a>(labels_text: &'a [u8], labels: &mut Vec<(&'a str, Cow<'a, str>)>) -> Result<(), String> {
    labels.clear();
    if labels_text.is_empty() {
        return Ok(());
    }
    let labels_text = std::str::from_utf8(labels_text).map_err(|_| "the label set is not UTF-8 text".to_string())?;
    match parse_labels(labels_text, 0, labels)? {
        end if end == labels_text.len() => Ok(()),
        end => Err(format!("unexpected {:?} after the label set", char_at(labels_text.as_bytes(), end))),
    }
}

/// Parses every sample line, calling `on_sample` with each (one `Sample` reused: nothing is
/// allocated per line without escapes). Returns the bad lines. The sources read lines with
/// `parse_lines` and parse a label set once per scrape (`gpu::scrape::ScrapeFold`).
pub fn parse_each<'a>(text: &'a str, mut on_sample: impl FnMut(&Sample<'a>)) -> ParseErrors {
    let mut sample = Sample { name: "", labels: Vec::with_capacity(16), value: 0.0, timestamp_ms: None };
    let mut label_errors = ParseErrors::default();
    let mut errors = parse_lines(
        text,
        |_| true,
        |line| {
            if let Err(message) = parse_label_set(line.labels_text, &mut sample.labels) {
                label_errors.push(ParseError { line: line.number, message });
                return;
            }
            sample.name = line.name();
            sample.value = line.value;
            sample.timestamp_ms = line.timestamp_ms;
            on_sample(&sample);
        },
    );
    errors.merge(label_errors);
    errors
}

/// Parses a whole document into owned-by-input samples (for tests and the fakes).
pub fn parse(text: &str) -> (Vec<Sample<'_>>, ParseErrors) {
    let mut out = Vec::new();
    let errors = parse_each(text, |s| out.push(s.clone()));
    (out, errors)
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn skip_blanks(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
        i += 1;
    }
    i
}

/// `Some(line)`, or `None` when the name was not wanted. `line` is trimmed and not empty;
/// `known` is the length of its name when it is known already to be a wanted one.
fn parse_line<'a>(
    line: &'a [u8],
    number: usize,
    known: Option<usize>,
    wanted: &mut impl FnMut(&str) -> bool,
) -> Result<Option<Line<'a>>, String> {
    let bytes = line;
    let mut i = match known {
        Some(end) => end,
        None => {
            if !bytes.first().is_some_and(|&b| is_name_start(b)) {
                return Err(format!("a metric name must start with a letter, '_' or ':', found {:?}", char_at(line, 0)));
            }
            let mut i = 1;
            while i < bytes.len() && is_name_char(bytes[i]) {
                i += 1;
            }
            i
        }
    };
    // ASCII by the loop above (or the kept name it equals): read as text only to be asked for
    // (a family's first line) or named in an error.
    let name_bytes = bytes.get(..i).unwrap_or_default();
    let name = || ascii(name_bytes);
    if known.is_none() && !wanted(name()) {
        return Ok(None);
    }
    let mut labels_text: &[u8] = &[];
    let brace = skip_blanks(bytes, i);
    if bytes.get(brace) == Some(&b'{') {
        // The set ends at the line's last '}': no value or timestamp holds one, and a set that
        // ends elsewhere fails when parsed (`parse_label_set`).
        let Some(close) = memchr::memrchr(b'}', bytes).filter(|&c| c > brace) else {
            // No end: the full parse says where the set goes wrong.
            let why = std::str::from_utf8(line).ok().and_then(|text| parse_labels(text, brace + 1, &mut Vec::new()).err());
            return Err(why.unwrap_or_else(|| "unterminated label set: missing '}'".into()));
        };
        labels_text = bytes.get(brace + 1..=close).unwrap_or_default();
        i = close + 1;
    }
    let after_labels = i;
    i = skip_blanks(bytes, i);
    if i == after_labels && i < bytes.len() {
        return Err(format!("expected a space before the value, found {:?}", char_at(line, i)));
    }
    let value_start = i;
    while i < bytes.len() && bytes[i] != b' ' && bytes[i] != b'\t' {
        i += 1;
    }
    let value_bytes = bytes.get(value_start..i).unwrap_or_default();
    if value_bytes.is_empty() {
        return Err(format!("{}: missing value", name()));
    }
    let (value, integer) = match plain_decimal(value_bytes) {
        Some(read) => read,
        None => {
            let value_text = String::from_utf8_lossy(value_bytes);
            let value = parse_value(&value_text).ok_or_else(|| format!("{}: {value_text:?} is not a number", name()))?;
            let integer = value_bytes.iter().enumerate().all(|(i, b)| b.is_ascii_digit() || (i == 0 && (*b == b'-' || *b == b'+')));
            (value, integer)
        }
    };
    i = skip_blanks(bytes, i);
    let mut timestamp_ms = None;
    if i < bytes.len() {
        let ts = String::from_utf8_lossy(bytes.get(i..).unwrap_or_default());
        timestamp_ms = Some(ts.parse::<i64>().map_err(|_| format!("{}: timestamp {ts:?} is not an integer (milliseconds)", name()))?);
    }
    Ok(Some(Line { number, name_bytes, labels_text, value, integer, timestamp_ms, new_name: false }))
}

/// Bytes known to be ASCII as text (a name read by `is_name_char`).
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

fn parse_labels<'a>(line: &'a str, mut i: usize, labels: &mut Vec<(&'a str, Cow<'a, str>)>) -> Result<usize, String> {
    let bytes = line.as_bytes();
    loop {
        i = skip_blanks(bytes, i);
        match bytes.get(i) {
            None => return Err("unterminated label set: missing '}'".into()),
            Some(b'}') => return Ok(i + 1),
            Some(&b) if is_name_start(b) && b != b':' => {}
            Some(_) => return Err(format!("expected a label name at column {}, found {:?}", i + 1, char_at(line.as_bytes(), i))),
        }
        let key_start = i;
        while i < bytes.len() && is_name_char(bytes[i]) && bytes[i] != b':' {
            i += 1;
        }
        let key = &line[key_start..i];
        i = skip_blanks(bytes, i);
        if bytes.get(i) != Some(&b'=') {
            return Err(format!("label {key}: expected '=' at column {}", i + 1));
        }
        i = skip_blanks(bytes, i + 1);
        if bytes.get(i) != Some(&b'"') {
            return Err(format!("label {key}: the value must be in double quotes"));
        }
        i += 1;
        let value_start = i;
        let mut escaped = false;
        loop {
            match bytes.get(i) {
                None => return Err(format!("label {key}: unterminated value")),
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    i += 2;
                }
                Some(_) => i += 1,
            }
        }
        let raw = line.get(value_start..i).ok_or_else(|| format!("label {key}: unterminated escape"))?;
        let value = if escaped { Cow::Owned(unescape(raw)) } else { Cow::Borrowed(raw) };
        labels.push((key, value));
        i = skip_blanks(bytes, i + 1);
        match bytes.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok(i + 1),
            _ => return Err(format!("label {key}: expected ',' or '}}' at column {}", i + 1)),
        }
    }
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Powers of ten an `f64` holds exactly.
const POWERS_OF_TEN: [f64; 16] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];

/// A value written as digits with an optional sign and point and at most 15 digits (what
/// dcgm-exporter writes: an integer field bare, a double with six decimals), and whether it was
/// an integer (no point); `None` for any other spelling, read by `parse_value`. Exact: the digits
/// and the power of ten are both exact in an `f64`, so their quotient is the correctly rounded
/// value, as `str::parse` gives it (Clinger's fast path).
fn plain_decimal(bytes: &[u8]) -> Option<(f64, bool)> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, bytes),
    };
    let (mut mantissa, mut count, mut decimals) = (0u64, 0usize, None::<usize>);
    for &b in digits {
        match b {
            b'0'..=b'9' => {
                mantissa = mantissa * 10 + u64::from(b - b'0');
                count += 1;
                if let Some(d) = &mut decimals {
                    *d += 1;
                }
                if count > 15 {
                    return None;
                }
            }
            b'.' if decimals.is_none() => decimals = Some(0),
            _ => return None,
        }
    }
    if count == 0 {
        return None;
    }
    let magnitude = mantissa as f64 / POWERS_OF_TEN.get(decimals.unwrap_or(0)).copied()?;
    Some((if negative { -magnitude } else { magnitude }, decimals.is_none()))
}

/// Go's ParseFloat spellings used by exporters: decimals, exponents, NaN, +Inf, -Inf.
fn parse_value(text: &str) -> Option<f64> {
    match text {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => {
            let b = text.as_bytes();
            // Rust also accepts "infinity" and similar words; the format does not.
            if b.iter().any(|c| c.is_ascii_alphabetic() && *c != b'e' && *c != b'E') {
                return None;
            }
            text.parse::<f64>().ok()
        }
    }
}

/// The character at byte `i` of a line (U+FFFD where it is not UTF-8), for messages.
fn char_at(line: &[u8], i: usize) -> char {
    let rest = line.get(i..).unwrap_or_default();
    String::from_utf8_lossy(rest.get(..4).unwrap_or(rest)).chars().next().unwrap_or(' ')
}

/// Renders samples back to text (used by the fake exporter and the round-trip property test).
pub fn render_sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (n, (k, v)) in labels.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        out.push_str(&value.to_string());
    }
    out.push('\n');
}
