//! A Prometheus text-format (0.0.4) parser, written by hand for speed and safety: no regex, no
//! allocation for lines without escapes, never panics. Malformed lines are reported with their
//! line number and skipped; the rest of the document still parses.

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

/// One sample line with its label set left as text (what follows its `{`, up to and including
/// its `}`), for `parse_label_set`: an exporter repeats each GPU's label set in every family, so
/// a caller that has read a text once need not parse it again.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    /// 1-based.
    pub number: usize,
    pub name: &'a str,
    pub labels_text: &'a str,
    pub value: f64,
    /// The value was written as an integer (no `.`, exponent or `NaN`): dcgm-exporter prints an
    /// integer field bare and a double with six decimals (`gpu_collector.go` `toString`).
    pub integer: bool,
    pub timestamp_ms: Option<i64>,
}

/// Parses every sample line but its labels, calling `wanted(name)` first so callers can skip
/// series they do not use, then `on_line` for each kept line. Returns the bad lines (a bad label
/// set shows when it is parsed).
pub fn parse_lines<'a>(text: &'a str, mut wanted: impl FnMut(&str) -> bool, mut on_line: impl FnMut(&Line<'a>)) -> ParseErrors {
    let mut errors = ParseErrors::default();
    // A family's lines come together: the answer for the last name is asked once per family.
    let mut last: (&str, bool) = ("", false);
    let mut cached_wanted = |name: &'a str| {
        if name != last.0 {
            last = (name, wanted(name));
        }
        last.1
    };
    let mut start = 0;
    for (index, end) in memchr::memchr_iter(b'\n', text.as_bytes()).chain([text.len()]).enumerate() {
        let raw = text.get(start..end).unwrap_or_default();
        start = end + 1;
        let line = raw.trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line, index + 1, &mut cached_wanted) {
            Ok(Some(parsed)) => on_line(&parsed),
            Ok(None) => {}
            Err(message) => errors.push(ParseError { line: index + 1, message }),
        }
    }
    errors
}

/// Parses a `Line`'s label set into `labels` (cleared first).
pub fn parse_label_set<'a>(labels_text: &'a str, labels: &mut Vec<(&'a str, Cow<'a, str>)>) -> Result<(), String> {
    labels.clear();
    if labels_text.is_empty() {
        return Ok(());
    }
    match parse_labels(labels_text, 0, labels)? {
        end if end == labels_text.len() => Ok(()),
        end => Err(format!("unexpected {:?} after the label set", char_at(labels_text, end))),
    }
}

/// Parses every sample line, calling `on_sample` with each (one `Sample` reused: nothing is
/// allocated per line without escapes). Returns the bad lines. The sources read lines with
/// `parse_lines` and parse a label set once per scrape (`gpu::series_from_exposition_capped`).
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
            sample.name = line.name;
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

/// `Some(line)`, or `None` when the name was not wanted.
fn parse_line<'a>(line: &'a str, number: usize, wanted: &mut impl FnMut(&'a str) -> bool) -> Result<Option<Line<'a>>, String> {
    let bytes = line.as_bytes();
    if !is_name_start(bytes[0]) {
        return Err(format!("a metric name must start with a letter, '_' or ':', found {:?}", char_at(line, 0)));
    }
    let mut i = 1;
    while i < bytes.len() && is_name_char(bytes[i]) {
        i += 1;
    }
    let name = &line[..i];
    if !wanted(name) {
        return Ok(None);
    }
    let mut labels_text = "";
    let brace = skip_blanks(bytes, i);
    if brace < bytes.len() && bytes[brace] == b'{' {
        // The set ends at the line's last '}': no value or timestamp holds one, and a set that
        // ends elsewhere fails when parsed (`parse_label_set`).
        let Some(close) = line.rfind('}').filter(|&c| c > brace) else {
            // No end: the full parse says where the set goes wrong.
            let why = parse_labels(line, brace + 1, &mut Vec::new()).err();
            return Err(why.unwrap_or_else(|| "unterminated label set: missing '}'".into()));
        };
        labels_text = &line[brace + 1..=close];
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
    let value_text = &line[value_start..i];
    if value_text.is_empty() {
        return Err(format!("{name}: missing value"));
    }
    let value = parse_value(value_text).ok_or_else(|| format!("{name}: {value_text:?} is not a number"))?;
    i = skip_blanks(bytes, i);
    let mut timestamp_ms = None;
    if i < bytes.len() {
        let ts = &line[i..];
        timestamp_ms = Some(ts.parse::<i64>().map_err(|_| format!("{name}: timestamp {ts:?} is not an integer (milliseconds)"))?);
    }
    let integer = value_text.bytes().enumerate().all(|(i, b)| b.is_ascii_digit() || (i == 0 && (b == b'-' || b == b'+')));
    Ok(Some(Line { number, name, labels_text, value, integer, timestamp_ms }))
}

fn parse_labels<'a>(line: &'a str, mut i: usize, labels: &mut Vec<(&'a str, Cow<'a, str>)>) -> Result<usize, String> {
    let bytes = line.as_bytes();
    loop {
        i = skip_blanks(bytes, i);
        match bytes.get(i) {
            None => return Err("unterminated label set: missing '}'".into()),
            Some(b'}') => return Ok(i + 1),
            Some(&b) if is_name_start(b) && b != b':' => {}
            Some(_) => return Err(format!("expected a label name at column {}, found {:?}", i + 1, char_at(line, i))),
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

fn char_at(line: &str, i: usize) -> char {
    line.get(i..).and_then(|s| s.chars().next()).unwrap_or(' ')
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
