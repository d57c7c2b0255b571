//! The invariants ARCHITECTURE.md states, checked on the sources: the module order (every import,
//! `crate::`, `super::` or `self::`, in a `use` group or inline, points down the order the
//! document states), which code may read the clock or touch the network, where side effects and
//! the mode check live, and that the code map lists every source file and names what is in it.
//!
//! Each check reads a tree (`src/` and ARCHITECTURE.md under one root) and returns the breaches it
//! found; the `planted_*` tests copy the tree, plant one breach and expect the check to name it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` (relative to `base`), recursively, sorted.
fn rust_files(base: &Path, dir: &str) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let mut found = Vec::new();
    walk(&base.join(dir), &mut found);
    let mut rel: Vec<String> = found.iter().map(|p| p.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/")).collect();
    rel.sort();
    rel
}

/// The text without comments; string and char literals kept whole (`keep_strings`) or emptied.
/// A `//` inside a string is not a comment.
fn strip(text: &str, keep_strings: bool) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let word_before = |i: usize| i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_');
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if (c == 'r' || c == 'b') && !word_before(i) && raw_string_start(&b, i).is_some() {
            let (hashes, body) = raw_string_start(&b, i).unwrap();
            let mut j = body;
            while j < b.len() && !(b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#'))) {
                j += 1;
            }
            let end = (j + 1 + hashes).min(b.len());
            if keep_strings {
                out.extend(&b[i..end]);
            } else {
                out.push_str("\"\"");
            }
            i = end;
        } else if c == '"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != '"' {
                j += if b[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            if keep_strings {
                out.extend(&b[i..end]);
            } else {
                out.push_str("\"\"");
            }
            i = end;
        } else if c == '\'' && next == Some('\\') {
            let mut j = i + 2;
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else if c == '\'' && b.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// At `r"`, `r#"`, `br"`…: the number of `#` and where the body starts.
fn raw_string_start(b: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if b[j] == 'b' {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&'"')).then_some((hashes, j + 1))
}

/// A file's code outside `#[cfg(test)]` modules, comments removed.
fn source(base: &Path, rel: &str, keep_strings: bool) -> String {
    let text = std::fs::read_to_string(base.join(rel)).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    strip(text, keep_strings)
}

/// Code with comments and string contents removed, whitespace runs made one space.
fn code(base: &Path, rel: &str) -> String {
    source(base, rel, false).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The module path of a file under `src/` (`src/gpu/window.rs` is `["gpu", "window"]`).
fn module_of(rel: &str) -> Vec<String> {
    let path = rel.trim_start_matches("src/").trim_end_matches(".rs");
    let mut parts: Vec<String> = path.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Expands a `use` tree (`a::{b, c::{d, e as f}}`) into its paths.
fn expand_use(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_string()];
    };
    let prefix = tree[..open].trim();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand_use)
        .map(|p| if p == "self" { prefix.trim_end_matches("::").to_string() } else { format!("{prefix}{p}") })
        .collect()
}

