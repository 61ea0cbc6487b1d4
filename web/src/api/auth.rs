//! Bearer tokens with a scope: `read` reads, `act` also changes things.
//! Without a token configured the API refuses every call: it is never open
//! by default.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use super::ApiState;
use super::error::ApiError;
use crate::dashboard::same;

/// The tokens the API accepts, by scope.
#[derive(Clone, Default)]
pub(crate) struct Tokens {
    read: Vec<String>,
    act: Vec<String>,
}

/// What a token may do; `Act` implies `Read`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Scope {
    Read,
    Act,
}

impl Tokens {
    pub(crate) fn new(read: Vec<String>, act: Vec<String>) -> Tokens {
        Tokens { read, act }
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.read.is_empty() || !self.act.is_empty()
    }

    /// The scope `headers` carry a token for; every configured token is
    /// compared, in constant time, so the time taken says nothing of
    /// which one (nearly) matched.
    fn scope(&self, headers: &axum::http::HeaderMap) -> Result<Scope, ApiError> {
        if !self.enabled() {
            return Err(ApiError::unauthorized(
                "the API is off: no token is configured (SHEAF_API_READ_TOKENS, SHEAF_API_ACT_TOKENS)",
            ));
        }
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| ApiError::unauthorized("an Authorization: Bearer <token> header is required"))?;
        let act = self.act.iter().fold(false, |m, t| m | same(t, given));
        let read = self.read.iter().fold(false, |m, t| m | same(t, given));
        match (act, read) {
            (true, _) => Ok(Scope::Act),
            (false, true) => Ok(Scope::Read),
            (false, false) => Err(ApiError::unauthorized("that token is not accepted")),
        }
    }
}

/// A caller allowed to read (any accepted token); `act` when its token
/// may also act.
pub(crate) struct Read {
    pub(crate) act: bool,
}

/// A caller allowed to act (a token of the act scope).
pub(crate) struct Act;

impl FromRequestParts<Arc<ApiState>> for Read {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<ApiState>) -> Result<Self, ApiError> {
        state
            .tokens
            .scope(&parts.headers)
            .map(|s| Read { act: s == Scope::Act })
    }
}

impl FromRequestParts<Arc<ApiState>> for Act {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<ApiState>) -> Result<Self, ApiError> {
        match state.tokens.scope(&parts.headers)? {
            Scope::Act => Ok(Act),
            Scope::Read => Err(ApiError::forbidden("this call needs a token of the act scope")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("a header value"),
        );
        h
    }

    #[test]
    fn a_token_has_the_scope_it_was_configured_with() {
        let tokens = Tokens::new(vec!["r".repeat(16)], vec!["a".repeat(16)]);
        assert_eq!(tokens.scope(&bearer(&"r".repeat(16))).ok(), Some(Scope::Read));
        assert_eq!(tokens.scope(&bearer(&"a".repeat(16))).ok(), Some(Scope::Act));
        assert!(tokens.scope(&bearer(&"a".repeat(15))).is_err());
        assert!(tokens.scope(&axum::http::HeaderMap::new()).is_err());
        assert!(
            Tokens::default().scope(&bearer("")).is_err(),
            "no token configured: closed"
        );
    }
}
