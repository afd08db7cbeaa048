//! The harness routes under `/v1/agents/sessions`, exactly as `truefoundry-gateway-sdk`
//! 0.4.2 calls them (`private/agents/sessions/raw_client.py`).

use std::collections::HashMap;
use std::sync::Arc;

use agentry_events::EventEnvelope;
use agentry_events::render::harness::{self, HarnessEvent};
use agentry_memory::{Order, PageRequest};
use agentry_runner::{PreviousTurn, Session, TurnHandle, TurnRequest};
use agentry_types::{RunRecord, SessionRecord, Timestamp, TurnId, TurnInputItem};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::sse::{self, Frame};

type AppStateRef = State<Arc<AppState>>;

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/agents/sessions", post(create_session).get(list_sessions))
        .route("/v1/agents/sessions/{session_id}", get(get_session).delete(delete_session))
        .route("/v1/agents/sessions/{session_id}/cancel", post(cancel_session))
        .route("/v1/agents/sessions/{session_id}/turns", post(create_turn).get(list_turns))
        .route("/v1/agents/sessions/{session_id}/turns/{turn_id}", get(get_turn))
        .route("/v1/agents/sessions/{session_id}/turns/{turn_id}/subscribe", post(subscribe))
        .route("/v1/agents/sessions/{session_id}/turns/{turn_id}/events", get(list_turn_events))
        .route("/v1/agents/sessions/{session_id}/events", get(list_session_events))
        .route("/v1/agents/turns/{turn_id}", get(find_turn))
}

/// Whether a body failed because it stopped arriving (`limits.body_timeout_secs`).
fn stalled(failed: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(failed);
    while let Some(error) = cause {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// A JSON request body: a malformed or mistyped body is a 400 in the SDK's error shape
/// naming what is wrong, an oversize one a 413, one that stalls a 408. An empty body is `{}`.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| match rejection {
            BytesRejection::FailedToBufferBody(failed)
                if failed.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    "the request body is larger than the server takes (its limits.body_bytes)",
                )
            }
            BytesRejection::FailedToBufferBody(failed) if stalled(&failed) => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body stopped arriving: no data came within limits.body_timeout_secs",
            ),
            other => ApiError::bad_request(format!("cannot read the request body: {other}")),
        })?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
        // Every body is an object: an array would otherwise be taken as its fields in
        // order (serde reads a struct from either).
        if text.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'[') {
            return Err(ApiError::bad_request("the request body is a JSON array; it must be a JSON object"));
        }
        let mut json = serde_json::Deserializer::from_slice(text);
        let value = serde_path_to_error::deserialize(&mut json).map_err(|error| {
            // The field at fault, when the error is inside one (`input[0].content`).
            let mut path = error.path().to_string();
            let inner = error.into_inner();
            if path.is_empty() || path == "." || path == "?" {
                path.clear();
            }
            // Text that is not JSON (cut short, or broken) is no field's fault. (serde_json
            // also counts a number out of range and nesting past 128 levels here.)
            if matches!(
                inner.classify(),
                serde_json::error::Category::Eof | serde_json::error::Category::Syntax
            ) {
                return ApiError::bad_request(format!("the request body is not valid JSON: {inner}"));
            }
            // A missing field is reported at its parent: the field itself is at fault.
            let message = inner.to_string();
            if let Some(field) =
                message.strip_prefix("missing field `").and_then(|rest| rest.split('`').next())
            {
                path = if path.is_empty() { field.to_owned() } else { format!("{path}.{field}") };
                return ApiError::bad_param(
                    &path,
                    format!("the request body has no `{path}`, which is required"),
                );
            }
            if path.is_empty() {
                ApiError::bad_request(format!("the request body is invalid: {inner}"))
            } else {
                ApiError::bad_param(&path, format!("the request body's `{path}` is invalid: {inner}"))
            }
        })?;
        json.end()
            .map_err(|error| ApiError::bad_request(format!("the request body is not valid JSON: {error}")))?;
        Ok(Self(value))
    }
}

/// Query parameters as strings, parsed field by field for precise errors.
pub(crate) struct Params(pub(crate) HashMap<String, String>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let Query(map) = Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|error| ApiError::bad_request(format!("invalid query string: {error}")))?;
        Ok(Self(map))
    }
}

