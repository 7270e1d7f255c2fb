//! The newcomer's programs live in the guides, and the guides' code is compiled: rustdoc
//! compiles every `rust` block of the README and of `src/docs/*.md` (`cargo test --doc`, the
//! guides through `lameduck::guide`, the README through a `cfg(doctest)` item), so a guide that
//! stops compiling fails CI. This test keeps it that way: no block may opt out with `ignore`,
//! and the three programs a new user writes first are there, whole (a `main`).

use std::path::Path;

/// The Rust code blocks of a Markdown file: (info string, code).
fn rust_blocks(file: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut blocks = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(info)) => current = Some((info.trim().to_owned(), String::new())),
            (Some(_), Some(_)) => blocks.extend(current.take()),
            (Some((_, code)), None) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, None) => {}
        }
    }
    // Only Rust: an info string of `rust…`, or none (rustdoc's default is Rust).
    blocks
        .into_iter()
        .filter(|(info, _)| info.is_empty() || info.starts_with("rust"))
        .collect()
}

/// The compiled program of `file` that contains every one of `needles`.
fn program<'a>(blocks: &'a [(String, String)], needles: &[&str]) -> &'a str {
    blocks
        .iter()
        .map(|(_, code)| code.as_str())
        .find(|code| code.contains("fn main") && needles.iter().all(|n| code.contains(n)))
        .unwrap_or_else(|| panic!("no program with {needles:?}"))
}

const GUIDES: [&str; 6] = [
    "README.md",
    "src/docs/axum.md",
    "src/docs/hyper.md",
    "src/docs/tonic.md",
    "src/docs/worker.md",
    "src/docs/kubernetes.md",
];

#[test]
fn no_guide_block_opts_out_of_compiling() {
    for file in GUIDES {
        for (info, code) in rust_blocks(file) {
            assert!(
                !info.split(',').any(|t| t.trim() == "ignore"),
                "{file}: a `{info}` block is not compiled; use `no_run` (and hidden `# ` lines):\n{code}"
            );
        }
    }
}

#[test]
fn the_three_first_programs_are_in_the_guides() {
    // An axum app with the admin port, a background worker and a closer, on the entry point
    // the README uses, with a `ConnectInfo` extractor and what it needs.
    let axum = rust_blocks("src/docs/axum.md");
    program(
        &axum,
        &[
            "AdminBuilder::new(&drain).serve(",
            "spawn_cancellable(",
            "on_close(",
            "lameduck::serve(",
            "ConnectInfo(",
            ".connect_info()",
            "drain.run()",
        ],
    );
    // A hyper-util accept loop of its own.
    let hyper = rust_blocks("src/docs/hyper.md");
    program(
        &hyper,
        &[
            "listener.accept()",
            "ConnMeta::accepted(",
            "drain.layer()",
            "drain.run()",
        ],
    );
    // A queue worker with only the admin port: no service listener, no layer.
    let worker = rust_blocks("src/docs/worker.md");
    let w = program(
        &worker,
        &[
            "AdminBuilder::new(&drain).serve(",
            "spawn_cancellable(",
            "drain.run()",
        ],
    );
    assert!(
        !w.contains("layer()"),
        "the worker serves no requests:\n{w}"
    );
    // The README's first Rust example is a whole service.
    let readme = rust_blocks("README.md");
    let first = &readme.first().expect("a Rust example").1;
    assert!(
        first.contains("fn main")
            && first.contains("lameduck::serve(")
            && first.contains("ConnectInfo(")
            && first.contains(".connect_info()"),
        "{first}"
    );
}
