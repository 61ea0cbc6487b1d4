//! What an error message may quote of a caller's value.
//!
//! A refusal names the bad value so a caller can find it, but a 1 MiB option
//! must not come back as a 1 MiB message (to the client and to the server
//! log). Every echoed value goes through [`excerpt`].

use std::fmt::Display;

/// The most bytes of a caller's value a message quotes.
pub const MAX_ECHO_BYTES: usize = 64;

/// `value` as text, cut to [`MAX_ECHO_BYTES`] at a character boundary; a cut
/// value says so and how long the whole was.
pub fn excerpt(value: impl Display) -> String {
    let text = value.to_string();
    if text.len() <= MAX_ECHO_BYTES {
        return text;
    }
    let mut end = MAX_ECHO_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes, cut)", &text[..end], text.len())
}

/// A string as a quoted, escaped literal (`{:?}`), cut like [`excerpt`].
pub fn quoted(text: &str) -> String {
    excerpt(format_args!("{text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_quoted_whole() {
        assert_eq!(excerpt("abc"), "abc");
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        assert_eq!(excerpt("x".repeat(MAX_ECHO_BYTES)), "x".repeat(MAX_ECHO_BYTES));
    }

    #[test]
    fn long_values_are_cut_and_say_so() {
        let cut = excerpt("y".repeat(1 << 20));
        assert!(cut.starts_with(&"y".repeat(MAX_ECHO_BYTES)));
        assert!(cut.ends_with("… (1048576 bytes, cut)"), "{cut}");
        assert!(cut.len() < 100);
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        // 'é' is two bytes: 64 bytes would split the 33rd.
        let cut = excerpt(format!("a{}", "é".repeat(100)));
        assert!(cut.starts_with(&format!("a{}", "é".repeat(31))));
        assert!(cut.contains("(201 bytes, cut)"), "{cut}");
    }
}