/// The crate paths a file under `src/` reaches (`pass::decide::Decision`, `gpu`…): every `use` (groups expanded) and every inline `crate::`, `super::` or
/// `self::` path, resolved against the file's place.
fn crate_imports(base: &Path, rel: &str) -> BTreeSet<String> {
    let code = code(base, rel);
    let me = module_of(rel);
    let children: BTreeSet<String> = {
        let dir = if rel.ends_with("mod.rs") || rel.ends_with("lib.rs") { base.join(rel).parent().map(Path::to_path_buf) } else { None };
        dir.map(|d| {
            rust_files(base, d.strip_prefix(base).unwrap().to_str().unwrap())
                .iter()
                .map(|f| module_of(f).last().cloned().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
    };
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let boundary = |i: usize| i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
    for (i, _) in code.match_indices("use ") {
        if !boundary(i) {
            continue;
        }
        let end = code[i..].find(';').map_or(code.len(), |e| i + e);
        paths.extend(expand_use(&code[i + 4..end]));
    }
    for head in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(head) {
            if boundary(i) {
                let tail: String = code[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                paths.push(tail);
            }
        }
    }
    let mut out = BTreeSet::new();
    for path in paths {
        let mut segs: Vec<&str> = path.split("::").map(str::trim).filter(|s| !s.is_empty()).collect();
        let mut at: Vec<String> = match segs.first() {
            Some(&"crate") => {
                segs.remove(0);
                Vec::new()
            }
            Some(&"self") => {
                segs.remove(0);
                me.clone()
            }
            Some(&"super") => me.clone(),
            Some(first) if children.contains(*first) => me.clone(),
            _ => continue,
        };
        // `super::super::`, `self::super::`: up one module per `super`.
        while let Some(&s @ ("super" | "self")) = segs.first() {
            segs.remove(0);
            if s == "super" {
                at.pop();
            }
        }
        at.extend(segs.iter().map(|s| s.to_string()));
        if !at.is_empty() {
            out.insert(at.join("::"));
        }
    }
    out
}

/// The order ARCHITECTURE.md states: each module's place, top first. Within a line `>` orders and
/// `,` makes peers (neither may import the other).
fn stated_order(base: &Path) -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string(base.join("ARCHITECTURE.md")).unwrap();
    let block = doc.split("### Module order").nth(1).and_then(|s| s.split("```").nth(1)).expect("ARCHITECTURE.md states the module order");
    let mut rank = BTreeMap::new();
    let mut place = 0;
    for line in block.lines().filter(|l| l.contains(':')) {
        for group in line.split_once(':').unwrap().1.split('>') {
            for m in group.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                assert!(rank.insert(m.to_string(), place).is_none(), "{m} is placed twice in the module order");
            }
            place += 1;
        }
    }
    rank
}

/// The module of the order a path lies in: its longest prefix the order places
/// (`pass::decide::Decision` is in `pass::decide`, `coder::types::Workspace` in `coder`).
fn unit(rank: &BTreeMap<String, usize>, path: &str) -> String {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len()).rev().map(|n| segs[..n].join("::")).find(|p| rank.contains_key(p)).unwrap_or_else(|| segs[0].to_string())
}

/// Imports against the stated order (which rules out cycles), and modules it does not place.
fn import_order(base: &Path) -> Vec<String> {
    let rank = stated_order(base);
    // What an import can name: the crate's modules (a path to anything else names an item of
    // `lib.rs` or of an inline module, as `super::parse` inside `duration`'s `mod serde`).
    let modules: BTreeSet<String> = rust_files(base, "src").iter().map(|f| module_of(f)).filter_map(|m| m.first().cloned()).collect();
    let mut breaches = Vec::new();
    for file in rust_files(base, "src") {
        if file == "src/main.rs" || file == "src/lib.rs" {
            continue;
        }
        let me = unit(&rank, &module_of(&file).join("::"));
        let Some(&mine) = rank.get(&me) else {
            breaches.push(format!("{me} ({file}) is not in ARCHITECTURE.md's module order"));
            continue;
        };
        for path in crate_imports(base, &file).into_iter().filter(|p| p.split("::").next().is_some_and(|top| modules.contains(top))) {
            let m = unit(&rank, &path);
            match rank.get(&m) {
                Some(&theirs) if m == me || theirs > mine => {}
                Some(_) => breaches.push(format!("{file} imports {m}, which is not below {me} in the module order")),
                None => breaches.push(format!("{file} imports {m}, which is not in the module order")),
            }
        }
    }
    breaches
}

/// Files that must stay pure: no I/O, no clock.
const PURE: [&str; 6] = [
    "src/pass/decide.rs",
    "src/pass/deadline.rs",
    "src/pass/policy.rs",
    "src/duration.rs",
    "src/pass/stop_lifecycle.rs",
    "src/gpu/window.rs",
];

