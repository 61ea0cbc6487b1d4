//! The words a shard returns in text columns (a move's phase, a blocker,
//! an event type, an audit outcome, ...), read as enums: [`words!`] declares
//! one, [`Word`] reads a column as one.

use std::error::Error;

use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type};

/// A type read from one of a shard's words. Crate-private: the public
/// enums parse only from rows, so no error type of their own is public.
pub(crate) trait Words: Sized {
    /// The value `word` spells; `None` for a word this driver does not know.
    fn from_word(word: &str) -> Option<Self>;
}

macro_rules! core_words {
    ($($t:ty),*) => {$(
        impl Words for $t {
            fn from_word(word: &str) -> Option<Self> {
                word.parse().ok()
            }
        }
    )*};
}
core_words!(
    sheaf_core::state::TaskKind,
    sheaf_core::state::TaskState,
    sheaf_core::state::ExecutionState
);

/// A text column read as `T`; a word `T` does not know fails the read,
/// naming the word.
struct Word<T>(T);

impl<'a, T: Words> FromSql<'a> for Word<T> {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let word = <&str as FromSql>::from_sql(ty, raw)?;
        T::from_word(word)
            .map(Word)
            .ok_or_else(|| format!("{word:?} is not a word this driver knows").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

/// Column `column` of `row`, read as `T`.
pub(crate) fn word<T: Words>(row: &Row, column: &str) -> Result<T, tokio_postgres::Error> {
    row.try_get::<_, Word<T>>(column).map(|w| w.0)
}

/// Column `column` of `row`, read as `T` or `None` for a NULL.
pub(crate) fn word_opt<T: Words>(row: &Row, column: &str) -> Result<Option<T>, tokio_postgres::Error> {
    row.try_get::<_, Option<Word<T>>>(column).map(|w| w.map(|w| w.0))
}

/// Column `column` of `row`, a text array, read as `T`s.
pub(crate) fn word_list<T: Words>(row: &Row, column: &str) -> Result<Vec<T>, tokio_postgres::Error> {
    row.try_get::<_, Vec<Word<T>>>(column)
        .map(|ws| ws.into_iter().map(|w| w.0).collect())
}

/// Declares a public enum of a shard's words: its variants and their
/// spellings, and optionally a last variant holding any other word (an
/// application's own event type, a refusal's text). Each gets `as_str`,
/// `Display` and `Serialize` (its word, so JSON output spells it as the
/// shard does), and compares equal to its word as a `&str`.
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $var:ident = $text:literal, )+
        }
        $( other $(#[$ometa:meta])* $other:ident )?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $var, )+
            $( $(#[$ometa])* $other(String), )?
        }

        impl $name {
            /// Its word, spelled as the shard spells it.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$var => $text, )+
                    $( $name::$other(word) => word, )?
                }
            }
        }

        impl $crate::words::Words for $name {
            fn from_word(word: &str) -> Option<Self> {
                match word {
                    $( $text => Some($name::$var), )+
                    _ => words!(@other $name word $( $other )?),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, word: &str) -> bool {
                self.as_str() == word
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, word: &&str) -> bool {
                self.as_str() == *word
            }
        }
    };
    (@other $name:ident $word:ident) => { None };
    (@other $name:ident $word:ident $other:ident) => { Some($name::$other($word.to_owned())) };
}
pub(crate) use words;

#[cfg(test)]
mod tests {
    use super::Words;
    use crate::{Blocker, EventType, MovePhase};

    #[test]
    fn a_word_reads_as_its_variant_and_spells_the_same_back() {
        assert_eq!(MovePhase::from_word("COMMITTED"), Some(MovePhase::Committed));
        assert_eq!(MovePhase::Committed.to_string(), "COMMITTED");
        assert_eq!(
            serde_json::to_value(Blocker::TaskClaimed).ok(),
            Some(serde_json::json!("task_claimed"))
        );
        assert!(EventType::SignalReceived == "SignalReceived");
    }

    #[test]
    fn an_unknown_word_is_refused_or_kept_as_it_is() {
        // A closed set refuses it (the row read fails, naming the word)...
        assert_eq!(MovePhase::from_word("LOST"), None);
        // ...an open one keeps it: an application's own event type.
        let own = EventType::from_word("InvoiceSent");
        assert_eq!(own, Some(EventType::Custom("InvoiceSent".into())));
        assert_eq!(own.map(|e| e.to_string()).as_deref(), Some("InvoiceSent"));
    }
}
