//! No function runs SQL built from caller text: a check over the
//! extension's Rust source and the SQL files (`tests/tests/privileges.rs`).
//!
//! The rules, over production code (test modules and `testing.rs` left out,
//! comments ignored):
//!
//! 1. Every statement is a `Stmt`, made in a `const` or `static` item
//!    (`const X: Stmt = Stmt::read(...)`): a constant cannot hold caller
//!    text (`format!` is not `const`). No `Stmt { .. }` literal outside
//!    `base/plans.rs`, and nothing `leak`ed into a `&'static str`.
//! 2. Only `base/plans.rs` talks to SPI (`prepare`, `update`, `select`,
//!    `Spi::run`, `Spi::get_*`, `Spi::execute`...); elsewhere only
//!    `Spi::connect`/`Spi::connect_mut` (which hand the client to
//!    `plans::run`). No raw `pg_sys::SPI_*`.
//! 3. No string literal of the extension, and no SQL file, uses dynamic
//!    SQL: `EXECUTE` (other than `GRANT`/`REVOKE EXECUTE`), `format(`,
//!    `quote_ident`/`quote_literal`/`quote_nullable`, `PREPARE`, `dblink`,
//!    `query_to_xml`.
//! 4. The one statement composed at run time is a listing's: its shape
//!    follows the caller's filter tree, its text is sheaf's own fragments
//!    (`sheaf_core::search::Filter::compile`, whose tests check that no
//!    caller text reaches it) and every caller value is a bound parameter.
//!    It runs through `plans::select_once`, called from
//!    `workflow/search.rs` alone.

use std::path::{Path, PathBuf};

/// A source file split into code (comments and literals blanked) and its
/// string literals.
pub struct Lexed {
    pub code: String,
    pub strings: Vec<String>,
}

