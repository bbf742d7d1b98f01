//! The table of entry points (`src/api/table.rs`) against what is built from it and what
//! describes it: the built library exports exactly the table's symbols, `include/cuda.h`
//! declares every supported entry point, and docs/cuda-api.md names every one (the
//! supported in its table of functions, the others under "Not supported").

mod common;

use std::collections::{BTreeSet, HashMap};

use vgpu_cuda::api::table::{EntryPoint, ENTRY_POINTS};

fn manifest_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every `cu*` name in `text` (a trailing `*` kept: a prefix).
fn cu_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("cu") {
        let before = text.len() - rest.len() + at;
        let boundary = text[..before]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let tail = &rest[at + word.len()..];
        let starred = tail.starts_with('*');
        if boundary && word.chars().nth(2).is_some_and(|c| c.is_ascii_uppercase()) {
            names.push(if starred {
                format!("{word}*")
            } else {
                word.clone()
            });
        }
        rest = &rest[at + word.len().max(2)..];
    }
    names
}

/// The text of `heading`'s section of `doc`, up to the next heading of its level or above.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/cuda-api.md has no {heading:?}"));
    let body = &doc[start + heading.len() + 2..];
    let end = body
        .match_indices("\n#")
        .find(|(at, _)| body[at + 1..].chars().take_while(|&c| c == '#').count() <= level)
        .map_or(body.len(), |(at, _)| at);
    &body[..end]
}

/// Whether `name` (a base name or a symbol) belongs to `e`.
fn names(e: &EntryPoint, name: &str) -> bool {
    e.name == name || e.symbols().any(|s| s.name == name)
}

#[test]
fn the_library_exports_exactly_the_tables_symbols() {
    let exported: BTreeSet<String> = common::elf::exported_functions(&common::library())
        .into_iter()
        .collect();
    let table: BTreeSet<String> = ENTRY_POINTS
        .iter()
        .flat_map(|e| e.symbols())
        .map(|s| s.name.to_string())
        .collect();
    let missing: Vec<_> = table.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "in src/api/table.rs but not exported (#[no_mangle] missing?): {missing:?}"
    );
    let untabled: Vec<_> = exported
        .iter()
        .filter(|n| n.starts_with("cu"))
        .filter(|n| !table.contains(*n))
        .collect();
    assert!(
        untabled.is_empty(),
        "exported but not in src/api/table.rs: {untabled:?}"
    );
    // Nothing else: the library exports the driver API, and the two calls the vGPU's
    // NVML library (nvml-shim) asks it through (src/api/vgpu.rs).
    let other: Vec<_> = exported
        .iter()
        .filter(|n| !n.starts_with("cu"))
        .filter(|n| !["vgpuCudaProbe", "vgpuCudaMemory"].contains(&n.as_str()))
        .collect();
    assert!(
        other.is_empty(),
        "exported beyond the driver API: {other:?}"
    );
}

#[test]
fn include_cuda_h_declares_every_supported_entry_point() {
    let header = manifest_file("include/cuda.h");
    let mut declared = BTreeSet::new();
    let mut defines = HashMap::new();
    for line in header.lines() {
        let line = line.trim();
        if let Some(def) = line.strip_prefix("#define ") {
            if let [from, to] = def.split_whitespace().collect::<Vec<_>>()[..] {
                if from.starts_with("cu") && to.starts_with("cu") {
                    defines.insert(from.to_string(), to.to_string());
                }
            }
        } else if let Some(decl) = line.strip_prefix("CUresult ") {
            let name = decl.split('(').next().unwrap_or("").trim();
            declared.insert(name.to_string());
        }
    }
    // What the header declares is what the library exports for a supported entry point.
    for name in &declared {
        assert!(
            ENTRY_POINTS.iter().any(|e| e.supported && names(e, name)),
            "include/cuda.h declares {name}, which src/api/table.rs has no supported entry for"
        );
    }
    for (from, to) in &defines {
        let entry = ENTRY_POINTS.iter().find(|e| e.name == from);
        assert!(
            entry.is_some_and(|e| e.symbols().any(|s| s.name == to)),
            "include/cuda.h maps {from} to {to}, not a variant of {from} in src/api/table.rs"
        );
        assert!(
            declared.contains(to),
            "include/cuda.h maps {from} to undeclared {to}"
        );
    }
    let undeclared: Vec<_> = ENTRY_POINTS
        .iter()
        .filter(|e| e.supported)
        .filter(|e| !declared.contains(e.name) && !defines.contains_key(e.name))
        .map(|e| e.name)
        .collect();
    assert!(
        undeclared.is_empty(),
        "include/cuda.h declares no {undeclared:?}"
    );
}

#[test]
fn docs_cuda_api_md_names_every_entry_point() {
    let doc = manifest_file("../docs/cuda-api.md");
    let supported = section(&doc, "## Supported functions");
    let table: String = supported
        .lines()
        .filter(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    let listed = cu_names(&table);
    for name in &listed {
        assert!(
            ENTRY_POINTS.iter().any(|e| e.supported && names(e, name)),
            "docs/cuda-api.md's table of supported functions lists {name}, which \
             src/api/table.rs has no supported entry for"
        );
    }
    let unlisted: Vec<_> = ENTRY_POINTS
        .iter()
        .filter(|e| e.supported && !listed.iter().any(|n| names(e, n)))
        .map(|e| e.name)
        .collect();
    assert!(
        unlisted.is_empty(),
        "docs/cuda-api.md's table of supported functions does not list {unlisted:?}"
    );

    let not_supported = cu_names(section(&doc, "## Not supported"));
    let covers = |pattern: &str, e: &EntryPoint| match pattern.strip_suffix('*') {
        Some(prefix) => {
            e.name.starts_with(prefix) || e.symbols().any(|s| s.name.starts_with(prefix))
        }
        None => names(e, pattern),
    };
    for pattern in not_supported.iter().filter(|p| p.ends_with('*')) {
        let wrong: Vec<_> = ENTRY_POINTS
            .iter()
            .filter(|e| e.supported && covers(pattern, e))
            .map(|e| e.name)
            .collect();
        assert!(
            wrong.is_empty(),
            "docs/cuda-api.md lists {pattern} as not supported, which covers {wrong:?}"
        );
    }
    let unnamed: Vec<_> = ENTRY_POINTS
        .iter()
        .filter(|e| !e.supported && !not_supported.iter().any(|p| covers(p, e)))
        .map(|e| e.name)
        .collect();
    assert!(
        unnamed.is_empty(),
        "docs/cuda-api.md's \"Not supported\" does not name {unnamed:?}"
    );
}
