//! Input hygiene: the one rule for every name sheaf stores, and the one size
//! limit for every value it stores (payloads, inputs, results, progress,
//! signals and error text).
//!
//! A name (a queue, a workflow and its ids, a key, a schedule, a rate limit,
//! a worker, a mutex, a search-attribute key) is valid when it is 1 to its
//! limit of bytes, has no character of general category Cc (control) or Cf
//! (format: the bidi controls U+202A..U+202E and U+2066..U+2069, U+200B,
//! U+FEFF, ...), and is already in Unicode NFC. A name that is not NFC is
//! refused, never normalized, so what sheaf accepts reads back byte for byte:
//! "payexe.com" spelled with U+202E, or "é" spelled e + U+0301 beside a stored
//! "é", cannot make a look-alike of another name.
//!
//! The extension checks a name where it would first be stored; a call naming
//! something already stored is not refused for its characters (names stored
//! before the rule keep working).

use unicode_normalization::is_nfc;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// The most bytes of JSON text (compact) a stored value may have, and the
/// most bytes of an error text: 1 MiB.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// The earliest `run_at` sheaf accepts: the Unix epoch, in Unix microseconds.
pub const MIN_RUN_AT_MICROS: i64 = 0;
/// The latest `run_at`: 9999-12-31 23:59:59.999999 UTC, in Unix microseconds.
pub const MAX_RUN_AT_MICROS: i64 = 253_402_300_799_999_999;

/// Why a name is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// Empty or over its limit: `got` bytes, `max` allowed.
    Length { got: usize, max: usize },
    /// A control character (Cc) at this 1-based character position.
    Control { ch: char, at: usize },
    /// A format character (Cf) at this 1-based character position.
    Format { ch: char, at: usize },
    /// Not in Unicode NFC.
    NotNfc,
}

impl NameError {
    /// Whether the name breaks the character rule (not only its length):
    /// the part a name stored before the rule is let off.
    pub fn is_characters(&self) -> bool {
        !matches!(self, NameError::Length { .. })
    }
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::Length { got, max } => write!(f, "must be 1 to {max} bytes, got {got}"),
            NameError::Control { ch, at } => write!(
                f,
                "must not contain control characters (U+{:04X} at character {at})",
                u32::from(*ch)
            ),
            NameError::Format { ch, at } => write!(
                f,
                "must not contain Unicode format characters such as bidi controls or zero-width spaces (U+{:04X} at character {at})",
                u32::from(*ch)
            ),
            NameError::NotNfc => {
                f.write_str("must be in Unicode normalization form C (NFC); normalize it before sending")
            }
        }
    }
}

/// The name rule: 1 to `max_bytes` bytes, no Cc or Cf character, in NFC.
pub fn check_name(name: &str, max_bytes: usize) -> Result<(), NameError> {
    if name.is_empty() || name.len() > max_bytes {
        return Err(NameError::Length {
            got: name.len(),
            max: max_bytes,
        });
    }
    check_characters(name)
}

/// The name rule's characters alone (no length): no Cc or Cf, in NFC.
pub fn check_characters(name: &str) -> Result<(), NameError> {
    for (i, ch) in name.chars().enumerate() {
        match ch.general_category() {
            GeneralCategory::Control => return Err(NameError::Control { ch, at: i + 1 }),
            GeneralCategory::Format => return Err(NameError::Format { ch, at: i + 1 }),
            _ => {}
        }
    }
    if !is_nfc(name) {
        return Err(NameError::NotNfc);
    }
    Ok(())
}

/// The size limit: a value of `bytes` bytes is at most [`MAX_VALUE_BYTES`].
/// The message says how large it was and the limit; the caller names the
/// argument.
pub fn check_size(bytes: usize) -> Result<(), String> {
    if bytes > MAX_VALUE_BYTES {
        return Err(format!(
            "is {bytes} bytes; the limit is {MAX_VALUE_BYTES} bytes (1 MiB), refused rather than cut"
        ));
    }
    Ok(())
}

