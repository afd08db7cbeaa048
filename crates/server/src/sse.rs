//! Server-Sent Events responses: `id:` on every numbered frame, keep-alive comments,
//! `Cache-Control: no-cache`, `X-Accel-Buffering: no`, never compressed (no compression
//! layer exists; `X-Accel-Buffering` also keeps proxies from buffering), and ended when
//! the server stops (clients reconnect with their cursor).

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};

use crate::AppState;

/// One frame: an optional `id` and the JSON `data`.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) id: Option<String>,
    pub(crate) data: String,
}

/// The `Last-Event-ID` header, trimmed; `None` when absent or empty (as an EventSource
/// sends before it has seen an id). Bytes that are not text are kept (lossily) for the
/// caller to refuse.
pub(crate) fn last_event_id(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get("last-event-id")?;
    let text = String::from_utf8_lossy(value.as_bytes()).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// An SSE response of `frames`, cut when the server stops.
pub(crate) fn respond(state: &Arc<AppState>, frames: impl Stream<Item = Frame> + Send + 'static) -> Response {
    respond_ending(state, frames.take_until(state.stopped()))
}

/// An SSE response of `frames`, which end by themselves when the server stops (so that a
/// stream may close with a last frame of its own).
pub(crate) fn respond_ending(
    state: &Arc<AppState>,
    frames: impl Stream<Item = Frame> + Send + 'static,
) -> Response {
    let client = state.metrics.sse_client();
    let counting = state.clone();
    let events = frames.map(move |frame| {
        let _client = &client;
        counting.metrics.event_streamed();
        let event = Event::default().data(frame.data);
        Ok::<_, Infallible>(match frame.id {
            Some(id) => event.id(id),
            None => event,
        })
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(state.heartbeat).text("keep-alive"))
        .into_response();
    let headers = response.headers_mut();
    headers.insert(axum::http::header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
