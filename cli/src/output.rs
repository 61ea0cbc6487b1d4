//! What every command prints with: JSON, shard failures, times, cut
//! columns, pages of a listing, and the one rule for stored text on a
//! terminal: [`escape`]. Every human-readable line goes out through [`say!`]
//! or [`table`] (and every complaint through `exit`), which escape it; a
//! test fails on a `println!` anywhere else.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use serde_json::{Value, json};
use sheaf_driver::{ClientError, ExecutionPage, ListPage, PageStatus, ShardId};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use crate::exit::{self, Exit};

/// Prints a line of human-readable output on stdout, [`escape`]d whole: a
/// task's error, a queue's name or any other stored text in it cannot
/// drive the operator's terminal. A line is one line: a newline inside is
/// escaped too (say two lines with two calls).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::say_line(&format!($($arg)*))
    };
}
pub(crate) use say;

/// [`say!`]'s line.
pub fn say_line(text: &str) {
    println!("{}", escape(text));
}

/// Whether `c` must not reach a terminal as it is: a C0 or C1 control or
/// DEL (ESC starts the sequences that clear, move and retitle, BEL rings,
/// CR overwrites the line), a line or paragraph separator, or a format
/// character (Unicode category Cf: the bidi embeddings, overrides and
/// isolates that reorder what follows, zero-width spaces and joiners, the
/// byte order mark, the invisible tags).
pub fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061C}'
                | '\u{06DD}'
                | '\u{070F}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08E2}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{110BD}'
                | '\u{110CD}'
                | '\u{13430}'..='\u{1343F}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0001}'
                | '\u{E0020}'..='\u{E007F}'
        )
}

/// Text made safe to print on a terminal: each [`hidden`] character
/// written visibly, as `\n`, `\r`, `\t` or `\u{1b}` (its code point in
/// hex), everything else (accents, CJK, emoji) as it is. A backslash stays
/// as it is, so `\u{1b}` may also be those six characters stored; `--json`
/// tells them apart. Escaping twice changes nothing.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => safe.push_str("\\n"),
            '\r' => safe.push_str("\\r"),
            '\t' => safe.push_str("\\t"),
            c if hidden(c) => {
                let _ = write!(safe, "\\u{{{:x}}}", u32::from(c));
            }
            c => safe.push(c),
        }
    }
    Cow::Owned(safe)
}

/// JSON text that is safe on a terminal and reads back as the same value:
/// serde_json escapes C0 controls in strings already; DEL, C1 controls and
/// format characters become `\u` escapes too (a pair of them past U+FFFF).
/// They occur only inside strings, so the escape is valid JSON.
fn terminal_safe(json: String) -> String {
    // The pretty printer's own newlines are the only raw ones: a newline
    // inside a string is escaped by serde_json.
    if !json.chars().any(|c| c != '\n' && hidden(c)) {
        return json;
    }
    let mut safe = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if c != '\n' && hidden(c) {
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(safe, "\\u{unit:04x}");
            }
        } else {
            safe.push(c);
        }
    }
    safe
}

/// A value as pretty JSON, [`terminal_safe`].
pub fn json_text(value: &Value) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(value).map(terminal_safe)
}

/// A value as JSON on one line, [`terminal_safe`]: a line of stderr
/// under `--json`.
pub fn json_line(value: &Value) -> Result<String, serde_json::Error> {
    serde_json::to_string(value).map(terminal_safe)
}

/// Prints the answer as pretty JSON on stdout.
pub fn print_json(value: &Value) {
    match json_text(value) {
        Ok(s) => println!("{s}"),
        Err(e) => exit::warn(format!("cannot encode the answer: {e}")),
    }
}

/// Prints a value as JSON on one line of stdout (a stream of reports).
pub fn print_json_line(value: &Value) {
    match json_line(value) {
        Ok(s) => println!("{s}"),
        Err(e) => exit::warn(format!("cannot encode the answer: {e}")),
    }
}

/// The address a server listens on, its first line: `serving URL`, or
/// `{"serving": URL}` under `--json` (a script that asked for port 0
/// learns it).
pub fn serving(url: &str, as_json: bool) {
    if as_json {
        print_json_line(&json!({ "serving": url }));
    } else {
        say!("serving {url}");
    }
}

/// Each failed shard and why: what a fan-out call reports.
pub type Failures = BTreeMap<ShardId, ClientError>;

