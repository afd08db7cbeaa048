//! Server-Sent Events responses: `id:` on every numbered frame, keep-alive comments,
//! `Cache-Control: no-cache`, `X-Accel-Buffering: no`, never compressed (no compression
//! layer exists; `X-Accel-Buffering` also keeps proxies from buffering), and cut when
//! the server stops: the connection is aborted rather than closed cleanly (no last empty
//! chunk), so a client tells a cut stream from a finished one, and reconnects with its
//! cursor (an SDK's event iterator raises instead of ending as if the turn were over).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};

use crate::AppState;
use crate::error::{ApiError, ApiResult};

/// The event streams each caller has open, at most `limit` at once: one client cannot
/// hold the server's connections and tasks (and the store reads a feed's replay makes)
/// without bound.
#[derive(Debug)]
pub(crate) struct StreamSlots {
    limit: usize,
    open: Mutex<HashMap<String, usize>>,
}

impl StreamSlots {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { limit, open: Mutex::default() })
    }

    /// A slot for one more stream of `subject`, taken before anything the stream is for is
    /// created (a turn, a session); 429 `too_many_streams` when the caller has all of its
    /// own open.
    pub(crate) fn take(self: &Arc<Self>, subject: &str) -> ApiResult<StreamSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(subject.to_owned()).or_default();
        if *count >= self.limit {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "{} event streams are open for this caller, the most allowed (limits.streams_per_subject): close one first",
                    self.limit
                ),
            ));
        }
        *count += 1;
        Ok(StreamSlot { slots: Arc::clone(self), subject: subject.to_owned() })
    }
}

/// One open stream of a caller, given back when its response body is dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    slots: Arc<StreamSlots>,
    subject: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.subject) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.subject);
            }
        }
    }
}

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

/// Why a stream was cut before its end: the server is stopping, or reading what it
/// streams failed. Ending the body with it aborts the connection, so the client
/// reconnects with its cursor instead of taking the stream for finished.
#[derive(Debug)]
pub(crate) struct Cut(pub(crate) String);

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Cut {}

/// An SSE response of `frames`, cut (the connection aborted) at the first error, or when
/// the server stops.
pub(crate) fn respond_or_cut(
    state: &Arc<AppState>,
    slot: StreamSlot,
    frames: impl Stream<Item = Result<Frame, Cut>> + Send + 'static,
) -> Response {
    let cut = futures_util::stream::unfold(
        (Box::pin(frames), Box::pin(state.stopped()), false),
        |(mut frames, mut stopped, over)| async move {
            if over {
                return None;
            }
            tokio::select! {
                biased;
                () = &mut stopped => {
                    Some((Err(Cut("the server is stopping".to_owned())), (frames, stopped, true)))
                }
                next = frames.next() => next.map(|frame| {
                    let over = frame.is_err();
                    (frame, (frames, stopped, over))
                }),
            }
        },
    );
    respond_results(state, slot, cut)
}

/// An SSE response of `frames`, which end by themselves when the server stops (so that a
/// stream may close with a last frame of its own).
pub(crate) fn respond_ending(
    state: &Arc<AppState>,
    slot: StreamSlot,
    frames: impl Stream<Item = Frame> + Send + 'static,
) -> Response {
    respond_results(state, slot, frames.map(Ok::<_, Infallible>))
}

/// An SSE response of `frames`; an error ends the body with it, which aborts the connection.
fn respond_results<E: std::error::Error + Send + Sync + 'static>(
    state: &Arc<AppState>,
    slot: StreamSlot,
    frames: impl Stream<Item = Result<Frame, E>> + Send + 'static,
) -> Response {
    let client = state.metrics.sse_client();
    let counting = state.clone();
    let events = frames.map(move |frame| {
        // Both held for as long as the body is.
        let _held = (&client, &slot);
        let frame = frame?;
        counting.metrics.event_streamed();
        let event = Event::default().data(frame.data);
        Ok::<_, E>(match frame.id {
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
