//! A one-dimensional SQL array argument.
//!
//! pgrx reads any array into a `Vec` by walking its elements in storage
//! order, so `ARRAY[[a, b], [c, d]]` would arrive as `[a, b, c, d]`: a 2-D
//! array silently flattened. sheaf's array arguments are lists; this type
//! keeps the array's dimension count so the function can refuse more than one.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::datum::FromDatum;
use pgrx::nullable::Nullable;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};

use crate::base::args::no_nulls;
use crate::base::errors::bad_argument;

pub struct List<T> {
    ndim: i32,
    items: Vec<Option<T>>,
}

impl<T> List<T> {
    /// The elements, none of which may be NULL; refuses an array of more
    /// than one dimension, naming `arg`.
    pub fn into_items(self, arg: &str) -> Vec<T> {
        if self.ndim > 1 {
            bad_argument(
                arg,
                format!("must be a one-dimensional array, got {} dimensions", self.ndim),
            );
        }
        no_nulls(self.items, arg)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<T> FromDatum for List<T>
where
    Vec<Option<T>>: FromDatum,
{
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        typoid: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null || datum.is_null() {
            return None;
        }
        let raw = datum.cast_mut_ptr::<pg_sys::varlena>();
        // SAFETY: a non-null array datum points at a varlena; detoasted it is
        // an ArrayType whose header holds the dimension count.
        let ndim = unsafe {
            let flat = pg_sys::pg_detoast_datum(raw);
            let ndim = (*flat.cast::<pg_sys::ArrayType>()).ndim;
            if flat != raw {
                pg_sys::pfree(flat.cast());
            }
            ndim
        };
        // SAFETY: the same datum, read by pgrx's own array conversion.
        let items = unsafe { Vec::<Option<T>>::from_polymorphic_datum(datum, false, typoid) }?;
        Some(List { ndim, items })
    }
}

// SAFETY: the argument is an array datum of T (the SQL signature says so).
unsafe impl<'fcx, T> ArgAbi<'fcx> for List<T>
where
    Vec<Option<T>>: FromDatum,
{
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

// SAFETY: the same SQL type as the `Vec` pgrx would map it to.
unsafe impl<T> SqlTranslatable for List<T>
where
    Vec<Option<T>>: SqlTranslatable,
{
    const TYPE_IDENT: &'static str = <Vec<Option<T>> as SqlTranslatable>::TYPE_IDENT;
    const TYPE_ORIGIN: TypeOrigin = <Vec<Option<T>> as SqlTranslatable>::TYPE_ORIGIN;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> =
        <Vec<Option<T>> as SqlTranslatable>::ARGUMENT_SQL;
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = <Vec<Option<T>> as SqlTranslatable>::RETURN_SQL;
}
