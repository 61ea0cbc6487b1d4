//! What every command prints with: JSON, shard failures, times, cut
//! columns, pages of a listing.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{Value, json};
use sheaf_driver::{ClientError, ExecutionPage, ListPage, PageStatus, ShardId};

use crate::exit::{self, Exit};

/// Each failed shard and why: what a fan-out call reports.
pub type Failures = BTreeMap<ShardId, ClientError>;

pub fn print_json(value: &Value) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("sheaf: cannot encode the answer: {e}"),
    }
}

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

/// A column's text, cut to `width` characters.
pub fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(width - 1).collect();
        s.push('…');
        s
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
            println!("more: --cursor {c}");
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
/// column, in order), the header aligned as its column.
pub fn table(columns: &[Column], rows: impl IntoIterator<Item = Vec<String>>) {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = columns
            .iter()
            .zip(cells)
            .map(|(c, text)| {
                if c.right {
                    format!("{text:>0$}", c.width)
                } else {
                    format!("{text:<0$}", c.width)
                }
            })
            .collect();
        println!("{}", padded.join(" "));
    };
    line(&mut columns.iter().map(|c| c.heading));
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}
