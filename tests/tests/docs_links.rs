//! The documentation's internal links: every relative Markdown link
//! (`[text](target)`, images too) in README.md, CONTRIBUTING.md and
//! `docs/**/*.md` names a file or folder that exists and, with a `#anchor`,
//! a Markdown file with a heading whose GitHub slug is that anchor (a bare
//! `#anchor` names a heading of the same file). Links to `http(s):` and
//! `mailto:` are not followed. Needs no database.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use sheaf_tests::repo_root;

#[test]
fn every_internal_link_resolves() {
    let root = repo_root();
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    markdown_under(&root.join("docs"), &mut files);
    assert!(files.len() > 10, "the book has its files: {files:?}");
    let broken = check(&root, &files);
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the documentation:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The check itself fails where it should: a missing file, a missing
/// anchor, a missing same-file anchor; and it follows duplicates' suffixes,
/// skips code and external links.
#[test]
fn the_check_catches_broken_links() {
    let dir = std::env::temp_dir().join(format!("sheaf-docs-links-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let a = dir.join("a.md");
    let b = dir.join("sub/b.md");
    std::fs::write(
        &a,
        "# Title\n\n## Step: `one` (two)\n\n## Step: `one` (two)\n\n\
         [ok](sub/b.md#b-heading) [ok](#step-one-two-1) [ok](https://example.com/x.md)\n\
         [gone](sub/c.md) [no anchor](sub/b.md#nowhere)\n\
         `[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n[here](#nothing-here)\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "# B heading\n\n[up](../a.md#title) [dup](../a.md#step-one-two-2)\n",
    )
    .unwrap();
    let broken = check(&dir, &[a, b]);
    let _ = std::fs::remove_dir_all(&dir);
    let expected = [
        "a.md:8: sub/c.md (no such file)",
        "a.md:8: sub/b.md#nowhere (no heading with this anchor)",
        "a.md:13: #nothing-here (no heading with this anchor)",
        "sub/b.md:3: ../a.md#step-one-two-2 (no heading with this anchor)",
    ];
    assert_eq!(broken, expected);
}

/// Every `.md` file under `dir`, sorted.
fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|x| x == "md") {
            out.push(path);
        }
    }
}

/// Every broken link of `files`, as `file:line: target (why)`, the file
/// relative to `root`.
fn check(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut anchors: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let shown = file.strip_prefix(root).unwrap_or(file).display().to_string();
        for (n, target) in links(&text) {
            if let Some(why) = broken_link(file, &target, &mut anchors) {
                broken.push(format!("{shown}:{n}: {target} ({why})"));
            }
        }
    }
    broken
}

/// Why `target`, linked from `file`, does not resolve; `None` when it does.
fn broken_link(file: &Path, target: &str, anchors: &mut HashMap<PathBuf, Vec<String>>) -> Option<String> {
    if ["http://", "https://", "mailto:"]
        .iter()
        .any(|p| target.starts_with(p))
    {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else {
        normalize(&file.parent().unwrap().join(path))
    };
    if !dest.exists() {
        return Some("no such file".into());
    }
    let anchor = anchor?;
    if dest.extension().is_none_or(|x| x != "md") {
        return Some("an anchor into a file that is not Markdown".into());
    }
    let slugs = anchors.entry(dest.clone()).or_insert_with(|| {
        let text = std::fs::read_to_string(&dest).unwrap_or_default();
        heading_slugs(&text)
    });
    if slugs.iter().any(|s| s == anchor) {
        None
    } else {
        Some("no heading with this anchor".into())
    }
}

/// `a/b/../c` as `a/c`, without asking the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fenced = false;
    text.lines().enumerate().filter_map(move |(i, line)| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return None;
        }
        (!fenced).then_some((i + 1, line))
    })
}

/// Every link target of `text` with its line: `[text](target)` outside code
/// (fenced blocks and inline code spans), a `"title"` after the target
/// dropped, `<target>` unwrapped.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = mask_code_spans(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let opened = rest[..i].contains('[');
            let after = &rest[i + 2..];
            let Some(end) = closing_paren(after) else { break };
            if opened {
                let target = after[..end].split_whitespace().next().unwrap_or("");
                let target = target.trim_start_matches('<').trim_end_matches('>');
                out.push((n, target.to_owned()));
            }
            rest = &after[end + 1..];
        }
    }
    out
}

/// Where the `)` that closes a link target is (parentheses inside it nest).
fn closing_paren(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `line` with every inline code span's content replaced by spaces, so a
/// link written as code is not followed (the backticks stay).
fn mask_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(c);
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The anchors GitHub gives the headings of `text`, in order: the heading's
/// text lowercased, every character but letters, digits, `-`, `_` and
/// spaces dropped, spaces turned into `-`; a repeated slug gets `-1`, `-2`.
fn heading_slugs(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim_end();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        out.push(if *count == 0 {
            slug
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    out
}
