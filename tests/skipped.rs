//! Runs after the `integration` target (Cargo runs test targets by name) and prints, once at the
//! end of `cargo test`, which tests skipped for a missing Debian package, and how to install it;
//! nothing when none did. The list is the file `common::installed_or_skip` appends to, removed
//! once printed.

fn main() {
    let note = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.tsv");
    let Ok(text) = std::fs::read_to_string(&note) else { return };
    let _ = std::fs::remove_file(&note);
    let mut lines: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once('\t')).collect();
    lines.sort_unstable();
    lines.dedup();
    if lines.is_empty() {
        return;
    }
    let mut packages: Vec<&str> = lines.iter().map(|(_, p)| *p).collect();
    packages.sort_unstable();
    packages.dedup();
    println!("\n{} test(s) skipped for a missing Debian package (apt-get install {}):", lines.len(), packages.join(" "));
    for (test, package) in lines {
        println!("  {test} (needs {package})");
    }
}
