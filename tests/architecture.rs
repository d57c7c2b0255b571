//! The invariants ARCHITECTURE.md states that types cannot, checked on the sources: the module
//! order (every import, `crate::`, `super::` or `self::`, in a `use` group or inline, points down
//! the order the document states) and no import cycle between files, even inside a folder; who
//! may hold Coder's write capability and the audit and webhook writers; where the mode check
//! lives; and that the code map lists every source file and names what is in it.
//!
//! Each check reads a tree (`src/`, `core/src/` and ARCHITECTURE.md under one root) and returns
//! the breaches it found; the `planted_*` tests copy the tree, plant one breach and expect the
//! check to name it. What the compiler refuses (the core crate's purity, writes on the read-only
//! client, private fields, whole-body reads) is shown in `fences.rs`, by building a planted copy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::Scratch;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The crates' sources: the service crate's `src/` and the core crate's `core/src/`.
const SOURCE_DIRS: [&str; 2] = ["src", "core/src"];

/// Every `.rs` file of both crates, relative to `base`.
fn sources(base: &Path) -> Vec<String> {
    SOURCE_DIRS.iter().filter(|d| base.join(d).exists()).flat_map(|d| rust_files(base, d)).collect()
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
    strip_marked(text, keep_strings).into_iter().map(|(c, _)| c).collect()
}

/// `strip`, each char marked when it lies inside a string or char literal (braces there do not
/// open or close anything).
fn strip_marked(text: &str, keep_strings: bool) -> Vec<(char, bool)> {
    struct Out(Vec<(char, bool)>);
    impl Out {
        fn push(&mut self, c: char) {
            self.0.push((c, false));
        }
        fn push_str(&mut self, s: &str) {
            let n = s.chars().count();
            // A literal's quotes are code, its body is not.
            self.0.extend(s.chars().enumerate().map(|(i, c)| (c, i > 0 && i + 1 < n)));
        }
        fn extend(&mut self, s: &[char]) {
            let n = s.len();
            let open = s.iter().position(|c| *c == '"').unwrap_or(0);
            self.0.extend(s.iter().enumerate().map(|(i, c)| (*c, i > open && i + 1 < n)));
        }
    }
    let b: Vec<char> = text.chars().collect();
    let mut out = Out(Vec::with_capacity(text.len()));
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
    out.0
}

/// Drops every `#[cfg(test)] mod name { ... }` (braces matched outside literals), wherever it
/// stands: code after a test module in the middle of a file is still read. A `#[cfg(test)]` on
/// anything else is read as code.
fn without_test_modules(marked: Vec<(char, bool)>) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let text: Vec<char> = marked.iter().map(|(c, _)| *c).collect();
    let at = |i: usize, s: &str| s.chars().enumerate().all(|(k, c)| text.get(i + k) == Some(&c));
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if !marked[i].1 && at(i, ATTR) {
            let mut j = i + ATTR.len();
            while text.get(j).is_some_and(|c| c.is_whitespace()) {
                j += 1;
            }
            if at(j, "pub ") {
                j += 4;
            }
            if at(j, "mod ") {
                let mut k = j;
                while k < text.len() && text[k] != '{' && text[k] != ';' {
                    k += 1;
                }
                if text.get(k) == Some(&'{') {
                    let mut depth = 0;
                    while k < text.len() {
                        if !marked[k].1 && text[k] == '{' {
                            depth += 1;
                        } else if !marked[k].1 && text[k] == '}' {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        k += 1;
                    }
                }
                i = k + 1;
                continue;
            }
        }
        out.push(text[i]);
        i += 1;
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
    without_test_modules(strip_marked(&text, keep_strings))
}

