//! A `jsonb` value carried through sheaf as Postgres stored it.
//!
//! pgrx's `JsonB` converts through text and `serde_json::Value`: a print and
//! a parse per value each way, and numbers squeezed through `f64`
//! (12345678901234567890123 came back as 12345678901234568000000, `1.50` as
//! `1.5`). Payloads are the caller's data, so they go through untouched:
//! this type holds the value's bytes (detoasted, 4-byte header) and hands
//! the same bytes back.

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::datum::{Datum, FromDatum, IntoDatum, UnboxDatum};
use pgrx::nullable::Nullable;
use pgrx::pg_sys;
use sheaf_core::nesting::check_depth;

use crate::base::args::within_size;
use crate::base::errors::{bad_argument, internal};

#[derive(Clone, PartialEq, Eq)]
pub struct Jsonb(Vec<u8>);

impl Jsonb {
    /// A value built in Rust (sheaf's own documents, never a caller's data).
    pub fn from_value(value: serde_json::Value) -> Jsonb {
        let datum = pgrx::JsonB(value).into_datum();
        // SAFETY: jsonb_in's result, a valid jsonb datum.
        datum
            .and_then(|d| unsafe { Jsonb::from_datum(d, false) })
            .unwrap_or_else(|| pgrx::error!("jsonb_in returned no value"))
    }
}

impl Jsonb {
    /// The value checked against sheaf's one nesting rule
    /// (`sheaf_core::nesting`): deeper values are refused, naming `arg`.
    pub fn checked(self, arg: &str) -> Jsonb {
        if let Err(why) = check_depth(self.depth()) {
            bad_argument(arg, why);
        }
        self
    }

    /// A caller's value as an entry point stores it: checked for nesting,
    /// and at most the one size limit of compact JSON text
    /// (`sheaf_core::hygiene::MAX_VALUE_BYTES`; 54000 naming `arg`, never
    /// cut). Sheaf's own copies of a value accepted here (a move's staging,
    /// a result the relay carries) are not measured again.
    pub fn sized(self, arg: &str) -> Jsonb {
        let checked = self.checked(arg);
        within_size(checked.compact_len(), arg);
        checked
    }

    /// The value as serde_json reads it, for sheaf's own use (options,
    /// inputs, results, event payloads), after the nesting check: serde_json
    /// stops at 128 levels, which a checked value stays well within.
    pub fn parse(self, arg: &str) -> serde_json::Value {
        let checked = self.checked(arg);
        let text = checked.with_palloc(|jb| {
            // SAFETY: `jb` is a valid jsonb; JsonbToCString with no buffer
            // pallocs a NUL-terminated string.
            unsafe {
                let cstr = pg_sys::JsonbToCString(std::ptr::null_mut(), &raw mut (*jb).root, 0);
                let text = std::ffi::CStr::from_ptr(cstr).to_string_lossy().into_owned();
                pg_sys::pfree(cstr.cast());
                text
            }
        });
        serde_json::from_str(&text)
            .unwrap_or_else(|e| internal(format!("reading back the jsonb value of {arg}: {e}")))
    }

    /// The length in bytes of the value's JSON text without whitespace, as
    /// serde_json's `to_string` writes it (history bytes are counted so).
    /// PostgreSQL prints a jsonb with one space after each `:` and after each
    /// `,` between two members or elements, and otherwise writes the same
    /// text (the same escapes, the same digits), so this is the printed
    /// length less one per key and one per separator: no serde pass over a
    /// large value.
    pub fn compact_len(&self) -> usize {
        self.with_palloc(|jb| {
            // SAFETY: `jb` is a valid jsonb; JsonbToCString with no buffer
            // pallocs a NUL-terminated string, and the iterator walks the
            // value and frees each level's frame as it leaves it.
            unsafe {
                let cstr = pg_sys::JsonbToCString(std::ptr::null_mut(), &raw mut (*jb).root, 0);
                let printed = std::ffi::CStr::from_ptr(cstr).to_bytes().len();
                pg_sys::pfree(cstr.cast());
                let mut it = pg_sys::JsonbIteratorInit(&raw mut (*jb).root);
                let mut value: pg_sys::JsonbValue = std::mem::zeroed();
                // Per open container: whether it is an object, its members so far.
                let mut open: Vec<(bool, usize)> = Vec::new();
                let mut spaces = 0usize;
                loop {
                    use pg_sys::JsonbIteratorToken::*;
                    match pg_sys::JsonbIteratorNext(&raw mut it, &raw mut value, false) {
                        WJB_DONE => break,
                        token @ (WJB_BEGIN_ARRAY | WJB_BEGIN_OBJECT) => {
                            if let Some((false, n)) = open.last_mut() {
                                *n += 1;
                            }
                            open.push((token == WJB_BEGIN_OBJECT, 0));
                        }
                        WJB_KEY | WJB_ELEM => {
                            if let Some((_, n)) = open.last_mut() {
                                *n += 1;
                            }
                        }
                        WJB_END_ARRAY | WJB_END_OBJECT => {
                            if let Some((object, n)) = open.pop() {
                                spaces += n.saturating_sub(1) + if object { n } else { 0 };
                            }
                        }
                        _ => {}
                    }
                }
                printed - spaces
            }
        })
    }

