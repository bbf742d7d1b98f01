//! Every repository path the docs name exists: backticked paths and link targets in the
//! Markdown files, and backticked or `docs/*.md` paths in `//!` comments. A path counts as
//! a repository path when its first component is an entry of the repository root (or of
//! the naming file's crate or directory, for paths written relative to those); build
//! outputs and directories made at run time are not checked. Nothing cites a design file
//! outside the repository.

use std::path::{Path, PathBuf};

/// Build outputs and run-time directories: named in docs, never committed.
const GENERATED: &[&str] = &[
    "target/",
    "fuzz/corpus",
    "fuzz/target",
    "fuzz/artifacts",
    "gpu-bundle",
    "launch-ab",
    "out/",
    "guests/target",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The files to scan: `*.md` and `*.rs`, outside build outputs.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.')
            || matches!(name.as_str(), "target" | "corpus" | "gpu-bundle" | "out")
        {
            continue;
        }
        if p.is_dir() {
            files(&p, out);
        } else if name.ends_with(".md") || name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// The spans between backticks in `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Markdown link targets `](target)` in `text`.
fn links(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            rest.find(')').map(|j| &rest[..j])
        })
        .collect()
}

/// Bare `docs/NAME.md` mentions in `text`.
fn bare_docs(text: &str) -> Vec<&str> {
    text.match_indices("docs/")
        .filter_map(|(i, _)| {
            if i > 0 && text.as_bytes()[i - 1].is_ascii_alphanumeric() {
                return None;
            }
            let rest = &text[i..];
            let end = rest.find(".md")? + 3;
            let cand = &rest[..end];
            cand[5..end - 3]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                .then_some(cand)
        })
        .collect()
}

/// `cand` as a path to check, or None when it does not look like a repository path.
fn as_repo_path(cand: &str) -> Option<&str> {
    let cand = cand.trim().trim_end_matches(['.', ',', ';', ':']);
    let cand = cand.split("::").next()?;
    let cand = cand.split('#').next()?;
    let cand = match cand.rsplit_once(':') {
        Some((p, line)) if line.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => cand,
    };
    let bad = |c: char| c.is_whitespace() || "*{}<>$?=|\"'[](),@%&".contains(c);
    if cand.is_empty()
        || !cand.contains('/')
        || cand.contains("://")
        || cand.starts_with(['/', '~', '-', '.'])
        || cand.chars().any(bad)
        || GENERATED.iter().any(|g| cand.starts_with(g))
    {
        return None;
    }
    Some(cand)
}

/// The nearest directory at or above `dir` with a Cargo.toml (the crate the file is in).
fn crate_dir(dir: &Path, root: &Path) -> Option<PathBuf> {
    let mut d = dir.to_path_buf();
    loop {
        if d.join("Cargo.toml").is_file() {
            return Some(d);
        }
        if d == root || !d.pop() {
            return None;
        }
    }
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let root = root();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut stale = Vec::new();
    let mut checked = 0;
    for file in &all {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let dir = file.parent().unwrap_or(&root);
        let rel = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        let md = rel.ends_with(".md");
        let design = concat!("DESIGN", ".md");
        if text.contains(design) {
            stale.push(format!(
                "{rel}: cites {design}, which is not in the repository (cite docs/*.md)"
            ));
        }
        let mut cands: Vec<(usize, &str)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if md {
                cands.extend(backticked(line).into_iter().map(|c| (n + 1, c)));
                cands.extend(links(line).into_iter().map(|c| (n + 1, c)));
            } else if let Some(doc) = line.trim_start().strip_prefix("//!") {
                cands.extend(backticked(doc).into_iter().map(|c| (n + 1, c)));
                cands.extend(bare_docs(doc).into_iter().map(|c| (n + 1, c)));
            }
        }
        let bases: Vec<PathBuf> = [
            Some(root.clone()),
            Some(dir.to_path_buf()),
            crate_dir(dir, &root),
        ]
        .into_iter()
        .flatten()
        .collect();
        for (line, cand) in cands {
            let Some(path) = as_repo_path(cand) else {
                continue;
            };
            let first = path.split('/').next().unwrap_or(path);
            // Only paths that start at a real entry of one of the bases.
            let rooted: Vec<&PathBuf> = bases.iter().filter(|b| b.join(first).exists()).collect();
            if rooted.is_empty() {
                continue;
            }
            checked += 1;
            if !rooted.iter().any(|b| b.join(path).exists()) {
                stale.push(format!("{rel}:{line}: `{path}` does not exist"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths checked: is the scan broken?"
    );
    assert!(
        stale.is_empty(),
        "{} stale paths in docs and doc comments:\n{}",
        stale.len(),
        stale.join("\n")
    );
}