/// Code with comments and string contents removed, whitespace runs made one space.
fn code(base: &Path, rel: &str) -> String {
    source(base, rel, false).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The module path of a source file: `src/gpu/exporter.rs` is `["gpu", "exporter"]`, and the
/// core crate's files lie under `core` (`core/src/gpu/window.rs` is `["core", "gpu", "window"]`).
fn module_of(rel: &str) -> Vec<String> {
    let mut parts = crate_root(rel);
    let path = rel.strip_prefix("core/src/").or_else(|| rel.strip_prefix("src/")).unwrap_or(rel).trim_end_matches(".rs");
    parts.extend(path.split('/').map(str::to_string));
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Where `crate::` leads from a file: the core crate's root is `core`.
fn crate_root(rel: &str) -> Vec<String> {
    if rel.starts_with("core/src/") { vec!["core".to_string()] } else { Vec::new() }
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
    // In a `mod.rs`, a child's name leads a path too (`exporter::ExporterSource`).
    let heads: Vec<String> =
        ["crate::", "super::", "self::"].into_iter().map(str::to_string).chain(children.iter().map(|c| format!("{c}::"))).collect();
    for head in &heads {
        for (i, _) in code.match_indices(head.as_str()) {
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
                crate_root(rel)
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
    let mut breaches = Vec::new();
    // What the path reading below cannot follow: the crate under another name, and items
    // re-exported at the crate root.
    for file in sources(base) {
        let code = code(base, &file);
        if code.contains("crate as ") || code.contains("extern crate self") {
            breaches.push(format!("{file} names the crate under another name: write crate:: paths"));
        }
    }
    for lib in ["src/lib.rs", "core/src/lib.rs"] {
        let code = code(base, lib);
        if code.split("pub use ").skip(1).any(|u| !u.starts_with("reclaimer_core::")) {
            breaches.push(format!("{lib} re-exports an item of its own: modules are reached by their paths"));
        }
    }
    let rank = stated_order(base);
    // What an import can name: the crate's modules (a path to anything else names an item of
    // `lib.rs` or of an inline module, as `super::parse` inside `duration`'s `mod serde`).
    // (The core crate's are `core::` and their name.)
    let top =
        |m: &[String]| m.iter().take(if m.first().is_some_and(|s| s == "core") { 2 } else { 1 }).cloned().collect::<Vec<_>>().join("::");
    let modules: BTreeSet<String> = sources(base).iter().map(|f| top(&module_of(f))).collect();
    for file in sources(base) {
        if file == "src/main.rs" || file.ends_with("src/lib.rs") {
            continue;
        }
        let me = unit(&rank, &module_of(&file).join("::"));
        let Some(&mine) = rank.get(&me) else {
            breaches.push(format!("{me} ({file}) is not in ARCHITECTURE.md's module order"));
            continue;
        };
        for path in crate_imports(base, &file)
            .into_iter()
            .filter(|p| modules.contains(&top(&p.split("::").map(str::to_string).collect::<Vec<_>>())))
        {
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

/// Import cycles between files, folders included (`gpu/mod.rs` and a source importing each
/// other): each file's imports, resolved to the file they lie in, searched depth first.
fn import_cycles(base: &Path) -> Vec<String> {
    let files: BTreeMap<String, String> = sources(base).into_iter().map(|f| (module_of(&f).join("::"), f)).collect();
    let file_of = |path: &str| -> Option<String> {
        let segs: Vec<&str> = path.split("::").collect();
        (1..=segs.len()).rev().map(|n| segs[..n].join("::")).find(|p| files.contains_key(p))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &files {
        let to = crate_imports(base, file).iter().filter_map(|p| file_of(p)).filter(|m| m != module && !m.is_empty()).collect();
        edges.insert(module.clone(), to);
    }
    fn visit(
        at: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<String>,
    ) {
        if let Some(start) = path.iter().position(|p| p == at) {
            found.push(format!("import cycle: {} > {at}", path[start..].join(" > ")));
            return;
        }
        if !done.insert(at.to_string()) {
            return;
        }
        path.push(at.to_string());
        for next in edges.get(at).into_iter().flatten() {
            visit(next, edges, path, done, found);
        }
        path.pop();
    }
    let (mut done, mut found) = (BTreeSet::new(), Vec::new());
    for module in edges.keys() {
        visit(module, &edges, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

/// The core crate stays pure: besides the compiler's fences (no tokio, reqwest or tracing among
/// its dependencies, chrono without its clock, clippy's bans: `fences.rs`), no file of it names
/// an I/O or clock path, and no `allow` lifts clippy's bans outside its tests.
fn pure_code(base: &Path) -> Vec<String> {
    let mut breaches = Vec::new();
    for file in sources(base).into_iter().filter(|f| f.starts_with("core/")) {
        let code = code(base, &file);
        // Paths however imported (`use std::{fs, env}` then `fs::`), output, and the clocks
        // however reached (`UNIX_EPOCH.elapsed()`).
        for banned in [
            "tokio",
            "reqwest",
            "tracing",
            "fs::",
            "net::",
            "env::",
            "process::",
            "io::stdin",
            "io::stdout",
            "io::stderr",
            "print!",
            "println!",
            "dbg!",
            "Instant",
            "SystemTime",
            "UNIX_EPOCH",
            "elapsed(",
            "Utc::now",
            "Local::now",
            "disallowed_methods",
            "disallowed_types",
            "disallowed_macros",
            "clippy::style",
            "clippy::all",
        ] {
            if code.contains(banned) {
                breaches.push(format!("{file} mentions {banned}: the core crate is pure"));
            }
        }
    }
    // The core's dependencies, in every dependency table but the dev one: a short list, each
    // added on purpose; chrono without its default features (they hold the clock).
    const MAY_DEPEND_ON: [&str; 5] = ["chrono", "humantime", "memchr", "serde", "serde_json"];
    let manifest = std::fs::read_to_string(base.join("core/Cargo.toml")).unwrap_or_default();
    let mut table = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.trim_matches(['[', ']']).to_string();
            if let Some(name) = table.strip_prefix("dependencies.") {
                if !MAY_DEPEND_ON.contains(&name) {
                    breaches
                        .push(format!("core/Cargo.toml depends on {name}: the core crate is pure (it may depend on {MAY_DEPEND_ON:?})"));
                }
            }
            continue;
        }
        let in_dependencies = table.ends_with("dependencies") && !table.ends_with("dev-dependencies");
        let Some((name, spec)) = line.split_once('=').filter(|_| in_dependencies && !line.starts_with('#')) else { continue };
        let name = name.trim().split('.').next().unwrap_or("").trim_matches('"');
        if !MAY_DEPEND_ON.contains(&name) {
            breaches.push(format!("core/Cargo.toml depends on {name}: the core crate is pure (it may depend on {MAY_DEPEND_ON:?})"));
        }
        if name == "chrono" && (spec.contains("clock") || spec.contains("workspace") || !spec.contains("default-features = false")) {
            breaches.push("core/Cargo.toml takes chrono with its clock: the core crate reads no clock".into());
        }
    }
    breaches
}

/// The lint attributes of `code` (`#[allow(...)]`, `#![allow(...)]`, `#[expect(...)]`): what is
/// inside the parentheses.
fn lint_attributes(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for start in ["[allow(", "[expect("] {
        for (i, _) in code.match_indices(start) {
            let rest = &code[i + start.len()..];
            out.push(rest.split(")]").next().unwrap_or(rest));
        }
    }
    out
}

/// Each `#[derive(...)]` followed by a struct: the derive list and the struct's body.
fn derived_structs(code: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("#[derive(") {
        let rest = &code[i..];
        let Some(end) = rest.find(")]") else { continue };
        let after = &rest[end..];
        let Some(at) = after.find("struct ") else { continue };
        // Only when the struct is the derive's item (no other item in between).
        if after[..at].contains(';') || after[..at].contains('}') {
            continue;
        }
        let item = &after[at..];
        // The body: a tuple struct's up to its `;`, a struct's up to its matching brace.
        let open = item.find(['{', '(', ';']).unwrap_or(item.len());
        let close = match item.as_bytes().get(open) {
            Some(b'{') => {
                let mut depth = 0usize;
                item.char_indices()
                    .skip_while(|(i, _)| *i < open)
                    .find(|(_, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map_or(item.len(), |(i, _)| i + 1)
            }
            _ => item.find(';').map_or(item.len(), |i| i + 1),
        };
        out.push((&rest[..end], &item[..close]));
    }
    out
}

/// `needle` at `i` starts a word (`Client::new` but not `CoderClient::new`).
fn word_at(code: &str, i: usize) -> bool {
    i == 0 || !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
}

/// Clients and body reads are fenced by clippy (`clippy.toml`, by type: `fences.rs`); what types
/// cannot say is checked here: only `http.rs` lifts the ban, and its client refuses redirects.
fn outgoing_http(base: &Path) -> Vec<String> {
    let mut breaches = Vec::new();
    for file in sources(base).into_iter().filter(|f| f.starts_with("src/")) {
        let code = code(base, &file);
        let lifted = code.matches("clippy::disallowed_methods").count();
        let allowed = if file == "src/http.rs" { 2 } else { 0 };
        if lifted > allowed {
            breaches.push(format!(
                "{file} allows clippy::disallowed_methods: only http::client and its body reader may build clients and read bodies"
            ));
        }
        // A group allow lifts the ban too (`disallowed_methods` is a style lint), and so does
        // `warnings`, every lint at once.
        for group in ["clippy::style", "clippy::all"] {
            if code.contains(group) {
                breaches.push(format!("{file} allows {group}: it lifts clippy's bans on clients and whole-body reads"));
            }
        }
        if lint_attributes(&code).iter().any(|a| a.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == "warnings")) {
            breaches.push(format!("{file} allows warnings: it lifts clippy's bans on clients and whole-body reads"));
        }
        // A derived `Default` calls `Client::default()` where clippy does not look (inside the
        // derive's expansion): a struct holding a client derives no `Default`.
        for (derive, body) in derived_structs(&code) {
            if derive.contains("Default") && (body.contains("reqwest::Client") || body.contains(": Client")) {
                breaches.push(format!("{file} derives Default for a struct holding an HTTP client: its default client follows redirects; build it with http::client"));
            }
        }
        // `Default` is a trait method clippy's list cannot name; the default client follows redirects.
        for default in ["Client::default(", "ClientBuilder::default("] {
            if code.match_indices(default).any(|(i, _)| word_at(&code, i)) {
                breaches.push(format!("{file} builds an HTTP client ({default}); use http::client (no redirects, the configured CAs)"));
            }
        }
    }
    if !code(base, "src/http.rs").contains("redirect::Policy::none()") {
        breaches.push("http::client must refuse redirects".into());
    }
    breaches
}

/// Coder's writes, the audit log and the webhook are capabilities: the types make every write a
/// method of `CoderActions` (`CoderClient` only reads) and keep `Outputs`' writers private; what
/// the types cannot say is who holds them. Only `Application::build` makes them and only the
/// actuator holds them; a write method or verb outside `coder/actions.rs`, a POST outside the
/// webhook, or a public writer field would reopen the door.
fn only_the_actuator_acts(base: &Path) -> Vec<String> {
    let mut breaches = Vec::new();
    let holders: [(&str, &[&str]); 4] = [
        ("CoderActions", &["src/coder/actions.rs", "src/pass/actuator.rs", "src/app.rs"]),
        ("AuditLog", &["src/pass/audit.rs", "src/pass/actuator.rs"]),
        ("Notifier", &["src/pass/audit.rs", "src/pass/actuator.rs"]),
        ("Outputs", &["src/pass/actuator.rs", "src/app.rs"]),
    ];
    let makers: [(&str, &str); 2] = [("CoderActions::new(", "src/app.rs"), ("Outputs::open(", "src/app.rs")];
    for file in sources(base).into_iter().filter(|f| f.starts_with("src/")) {
        let code = code(base, &file);
        let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        for (name, may) in holders {
            let named = code
                .match_indices(name)
                .any(|(i, _)| word_at(&code, i) && !code[i + name.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_'));
            if named && !may.contains(&file.as_str()) {
                breaches.push(format!("{file} names {name}: only the actuator holds it ({may:?})"));
            }
        }
        for (maker, may) in makers {
            if compact.contains(maker) && file != may {
                breaches.push(format!("{file} makes {maker}..): only Application::build does"));
            }
        }
        if file != "src/coder/actions.rs" {
            for verb in ["Method::PUT", "Method::PATCH", "Method::DELETE"] {
                if compact.contains(verb) {
                    breaches.push(format!("{file} sends {verb}: Coder's writes are CoderActions' methods (coder/actions.rs)"));
                }
            }
            // Reading permissions is the one POST that changes nothing.
            let posts = compact.matches("Method::POST").count();
            let reads = if file == "src/coder/mod.rs" { compact.matches("Method::POST,\"\",").count() } else { 0 };
            if posts > reads || (file == "src/coder/mod.rs" && reads > 1) {
                breaches.push(format!("{file} sends Method::POST: Coder's writes are CoderActions' methods (coder/actions.rs)"));
            }
        }
        if file != "src/pass/audit.rs" {
            for verb in [".post(", ".put(", ".patch(", ".delete("] {
                if compact.contains(verb) {
                    breaches.push(format!("{file} sends {verb}..): only the webhook (pass/audit.rs) and CoderActions write"));
                }
            }
        }
    }
    // What would hide a holder or a verb from the checks above: an alias, a renamed import, a
    // `Clone` written by hand.
    for file in sources(base).into_iter().filter(|f| f.starts_with("src/")) {
        let spaced = code(base, &file);
        let compact: String = spaced.chars().filter(|c| !c.is_whitespace()).collect();
        for (name, _) in holders {
            let aliased = spaced.match_indices("type ").filter(|(i, _)| word_at(&spaced, *i)).any(|(i, _)| {
                let statement = &spaced[i..spaced[i..].find(';').map_or(spaced.len(), |e| i + e)];
                statement.contains('=') && statement.contains(name)
            });
            if aliased || spaced.contains(&format!("{name} as ")) || compact.contains(&format!("implClonefor{name}")) {
                breaches.push(format!("{file} aliases or clones {name}: name it as it is"));
            }
        }
        if spaced.contains("Method as ") {
            breaches.push(format!("{file} renames reqwest's Method: the verb checks read `Method::`"));
        }
    }
    let authcheck: String = source(base, "src/coder/mod.rs", true).chars().filter(|c| !c.is_whitespace()).collect();
    if authcheck.matches("Method::POST,").count() != authcheck.matches("Method::POST,\"POST/api/v2/authcheck\"").count() {
        breaches.push("src/coder/mod.rs sends a POST other than authcheck: Coder's writes are CoderActions' methods".into());
    }
    let actuator: String = code(base, "src/pass/actuator.rs").chars().filter(|c| !c.is_whitespace()).collect();
    if actuator.contains("pubaudit:") || actuator.contains("pubnotifier:") {
        breaches.push("Outputs' fields are public: others could write the audit log".into());
    }
    if code(base, "src/coder/actions.rs").contains("derive(Clone") || code(base, "src/coder/actions.rs").contains("implClone") {
        breaches.push("CoderActions is Clone: a second holder could appear".into());
    }
    // `Application::build` makes the capability for `Role::Run` in enforce mode only: `plan` (and
    // every subcommand but `run` and `demo`) builds as `Role::Plan`, which observes.
    for file in sources(base)
        .into_iter()
        .filter(|f| f.starts_with("src/") && !["src/app.rs", "src/commands/run.rs", "src/commands/demo.rs"].contains(&f.as_str()))
    {
        if code(base, &file).contains("Role::Run") {
            breaches.push(format!("{file} builds the application as Role::Run: only run and demo may act; build as Role::Plan"));
        }
    }
    let app: String = code(base, "src/app.rs").chars().filter(|c| !c.is_whitespace()).collect();
    if !app.contains("acts(mode).then(||CoderActions::new(") {
        breaches.push("src/app.rs makes CoderActions without asking actuator::acts(mode): only enforce mode may write".into());
    }
    breaches
}

/// Every place a mode is checked: compared, matched, or tested with `matches!`/`if let`.
/// Naming a mode to make one (`mode: Mode::Observe`, `=> Mode::Observe`) is not a check.
fn mode_checks(base: &Path) -> Vec<String> {
    let mut checks = Vec::new();
    for file in sources(base) {
        if file == "core/src/pass/mode.rs" {
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
            // A path in front (`crate::pass::mode::Mode::Enforce`) is part of the name.
            let before: String = code[..i].chars().filter(|ch| !ch.is_whitespace()).collect();
            let before = before.trim_end_matches(|ch: char| ch.is_alphanumeric() || ch == '_' || ch == ':').to_string();
            let after: String =
                code[i + 6..].chars().skip_while(|ch| ch.is_alphanumeric() || *ch == '_').filter(|ch| !ch.is_whitespace()).collect();
            // Inside a `matches!` whose own parenthesis is still open here.
            let in_matches = before.rfind("matches!(").is_some_and(|m| {
                let mut depth = 0;
                for ch in before[m + 8..].chars() {
                    if ch == '(' {
                        depth += 1;
                    } else if ch == ')' {
                        depth -= 1;
                        if depth == 0 {
                            return false;
                        }
                    }
                }
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
        // The mode's names are spelled only by `Mode::as_str`: a literal elsewhere is a check
        // waiting to happen (`== "enforce"`, `"observe".eq(..)`, a pattern).
        let with_strings = source(base, &file, true);
        for name in ["\"observe\"", "\"enforce\""] {
            if with_strings.contains(name) {
                checks.push(format!("{file}: the mode's name compared ({name} outside Mode::as_str)"));
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
    let m: String = code(base, "core/src/pass/mode.rs").chars().filter(|c| !c.is_whitespace()).collect();
    for banned in ["->bool", "==", "!=", "matches!"] {
        if m.contains(banned) {
            breaches.push(format!("core/src/pass/mode.rs holds {banned}: it phrases texts, the actuator decides"));
        }
    }
    breaches
}

/// Every source file has a code-map row, and the names a `src/` row puts in backticks are in that
/// file (`decide()` as a function, `Mode` as a word).
fn code_map(base: &Path) -> Vec<String> {
    let map = std::fs::read_to_string(base.join("ARCHITECTURE.md")).unwrap();
    let mut breaches = Vec::new();
    let mut files = sources(base);
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
    for row in map.lines().filter(|l| l.starts_with("| `src/") || l.starts_with("| `core/src/")) {
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
fn no_file_imports_in_a_cycle() {
    assert_eq!(import_cycles(&root()), Vec::<String>::new());
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

/// A copy of both crates' sources, the core's manifest and ARCHITECTURE.md.
type Copy = Scratch;

impl Scratch {
    fn sources() -> Self {
        Scratch::of("architecture", sources(&root()).into_iter().chain(["ARCHITECTURE.md".to_string(), "core/Cargo.toml".to_string()]))
    }
}

/// The check passes on the copy as it is, and fails once the breach is planted.
fn fails_on(check: fn(&Path) -> Vec<String>, planted: Copy, expect: &str) {
    assert_eq!(check(&Copy::sources().0), Vec::<String>::new(), "the unchanged copy passes");
    let breaches = check(&planted.0);
    assert!(breaches.iter().any(|b| b.contains(expect)), "the planted breach is caught ({expect}): {breaches:?}");
}

#[test]
fn planted_imports_against_the_order_are_caught() {
    fails_on(import_order, Copy::sources().plant("src/gpu/exporter.rs", "use ", "use super::super::config::Settings;"), "imports config");
    fails_on(
        import_order,
        Copy::sources().plant("src/gpu/exporter.rs", "use ", "use self::super::super::app::Application;"),
        "imports app",
    );
    fails_on(
        import_order,
        Copy::sources().plant("src/pass/evaluate.rs", "use ", "use crate::{\n    duration::human,\n    pass::publish::State,\n};"),
        "imports pass::publish",
    );
    fails_on(
        import_order,
        Copy::sources().plant("src/pass/audit.rs", "use ", "fn f() -> crate::pass::actuator::Outputs { todo!() }"),
        "imports pass::actuator",
    );
    // Within a crate's folder, `super::` names a sibling: decide may not reach up to the audit
    // vocabulary, nor the Coder models to the decisions.
    fails_on(
        import_order,
        Copy::sources().plant("core/src/pass/decide.rs", "use ", "use super::audit::AuditKind;"),
        "imports core::pass::audit",
    );
    fails_on(
        import_order,
        Copy::sources().plant("core/src/coder/types.rs", "use ", "use crate::pass::decide::Decision;"),
        "imports core::pass::decide",
    );
    fails_on(import_order, Copy::sources().plant("src/gpu/exporter.rs", "use ", "use super::Sources;"), "imports gpu,");
    fails_on(import_order, Copy::sources().plant("src/pass/actuator.rs", "use ", "use crate::config::Settings;"), "imports config");
    // A string holding `//` on the line does not hide the import after it.
    fails_on(
        import_order,
        Copy::sources().plant("src/gpu/exporter.rs", "use ", r#"const U: &str = "http://x"; use crate::pass::evaluate::Evaluation;"#),
        "imports pass::evaluate",
    );
    // Nor does a test module in the middle of a file hide the code after it.
    fails_on(
        import_order,
        Copy::sources().plant(
            "src/gpu/source.rs",
            "use ",
            "#[cfg(test)]\nmod early {\n    fn f() -> &'static str { \"}\" }\n}\nuse crate::pass::evaluate::Evaluation;",
        ),
        "imports pass::evaluate",
    );
    fails_on(import_order, Copy::sources().replace("ARCHITECTURE.md", "http:     http\n", ""), "http (src/http.rs) is not in");
    fails_on(
        import_order,
        Copy::sources().plant("src/gpu/exporter.rs", "\nuse ", "use crate as c;\nfn f() -> c::config::Settings { todo!() }"),
        "names the crate under another name",
    );
    fails_on(
        import_order,
        Copy::sources().plant("src/lib.rs", "pub mod serve;", "pub use config::Settings;"),
        "re-exports an item of its own",
    );
}

#[test]
fn planted_cycles_are_caught_even_inside_a_folder() {
    // Between folders the order catches it too; inside one (`core::coder` and its `types`, one
    // place in the order) only the cycle check does.
    fails_on(import_cycles, Copy::sources().plant("src/gpu/exporter.rs", "use ", "use super::Sources;"), "import cycle: gpu");
    fails_on(import_cycles, Copy::sources().plant("src/coder/mod.rs", "\nuse ", "use identity::Identity;"), "import cycle: coder");
    let inside = Copy::sources()
        .plant("core/src/coder/mod.rs", "pub mod types;", "pub const ANSWER: u8 = 42;\nuse types::Workspace;")
        .plant("core/src/coder/types.rs", "use ", "use super::ANSWER;");
    assert_eq!(import_order(&inside.0), Vec::<String>::new(), "one place in the order: the order cannot see it");
    // Either rotation of the cycle, whichever module the search met first.
    fails_on(import_cycles, inside, "core::coder > core::coder::types");
}

#[test]
fn planted_clocks_and_io_in_the_pure_code_are_caught() {
    fails_on(
        pure_code,
        Copy::sources().plant("core/src/gpu/window.rs", "use ", "fn n() -> chrono::DateTime<chrono::Utc> { chrono::Utc::now() }"),
        "Utc::now",
    );
    fails_on(
        pure_code,
        Copy::sources().plant("core/src/pass/decide.rs", "use ", "fn n() -> std::time::Instant { std::time::Instant::now() }"),
        "mentions Instant",
    );
    fails_on(
        pure_code,
        Copy::sources().plant(
            "core/src/pass/stop_lifecycle.rs",
            "use ",
            "fn n() -> std::time::SystemTime { std::time::SystemTime::now() }",
        ),
        "SystemTime",
    );
    fails_on(pure_code, Copy::sources().plant("core/src/pass/policy.rs", "use ", "fn n() { let _ = chrono::Local::now(); }"), "Local::now");
    fails_on(pure_code, Copy::sources().plant("core/src/pass/policy.rs", "use ", "fn n() { tracing::warn!(\"x\"); }"), "tracing");
    fails_on(
        pure_code,
        Copy::sources().plant("core/src/pass/decide.rs", "use ", "fn n() -> bool { std::env::var(\"X\").is_ok() }"),
        "mentions env::",
    );
    fails_on(
        pure_code,
        Copy::sources().plant("core/src/gpu/window.rs", "use ", "#[allow(clippy::disallowed_methods)]\nfn n() {}"),
        "disallowed_methods",
    );
    fails_on(pure_code, Copy::sources().plant("core/Cargo.toml", "[dependencies]", "tracing = \"0.1\""), "depends on tracing");
    fails_on(
        pure_code,
        Copy::sources().replace(
            "core/Cargo.toml",
            "[dev-dependencies]",
            "[target.'cfg(unix)'.dependencies]\nureq = \"2\"\n\n[dev-dependencies]",
        ),
        "depends on ureq",
    );
    fails_on(
        pure_code,
        Copy::sources().replace(
            "core/Cargo.toml",
            "chrono = { version = \"0.4\", default-features = false, features = [\"std\", \"serde\"] }",
            "chrono = \"0.4\"",
        ),
        "chrono with its clock",
    );
    fails_on(
        pure_code,
        Copy::sources().plant(
            "core/src/pass/decide.rs",
            "\nuse ",
            "use std::{fs, time};\nfn n() -> bool { fs::metadata(\"x\").is_ok() && time::UNIX_EPOCH.elapsed().is_ok() }",
        ),
        "fs::",
    );
    fails_on(
        pure_code,
        Copy::sources().replace("core/Cargo.toml", "features = [\"std\", \"serde\"]", "features = [\"std\", \"serde\", \"clock\"]"),
        "chrono with its clock",
    );
}

#[test]
fn planted_plan_that_could_act_is_caught() {
    fails_on(
        only_the_actuator_acts,
        Copy::sources().replace("src/commands/plan.rs", "Role::Plan", "crate::app::Role::Run"),
        "src/commands/plan.rs builds the application as Role::Run",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().replace("src/app.rs", "acts(mode).then(|| CoderActions::new(", "Some(CoderActions::new("),
        "makes CoderActions without asking actuator::acts(mode)",
    );
}

#[test]
fn planted_lifts_of_the_http_fence_are_caught() {
    fails_on(
        outgoing_http,
        Copy::sources().plant("src/gpu/exporter.rs", "use ", "#[allow(clippy::disallowed_methods)]\nfn f() {}"),
        "src/gpu/exporter.rs allows clippy::disallowed_methods",
    );
    fails_on(
        outgoing_http,
        Copy::sources().replace("src/http.rs", "redirect::Policy::none()", "redirect::Policy::limited(3)"),
        "must refuse redirects",
    );
    fails_on(
        outgoing_http,
        Copy::sources().plant("src/gpu/exporter.rs", "\nuse ", "#[allow(clippy::style)]\nfn f() {}"),
        "allows clippy::style",
    );
    fails_on(
        outgoing_http,
        Copy::sources().plant("src/gpu/exporter.rs", "\nuse ", "fn f() -> reqwest::Client { reqwest::Client::default() }"),
        "builds an HTTP client (Client::default(",
    );
    fails_on(
        outgoing_http,
        Copy::sources().plant(
            "src/gpu/exporter.rs",
            "\nuse ",
            "#[allow(warnings)]\nasync fn f(r: reqwest::Response) -> Option<String> { r.text().await.ok() }",
        ),
        "src/gpu/exporter.rs allows warnings",
    );
    fails_on(
        outgoing_http,
        Copy::sources().plant("src/gpu/exporter.rs", "\nuse ", "#[derive(Default)]\nstruct Peer {\n    http: reqwest::Client,\n}"),
        "derives Default for a struct holding an HTTP client",
    );
}

#[test]
fn planted_actions_outside_the_actuator_are_caught() {
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant(
            "src/pass/publish.rs",
            "use ",
            "fn w(n: &crate::pass::audit::Notifier, e: &crate::pass::audit::AuditEvent) { n.send(e); }",
        ),
        "src/pass/publish.rs names Notifier",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().replace("src/pass/actuator.rs", "    audit: Option<Arc<AuditLog>>,", "    pub audit: Option<Arc<AuditLog>>,"),
        "Outputs' fields are public",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant(
            "src/pass/evaluate.rs",
            "use ",
            "async fn s(a: &crate::coder::actions::CoderActions) { let _ = a.stop_workspace(\"id\").await; }",
        ),
        "src/pass/evaluate.rs names CoderActions",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant(
            "src/commands/mod.rs",
            "use ",
            "fn s(c: crate::coder::CoderClient) { let _ = crate::coder::actions::CoderActions::new(c); }",
        ),
        "makes CoderActions::new(",
    );
    // A new write added to the read-only client (and so callable by the evaluator).
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant(
            "src/coder/mod.rs",
            "use ",
            "async fn put(c: &CoderClient) -> Result<(), CoderError> {\n    c.call::<serde::de::IgnoredAny>(Method::PUT, \"PUT /x\", \"/x\".into(), None::<&()>).await.map(|_| ())\n}",
        ),
        "src/coder/mod.rs sends Method::PUT",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant(
            "src/coder/mod.rs",
            "use ",
            "async fn post(c: &CoderClient) -> Result<(), CoderError> {\n    c.call::<serde::de::IgnoredAny>(Method::POST, \"POST /api/v2/workspaces/{workspace}/builds\", \"/x\".into(), None::<&()>).await.map(|_| ())\n}",
        ),
        "a POST other than authcheck",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant("src/pass/publish.rs", "use ", "fn p(h: &reqwest::Client) { let _ = h.post(\"http://hook\"); }"),
        "src/pass/publish.rs sends .post(",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().replace("src/coder/actions.rs", "pub struct CoderActions {", "#[derive(Clone)]\npub struct CoderActions {"),
        "CoderActions is Clone",
    );
    // What would hide a holder or a verb: an alias made where the name is allowed, a `Clone`
    // written by hand, a renamed `Method`.
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant("src/app.rs", "\nuse ", "pub type W = crate::coder::actions::CoderActions;"),
        "src/app.rs aliases or clones CoderActions",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant(
            "src/pass/actuator.rs",
            "\nuse ",
            "impl Clone for CoderActions { fn clone(&self) -> Self { CoderActions::new((**self).clone()) } }",
        ),
        "aliases or clones CoderActions",
    );
    fails_on(
        only_the_actuator_acts,
        Copy::sources().plant("src/coder/identity.rs", "\nuse ", "use reqwest::Method as M;"),
        "renames reqwest's Method",
    );
}

#[test]
fn planted_mode_checks_are_caught() {
    let check = mode_rule;
    fails_on(
        check,
        Copy::sources().plant("src/pass/publish.rs", "use ", "fn m(mode: Mode) -> bool { matches!(mode, Mode::Enforce) }"),
        "src/pass/publish.rs",
    );
    fails_on(
        check,
        Copy::sources().plant("src/pass/publish.rs", "use ", "fn m(mode: Mode) -> bool { mode != Mode::Observe }"),
        "src/pass/publish.rs",
    );
    fails_on(
        check,
        Copy::sources().plant(
            "src/app.rs",
            "use ",
            "fn m(mode: Mode) -> u8 { match mode {\n    Mode::Observe => 0,\n    Mode::Enforce => 1,\n} }",
        ),
        "src/app.rs",
    );
    fails_on(
        check,
        Copy::sources().plant(
            "src/app.rs",
            "use ",
            "fn m(mode: Mode, x: Option<u8>) -> u8 { match (mode, x) { (Mode::Enforce, Some(_)) => 1, _ => 0 } }",
        ),
        "src/app.rs",
    );
    fails_on(
        check,
        Copy::sources().plant("src/app.rs", "use ", "fn m(mode: Mode) -> u8 { if let Mode::Enforce = mode { 1 } else { 0 } }"),
        "src/app.rs",
    );
    fails_on(
        check,
        Copy::sources().plant("src/pass/page.rs", "use ", "fn m(mode: &str) -> bool { mode == \"enforce\" }"),
        "the mode's name compared",
    );
    fails_on(
        check,
        Copy::sources().plant("core/src/pass/mode.rs", "impl Mode {", "    pub fn acts(self) -> bool { self == Mode::Enforce }"),
        "core/src/pass/mode.rs holds",
    );
    fails_on(
        check,
        Copy::sources().plant("src/pass/publish.rs", "use ", "fn m(mode: Mode) -> bool { mode.as_str() != \"observe\" }"),
        "the mode's name compared",
    );
    fails_on(
        check,
        Copy::sources().plant("src/pass/publish.rs", "use ", "fn m(mode: Mode) -> bool { \"enforce\".eq(mode.as_str()) }"),
        "the mode's name compared",
    );
    fails_on(
        check,
        Copy::sources().plant(
            "core/src/pass/decide.rs",
            "use ",
            "fn m(mode: crate::pass::mode::Mode) -> bool { mode == crate::pass::mode::Mode::Enforce }",
        ),
        "core/src/pass/decide.rs",
    );
}

#[test]
fn planted_code_map_drift_is_caught() {
    let copy = Copy::sources();
    std::fs::write(copy.0.join("src/unlisted.rs"), "//! Nobody lists me.\n").unwrap();
    fails_on(code_map, copy, "does not list src/unlisted.rs");
    fails_on(
        code_map,
        Copy::sources().replace("core/src/pass/fleet.rs", "pub fn apply_fleet_rules", "pub fn fleet_rules"),
        "holds `apply_fleet_rules()`",
    );
    fails_on(
        code_map,
        Copy::sources().replace(
            "ARCHITECTURE.md",
            "`src/pass/actuator.rs` | the act step:",
            "`src/pass/actuator.rs` | the act step: `Evaluator`,",
        ),
        "holds `Evaluator`",
    );
}

/// Making a mode is not checking one, whatever came earlier in the file: a match guard inside
/// `matches!`, a quote as a char literal (both once misread as checks).
#[test]
fn making_a_mode_after_tricky_code_is_not_a_check() {
    let tricky = "fn t(c: char, n: u8) -> bool { matches!(c, '\"' | '(' if n > 1) || matches!(n, 2 if c == ')') }\nfn make() -> Mode { Mode::Enforce }\nfn made() -> Option<Mode> { Some(Mode::Observe) }";
    let copy = Copy::sources().plant("src/pass/publish.rs", "use ", tricky);
    assert_eq!(mode_rule(&copy.0), Vec::<String>::new());
}

#[test]
fn the_stripper_keeps_strings_and_drops_comments() {
    let s = strip("let u = \"http://x\"; use crate::a; // crate::b\n/* crate::c */ let c = '\"'; use crate::d;", true);
    assert!(s.contains("use crate::a") && s.contains("use crate::d") && s.contains("\"http://x\""), "{s}");
    assert!(!s.contains("crate::b") && !s.contains("crate::c"), "{s}");
    assert_eq!(expand_use("crate::{a::{b, c as d}, self, e}"), ["crate::a::b", "crate::a::c", "crate", "crate::e"]);
}