/// Splits Rust source into code without comments or literal contents (each
/// literal becomes `""`) and the literals themselves.
pub fn lex(src: &str) -> Lexed {
    let b = src.as_bytes();
    let mut code = String::with_capacity(src.len());
    let mut strings = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if let Some((len, text)) = raw_string(rest) {
            strings.push(text);
            code.push_str("\"\"");
            i += len;
        } else if b[i] == b'"' || rest.starts_with("b\"") {
            let start = if b[i] == b'"' { i + 1 } else { i + 2 };
            let mut j = start;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            strings.push(src[start..j.min(b.len())].to_owned());
            code.push_str("\"\"");
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let close = if rest.as_bytes().get(1) == Some(&b'\\') {
                rest[2..].find('\'').map(|e| e + 3)
            } else {
                rest.char_indices()
                    .nth(2)
                    .filter(|(_, c)| *c == '\'')
                    .map(|(e, _)| e + 1)
            };
            match close {
                Some(len) => {
                    code.push_str("' '");
                    i += len;
                }
                None => {
                    code.push('\'');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            code.push(c);
            i += c.len_utf8();
        }
    }
    Lexed { code, strings }
}

/// `r"..."`, `r#"..."#` (and `br`): its length and contents.
fn raw_string(rest: &str) -> Option<(usize, String)> {
    let body = rest.strip_prefix("br").or_else(|| rest.strip_prefix('r'))?;
    let hashes = body.len() - body.trim_start_matches('#').len();
    let after = body[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = after.find(&close)?;
    let prefix = rest.len() - body.len() + hashes + 1;
    Some((prefix + end + close.len(), after[..end].to_owned()))
}

/// Production code: `src` with every `#[cfg(any(test, feature = "pg_test"))]`
/// item (a `mod tests { .. }`) removed. Returns the names of gated
/// `mod x;` declarations too (their files are left out).
pub fn without_tests(code: &str) -> (String, Vec<String>) {
    const GATE: &str = "#[cfg(any(test, feature = \"\"))]";
    let mut out = String::new();
    let mut gated = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(GATE) {
        out.push_str(&rest[..at]);
        let after = &rest[at + GATE.len()..];
        let semi = after.find(';').unwrap_or(after.len());
        let brace = after.find('{').unwrap_or(after.len());
        if semi < brace {
            if let Some(name) = after[..semi].trim().rsplit(' ').next() {
                gated.push(name.to_owned());
            }
            rest = &after[(semi + 1).min(after.len())..];
            continue;
        }
        let mut depth = 0usize;
        let mut end = after.len();
        for (k, c) in after.char_indices().skip(brace) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    (out, gated)
}

/// Words of dynamic SQL, upper-cased, for literals and SQL files.
const DYNAMIC_SQL: &[&str] = &[
    "EXECUTE",
    "FORMAT(",
    "QUOTE_IDENT",
    "QUOTE_LITERAL",
    "QUOTE_NULLABLE",
    "PREPARE ",
    "DBLINK",
    "QUERY_TO_XML",
];

/// Dynamic SQL in one piece of SQL text (`GRANT`/`REVOKE EXECUTE` and
/// `--` comments aside).
pub fn dynamic_sql(sql: &str) -> Vec<&'static str> {
    let upper: String = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
        .to_uppercase()
        .replace("GRANT EXECUTE", "GRANT")
        .replace("REVOKE EXECUTE", "REVOKE");
    let squeezed: String = upper.split_whitespace().collect::<Vec<_>>().join(" ");
    let squeezed = squeezed.replace("FORMAT (", "FORMAT(");
    DYNAMIC_SQL
        .iter()
        .copied()
        .filter(|w| squeezed.contains(w))
        .collect()
}

/// SPI entry points only `base/plans.rs` may use.
const SPI_CALLS: &[&str] = &[
    ".prepare(",
    ".prepare_mut(",
    ".update(",
    ".select(",
    ".open_cursor(",
    ".open_cursor_mut(",
    "Spi::run",
    "Spi::get_",
    "Spi::execute",
    "Spi::explain",
];

/// How many `Stmt::read(`/`Stmt::write(` are not in the initializer of a
/// `const` or `static` item: the item around one starts after the last `;`,
/// `{` or `}` outside parentheses and brackets.
fn loose_statements(code: &str) -> usize {
    let (mut parens, mut item_start, mut loose) = (0i32, 0usize, 0usize);
    for (k, c) in code.char_indices() {
        match c {
            '(' | '[' => parens += 1,
            ')' | ']' => parens -= 1,
            ';' | '{' | '}' if parens == 0 => item_start = k + 1,
            _ => {}
        }
        let rest = &code[k..];
        if rest.starts_with("Stmt::read(") || rest.starts_with("Stmt::write(") {
            let item = code[item_start..k].trim_start();
            let item = item
                .strip_prefix("pub(crate) ")
                .or_else(|| item.strip_prefix("pub "))
                .unwrap_or(item);
            if !(item.starts_with("const ") || item.starts_with("static ")) {
                loose += 1;
            }
        }
    }
    loose
}

/// Problems in one production file (`rel` is its path under `src/`).
pub fn check_file(rel: &str, code: &str, strings: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let squeezed: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
    let plans = rel == "base/plans.rs";
    for call in SPI_CALLS {
        if !plans && squeezed.contains(call) {
            problems.push(format!(
                "{rel}: `{call}` outside base/plans.rs (run statements through plans::run)"
            ));
        }
    }
    let spi_rest = squeezed
        .replace("Spi::connect_mut(", "")
        .replace("Spi::connect(", "");
    if !plans && spi_rest.contains("Spi::") {
        problems.push(format!("{rel}: an SPI call other than Spi::connect/connect_mut"));
    }
    for banned in ["pg_sys::SPI_", "SPI_execute", "SPI_prepare", "leak("] {
        if squeezed.contains(banned) {
            problems.push(format!("{rel}: `{banned}` (a statement must be a constant)"));
        }
    }
    if !plans && rel != "workflow/search.rs" && squeezed.contains("select_once(") {
        problems.push(format!(
            "{rel}: `select_once` outside workflow/search.rs (the listing is the one statement composed at run time)"
        ));
    }
    if !plans && squeezed.contains("Stmt {") {
        problems.push(format!("{rel}: a `Stmt {{ .. }}` literal outside base/plans.rs"));
    }
    // Every Stmt::read/write is in the initializer of a const or static item.
    let loose = loose_statements(&squeezed);
    if loose > 0 {
        problems.push(format!(
            "{rel}: {loose} statements are not made in a `const`/`static` item (`const X: Stmt = Stmt::read(..)`)"
        ));
    }
    for s in strings {
        for w in dynamic_sql(s) {
            problems.push(format!(
                "{rel}: dynamic SQL ({w}) in a string literal: {}",
                cut(s)
            ));
        }
    }
    problems
}

fn cut(s: &str) -> String {
    s.chars().take(120).collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every problem in the extension's source (`extension/src`) and the SQL
/// files (`sql/*.sql`) under `root`, the repository.
pub fn check_repository(root: &Path) -> Vec<String> {
    let src = root.join("extension/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 10, "the extension's source under {}", src.display());
    let mut gated = Vec::new();
    let mut lexed = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let rel = f.strip_prefix(&src).unwrap_or(f).to_string_lossy().into_owned();
        let l = lex(&text);
        let (code, mods) = without_tests(&l.code);
        gated.extend(mods);
        // Literals of the production part only: lex it again.
        let strings = production_strings(&text);
        lexed.push((rel, code, strings));
    }
    let mut problems = Vec::new();
    for (rel, code, strings) in &lexed {
        let stem = rel.trim_end_matches(".rs");
        if gated.iter().any(|m| m == stem) {
            continue;
        }
        problems.extend(check_file(rel, code, strings));
    }
    let sql = root.join("sql");
    let mut sql_files: Vec<PathBuf> = std::fs::read_dir(&sql)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    sql_files.retain(|p| p.extension().is_some_and(|x| x == "sql"));
    sql_files.sort();
    assert!(!sql_files.is_empty(), "the SQL files under {}", sql.display());
    for f in &sql_files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for w in dynamic_sql(&text) {
            problems.push(format!("{}: dynamic SQL ({w})", f.display()));
        }
    }
    problems
}

/// The string literals of the production part of a file.
fn production_strings(text: &str) -> Vec<String> {
    const GATE: &str = "#[cfg(any(test, feature = \"pg_test\"))]";
    match text.find(GATE) {
        // Test modules sit at the end of their file; a gated `mod x;` is
        // one line.
        Some(at) if !text[at..].lines().nth(1).unwrap_or("").trim_end().ends_with(';') => {
            lex(&text[..at]).strings
        }
        _ => lex(text).strings,
    }
}