impl Params {
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str).filter(|value| !value.is_empty())
    }

    /// An integer within `1..=max`, or `default`.
    fn limit(&self, default: usize, max: usize) -> ApiResult<usize> {
        match self.text("limit") {
            None => Ok(default),
            Some(text) => match text.parse::<usize>() {
                Ok(limit) if (1..=max).contains(&limit) => Ok(limit),
                _ => Err(ApiError::bad_param(
                    "limit",
                    format!("limit must be an integer from 1 to {max}, not {text:?}"),
                )),
            },
        }
    }

    /// `asc` or `desc`, in any case.
    fn order(&self, default: Order) -> ApiResult<Order> {
        match self.text("order") {
            None => Ok(default),
            Some(order) if order.eq_ignore_ascii_case("asc") => Ok(Order::Asc),
            Some(order) if order.eq_ignore_ascii_case("desc") => Ok(Order::Desc),
            Some(other) => {
                Err(ApiError::bad_param("order", format!("order must be `asc` or `desc`, not {other:?}")))
            }
        }
    }

    /// An ISO-8601 date or date-time: RFC 3339, or without seconds, or without an offset
    /// (UTC), or with an offset written `+hhmm`, or a date alone (its midnight, UTC).
    fn timestamp(&self, name: &str) -> ApiResult<Option<Timestamp>> {
        self.text(name)
            .map(|text| {
                let full = full_rfc3339(text);
                full.parse::<Timestamp>().map_err(|_| {
                    // A `+` sent as is in a query string reads as a space.
                    let hint =
                        if text.contains(' ') { " (a `+` in a query string is sent as %2B)" } else { "" };
                    ApiError::bad_param(
                        name,
                        format!(
                            "{name} must be an ISO-8601 date or date-time (2026-11-26, 2026-11-26T18:00, \
                             2026-11-26T18:00:00+01:00; UTC without an offset), not {text:?}{hint}"
                        ),
                    )
                })
            })
            .transpose()
    }
}

/// A session's latest turn, if it has one.
pub(crate) async fn latest_turn(session: &Session) -> ApiResult<Option<TurnHandle>> {
    Ok(session.list_turns(Order::Desc, &PageRequest::first(1)).await?.items.into_iter().next())
}

/// `Session`.
fn session_json(record: &SessionRecord) -> Value {
    json!({
        "type": "session",
        "id": record.id.to_string(),
        "agent_name": record.name,
        "title": record.title,
        "created_by_subject": record.owner,
        "created_at": record.created_at.to_rfc3339(),
        "updated_at": record.updated_at.to_rfc3339(),
    })
}