    /// How deep the value nests arrays and objects (a scalar is 0).
    pub fn depth(&self) -> usize {
        self.with_palloc(|jb| {
            // SAFETY: `jb` is a valid jsonb; the iterator walks it and frees
            // each level's frame as it leaves it.
            unsafe {
                if (*jb).root.header & pg_sys::JB_FSCALAR != 0 {
                    return 0;
                }
                let mut it = pg_sys::JsonbIteratorInit(&raw mut (*jb).root);
                let mut value: pg_sys::JsonbValue = std::mem::zeroed();
                let (mut depth, mut deepest) = (0usize, 0usize);
                loop {
                    use pg_sys::JsonbIteratorToken::*;
                    match pg_sys::JsonbIteratorNext(&raw mut it, &raw mut value, false) {
                        WJB_DONE => break,
                        WJB_BEGIN_ARRAY | WJB_BEGIN_OBJECT => {
                            depth += 1;
                            deepest = deepest.max(depth);
                        }
                        WJB_END_ARRAY | WJB_END_OBJECT => depth -= 1,
                        _ => {}
                    }
                }
                deepest
            }
        })
    }

    /// Runs `f` on a palloc'd (so suitably aligned) copy of the value.
    fn with_palloc<R>(&self, f: impl FnOnce(*mut pg_sys::Jsonb) -> R) -> R {
        // SAFETY: palloc'd and MAXALIGNed, exactly the value's bytes.
        unsafe {
            let ptr = pg_sys::palloc(self.0.len()).cast::<u8>();
            std::ptr::copy_nonoverlapping(self.0.as_ptr(), ptr, self.0.len());
            let out = f(ptr.cast());
            pg_sys::pfree(ptr.cast());
            out
        }
    }
}

impl std::fmt::Debug for Jsonb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Jsonb({} bytes)", self.0.len())
    }
}

impl FromDatum for Jsonb {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Jsonb> {
        if is_null || datum.is_null() {
            return None;
        }
        let raw = datum.cast_mut_ptr::<pg_sys::varlena>();
        // SAFETY: a non-null jsonb datum points at a varlena; detoasting
        // yields an uncompressed copy with a 4-byte header (or the value itself
        // if it already is one), VARSIZE bytes long.
        unsafe {
            let flat = pg_sys::pg_detoast_datum(raw);
            let len = pgrx::varlena::varsize_any(flat);
            let bytes = std::slice::from_raw_parts(flat as *const u8, len).to_vec();
            if flat != raw {
                pg_sys::pfree(flat.cast());
            }
            Some(Jsonb(bytes))
        }
    }
}

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        // SAFETY: palloc'd in the current memory context, exactly the bytes of
        // a valid 4-byte-header varlena.
        unsafe {
            let ptr = pg_sys::palloc(self.0.len()).cast::<u8>();
            std::ptr::copy_nonoverlapping(self.0.as_ptr(), ptr, self.0.len());
            Some(pg_sys::Datum::from(ptr))
        }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: unboxing copies the bytes out; nothing borrows the source.
unsafe impl UnboxDatum for Jsonb {
    type As<'src> = Jsonb;
    unsafe fn unbox<'src>(d: Datum<'src>) -> Jsonb
    where
        Self: 'src,
    {
        // SAFETY: the caller hands a non-null jsonb datum.
        unsafe { Jsonb::from_datum(d.sans_lifetime(), false) }
            .unwrap_or_else(|| pgrx::error!("a jsonb array element was null"))
    }
}

// SAFETY: the argument is a jsonb datum (the SQL signature says so).
unsafe impl<'fcx> ArgAbi<'fcx> for Jsonb {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // SAFETY: as above.
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| pgrx::error!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        // SAFETY: as above.
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

// SAFETY: the returned datum is a valid jsonb, allocated in the function's
// current memory context.
unsafe impl BoxRet for Jsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        match self.into_datum() {
            // SAFETY: see above.
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

pgrx::impl_sql_translatable!(Jsonb, "jsonb");

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::Jsonb;
    use pgrx::prelude::*;

    #[pg_test]
    fn the_compact_length_is_serde_jsons() {
        let values = [
            r#"{}"#,
            r#"[]"#,
            r#"7"#,
            r#""a, b: c""#,
            r#"{"a": 1, "b": [1, 2, {"c": "d, e"}], "f": {}, "g": [[]], "h": null}"#,
            r#"[{"k": "\n\t\u0001 \" \\ é 😀"}, 12345678901234567890.10, -0.0, 1e400, true]"#,
            r#"{"nested": {"deeper": {"deepest": [1, [2, [3, []]]]}}}"#,
        ];
        for text in values {
            let jb = Spi::get_one_with_args::<Jsonb>("SELECT $1::jsonb", &[text.into()])
                .expect("a jsonb")
                .expect("not null");
            let serde = serde_json::to_string(&jb.clone().parse("v"))
                .expect("serialized")
                .len();
            assert_eq!(jb.compact_len(), serde, "{text}");
        }
    }
}
