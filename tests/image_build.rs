//! The Dockerfile's build stage has every file the binary is compiled from. The binary embeds
//! files from outside `src/` (the shard fence's admission policies from `rbac/`), and an image
//! build that lacks one fails only where the image is built, which these machines cannot do
//! (no registry for its base images). Pure: reads files, needs no cluster.

mod support;

use std::path::{Path, PathBuf};
use support::repo_root;

/// The sources of the Dockerfile's `COPY` instructions from the build context (not those
/// `--from` another stage), as paths relative to the context, without `./` or a trailing `/`.
fn copied(dockerfile: &str) -> Vec<String> {
    dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().skip(1).filter(|w| !w.starts_with("--")).collect();
            let sources = &words[..words.len().saturating_sub(1)];
            sources.iter().map(|s| s.trim_start_matches("./").trim_end_matches('/').to_string()).collect::<Vec<_>>()
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files `file` embeds with `include_str!` or `include_bytes!`, relative to `root`.
fn embedded(file: &Path, root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("a source file");
    let mut found = Vec::new();
    for macro_call in ["include_str!(\"", "include_bytes!(\""] {
        for (at, _) in text.match_indices(macro_call) {
            let rest = &text[at + macro_call.len()..];
            let Some(end) = rest.find('"') else { continue };
            let target = file.parent().expect("a directory").join(&rest[..end]);
            let target = target.canonicalize().unwrap_or_else(|e| {
                panic!("{} embeds {}, which cannot be read: {e}", file.display(), target.display())
            });
            let relative = target.strip_prefix(root).expect("a file of the repository");
            found.push(relative.to_string_lossy().into_owned());
        }
    }
    found
}

#[test]
fn the_dockerfile_copies_every_file_the_binary_embeds() {
    let root = repo_root().canonicalize().expect("the repository");
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    // Forms `copied` does not read: a file they bring in would go unseen.
    for line in dockerfile.lines().map(str::trim) {
        assert!(
            !line.starts_with("ADD ") && !line.starts_with("COPY ["),
            "tests/image_build.rs reads COPY SRC... DEST only, not: {line}"
        );
    }
    let copied = copied(&dockerfile);
    // What the build context leaves out, whatever the Dockerfile copies.
    let ignored: Vec<String> = std::fs::read_to_string(root.join(".dockerignore"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().trim_start_matches("./").trim_end_matches('/').to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for needed in ["Cargo.toml", "Cargo.lock", "src"] {
        assert!(copied.iter().any(|c| c == needed), "the Dockerfile's build stage copies {needed}: {copied:?}");
    }
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut embedded: Vec<String> = files.iter().flat_map(|f| embedded(f, &root)).collect();
    embedded.sort();
    embedded.dedup();
    assert!(
        embedded.iter().any(|e| e.starts_with("rbac/")),
        "the binary embeds the shard fence's policies: {embedded:?}"
    );
    let under = |path: &str, dir: &str| path == dir || path.starts_with(&format!("{dir}/"));
    let missing: Vec<&String> = embedded
        .iter()
        .filter(|e| !copied.iter().any(|c| under(e, c)) || ignored.iter().any(|i| under(e, i)))
        .collect();
    assert!(
        missing.is_empty(),
        "the binary embeds {missing:?}, which the Dockerfile's build stage does not copy (it copies {copied:?}; .dockerignore leaves out {ignored:?})"
    );
}

#[test]
fn copy_sources_are_read_without_the_destination_or_flags() {
    let sources = copied(
        "FROM x AS build\nCOPY Cargo.toml Cargo.lock ./\nCOPY --chown=1:1 ./rbac/ ./rbac\nCOPY --from=build /a /b\n",
    );
    assert_eq!(sources, ["Cargo.toml", "Cargo.lock", "rbac"]);
}