/// `TokenPagination`.
fn pagination(next: Option<String>, limit: usize) -> Value {
    json!({"next_page_token": next, "limit": limit})
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSession {
    agent_name: String,
    #[serde(default)]
    title: Option<String>,
}

async fn create_session(
    State(state): AppStateRef,
    caller: Caller,
    JsonBody(body): JsonBody<CreateSession>,
) -> ApiResult<Response> {
    if body.agent_name.trim().is_empty() {
        return Err(ApiError::bad_param("agent_name", "agent_name must not be empty"));
    }
    if let Some(title) = &body.title {
        check_title("title", title)?;
    }
    let session = state.runtime.create_session_as(caller.0, &body.agent_name, body.title.as_deref()).await?;
    Ok(Json(json!({"data": session_json(session.record())})).into_response())
}

/// The most characters a session's title may have (an AG-UI thread id becomes its
/// session's title): every listing of sessions repeats it.
pub(crate) const MAX_TITLE_CHARS: usize = 1000;

/// Refuses a title (named `param`) longer than [`MAX_TITLE_CHARS`].
pub(crate) fn check_title(param: &str, title: &str) -> ApiResult<()> {
    let chars = title.chars().count();
    if chars > MAX_TITLE_CHARS {
        return Err(ApiError::bad_param(
            param,
            format!("{param} has {chars} characters; at most {MAX_TITLE_CHARS} are accepted"),
        ));
    }
    Ok(())
}

async fn list_sessions(State(state): AppStateRef, caller: Caller, params: Params) -> ApiResult<Response> {
    let agent_name = params
        .text("agent_name")
        .ok_or_else(|| ApiError::bad_param("agent_name", "agent_name is required"))?
        .to_owned();
    if state.runtime.agent(&agent_name).is_none() {
        return Err(ApiError::not_found("agent", &agent_name));
    }
    let limit = params.limit(10, 100)?;
    let mut filter = caller.sessions();
    filter.name = Some(agent_name);
    filter.oldest_first = params.order(Order::Desc)? == Order::Asc;
    filter.created_from = params.timestamp("start_timestamp")?;
    filter.created_until = params.timestamp("end_timestamp")?;
    if let (Some(from), Some(until)) = (filter.created_from, filter.created_until)
        && from > until
    {
        return Err(ApiError::bad_param(
            "end_timestamp",
            format!("end_timestamp {until} is before start_timestamp {from}: no session could match"),
        ));
    }
    let page = PageRequest { token: params.text("page_token").map(str::to_owned), limit };
    let sessions = state
        .runtime
        .list_sessions(&filter, &page)
        .await
        .map_err(|error| token_error(error.into(), "page_token"))?;
    let data: Vec<Value> = sessions.items.iter().map(session_json).collect();
    Ok(Json(json!({"data": data, "pagination": pagination(sessions.next_token, limit)})).into_response())
}

/// A store's complaint about a page token is the caller's bad token.
fn token_error(error: ApiError, param: &str) -> ApiError {
    if error.status == StatusCode::BAD_REQUEST {
        // The store's wording, for the HTTP field names: "invalid page token \"x\": …".
        let detail = error.message.strip_prefix("invalid page token ").unwrap_or(&error.message);
        let detail = detail.replace("a page's next_token", "a response's next_page_token");
        ApiError::bad_param(param, format!("invalid {param} {detail}"))
    } else {
        error
    }
}

async fn get_session(
    State(state): AppStateRef,
    caller: Caller,
    Path(session_id): Path<String>,
) -> ApiResult<Response> {
    let session = caller.session(&state, &session_id).await?;
    Ok(Json(json!({"data": session_json(session.record())})).into_response())
}

/// `DELETE …/sessions/{id}` (not in the SDK): deletes the session with everything stored
/// for it; 412 `turn_running` while a turn of it runs (cancel it first), naming the turn,
/// or saying the session is busy while its lease is held for anything else.
async fn delete_session(
    State(state): AppStateRef,
    caller: Caller,
    Path(session_id): Path<String>,
) -> ApiResult<Response> {
    let session = caller.session(&state, &session_id).await?;
    match session.delete().await {
        Ok(()) => {
            Ok(Json(json!({"data": {"type": "session", "id": session.id().to_string(), "deleted": true}}))
                .into_response())
        }
        Err(agentry_runner::RunnerError::TurnRunning { .. }) => match running_turn(&session).await {
            Some(turn) => Err(ApiError::precondition(
                "turn_running",
                format!(
                    "session {} cannot be deleted while a turn of it runs (cancel it with POST …/cancel first; a \
                     cancel sent to another server on the store lands within 500 ms); the running turn: \
                     {turn}",
                    session.id()
                ),
            )),
            None => Err(busy(&state, &session, "the deletion").await),
        },
        Err(error) => Err(error.into()),
    }
}

/// `POST …/cancel`: cancels the session's running turn, if any (idempotent). The session
/// stays open: the next turn chains on the cancelled turn's history.
async fn cancel_session(
    State(state): AppStateRef,
    caller: Caller,
    Path(session_id): Path<String>,
) -> ApiResult<Response> {
    let session = caller.session(&state, &session_id).await?;
    if let Some(turn) = latest_turn(&session).await?
        && !turn.record().state.is_terminal()
    {
        turn.cancel().await?;
    }
    Ok(Json(json!({})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTurn {
    #[serde(default)]
    input: Option<Vec<TurnInputItem>>,
    #[serde(default)]
    previous_turn_id: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
}

/// The header naming a request so that a retry of it is recognised (the IETF
/// `Idempotency-Key` draft; `POST …/turns` takes it).
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response header telling a client that the turn it gets is one an earlier request
/// with the same `Idempotency-Key` created.
pub(crate) const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The longest `Idempotency-Key` taken, in bytes: with [`HARNESS_KEY_PREFIX`], within the
/// runtime's [`agentry_runner::MAX_IDEMPOTENCY_KEY`].
const MAX_KEY_BYTES: usize = 1000;
const _: () = assert!(MAX_KEY_BYTES + HARNESS_KEY_PREFIX.len() <= agentry_runner::MAX_IDEMPOTENCY_KEY);

/// A request's `Idempotency-Key`, checked: printable ASCII, not blank, at most
/// [`MAX_KEY_BYTES`]; prefixed, so that it names no AG-UI run's turn.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else { return Ok(None) };
    let bad = |message: String| ApiError::bad_param("Idempotency-Key", message);
    if values.next().is_some() {
        return Err(bad("the Idempotency-Key header is given more than once: send one".to_owned()));
    }
    let key = std::str::from_utf8(value.as_bytes())
        .ok()
        .filter(|text| text.bytes().all(|byte| (b' '..=b'~').contains(&byte)))
        .ok_or_else(|| bad("the Idempotency-Key header is not printable ASCII text".to_owned()))?
        .trim();
    if key.is_empty() {
        return Err(bad("the Idempotency-Key header is blank".to_owned()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(bad(format!(
            "the Idempotency-Key header is {} bytes long; at most {MAX_KEY_BYTES} are taken",
            key.len()
        )));
    }
    Ok(Some(format!("{HARNESS_KEY_PREFIX}{key}")))
}

/// What a harness request's key is prefixed with in the runtime's key space.
const HARNESS_KEY_PREFIX: &str = "harness:";

/// The turn an earlier request with this request's `Idempotency-Key` created, if it did,
/// after checking that the request is the same one: the same input, on the same previous
/// turn when it names one (400 otherwise, as a key may name one request only).
async fn replayed_turn(session: &Session, key: &str, body: &CreateTurn) -> ApiResult<Option<TurnHandle>> {
    let turn = match session.get_turn(agentry_runner::turn_id_for_key(session.id(), key)).await {
        Ok(turn) => turn,
        Err(agentry_runner::RunnerError::NotFound { .. }) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let record = turn.record();
    let same_previous = match body.previous_turn_id.as_deref() {
        None | Some("auto") => true,
        Some("none") => record.previous_turn_id.is_none(),
        Some(id) => match id.parse::<TurnId>() {
            Ok(id) => record.previous_turn_id == Some(id),
            // As for a first request: no turn has that id.
            Err(_) => return Err(ApiError::not_found("turn", id)),
        },
    };
    if record.input != body.input.as_deref().unwrap_or_default() || !same_previous {
        // 400, not the IETF draft's 422: the SDK's clients know 400 (BadRequestError).
        let mut error = ApiError::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_reused",
            format!(
                "the Idempotency-Key was used for another request of this session (turn {}), with other input \
                 or another previous turn: send a new key for a new request",
                record.id
            ),
        );
        error.param = Some("Idempotency-Key".to_owned());
        return Err(error);
    }
    Ok(Some(turn))
}

/// `POST …/sessions/{id}/turns`: creates a turn (streamed with `"stream": true`); a copy
/// of a request with an `Idempotency-Key` gets the turn the first one created.
async fn create_turn(
    State(state): AppStateRef,
    caller: Caller,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateTurn>,
) -> ApiResult<Response> {
    let session = caller.session(&state, &session_id).await?;
    let key = idempotency_key(&headers)?;
    // Taken before the turn is created: a stream refused after would leave a turn its
    // caller never heard of.
    let slot = body.stream.unwrap_or(false).then(|| state.streams.take(&caller.0.subject_id)).transpose()?;
    // A copy of a keyed request is answered with the turn the first one created before
    // the request's own checks: the session may have gone on since (`none` no longer
    // fits), or this server may lack the agent that ran it.
    if let Some(key) = &key
        && let Some(turn) = replayed_turn(&session, key, &body).await?
    {
        return Ok(respond_with_turn(&state, slot, &turn, true));
    }
    let previous_turn_id = match body.previous_turn_id.as_deref() {
        None | Some("auto") => PreviousTurn::Auto,
        Some("none") => {
            if latest_turn(&session).await?.is_some() {
                // A copy of a keyed first request whose turn was stored since the look-up
                // above gets that turn.
                if let Some(key) = &key
                    && let Some(turn) = replayed_turn(&session, key, &body).await?
                {
                    return Ok(respond_with_turn(&state, slot, &turn, true));
                }
                return Err(ApiError::bad_param(
                    "previous_turn_id",
                    "previous_turn_id `none` starts a conversation, but this session already has turns: \
                     use `auto` or the latest turn's id",
                ));
            }
            PreviousTurn::Auto
        }
        Some(id) => PreviousTurn::Turn(id.parse().map_err(|_| ApiError::not_found("turn", id))?),
    };
    let request = TurnRequest {
        input: body.input.clone().unwrap_or_default(),
        previous_turn_id,
        created_by: Some(caller.0),
        idempotency_key: key.clone(),
        ..TurnRequest::default()
    };
    match session.create_turn(request).await {
        Ok(turn) => {
            state.track(&turn);
            Ok(respond_with_turn(&state, slot, &turn, false))
        }
        Err(error) => {
            use agentry_runner::RunnerError::{TurnExists, TurnResumed, TurnRunning};
            // A copy sent at the same time as the first: stored by now, or still being
            // started (the session's lease taken, no turn yet: 412, and a retry under the
            // same key gets the turn).
            let copy = match (&key, &error) {
                (Some(key), TurnExists { .. } | TurnRunning { .. } | TurnResumed { .. }) => {
                    replayed_turn(&session, key, &body).await?
                }
                _ => None,
            };
            match copy {
                Some(turn) => Ok(respond_with_turn(&state, slot, &turn, true)),
                None if matches!(error, TurnRunning { .. }) => {
                    Err(naming_running_turn(&state, &session, error).await)
                }
                None => Err(error.into()),
            }
        }
    }
}

/// A created turn's answer: its events over SSE when a stream was asked for, else its
/// record; a replay (a copy of a keyed request) says so in `Idempotent-Replayed`.
fn respond_with_turn(
    state: &Arc<AppState>,
    slot: Option<sse::StreamSlot>,
    turn: &TurnHandle,
    replayed: bool,
) -> Response {
    let mut response = match slot {
        Some(slot) => stream_turn(state, slot, turn, None),
        None => Json(json!({"data": harness::turn(turn.record())})).into_response(),
    };
    if replayed {
        response.headers_mut().insert(IDEMPOTENT_REPLAYED, axum::http::HeaderValue::from_static("true"));
    }
    response
}

/// `TurnRunning`'s error, naming the running turn when the session's latest is running,
/// so that a client can subscribe to it; else [`busy`] (404 once the session is gone).
pub(crate) async fn naming_running_turn(
    state: &AppState,
    session: &Session,
    error: agentry_runner::RunnerError,
) -> ApiError {
    let mut api = ApiError::from(error);
    match running_turn(session).await {
        Some(turn) => api.message = format!("{}: {turn}", api.message),
        None => return busy(state, session, "the request").await,
    }
    api
}

/// 412 for a session whose lease is held with no turn running: a turn is being started,
/// or the session is being deleted (404 once it is) or a turn of it recovered.
async fn busy(state: &AppState, session: &Session, what: &str) -> ApiError {
    let id = session.id().to_string();
    if let Err(agentry_runner::RunnerError::NotFound { .. }) = state.runtime.get_session(session.id()).await {
        return ApiError::not_found("session", &id);
    }
    ApiError::precondition(
        "turn_running",
        format!(
            "session {id} is busy: a turn of it is being started or recovered, or the session is being \
             deleted; send {what} again shortly"
        ),
    )
}

/// The session's latest turn, when it is running (none when the read fails).
async fn running_turn(session: &Session) -> Option<TurnId> {
    let latest = latest_turn(session).await.ok()??;
    (!latest.record().state.is_terminal()).then(|| latest.id())
}

/// The SSE response of a turn's events after `after`.
fn stream_turn(
    state: &Arc<AppState>,
    slot: sse::StreamSlot,
    turn: &TurnHandle,
    after: Option<u64>,
) -> Response {
    let turn_id = turn.id();
    let frames = turn.stream(after).filter_map(move |event| async move {
        match event {
            Ok(event) => harness::render(&event).map(|rendered| Ok(frame(&event, &rendered))),
            Err(error) => {
                // The connection is aborted, not closed: the client takes the stream for
                // cut, reconnects with its last id and gets the rest.
                tracing::warn!(turn = %turn_id, %error, "a turn stream ended early");
                Some(Err(sse::Cut(format!("reading the turn's events failed: {error}"))))
            }
        }
    });
    sse::respond_or_cut(state, slot, frames)
}

fn frame(event: &EventEnvelope, rendered: &HarnessEvent) -> Frame {
    Frame { id: Some(event.seq.to_string()), data: serde_json::to_string(rendered).unwrap_or_default() }
}

async fn list_turns(
    State(state): AppStateRef,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> ApiResult<Response> {
    let session = caller.session(&state, &session_id).await?;
    let limit = params.limit(10, 25)?;
    // Not an SDK parameter (the SDK lists newest first), honoured like the other listings'.
    let order = params.order(Order::Desc)?;
    let page = PageRequest { token: params.text("page_token").map(str::to_owned), limit };
    let turns =
        session.list_turns(order, &page).await.map_err(|error| token_error(error.into(), "page_token"))?;
    let data: Vec<_> = turns.items.iter().map(|turn| harness::turn(turn.record())).collect();
    Ok(Json(json!({"data": data, "pagination": pagination(turns.next_token, limit)})).into_response())
}

/// A turn of a session the caller owns.
async fn owned_turn(
    state: &AppState,
    caller: &Caller,
    session_id: &str,
    turn_id: &str,
) -> ApiResult<TurnHandle> {
    let session = caller.session(state, session_id).await?;
    let id: TurnId = turn_id.parse().map_err(|_| ApiError::not_found("turn", turn_id))?;
    Ok(session.get_turn(id).await?)
}

async fn get_turn(
    State(state): AppStateRef,
    caller: Caller,
    Path((session_id, turn_id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let turn = owned_turn(&state, &caller, &session_id, &turn_id).await?;
    Ok(Json(json!({"data": harness::turn(turn.record())})).into_response())
}

/// `GET /v1/agents/turns/{turn_id}` (not in the SDK): a turn by id alone, for tools that
/// know a turn but not its session. Another subject's turn is not found.
async fn find_turn(
    State(state): AppStateRef,
    caller: Caller,
    Path(turn_id): Path<String>,
) -> ApiResult<Response> {
    let id: TurnId = turn_id.parse().map_err(|_| ApiError::not_found("turn", &turn_id))?;
    let turn = state.runtime.get_turn(id).await?;
    caller
        .session(&state, &turn.session_id().to_string())
        .await
        .map_err(|_| ApiError::not_found("turn", &turn_id))?;
    Ok(Json(json!({"data": harness::turn(turn.record())})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Subscribe {
    #[serde(default)]
    after_sequence_number: Option<u64>,
}

/// An ISO-8601 date or date-time in the RFC 3339 form the parser takes: a date alone is its
/// midnight UTC; a time without seconds gets `:00`; one without an offset is UTC; an offset
/// `+hhmm` becomes `+hh:mm`. Anything else is left for the parser to refuse.
fn full_rfc3339(text: &str) -> String {
    if text.len() == 10 && !text.contains(['T', 't', ' ']) {
        return format!("{text}T00:00:00Z");
    }
    let Some(at) = text.find(['T', 't', ' ']) else { return text.to_owned() };
    let (date, time) = (&text[..at], &text[at + 1..]);
    // The clock ends where the offset (`Z`, `+`, `-`) begins.
    let end = time.find(['Z', 'z', '+', '-']).unwrap_or(time.len());
    let (clock, offset) = time.split_at(end);
    let clock = if clock.len() == 5 { format!("{clock}:00") } else { clock.to_owned() };
    let offset = match offset {
        "" => "Z".to_owned(),
        compact if compact.len() == 5 && compact[1..].bytes().all(|byte| byte.is_ascii_digit()) => {
            format!("{}:{}", &compact[..3], &compact[3..])
        }
        other => other.to_owned(),
    };
    format!("{date}T{clock}{offset}")
}

/// `POST …/subscribe`: the turn's events after the cursor, live while it runs. The
/// `Last-Event-ID` header wins over `after_sequence_number`.
async fn subscribe(
    State(state): AppStateRef,
    caller: Caller,
    Path((session_id, turn_id)): Path<(String, String)>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Subscribe>,
) -> ApiResult<Response> {
    let header = crate::sse::last_event_id(&headers)
        .map(|text| {
            text.parse::<u64>().map_err(|_| {
                ApiError::bad_param("Last-Event-ID", "Last-Event-ID must be a sequence number (an integer)")
            })
        })
        .transpose()?;
    let turn = owned_turn(&state, &caller, &session_id, &turn_id).await?;
    let param = if header.is_some() { "Last-Event-ID" } else { "after_sequence_number" };
    let after = header.or(body.after_sequence_number);
    // A cursor past every number the turn has given out is not one this turn gave: most
    // likely another turn's. Said so, rather than answered with an empty stream that reads
    // as "nothing more". An ended turn's bound is its last stored event; a running turn's
    // is its high-water mark (deltas are numbered but not stored, and every number is at
    // most the mark stored before it was published).
    if let Some(after) = after {
        let store = state.runtime.store();
        if matches!(turn.record().state, agentry_types::TurnState::Running) {
            let high_water = store.high_water(turn.id()).await?;
            if after > high_water {
                let message = format!(
                    "{param} {after} is past every sequence number this turn has given out (at most {high_water} so far): a cursor is a sequence_number of its events"
                );
                return Err(ApiError::bad_param(param, message));
            }
        } else {
            let last = store.turn_events(turn.id(), Order::Desc, None, 1).await?;
            let last = last.first().map_or(0, |stored| stored.event.seq);
            if after > last {
                let message = format!(
                    "{param} {after} is past this turn's last event, {last}: the turn has ended, and a cursor is a sequence_number of its events"
                );
                return Err(ApiError::bad_param(param, message));
            }
        }
    }
    let slot = state.streams.take(&caller.0.subject_id)?;
    Ok(stream_turn(&state, slot, &turn, after))
}

/// A page token over a turn's or a session's stored events.
#[derive(Debug, Serialize, Deserialize)]
struct EventCursor {
    turn_id: String,
    sequence_number: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    order: Option<String>,
}

fn encode_cursor(cursor: &EventCursor) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(cursor).unwrap_or_default())
}

fn decode_cursor(token: &str) -> ApiResult<EventCursor> {
    URL_SAFE_NO_PAD.decode(token).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).ok_or_else(
        || {
            ApiError::bad_param(
                "page_token",
                format!(
                    "invalid page_token {:?}: it is not a page token (pass a response's next_page_token as given)",
                    crate::error::quoted_id(token)
                ),
            )
        },
    )
}

/// Up to `limit` rendered stored events of `turn` past `cursor` in `order`, those `keep`
/// accepts; and the cursor after the last one when more remain.
async fn turn_page(
    state: &AppState,
    turn: TurnId,
    order: Order,
    mut cursor: Option<u64>,
    limit: usize,
    keep: impl Fn(&HarnessEvent) -> bool,
) -> ApiResult<(Vec<(u64, HarnessEvent)>, Option<u64>)> {
    let store = state.runtime.store();
    let mut out = Vec::new();
    loop {
        let batch = store.turn_events(turn, order, cursor, limit + 1).await?;
        let exhausted = batch.len() <= limit;
        for stored in batch {
            cursor = Some(stored.event.seq);
            if let Some(rendered) = harness::render(&stored.event).filter(|rendered| keep(rendered)) {
                if out.len() == limit {
                    // One more exists past the page: the page ends at the last one kept.
                    let last = out.last().map(|(seq, _)| *seq);
                    return Ok((out, last));
                }
                out.push((stored.event.seq, rendered));
            }
        }
        if exhausted {
            return Ok((out, None));
        }
    }
}

/// `GET …/turns/{turn_id}/events`: a finished turn's stored content events (no
/// `turn.created`, `turn.done` or deltas), paginated.
async fn list_turn_events(
    State(state): AppStateRef,
    caller: Caller,
    Path((session_id, turn_id)): Path<(String, String)>,
    params: Params,
) -> ApiResult<Response> {
    let limit = params.limit(25, 25)?;
    let order = params.order(Order::Asc)?;
    let order_name = if order == Order::Asc { "asc" } else { "desc" };
    let cursor = params.text("page_token").map(decode_cursor).transpose()?;
    let turn = owned_turn(&state, &caller, &session_id, &turn_id).await?;
    if let Some(cursor) = &cursor
        && (cursor.turn_id != turn.id().to_string() || cursor.order.as_deref() != Some(order_name))
    {
        return Err(ApiError::bad_param("page_token", "the page_token belongs to another listing"));
    }
    if !turn.state().await?.is_terminal() {
        return Err(ApiError::precondition(
            "turn_running",
            format!("turn {} is still running: subscribe to it for its events", turn.id()),
        ));
    }
    let (events, next) = turn_page(
        &state,
        turn.id(),
        order,
        cursor.map(|cursor| cursor.sequence_number),
        limit,
        HarnessEvent::is_turn_event,
    )
    .await?;
    let next = next.map(|sequence_number| {
        encode_cursor(&EventCursor {
            turn_id: turn.id().to_string(),
            sequence_number,
            order: Some(order_name.to_owned()),
        })
    });
    let data: Vec<HarnessEvent> = events.into_iter().map(|(_, event)| event).collect();
    Ok(Json(json!({"data": data, "pagination": pagination(next, limit)})).into_response())
}

/// `GET …/events`: the stored events of a chain of turns, newest first, as
/// `{turn_id, event}`. The chain starts at `last_turn_id` (or the latest turn); a running
/// anchor is skipped for its parent, which subscribers get live instead.
async fn list_session_events(
    State(state): AppStateRef,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> ApiResult<Response> {
    let limit = params.limit(100, 100)?;
    // Unlike the turn listings, this one has one order: a client asking for another would
    // otherwise read the events backwards without knowing it.
    if params.order(Order::Desc)? != Order::Desc {
        return Err(ApiError::bad_param(
            "order",
            "session events are listed newest first only (`order=desc`); a turn's events take `order=asc`",
        ));
    }
    let cursor = params.text("page_token").map(decode_cursor).transpose()?;
    let session = caller.session(&state, &session_id).await?;
    let store = state.runtime.store();
    let (mut next_turn, mut before): (Option<RunRecord>, Option<u64>) = if let Some(cursor) = cursor {
        // A turn's own listing writes its order into its tokens; this one writes none.
        if cursor.order.is_some() {
            return Err(ApiError::bad_param("page_token", "the page_token belongs to another listing"));
        }
        // A token naming another session's turn is answered as one naming no turn: whether
        // a turn exists is not told to a caller who cannot read it.
        let invalid = || {
            ApiError::bad_param("page_token", "invalid page_token: pass a page's next_page_token as given")
        };
        let id: TurnId = cursor.turn_id.parse().map_err(|_| invalid())?;
        let run = match store.get_run(id).await {
            Ok(run) => run,
            Err(error) if error.is_not_found() => return Err(invalid()),
            Err(error) => return Err(error.into()),
        };
        if run.session_id != session.id() {
            return Err(invalid());
        }
        (Some(run), Some(cursor.sequence_number))
    } else {
        let anchor = match params.text("last_turn_id") {
            Some(id) => {
                let id: TurnId = id.parse().map_err(|_| ApiError::not_found("turn", id))?;
                Some(session.get_turn(id).await?.record().clone())
            }
            None => latest_turn(&session).await?.map(|turn| turn.record().clone()),
        };
        let anchor = match anchor {
            Some(run) if !run.state.is_terminal() => match run.previous_turn_id {
                Some(previous) => Some(store.get_run(previous).await?),
                None => None,
            },
            other => other,
        };
        (anchor, None)
    };
    let mut data = Vec::new();
    let mut next = None;
    while let Some(run) = next_turn.take() {
        let (events, more) =
            turn_page(&state, run.id, Order::Desc, before.take(), limit - data.len(), |_| true).await?;
        for (_, event) in events {
            data.push(json!({"turn_id": run.id.to_string(), "event": event}));
        }
        if let Some(sequence_number) = more {
            next = Some(encode_cursor(&EventCursor {
                turn_id: run.id.to_string(),
                sequence_number,
                order: None,
            }));
            break;
        }
        let Some(previous) = run.previous_turn_id else { break };
        let previous = store.get_run(previous).await?;
        if data.len() == limit {
            // The page is full at a turn boundary: the next page starts with the previous turn.
            next = Some(encode_cursor(&EventCursor {
                turn_id: previous.id.to_string(),
                sequence_number: u64::MAX,
                order: None,
            }));
            break;
        }
        next_turn = Some(previous);
    }
    Ok(Json(json!({"data": data, "pagination": pagination(next, limit)})).into_response())
}
