//! Checks of the SQL surface as the catalog shows it: the conventions every
//! function of schema `sheaf` follows (docs/reference/sql/README.md).

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// No parameter name is a reserved, type-name or function-name SQL
    /// keyword (`pg_get_keywords()` catcodes R, T, C): such names need
    /// quoting in named-argument calls. Unreserved keywords (`name`, `key`)
    /// are fine.
    #[pg_test]
    fn no_parameter_name_is_a_reserved_keyword() {
        let offenders = Spi::get_one::<String>(
            "SELECT string_agg(p.proname || '(' || a.name || ': ' || k.catdesc || ')', ', ' ORDER BY 1) \
             FROM pg_proc p \
             CROSS JOIN LATERAL unnest(p.proargnames) AS a(name) \
             JOIN pg_get_keywords() k ON k.word = a.name AND k.catcode IN ('R', 'T', 'C') \
             WHERE p.pronamespace = 'sheaf'::regnamespace",
        )
        .expect("the catalog query runs");
        assert_eq!(offenders, None, "parameter names that are SQL keywords");
    }

    /// The check above would see a keyword: a function of our own with one
    /// as a parameter name is reported.
    #[pg_test]
    fn the_keyword_check_sees_a_keyword() {
        Spi::run("CREATE FUNCTION sheaf.probe(\"limit\" int) RETURNS int LANGUAGE sql AS 'SELECT 1'")
            .expect("create a probe function");
        let found = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc p CROSS JOIN LATERAL unnest(p.proargnames) AS a(name) \
             JOIN pg_get_keywords() k ON k.word = a.name AND k.catcode IN ('R', 'T', 'C') \
             WHERE p.pronamespace = 'sheaf'::regnamespace",
        )
        .expect("the catalog query runs");
        assert_eq!(found, Some(1));
    }

    /// Every function pins its search_path; every one that may read a table
    /// (all but the immutable ones) runs as SECURITY DEFINER, so the roles
    /// need no table rights; none with arguments is STRICT (a NULL argument
    /// is refused with 22004, never turned into a NULL result).
    #[pg_test]
    fn every_function_pins_its_search_path_and_is_not_strict() {
        let offenders = Spi::get_one::<String>(
            "SELECT string_agg(proname, ', ' ORDER BY proname) FROM pg_proc \
             WHERE pronamespace = 'sheaf'::regnamespace AND prokind = 'f' \
               AND ((proisstrict AND pronargs > 0) OR (NOT prosecdef AND provolatile <> 'i') \
                    OR NOT coalesce(proconfig::text LIKE '%search_path=%', false)) \
               AND prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')",
        )
        .expect("the catalog query runs");
        assert_eq!(offenders, None, "functions that break the conventions");
    }
}
