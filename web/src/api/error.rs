//! The API's errors: `{"error": {"code", "sqlstate", "message"}}`, the code
//! named after the SQLSTATE as docs/reference/errors.md lists it, with the
//! HTTP status that fits. A message never names a shard or a connection
//! string: a shard that could not serve a call is a 503 that says so.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sheaf_driver::ClientError;
use utoipa::ToSchema;

/// The body of every refusal.
#[derive(Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

/// What was refused and why.
#[derive(Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// The SQLSTATE's name (`invalid_parameter_value`, `no_data_found`,
    /// …), or the API's own (`unauthorized`, `forbidden`,
    /// `shard_unavailable`, `too_many_requests`).
    code: &'static str,
    /// The SQLSTATE, when the refusal has one.
    sqlstate: Option<&'static str>,
    /// What was wrong, naming the parameter when one was.
    message: String,
}

/// A refusal, ready to send.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    sqlstate: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, sqlstate: Option<&'static str>, message: String) -> Self {
        ApiError {
            status,
            code,
            sqlstate,
            message,
        }
    }

    /// A parameter (query, path or body field) that is malformed or out of
    /// range: 400 naming it.
    pub(crate) fn bad(parameter: &str, why: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_parameter_value",
            Some("22023"),
            format!("{parameter}: {why}"),
        )
    }

    /// No such thing: 404.
    pub(crate) fn not_found(message: String) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "no_data_found", Some("P0002"), message)
    }

    /// No token, or one that is not configured: 401.
    pub(crate) fn unauthorized(message: &str) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", None, message.to_owned())
    }

    /// A token whose scope does not cover the call: 403.
    pub(crate) fn forbidden(message: &str) -> Self {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            Some("42501"),
            message.to_owned(),
        )
    }

    /// An expensive report asked for too often: 429.
    pub(crate) fn too_many(message: &str) -> Self {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            None,
            message.to_owned(),
        )
    }

    /// Shards that could not answer: 503, retry later (never which ones).
    pub(crate) fn unavailable(message: &str) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shard_unavailable",
            None,
            message.to_owned(),
        )
    }

    /// A conflict the caller resolves by choosing: 409.
    pub(crate) fn conflict(message: String) -> Self {
        ApiError::new(
            StatusCode::CONFLICT,
            "object_not_in_prerequisite_state",
            Some("55000"),
            message,
        )
    }
}

impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> Self {
        use ClientError as E;
        let refused =
            |status, code, sqlstate, message: String| ApiError::new(status, code, Some(sqlstate), message);
        match e {
            E::InvalidArgument { message, .. } => refused(
                StatusCode::BAD_REQUEST,
                "invalid_parameter_value",
                "22023",
                message,
            ),
            E::BadRequest(message) => refused(
                StatusCode::BAD_REQUEST,
                "invalid_parameter_value",
                "22023",
                message,
            ),
            E::Route(route) => refused(
                StatusCode::BAD_REQUEST,
                "invalid_parameter_value",
                "22023",
                route.to_string(),
            ),
            E::UnknownExecution { message, .. }
            | E::UnknownTask { message, .. }
            | E::UnknownQueue { message, .. }
            | E::UnknownSchedule { message, .. } => ApiError::not_found(message),
            E::WrongState { message, .. } => refused(
                StatusCode::CONFLICT,
                "object_not_in_prerequisite_state",
                "55000",
                message,
            ),
            E::QuotaExceeded { message, .. } => refused(
                StatusCode::CONFLICT,
                "configuration_limit_exceeded",
                "53400",
                message,
            ),
            E::GateRejected { message, .. } => {
                refused(StatusCode::CONFLICT, "object_in_use", "55006", message)
            }
            E::StaleToken { message, .. } => {
                refused(StatusCode::CONFLICT, "lock_not_available", "55P03", message)
            }
            E::TaskCancelled { message, .. } => {
                refused(StatusCode::CONFLICT, "operator_intervention", "57000", message)
            }
            E::Misplaced { message, .. } => {
                refused(StatusCode::CONFLICT, "check_violation", "23514", message)
            }
            E::Conflict { .. } => refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "serialization_failure",
                "40001",
                "every attempt hit a transient conflict; nothing changed, retry later".to_owned(),
            ),
            E::Database {
                code: Some(code),
                message,
                ..
            } => database(&code, message),
            E::TopologyMismatch { .. } => ApiError::unavailable(
                "this server's topology is not the one the fleet published (sheaf topology diff)",
            ),
            E::Shard { .. } | E::NoShardAvailable { .. } | E::Moved { .. } | E::TooManyForwards { .. } => {
                ApiError::unavailable("a shard could not serve the call now; retry later")
            }
            E::MissingRole { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "insufficient_privilege",
                Some("42501"),
                "this server's database role lacks a grant the call needs (see its log)".to_owned(),
            ),
            other => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                None,
                other.to_string(),
            ),
        }
    }
}

/// A SQLSTATE the driver has no variant for, by docs/reference/errors.md.
fn database(code: &str, message: String) -> ApiError {
    let known = match code {
        "54000" => Some((StatusCode::PAYLOAD_TOO_LARGE, "program_limit_exceeded", "54000")),
        "22004" => Some((StatusCode::BAD_REQUEST, "null_value_not_allowed", "22004")),
        "0A000" => Some((
            StatusCode::INTERNAL_SERVER_ERROR,
            "feature_not_supported",
            "0A000",
        )),
        "42501" => Some((StatusCode::SERVICE_UNAVAILABLE, "insufficient_privilege", "42501")),
        "XX000" => Some((StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "XX000")),
        _ => None,
    };
    match known {
        Some((status, name, sqlstate)) => ApiError::new(status, name, Some(sqlstate), message),
        None => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            None,
            format!("SQLSTATE {code}: {message}"),
        ),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                sqlstate: self.sqlstate,
                message: self.message,
            },
        };
        (
            self.status,
            [(axum::http::header::CACHE_CONTROL, "no-store")],
            Json(body),
        )
            .into_response()
    }
}