/// The `run_at` bounds: from the Unix epoch to the end of year 9999 UTC.
pub fn check_run_at(micros: i64) -> Result<(), String> {
    if !(MIN_RUN_AT_MICROS..=MAX_RUN_AT_MICROS).contains(&micros) {
        return Err("must be from 1970-01-01 00:00:00 UTC to 9999-12-31 23:59:59.999999 UTC".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_names_pass() {
        for name in [
            "default",
            "payments.eu-1",
            "é",
            "中文",
            "😀",
            "a b",
            "x".repeat(256).as_str(),
        ] {
            assert_eq!(check_name(name, 256), Ok(()), "{name:?}");
        }
    }

    #[test]
    fn length_is_1_to_max_bytes() {
        assert_eq!(check_name("", 8), Err(NameError::Length { got: 0, max: 8 }));
        assert_eq!(
            check_name("123456789", 8),
            Err(NameError::Length { got: 9, max: 8 })
        );
        // Bytes, not characters: four 2-byte characters fill 8.
        assert_eq!(check_name("éééé", 8), Ok(()));
        assert!(!NameError::Length { got: 0, max: 1 }.is_characters());
    }

    #[test]
    fn control_characters_are_refused() {
        for (name, ch, at) in [
            ("a\nb", '\n', 2),
            ("\t", '\t', 1),
            ("ab\u{7f}", '\u{7f}', 3),
            ("a\u{85}", '\u{85}', 2),
        ] {
            assert_eq!(
                check_name(name, 256),
                Err(NameError::Control { ch, at }),
                "{name:?}"
            );
        }
    }

    #[test]
    fn format_characters_are_refused() {
        // Right-to-left override: "pay\u{202e}moc.exe" reads as "payexe.com".
        for ch in [
            '\u{202a}',
            '\u{202b}',
            '\u{202c}',
            '\u{202d}',
            '\u{202e}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{200e}',
            '\u{200f}',
            '\u{feff}',
            '\u{ad}',
            '\u{2060}',
            '\u{e0001}',
        ] {
            let name = format!("pay{ch}moc.exe");
            assert_eq!(
                check_name(&name, 256),
                Err(NameError::Format { ch, at: 4 }),
                "U+{:04X}",
                u32::from(ch)
            );
        }
    }

    #[test]
    fn names_not_in_nfc_are_refused_not_normalized() {
        // e + combining acute accent: NFC is the one character U+00E9.
        assert_eq!(check_name("cafe\u{301}", 256), Err(NameError::NotNfc));
        assert_eq!(check_name("caf\u{e9}", 256), Ok(()));
        // The Angstrom sign normalizes to U+00C5.
        assert_eq!(check_name("\u{212b}", 256), Err(NameError::NotNfc));
    }

    #[test]
    fn messages_name_the_character_never_echo_the_name() {
        let why = check_name("pay\u{202e}moc.exe", 256).unwrap_err().to_string();
        assert!(why.contains("U+202E at character 4"), "{why}");
        assert!(!why.contains("pay"), "{why}");
        let why = check_name(&"x".repeat(1 << 20), 256).unwrap_err().to_string();
        assert_eq!(why, "must be 1 to 256 bytes, got 1048576");
    }

    #[test]
    fn the_size_limit_is_one_mib() {
        assert_eq!(check_size(MAX_VALUE_BYTES), Ok(()));
        let why = check_size(MAX_VALUE_BYTES + 1).unwrap_err();
        assert!(why.contains("1048577 bytes") && why.contains("1048576"), "{why}");
    }

    #[test]
    fn run_at_is_from_the_epoch_to_year_9999() {
        assert!(check_run_at(0).is_ok());
        assert!(check_run_at(MAX_RUN_AT_MICROS).is_ok());
        assert!(check_run_at(-1).is_err());
        assert!(check_run_at(MAX_RUN_AT_MICROS + 1).is_err());
        assert!(check_run_at(i64::MIN).is_err() && check_run_at(i64::MAX).is_err());
    }

    proptest! {
        /// Any string the rule accepts is NFC, free of Cc and Cf, and its
        /// NFC form is itself (sheaf reads back what it accepted).
        #[test]
        fn accepted_names_are_clean(name in "\\PC{0,40}|.{0,40}") {
            use unicode_normalization::UnicodeNormalization;
            if check_name(&name, 256).is_ok() {
                prop_assert!(!name.is_empty() && name.len() <= 256);
                prop_assert_eq!(name.nfc().collect::<String>(), name.clone());
                prop_assert!(name.chars().all(|c| !matches!(c.general_category(), GeneralCategory::Control | GeneralCategory::Format)));
            }
        }

        /// Inserting any Cc or Cf character into an accepted name makes it refused.
        #[test]
        fn one_bad_character_refuses(name in "[a-z]{1,20}", at in 0usize..20, bad in prop::sample::select(vec!['\u{0}', '\u{1b}', '\u{202e}', '\u{200b}', '\u{feff}', '\u{2066}', '\u{9f}'])) {
            let at = at.min(name.len());
            let mut bad_name = name.clone();
            bad_name.insert(at, bad);
            prop_assert!(check_name(&bad_name, 256).unwrap_err().is_characters());
        }

        /// Decomposing an accepted name with a composed character refuses it.
        #[test]
        fn a_decomposed_look_alike_is_refused(prefix in "[a-z]{0,10}", base in prop::sample::select(vec!['é', 'ñ', 'Å', 'ü'])) {
            use unicode_normalization::UnicodeNormalization;
            let composed = format!("{prefix}{base}");
            let decomposed: String = composed.nfd().collect();
            prop_assert_eq!(check_name(&composed, 256), Ok(()));
            prop_assert_eq!(check_name(&decomposed, 256), Err(NameError::NotNfc));
        }
    }
}
