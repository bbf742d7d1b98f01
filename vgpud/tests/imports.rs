//! The daemon's modules form layers: no module reaches, through the paths it names, a
//! module that reaches it back (docs/architecture.md, "Inside vgpud"). This test reads
//! every `super::…`, `self::…` and `crate::daemon::…` path in vgpud/src/daemon (test
//! modules, inline or `tests.rs`, left out) and fails on a cycle among the daemon's
//! top-level modules, naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The node standing for `daemon/mod.rs` itself (the items it defines).
const ROOT: &str = "daemon";

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("vgpud/src/daemon is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs")
            && p.file_stem().is_some_and(|s| s != "tests")
        {
            // A `tests.rs` file is a test module: it may reach anywhere.
            out.push(p);
        }
    }
}

/// The module path of `file` below the daemon (`core.rs`: ["core"]; `http/body.rs`:
/// ["http", "body"]; `mod.rs`: []).
fn module_path(daemon: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(daemon).expect("under the daemon");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// `src` without its test modules (`#[cfg(test)]` on a `mod`, which the daemon's files
/// keep at their end) and without `//` comments.
fn code_of(src: &str) -> String {
    let mut out = String::new();
    let mut lines = src.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            let next = lines.peek().map(|l| l.trim_start()).unwrap_or("");
            if next.starts_with("mod ") || next.contains(" mod ") {
                break;
            }
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The names a path continues with after a prefix: `name` or the names of `{a, b::c}`.
fn names_after(rest: &str) -> Vec<String> {
    if let Some(group) = rest.strip_prefix('{') {
        let end = group.find('}').unwrap_or(group.len());
        group[..end]
            .split(',')
            .filter_map(|item| {
                let first: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
                (!first.is_empty()).then_some(first)
            })
            .collect()
    } else {
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() {
            Vec::new()
        } else {
            vec![name]
        }
    }
}

/// The daemon-level names `code` (in the module at `path`) refers to.
fn referenced(path: &[String], code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let at = &code[i..];
        let word_start = i == 0 || !is_ident(bytes[i - 1] as char);
        if word_start {
            if let Some(rest) = at.strip_prefix("crate::daemon::") {
                found.extend(names_after(rest));
            } else if at.starts_with("super::") {
                let mut rest = at;
                let mut ups = 0;
                while let Some(r) = rest.strip_prefix("super::") {
                    rest = r;
                    ups += 1;
                }
                // `super` from a file at depth d (its module path's length) lands at depth
                // d - ups; the daemon's own level is depth 0.
                if ups == path.len() {
                    found.extend(names_after(rest));
                }
                i += at.len() - rest.len();
                continue;
            } else if path.is_empty() {
                if let Some(rest) = at.strip_prefix("self::") {
                    found.extend(names_after(rest));
                }
            }
        }
        i += at.chars().next().map_or(1, char::len_utf8);
    }
    found
}

/// The daemon's module graph: top-level module -> the top-level modules it refers to.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let daemon = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon");
    let mut files = Vec::new();
    rust_files(&daemon, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(&daemon, f).first().cloned())
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let path = module_path(&daemon, f);
        let node = path.first().cloned().unwrap_or_else(|| ROOT.into());
        let src = std::fs::read_to_string(f).expect("a readable source file");
        let edges = g.entry(node.clone()).or_default();
        for name in referenced(&path, &code_of(&src)) {
            let to = if modules.contains(&name) {
                name
            } else {
                ROOT.into()
            };
            if to != node {
                edges.insert(to);
            }
        }
    }
    g
}

/// A cycle of `g`, when it has one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(n) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|s| s == n).unwrap_or(0);
                let mut cycle = stack[from..].to_vec();
                cycle.push(n.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(n.to_owned(), Mark::Open);
        stack.push(n.to_owned());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(n.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_daemons_modules_import_in_layers() {
    let g = graph();
    assert!(
        g.len() > 20 && g.get("core").is_some_and(|e| e.contains("state")),
        "the graph was read: {g:?}"
    );
    if let Some(cycle) = find_cycle(&g) {
        panic!(
            "the daemon's modules import in a circle: {}\n(a plain type both sides need \
             belongs in a module of its own that imports neither)",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_operation_modules_do_not_reach_back_into_what_the_daemon_owns() {
    // The types the daemon owns sit below `core`: none of them names `core`.
    let g = graph();
    for leaf in [
        "state",
        "gpu_memory",
        "rebalancer",
        "spares",
        "host_registry",
        "saver",
        "shm",
        "locks",
        "config",
        "grants",
        "attach",
        "worker_files",
    ] {
        let edges = g.get(leaf).cloned().unwrap_or_default();
        assert!(!edges.contains("core"), "{leaf} imports core: {edges:?}");
    }
}

#[test]
fn the_daemon_has_its_fields_and_one_dispatcher_and_the_operations_are_functions() {
    // `Daemon` is built in `core.rs` and dispatches commands in `command.rs`; every other
    // module's operations are functions taking the part of the daemon they need, so the
    // modules' layers show in their paths (a method hides its caller's edge).
    let daemon = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon");
    let mut files = Vec::new();
    rust_files(&daemon, &mut files);
    let mut blocks: Vec<String> = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(f).expect("a readable source file");
        let name = module_path(&daemon, f).join("/");
        for line in code_of(&src).lines() {
            let t = line.trim_start();
            let for_daemon = t.contains(" for Daemon ") || t.ends_with(" for Daemon {");
            if t.starts_with("impl Daemon") || (t.starts_with("impl") && for_daemon) {
                blocks.push(name.clone());
            }
        }
    }
    blocks.sort();
    assert_eq!(
        blocks,
        vec!["command".to_string(), "core".to_string()],
        "`impl Daemon` belongs in core.rs (construction) and command.rs (dispatch) only; \
         write an operation as a function of its module taking the parts it reads"
    );
}

#[test]
fn the_checker_finds_a_cycle_in_paths_it_reads() {
    // A two-module circle written the ways the daemon's files write paths.
    let a = referenced(
        &["a".into()],
        "use super::b::Thing;\nfn f() { super::c::g(); }",
    );
    let b = referenced(
        &["b".into(), "inner".into()],
        "use super::super::{a, core::Daemon};\nuse super::sibling;",
    );
    assert_eq!(a, BTreeSet::from(["b".into(), "c".into()]));
    assert_eq!(b, BTreeSet::from(["a".into(), "core".into()]));
    let g = BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
    let cycle = find_cycle(&g).expect("a -> b -> a");
    assert_eq!(cycle.first(), cycle.last());
    // Test modules and comments are not read.
    let code =
        code_of("use super::x;\n// super::y\n#[cfg(test)]\nmod tests {\n use super::z;\n}\n");
    assert_eq!(
        referenced(&["m".into()], &code),
        BTreeSet::from(["x".to_string()])
    );
}