fn pure_code(base: &Path) -> Vec<String> {
    let mut breaches = Vec::new();
    for file in PURE {
        let code = code(base, file);
        for banned in [
            "tokio",
            "reqwest",
            "std::fs",
            "std::net",
            "std::time::Instant",
            "Utc::now",
            "Local::now",
            "Instant::now",
            "SystemTime",
            "Utc.timestamp",
        ] {
            if code.contains(banned) {
                breaches.push(format!("{file} mentions {banned}: it is pure"));
            }
        }
        let imports_instant = code.contains("time::{") && code.contains("Instant");
        if imports_instant {
            breaches.push(format!("{file} imports Instant: it is pure"));
        }
    }
    breaches
}

/// `needle` at `i` starts a word (`Client::new` but not `CoderClient::new`).
fn word_at(code: &str, i: usize) -> bool {
    i == 0 || !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
}

fn outgoing_http(base: &Path) -> Vec<String> {
    let mut breaches = Vec::new();
    for file in rust_files(base, "src") {
        let code = code(base, &file);
        let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        if file != "src/http.rs" {
            for builder in ["Client::new(", "Client::builder(", "ClientBuilder", "reqwest::get(", "reqwest::blocking", "Client::default("] {
                if code.match_indices(builder).any(|(i, _)| word_at(&code, i)) {
                    breaches.push(format!("{file} builds an HTTP client ({builder}); use http::client (no redirects, the configured CAs)"));
                }
            }
            if compact.contains(".chunk().await") || compact.contains(".bytes_stream(") {
                breaches.push(format!("{file} reads a body by hand; use http::read_limited or http::read_split"));
            }
        }
        for whole in [".json::<", ".json().await", ".text().await", ".bytes().await", ".text_with_charset("] {
            if compact.contains(whole) {
                breaches.push(format!("{file} reads a peer's body whole ({whole}); use http::read_limited"));
            }
        }
    }
    if !code(base, "src/http.rs").contains("redirect::Policy::none()") {
        breaches.push("http::client must refuse redirects".into());
    }
    breaches
}

