//! TLS to shards. A connection string with `sslmode=require` (or libpq's
//! `verify-ca` and `verify-full`) connects over TLS (rustls), the server's
//! certificate always verified, hostname included: against `sslrootcert`
//! (a PEM file named in the connection string, else in
//! `SHEAF_SSL_ROOT_CERT`), else against the system's roots. Without
//! `sslmode`, or with `disable` or `prefer`, a connection is plain, as
//! before: tokio-postgres' `prefer` would try TLS on a server that offers it
//! and fail on a certificate it cannot verify, where libpq falls back.
//!
//! Every connection a client opens goes through [`shard_config`]: the
//! pools, the listeners, the status probes, cancel requests and
//! `Client::from_env`'s first look.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a client connects to one shard.
pub(crate) type Tls = MakeRustlsConnect;

/// The variable naming a PEM file of root certificates for every shard
/// whose connection string names none.
pub const ROOT_CERT_VAR: &str = "SHEAF_SSL_ROOT_CERT";

/// The two settings sheaf reads itself (tokio-postgres refuses the first
/// and knows only `disable`, `prefer` and `require` of the second).
#[derive(Debug, Default, PartialEq, Eq)]
struct Extracted {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// `url` without `sslrootcert` and with `sslmode` taken out, and what they
/// said. Both forms: `postgres://...?k=v&...` and `k=v k=v ...`.
fn extract(url: &str) -> (String, Extracted) {
    let mut out = Extracted::default();
    let mut take = |k: &str, v: &str| -> bool {
        match k {
            "sslmode" => out.sslmode = Some(v.to_owned()),
            "sslrootcert" => out.sslrootcert = Some(v.to_owned()),
            _ => return false,
        }
        true
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), out);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                !take(k, &percent_decode(v))
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (rest, out)
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                !take(k.trim(), v.trim_matches('\''))
            })
            .collect();
        (kept.join(" "), out)
    }
}

/// `%XX` sequences decoded (a path in a URL's query).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The roots a TLS connection verifies the server against.
fn roots(file: Option<&str>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert {path}: {e}"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("sslrootcert {path}: {e}"))?;
            if certs.is_empty() {
                return Err(format!("sslrootcert {path}: no certificate in it"));
            }
            for cert in certs {
                store.add(cert).map_err(|e| format!("sslrootcert {path}: {e}"))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = store.add(cert);
            }
            if store.is_empty() {
                return Err(format!(
                    "sslmode asks for TLS but the system has no root certificates: name a PEM file with \
                     sslrootcert=... or {ROOT_CERT_VAR}"
                ));
            }
        }
    }
    Ok(store)
}

fn connector(roots: RootCertStore) -> Result<Tls, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// A shard's connection string as tokio-postgres takes it, and the
/// connector to use with it. Errors never repeat the connection string.
pub(crate) fn shard_config(url: &str) -> Result<(tokio_postgres::Config, Tls), String> {
    let (rest, extracted) = extract(url);
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e: tokio_postgres::Error| format!("bad connection string: {e}"))?;
    let tls_required = match extracted.sslmode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => false,
        Some("require" | "verify-ca" | "verify-full") => true,
        Some(other) => {
            let shown: String = other.chars().take(32).collect();
            return Err(format!(
                "bad connection string: sslmode {shown:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ));
        }
    };
    if !tls_required {
        config.ssl_mode(SslMode::Disable);
        return Ok((config, connector(RootCertStore::empty())?));
    }
    config.ssl_mode(SslMode::Require);
    let file = extracted
        .sslrootcert
        .or_else(|| std::env::var(ROOT_CERT_VAR).ok());
    Ok((config, connector(roots(file.as_deref())?)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sheafs_own_settings_are_taken_out_of_both_forms() {
        let (rest, x) = extract(
            "postgres://u:p@h:5/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=a",
        );
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=a");
        assert_eq!(x.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(x.sslrootcert.as_deref(), Some("/tmp/ca.pem"));
        let (rest, x) = extract("host=h port=5 sslmode=require sslrootcert='/tmp/ca.pem' user=u");
        assert_eq!(rest, "host=h port=5 user=u");
        assert_eq!(x.sslrootcert.as_deref(), Some("/tmp/ca.pem"));
        let (rest, x) = extract("postgres://h/db");
        assert_eq!((rest.as_str(), x), ("postgres://h/db", Extracted::default()));
    }

    #[test]
    fn without_sslmode_a_connection_is_plain_and_a_bad_one_is_refused_unechoed() {
        let (config, _) = shard_config("postgres://u@127.0.0.1:5/db").unwrap();
        assert_eq!(config.get_ssl_mode(), SslMode::Disable);
        let e = shard_config("postgres://u:secret@h/db?sslmode=sometimes")
            .err()
            .unwrap();
        assert!(e.contains("sometimes") && !e.contains("secret"), "{e}");
        let e = shard_config("postgres://u:secret@h/db?sslmode=require&sslrootcert=/nonexistent.pem")
            .err()
            .unwrap();
        assert!(e.contains("/nonexistent.pem") && !e.contains("secret"), "{e}");
    }
}
