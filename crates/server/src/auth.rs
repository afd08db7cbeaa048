//! Bearer API keys mapped to subjects. With no keys configured the server serves loopback
//! clients only and every request acts as subject `local`.

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
        if state.keys.is_empty() {
            return Ok(Self(crate::config::subject("local")));
        }
        let unauthorized = |message: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
        let header = parts
            .headers
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