/// Stop builds, TTL changes, deadline extensions, the audit log and the webhook: only in the actuator.
fn only_the_actuator_acts(base: &Path) -> Vec<String> {
    let mut breaches = Vec::new();
    for file in rust_files(base, "src") {
        if matches!(file.as_str(), "src/pass/actuator.rs" | "src/pass/audit.rs" | "src/coder/mod.rs") {
            continue;
        }
        let code = code(base, &file);
        let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        for needle in [".stop_workspace(", ".set_ttl(", ".extend_deadline(", "AuditLog", "Notifier", "AuditEvent::new("] {
            if compact.contains(needle) {
                breaches.push(format!("{file} uses {needle}: only the actuator acts"));
            }
        }
        for field in [".audit", ".notifier"] {
            if compact.match_indices(field).any(|(i, _)| !compact[i + field.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_'))
            {
                breaches.push(format!("{file} uses Outputs' field {field}: only the actuator acts"));
            }
        }
    }
    let actuator: String = code(base, "src/pass/actuator.rs").chars().filter(|c| !c.is_whitespace()).collect();
    if actuator.contains("pubaudit:") || actuator.contains("pubnotifier:") {
        breaches.push("Outputs' fields are public: others could write the audit log".into());
    }
    breaches
}

/// Every place a mode is checked: compared, matched, or tested with `matches!`/`if let`.
/// Naming a mode to make one (`mode: Mode::Observe`, `=> Mode::Observe`) is not a check.
fn mode_checks(base: &Path) -> Vec<String> {
    let mut checks = Vec::new();
    for file in rust_files(base, "src") {
        if file == "src/pass/mode.rs" {
            continue;
        }
        let code = code(base, &file);
        let c: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        if c.contains("Mode::*") || c.contains("Mode::{") {
            checks.push(format!("{file}: imports Mode's variants"));
        }
        for (i, _) in code.match_indices("Mode::") {
            if !word_at(&code, i) {
                continue;
            }
            let before: String = code[..i].chars().filter(|ch| !ch.is_whitespace()).collect();
            let after: String =
                code[i + 6..].chars().skip_while(|ch| ch.is_alphanumeric() || *ch == '_').filter(|ch| !ch.is_whitespace()).collect();
            let in_matches = before.rfind("matches!(").is_some_and(|m| {
                let depth: i32 = before[m + 8..]
                    .chars()
                    .map(|ch| {
                        if ch == '(' {
                            1
                        } else if ch == ')' {
                            -1
                        } else {
                            0
                        }
                    })
                    .sum();
                depth > 0
            });
            // After the group it closes: `(Mode::Enforce, x) =>`, `Some(Mode::Enforce) =>`.
            let mut depth = 0;
            let mut rest = None;
            for (j, ch) in after.char_indices() {
                match ch {
                    '(' | '[' => depth += 1,
                    ')' | ']' if depth == 0 => {
                        rest = Some(&after[j + 1..]);
                        break;
                    }
                    ')' | ']' => depth -= 1,
                    ';' | '{' | '}' if depth == 0 => break,
                    _ => {}
                }
            }
            let pattern_follows =
                |s: &str| s.starts_with("=>") || s.starts_with('|') || s.starts_with("if") || (s.starts_with('=') && !s.starts_with("=="));
            let compared = before.ends_with("==") || before.ends_with("!=") || after.starts_with("==") || after.starts_with("!=");
            let bound = before.ends_with("let") || before.ends_with('|');
            let matched =
                pattern_follows(&after) || ((before.ends_with('(') || before.ends_with(',')) && rest.is_some_and(pattern_follows));
            if compared || bound || in_matches || matched {
                checks.push(format!("{file}: {}", &code[i..(i + 30).min(code.len())]));
            }
        }
        for s in ["==\"observe\"", "==\"enforce\"", "\"observe\"==", "\"enforce\"==", "\"observe\"=>", "\"enforce\"=>"] {
            if source(base, &file, true).split_whitespace().collect::<String>().contains(s) {
                checks.push(format!("{file}: the mode's name compared ({s})"));
            }
        }
    }
    checks
}

/// The one check is `actuator::acts`; `pass/mode.rs` only phrases texts (no comparison, no boolean).
fn mode_rule(base: &Path) -> Vec<String> {
    let checks = mode_checks(base);
    let mut breaches = Vec::new();
    if checks.len() != 1 || !checks[0].starts_with("src/pass/actuator.rs") {
        breaches.push(format!("the mode is checked in exactly one place, in the actuator: {checks:?}"));
    }
    let m: String = code(base, "src/pass/mode.rs").chars().filter(|c| !c.is_whitespace()).collect();
    for banned in ["->bool", "==", "!=", "matches!"] {
        if m.contains(banned) {
            breaches.push(format!("src/pass/mode.rs holds {banned}: it phrases texts, the actuator decides"));
        }
    }
    breaches
}

/// Every source file has a code-map row, and the names a `src/` row puts in backticks are in that
/// file (`decide()` as a function, `Mode` as a word).
fn code_map(base: &Path) -> Vec<String> {
    let map = std::fs::read_to_string(base.join("ARCHITECTURE.md")).unwrap();
    let mut breaches = Vec::new();
    let mut files = rust_files(base, "src");
    for dir in ["mocks/src", "tests", "benches"] {
        if base.join(dir).exists() {
            files.extend(rust_files(base, dir));
        }
    }
    for f in &files {
        if !map.contains(&format!("`{f}`")) {
            breaches.push(format!("ARCHITECTURE.md's code map does not list {f}"));
        }
    }
    for row in map.lines().filter(|l| l.starts_with("| `src/")) {
        let mut cells = row.split('|').map(str::trim).filter(|c| !c.is_empty());
        let (Some(path), Some(owns)) = (cells.next(), cells.next()) else { continue };
        let path = path.trim_matches('`');
        let Ok(text) = std::fs::read_to_string(base.join(path)) else {
            breaches.push(format!("the code map lists {path}, which does not exist"));
            continue;
        };
        let text = strip(&text, true);
        for name in owns.split('`').skip(1).step_by(2) {
            let fn_name = name.strip_suffix("()");
            let ident = fn_name.unwrap_or(name).rsplit("::").next().unwrap_or(name);
            if ident.is_empty()
                || !ident.chars().all(|c| c.is_alphanumeric() || c == '_')
                || ident.chars().next().is_some_and(|c| c.is_ascii_digit())
            {
                continue;
            }
            let found = match fn_name {
                Some(_) => text.contains(&format!("fn {ident}")),
                None => text
                    .match_indices(ident)
                    .any(|(i, _)| word_at(&text, i) && !text[i + ident.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')),
            };
            if !found {
                breaches.push(format!("the code map says {path} holds `{name}`; it does not"));
            }
        }
    }
    breaches
}

#[test]
fn dependencies_point_down_the_stated_order() {
    assert_eq!(import_order(&root()), Vec::<String>::new());
}

#[test]
fn the_decision_code_does_no_io_and_reads_no_clock() {
    assert_eq!(pure_code(&root()), Vec::<String>::new());
}

#[test]
fn only_the_actuator_acts_on_the_world() {
    assert_eq!(only_the_actuator_acts(&root()), Vec::<String>::new());
}

#[test]
fn the_mode_is_checked_in_exactly_one_place() {
    assert_eq!(mode_rule(&root()), Vec::<String>::new());
}

#[test]
fn the_code_map_lists_every_source_file_and_what_it_holds() {
    assert_eq!(code_map(&root()), Vec::<String>::new());
}

#[test]
fn every_outgoing_client_refuses_redirects_and_every_body_is_bounded() {
    assert_eq!(outgoing_http(&root()), Vec::<String>::new());
}

/// A copy of `src/` and ARCHITECTURE.md, removed when dropped.
struct Copy(PathBuf);

impl Copy {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("architecture-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        for file in rust_files(&root(), "src") {
            let to = dir.join(&file);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(root().join(&file), to).unwrap();
        }
        std::fs::copy(root().join("ARCHITECTURE.md"), dir.join("ARCHITECTURE.md")).unwrap();
        Copy(dir)
    }

    /// Inserts `code` after the file's first line that contains `after`.
    fn plant(self, file: &str, after: &str, code: &str) -> Self {
        let path = self.0.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let at = text.find(after).unwrap_or_else(|| panic!("{after:?} not in {file}"));
        let at = text[at..].find('\n').map_or(text.len(), |n| at + n + 1);
        std::fs::write(&path, format!("{}{code}\n{}", &text[..at], &text[at..])).unwrap();
        self
    }

    fn replace(self, file: &str, from: &str, to: &str) -> Self {
        let path = self.0.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from:?} not in {file}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        self
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The check passes on the copy as it is, and fails once the breach is planted.
fn fails_on(check: fn(&Path) -> Vec<String>, planted: Copy, expect: &str) {
    assert_eq!(check(&Copy::new().0), Vec::<String>::new(), "the unchanged copy passes");
    let breaches = check(&planted.0);
    assert!(breaches.iter().any(|b| b.contains(expect)), "the planted breach is caught ({expect}): {breaches:?}");
}

#[test]
fn planted_imports_against_the_order_are_caught() {
    fails_on(import_order, Copy::new().plant("src/gpu/window.rs", "use ", "use super::super::config::Settings;"), "imports config");
    fails_on(import_order, Copy::new().plant("src/gpu/window.rs", "use ", "use self::super::super::app::Application;"), "imports app");
    fails_on(
        import_order,
        Copy::new().plant("src/pass/decide.rs", "use ", "use crate::{\n    duration::human,\n    pass::evaluate::Evaluation,\n};"),
        "imports pass::evaluate",
    );
    fails_on(
        import_order,
        Copy::new().plant("src/pass/policy.rs", "use ", "fn f() -> crate::pass::publish::State { todo!() }"),
        "imports pass::publish",
    );
    // Within the pass, `super::` names a sibling: decide may not reach up to the actuator.
    fails_on(import_order, Copy::new().plant("src/pass/decide.rs", "use ", "use super::actuator::Actuator;"), "imports pass::actuator");
    fails_on(import_order, Copy::new().plant("src/coder/types.rs", "use ", "use super::identity::Identity;"), "imports coder::identity");
    fails_on(import_order, Copy::new().plant("src/pass/actuator.rs", "use ", "use crate::config::Settings;"), "imports config");
    // A string holding `//` on the line does not hide the import after it.
    fails_on(
        import_order,
        Copy::new().plant("src/gpu/exporter.rs", "use ", r#"const U: &str = "http://x"; use crate::pass::evaluate::Evaluation;"#),
        "imports pass::evaluate",
    );
    fails_on(import_order, Copy::new().replace("ARCHITECTURE.md", "http:     http\n", ""), "http (src/http.rs) is not in");
}

#[test]
fn planted_clocks_and_io_in_the_pure_code_are_caught() {
    fails_on(
        pure_code,
        Copy::new().plant("src/gpu/window.rs", "use ", "fn n() -> chrono::DateTime<chrono::Utc> { chrono::Utc::now() }"),
        "Utc::now",
    );
    fails_on(
        pure_code,
        Copy::new().plant("src/pass/decide.rs", "use ", "fn n() -> std::time::Instant { std::time::Instant::now() }"),
        "Instant::now",
    );
    fails_on(
        pure_code,
        Copy::new().plant("src/pass/stop_lifecycle.rs", "use ", "fn n() -> std::time::SystemTime { std::time::SystemTime::now() }"),
        "SystemTime",
    );
    fails_on(pure_code, Copy::new().plant("src/pass/policy.rs", "use ", "fn n() { let _ = chrono::Local::now(); }"), "Local::now");
}

#[test]
fn planted_clients_and_whole_body_reads_are_caught() {
    fails_on(
        outgoing_http,
        Copy::new().plant("src/gpu/exporter.rs", "use ", "async fn f() -> Result<String, reqwest::Error> { reqwest::Client::new().get(\"http://x\").send().await?.json::<String>().await }"),
        "builds an HTTP client",
    );
    fails_on(
        outgoing_http,
        Copy::new().plant(
            "src/gpu/exporter.rs",
            "use ",
            "async fn f(r: reqwest::Response) -> Result<String, reqwest::Error> { r.json::<String>().await }",
        ),
        "reads a peer's body whole (.json::<",
    );
    fails_on(
        outgoing_http,
        Copy::new().plant(
            "src/coder/mod.rs",
            "use ",
            "async fn f(r: reqwest::Response) -> String { r.text()\n    .await.unwrap_or_default() }",
        ),
        "(.text().await)",
    );
    fails_on(
        outgoing_http,
        Copy::new().plant("src/pass/audit.rs", "use ", "fn c() { let _ = reqwest::Client::builder(); }"),
        "Client::builder(",
    );
    fails_on(
        outgoing_http,
        Copy::new().plant(
            "src/gpu/prometheus.rs",
            "use ",
            "async fn f(r: reqwest::Response) -> Vec<u8> { r.bytes().await.map(|b| b.to_vec()).unwrap_or_default() }",
        ),
        "(.bytes().await)",
    );
}

#[test]
fn planted_actions_outside_the_actuator_are_caught() {
    fails_on(
        only_the_actuator_acts,
        Copy::new().plant(
            "src/pass/publish.rs",
            "use ",
            "fn w(o: &crate::pass::actuator::Outputs, e: &crate::pass::audit::AuditEvent) { if let Some(a) = &o.audit { a.append(e); } }",
        ),
        "uses Outputs' field .audit",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::new().replace("src/pass/actuator.rs", "    audit: Option<Arc<AuditLog>>,", "    pub audit: Option<Arc<AuditLog>>,"),
        "Outputs' fields are public",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::new().plant("src/app.rs", "use ", "async fn s(c: &crate::coder::CoderClient) { let _ = c.stop_workspace(\"id\").await; }"),
        ".stop_workspace(",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::new().plant(
            "src/pass/evaluate.rs",
            "use ",
            "async fn x(c: &crate::coder::CoderClient) { let _ = c\n    .extend_deadline(\"id\", chrono::Utc::now()).await; }",
        ),
        ".extend_deadline(",
    );
}

#[test]
fn planted_mode_checks_are_caught() {
    let check = mode_rule;
    fails_on(
        check,
        Copy::new().plant("src/pass/publish.rs", "use ", "fn m(mode: Mode) -> bool { matches!(mode, Mode::Enforce) }"),
        "src/pass/publish.rs",
    );
    fails_on(
        check,
        Copy::new().plant("src/pass/publish.rs", "use ", "fn m(mode: Mode) -> bool { mode != Mode::Observe }"),
        "src/pass/publish.rs",
    );
    fails_on(
        check,
        Copy::new().plant(
            "src/app.rs",
            "use ",
            "fn m(mode: Mode) -> u8 { match mode {\n    Mode::Observe => 0,\n    Mode::Enforce => 1,\n} }",
        ),
        "src/app.rs",
    );
    fails_on(
        check,
        Copy::new().plant(
            "src/app.rs",
            "use ",
            "fn m(mode: Mode, x: Option<u8>) -> u8 { match (mode, x) { (Mode::Enforce, Some(_)) => 1, _ => 0 } }",
        ),
        "src/app.rs",
    );
    fails_on(
        check,
        Copy::new().plant("src/app.rs", "use ", "fn m(mode: Mode) -> u8 { if let Mode::Enforce = mode { 1 } else { 0 } }"),
        "src/app.rs",
    );
    fails_on(
        check,
        Copy::new().plant("src/pass/page.rs", "use ", "fn m(mode: &str) -> bool { mode == \"enforce\" }"),
        "the mode's name compared",
    );
    fails_on(
        check,
        Copy::new().plant("src/pass/mode.rs", "impl Mode {", "    pub fn acts(self) -> bool { self == Mode::Enforce }"),
        "src/pass/mode.rs holds",
    );
}

#[test]
fn planted_code_map_drift_is_caught() {
    let copy = Copy::new();
    std::fs::write(copy.0.join("src/unlisted.rs"), "//! Nobody lists me.\n").unwrap();
    fails_on(code_map, copy, "does not list src/unlisted.rs");
    fails_on(
        code_map,
        Copy::new().replace("src/pass/decide.rs", "pub fn apply_fleet_rules", "pub fn fleet_rules"),
        "holds `apply_fleet_rules()`",
    );
    fails_on(
        code_map,
        Copy::new().replace(
            "ARCHITECTURE.md",
            "`src/pass/actuator.rs` | the act step:",
            "`src/pass/actuator.rs` | the act step: `Evaluator`,",
        ),
        "holds `Evaluator`",
    );
}

#[test]
fn the_stripper_keeps_strings_and_drops_comments() {
    let s = strip("let u = \"http://x\"; use crate::a; // crate::b\n/* crate::c */ let c = '\"'; use crate::d;", true);
    assert!(s.contains("use crate::a") && s.contains("use crate::d") && s.contains("\"http://x\""), "{s}");
    assert!(!s.contains("crate::b") && !s.contains("crate::c"), "{s}");
    assert_eq!(expand_use("crate::{a::{b, c as d}, self, e}"), ["crate::a::b", "crate::a::c", "crate", "crate::e"]);
}