/// Each failed shard's id and error text.
pub fn failures_json(failures: &Failures) -> Value {
    failures
        .iter()
        .map(|(shard, e)| (shard.to_string(), Value::String(e.to_string())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A time as RFC 3339, to the microsecond.
pub fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

/// Stored text for a column: [`escape`]d, then cut to `width` columns of
/// the terminal (a CJK character takes two), ending with `…` when cut.
pub fn cut(text: &str, width: usize) -> String {
    let text = escape(text);
    if text.width() <= width {
        return text.into_owned();
    }
    let mut kept = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        // Room for the ellipsis, one column.
        if used + w + 1 > width {
            break;
        }
        kept.push(c);
        used += w;
    }
    if width > 0 {
        kept.push('…');
    }
    kept
}

/// `text` padded with spaces to `width` terminal columns.
fn pad(text: &str, width: usize, right: bool) -> String {
    let fill = " ".repeat(width.saturating_sub(text.width()));
    if right {
        fill + text
    } else {
        format!("{text}{fill}")
    }
}

/// A page of a listing across shards: its rows, the cursor on, and the
/// shards that did not answer.
pub trait Page {
    type Item;
    fn items(&self) -> &[Self::Item];
    fn next_cursor(&self) -> Option<&str>;
    fn status(&self) -> PageStatus;
    fn unavailable_shards(&self) -> &Failures;
}

/// `Page` for the driver's page types, which have the same fields.
macro_rules! page {
    ($page:ty, $item:ty $(, $t:ident)?) => {
        impl$(<$t>)? Page for $page {
            type Item = $item;
            fn items(&self) -> &[$item] {
                &self.items
            }
            fn next_cursor(&self) -> Option<&str> {
                self.next_cursor.as_deref()
            }
            fn status(&self) -> PageStatus {
                self.status
            }
            fn unavailable_shards(&self) -> &Failures {
                &self.unavailable_shards
            }
        }
    };
}
page!(ListPage<T>, T, T);
page!(ExecutionPage, sheaf_driver::ListedExecution);

/// Prints a page: as JSON (its items by `item_json`, the cursor on, its
/// status and the shards that did not answer), or as `table` and a last
/// line `more: --cursor C` when a page follows. Exit 3 when it is partial.
pub fn print_page<P: Page>(
    page: &P,
    as_json: bool,
    item_json: impl Fn(&P::Item) -> Value,
    table: impl FnOnce(&[P::Item]),
) -> Exit {
    if as_json {
        print_json(&json!({
            "items": page.items().iter().map(item_json).collect::<Vec<_>>(),
            "next_cursor": page.next_cursor(),
            "status": page.status(),
            "unavailable_shards": failures_json(page.unavailable_shards()),
        }));
    } else {
        table(page.items());
        if let Some(c) = page.next_cursor() {
            say!("more: --cursor {c}");
        }
    }
    exit::partial_if(page.unavailable_shards(), page.status() == PageStatus::Partial)
}

/// A column of a table: its heading, and the width its cells are padded
/// to (the last column's is 0: not padded).
pub struct Column {
    pub heading: &'static str,
    pub width: usize,
    /// Right-aligned (a number), else left.
    pub right: bool,
}

impl Column {
    pub const fn left(heading: &'static str, width: usize) -> Column {
        Column {
            heading,
            width,
            right: false,
        }
    }

    pub const fn right(heading: &'static str, width: usize) -> Column {
        Column {
            heading,
            width,
            right: true,
        }
    }
}

/// Prints a table: the headings, then a line per row of cells (one per
/// column, in order), the header aligned as its column. Every cell is
/// [`escape`]d and padded to its width on the terminal.
pub fn table(columns: &[Column], rows: impl IntoIterator<Item = Vec<String>>) {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = columns
            .iter()
            .zip(cells)
            .map(|(c, text)| pad(&escape(text), c.width, c.right))
            .collect();
        println!("{}", padded.join(" "));
    };
    line(&mut columns.iter().map(|c| c.heading));
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_format_characters_are_escaped_and_text_kept() {
        assert_eq!(
            escape("a\u{1b}[2Jb\u{7}c\rd\ne\tf"),
            "a\\u{1b}[2Jb\\u{7}c\\rd\\ne\\tf"
        );
        assert_eq!(
            escape("\u{202e}gnp.exe \u{7f}\u{9b}\u{200b}\u{2066}\u{feff}\u{61c}\u{2028}\u{e0041}"),
            "\\u{202e}gnp.exe \\u{7f}\\u{9b}\\u{200b}\\u{2066}\\u{feff}\\u{61c}\\u{2028}\\u{e0041}"
        );
        let plain = "café 日本語 ✓ naïve \\ \"q\"";
        assert!(matches!(escape(plain), Cow::Borrowed(p) if p == plain));
        let once = escape("x\u{1b}y\u{202e}").into_owned();
        assert_eq!(escape(&once), once, "escaping twice changes nothing");
    }

    #[test]
    fn cut_escapes_and_counts_terminal_columns() {
        assert_eq!(cut("日本語のキュー", 7), "日本語…");
        assert_eq!(cut("日本語のキュー", 14), "日本語のキュー");
        assert_eq!(cut("\u{1b}[31mred", 6), "\\u{1b…");
        assert_eq!(cut("abc", 0), "");
        assert_eq!(pad("日本", 6, false), "日本  ");
        assert_eq!(pad("7", 3, true), "  7");
    }

    #[test]
    fn json_is_exact_and_safe_on_a_terminal() {
        let stored = "e\u{1b}]0;pwned\u{7}\r\u{202e}\u{85}\u{7f}\u{e0041}日本 \\ \"";
        let value = json!({"last_error": stored, "n": [1, 2]});
        for text in [json_text(&value).unwrap(), json_line(&value).unwrap()] {
            assert!(
                !text.chars().any(|c| c != '\n' && hidden(c)),
                "nothing hidden reaches the terminal: {text:?}"
            );
            let back: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(back, value, "the same value: {text}");
        }
        assert!(
            json_line(&value)
                .unwrap()
                .contains("\\u202e\\u0085\\u007f\\udb40\\udc41日本")
        );
    }

    /// Every line a command prints goes through `say!`, `table`, the JSON
    /// printers here or `exit`'s complaints: a `println!` elsewhere could
    /// print stored text raw.
    #[test]
    fn only_the_escaping_printers_print() {
        const PRINTERS: [&str; 2] = ["output.rs", "exit.rs"];
        const RAW: [&str; 6] = [
            "println!",
            "print!(",
            "eprintln!",
            "eprint!(",
            "stdout()",
            "stderr()",
        ];
        let mut stack = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        let mut raw = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if PRINTERS.contains(&name.as_str()) || !name.ends_with(".rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    if RAW.iter().any(|r| line.contains(r)) && !line.trim_start().starts_with("//") {
                        raw.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            raw.is_empty(),
            "print with say! or table (output.rs):\n{}",
            raw.join("\n")
        );
    }
}
