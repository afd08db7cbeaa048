//! Errors over HTTP: every failure is a `RequestErrorResponse` body
//! (`{"error": {"message", "type", "code", "param"}}`) with the status the SDK expects.

use agentry_memory::StoreError;
use agentry_runner::RunnerError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answer: a status and the SDK's `RequestErrorResponse` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// A stable machine-readable code (`not_found`, `turn_running`, …).
    pub code: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: BodyError<'a>,
}

#[derive(Serialize)]
struct BodyError<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    param: Option<&'a str>,
}

impl ApiError {
    /// An error with a status, a code and a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), code, param: None }
    }

    /// 400: the request is malformed or breaks a rule.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 400 naming the parameter at fault.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        Self { param: Some(param.to_owned()), ..Self::bad_request(message) }
    }

    /// 404: no such thing (or not visible to the caller).
    pub fn not_found(kind: &str, id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("{kind} {} not found", quoted_id(id)))
    }

    /// 412: the request cannot be served in the current state.
    pub fn precondition(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::PRECONDITION_FAILED, code, message)
    }

    /// 500 with a message that leaks nothing internal beyond what failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    /// The `type` field: the status class, as OpenAI-style error bodies carry it.
    const fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            409 | 412 => "conflict_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: BodyError {
                message: &self.message,
                kind: self.kind(),
                code: self.code,
                param: self.param.as_deref(),
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 9110: a 401 names the scheme the client must use.
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<RunnerError> for ApiError {
    fn from(error: RunnerError) -> Self {
        match error {
            // The store calls turns runs; the API calls them turns.
            RunnerError::NotFound { kind, id } => {
                Self::not_found(if kind == "run" { "turn" } else { kind }, &id)
            }
            RunnerError::TurnRunning { .. } | RunnerError::TurnResumed { .. } => {
                Self::precondition("turn_running", error.to_string())
            }
            RunnerError::TurnExists { .. } => {
                Self::new(StatusCode::CONFLICT, "turn_exists", error.to_string())
            }
            RunnerError::SessionCancelled { .. } => {
                Self::precondition("session_cancelled", error.to_string())
            }
            RunnerError::InvalidInput(message) => Self::bad_param("input", message),
            RunnerError::NotLatestTurn { .. } => Self::bad_param("previous_turn_id", error.to_string()),
            RunnerError::HandedOver => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", error.to_string())
            }
            RunnerError::Store(store) => store.into(),
            other => {
                tracing::error!(error = %other, "request failed");
                Self::internal(other.to_string())
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound { kind, id } => Self::not_found(kind, &id),
            StoreError::InvalidInput(message) => Self::bad_request(message),
            StoreError::TooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", error.to_string())
            }
            StoreError::Conflict(_) => Self::new(StatusCode::CONFLICT, "conflict", error.to_string()),
            other => {
                tracing::error!(error = %other, "storage failed");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_unavailable",
                    "the store failed; try again",
                )
            }
        }
    }
}

/// A handler result.
pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// The longest id an error message repeats whole; a longer one (no id is that long) is
/// cut, so a client that sends megabytes in a path does not get them back.
const MAX_ECHOED_ID: usize = 80;

/// `id` as an error message repeats it: whole when short, else its start and its length.
pub(crate) fn quoted_id(id: &str) -> std::borrow::Cow<'_, str> {
    if id.len() <= MAX_ECHOED_ID {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut end = MAX_ECHOED_ID;
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}… ({} bytes)", &id[..end], id.len()))
}
