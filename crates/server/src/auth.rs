//! Bearer API keys mapped to subjects. With no keys configured the server serves loopback
//! clients only and every request acts as subject `local`; a request a web page makes
//! (its `Origin` not a loopback one) or one that names another host (DNS rebinding) is
//! refused, so a site open in the local browser cannot drive the agents.

use std::collections::HashMap;
use std::sync::Arc;

use agentry_memory::SessionQuery;
use agentry_runner::Session;
use agentry_types::{SessionId, Subject};
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use crate::AppState;
use crate::error::{ApiError, ApiResult};

/// The configured keys.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    by_key: HashMap<String, Subject>,
}

impl Keys {
    pub(crate) fn new(keys: Vec<(String, Subject)>) -> Self {
        Self { by_key: keys.into_iter().collect() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The subject of a presented key. Every stored key is compared, so the time taken
    /// does not depend on which key matched or how much of it did.
    fn subject(&self, presented: &str) -> Option<&Subject> {
        let mut found = None;
        for (key, subject) in &self.by_key {
            if constant_time_eq(key.as_bytes(), presented.as_bytes()) {
                found = Some(subject);
            }
        }
        found
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The subject a request acts as.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) Subject);

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        Self::of(&parts.headers, state)
    }
}

impl Caller {
    /// The caller a request's headers name: `local` without keys, else the subject of the
    /// `Authorization: Bearer` key. Errors: 401, saying what is missing or wrong.
    pub(crate) fn of(headers: &axum::http::HeaderMap, state: &AppState) -> Result<Self, ApiError> {
        if state.keys.is_empty() {
            return Ok(Self(crate::config::subject("local")));
        }
        let unauthorized = |message: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
        let header = headers
            .get(AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing API key: send `Authorization: Bearer <key>`"))?;
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let presented = header
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key.trim())
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <key>`"))?;
        state.keys.subject(presented).cloned().map(Self).ok_or_else(|| unauthorized("invalid API key"))
    }
}

/// Middleware for every route: without keys, [`check_local`].
pub(crate) async fn local_only(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if state.keys.is_empty() {
        let (parts, body) = request.into_parts();
        if let Err(error) = check_local(&parts) {
            return axum::response::IntoResponse::into_response(error);
        }
        return next.run(axum::extract::Request::from_parts(parts, body)).await;
    }
    next.run(request).await
}

/// Without keys, only loopback clients are served, and a browser on this machine is one:
/// a page of another site may send it requests (a form's plain-text POST needs no CORS
/// preflight), or reach it under its own name after a DNS rebinding. Such requests carry
/// a foreign `Origin` or `Host`, and are refused.
fn check_local(parts: &Parts) -> ApiResult<()> {
    let forbidden = |what: String| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "without API keys this server serves local clients only, and {what}; configure API keys to serve \
                 other clients"
            ),
        )
    };
    if let Some(host) = parts.headers.get(axum::http::header::HOST) {
        let host = host.to_str().unwrap_or_default();
        if !is_loopback_authority(host) {
            return Err(forbidden(format!("this request names the host {host:?}")));
        }
    }
    if let Some(origin) = parts.headers.get(axum::http::header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        let authority = origin.split_once("://").map(|(_, rest)| rest.trim_end_matches('/'));
        if !authority.is_some_and(is_loopback_authority) {
            return Err(forbidden(format!("this request comes from a web page of {origin:?}")));
        }
    }
    Ok(())
}

/// Whether `host[:port]` names this machine: `localhost` (or a name under it), a
/// 127.0.0.0/8 address or `[::1]`.
fn is_loopback_authority(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    let host = host.to_ascii_lowercase();
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|address| address.is_loopback())
}

impl Caller {
    /// A session the caller owns; any other (another subject's, unknown, malformed id) is
    /// not found.
    pub(crate) async fn session(&self, state: &AppState, id: &str) -> ApiResult<Session> {
        let not_found = || ApiError::not_found("session", id);
        let session_id: SessionId = id.parse().map_err(|_| not_found())?;
        let session = state.runtime.get_session(session_id).await.map_err(ApiError::from)?;
        if session.record().owner.subject_id != self.0.subject_id {
            return Err(not_found());
        }
        Ok(session)
    }

    /// The filter that keeps listings to the caller's sessions.
    pub(crate) fn sessions(&self) -> SessionQuery {
        SessionQuery { owner: Some(self.0.subject_id.clone()), ..SessionQuery::default() }
    }
}
