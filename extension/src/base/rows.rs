//! Reading SPI rows into typed values, with one NULL policy: a column read
//! as `T` must not be NULL (a NULL there is a bug in sheaf's SQL or schema:
//! XX000 naming what sheaf was doing and the column), a column read as
//! `Option<T>` may be. Never a panic, never an invented default.

use pgrx::datum::{FromDatum, Interval, IntoDatum, TimestampWithTimeZone};
use pgrx::spi::{SpiHeapTupleData, SpiTupleTable};

use crate::base::errors::{SpiResultExt, internal};
use crate::base::jsonb::Jsonb;
use sheaf_core::state::{ExecutionState, TaskState};

/// A column type that is never NULL where sheaf reads it as itself.
pub trait NotNull: FromDatum + IntoDatum {}

impl NotNull for bool {}
impl NotNull for i32 {}
impl NotNull for i64 {}
impl NotNull for f64 {}
impl NotNull for pgrx::pg_sys::TransactionId {}
impl NotNull for String {}
impl NotNull for pgrx::Uuid {}
impl NotNull for Jsonb {}
impl NotNull for pgrx::JsonB {}
impl NotNull for TimestampWithTimeZone {}
impl NotNull for Interval {}
impl NotNull for Vec<String> {}
impl NotNull for Vec<i32> {}
impl NotNull for Vec<pgrx::Uuid> {}

/// One column of a row.
pub trait Column: Sized {
    fn read(row: &SpiHeapTupleData<'_>, ordinal: usize, doing: &str) -> Self;
}

impl<T: NotNull> Column for T {
    fn read(row: &SpiHeapTupleData<'_>, ordinal: usize, doing: &str) -> T {
        match row.get::<T>(ordinal).or_internal(doing) {
            Some(v) => v,
            None => internal(format_args!("{doing}: column {ordinal} is NULL")),
        }
    }
}

impl<T: NotNull> Column for Option<T> {
    fn read(row: &SpiHeapTupleData<'_>, ordinal: usize, doing: &str) -> Option<T> {
        row.get::<T>(ordinal).or_internal(doing)
    }
}

/// A whole row, read into a named type (`row!`); no tuple implements it, so
/// no row is read by position.
pub trait FromRow: Sized {
    fn from_row(row: &SpiHeapTupleData<'_>, doing: &str) -> Self;
}

/// A named row type, its [`FromRow`] (the statement's columns, in the
/// order of the fields) and its [`FromColumns`] (the same run of columns
/// inside a wider row, read as a [`Split`]).
///
/// ```ignore
/// row! {
///     pub struct Claimed {
///         pub id: pgrx::Uuid,
///         pub token: i64,
///         pub key: Option<String>,
///     }
/// }
/// ```
macro_rules! row {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fmeta:meta])* $fvis:vis $field:ident: $ty:ty),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$fmeta])* $fvis $field: $ty),+
        }

        impl $crate::base::rows::FromColumns for $name {
            const WIDTH: usize = [$(stringify!($field)),+].len();
            fn from_columns(row: &::pgrx::spi::SpiHeapTupleData<'_>, offset: usize, doing: &str) -> Self {
                // Struct fields are evaluated in the order written: the
                // first field is the column after `offset`.
                let mut ordinal = offset;
                $name {
                    $($field: {
                        ordinal += 1;
                        <$ty as $crate::base::rows::Column>::read(row, ordinal, doing)
                    }),+
                }
            }
        }

        impl $crate::base::rows::FromRow for $name {
            fn from_row(row: &::pgrx::spi::SpiHeapTupleData<'_>, doing: &str) -> Self {
                <Self as $crate::base::rows::FromColumns>::from_columns(row, 0, doing)
            }
        }
    };
}
pub(crate) use row;

/// A run of consecutive columns, starting after `offset` others.
pub trait FromColumns: Sized {
    /// How many columns it reads.
    const WIDTH: usize;
    fn from_columns(row: &SpiHeapTupleData<'_>, offset: usize, doing: &str) -> Self;
}

/// A row read as two: its first `A::WIDTH` columns, then the rest (a
/// record and the keys beside it).
pub struct Split<A, B> {
    pub head: A,
    pub tail: B,
}

impl<A: FromColumns, B: FromColumns> FromRow for Split<A, B> {
    fn from_row(row: &SpiHeapTupleData<'_>, doing: &str) -> Self {
        Split {
            head: A::from_columns(row, 0, doing),
            tail: B::from_columns(row, A::WIDTH, doing),
        }
    }
}

/// Every row of `table`.
pub fn all<T: FromRow>(table: SpiTupleTable<'_>, doing: &str) -> Vec<T> {
    table.map(|row| T::from_row(&row, doing)).collect()
}

/// The first row of `table`, if it has one.
pub fn first<T: FromRow>(mut table: SpiTupleTable<'_>, doing: &str) -> Option<T> {
    table.next().map(|row| T::from_row(&row, doing))
}

/// The one row a statement always returns (an aggregate, `EXISTS`, a
/// `RETURNING` of a row known to exist); XX000 if there is none.
pub fn only<T: FromRow>(table: SpiTupleTable<'_>, doing: &str) -> T {
    first(table, doing).unwrap_or_else(|| internal(format_args!("{doing}: the statement returned no row")))
}

/// The first column of every row of `table`.
pub fn values<T: Column>(table: SpiTupleTable<'_>, doing: &str) -> Vec<T> {
    table.map(|row| T::read(&row, 1, doing)).collect()
}

/// The first column of the first row of `table`, if it has a row.
pub fn value<T: Column>(mut table: SpiTupleTable<'_>, doing: &str) -> Option<T> {
    table.next().map(|row| T::read(&row, 1, doing))
}

/// The first column of the one row a statement always returns; XX000 if
/// there is none.
pub fn only_value<T: Column>(table: SpiTupleTable<'_>, doing: &str) -> T {
    value(table, doing).unwrap_or_else(|| internal(format_args!("{doing}: the statement returned no row")))
}

/// A state column: its text, which must name a state of the enum (`sheaf_core::state`).
macro_rules! state_column {
    ($t:ty) => {
        impl Column for $t {
            fn read(row: &SpiHeapTupleData<'_>, ordinal: usize, doing: &str) -> $t {
                parse_state(String::read(row, ordinal, doing), doing)
            }
        }

        impl Column for Option<$t> {
            fn read(row: &SpiHeapTupleData<'_>, ordinal: usize, doing: &str) -> Option<$t> {
                Option::<String>::read(row, ordinal, doing).map(|s| parse_state(s, doing))
            }
        }
    };
}
state_column!(ExecutionState);
state_column!(TaskState);

fn parse_state<T: std::str::FromStr<Err = sheaf_core::state::UnknownState>>(text: String, doing: &str) -> T {
    text.parse()
        .unwrap_or_else(|e| internal(format_args!("{doing}: {e}")))
}
