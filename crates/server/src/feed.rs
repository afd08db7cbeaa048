//! The opencode-style event feeds: `GET /event?session_id=…` (one session) and
//! `GET /global/event` (every session of the caller). Each opens with `server.connected`,
//! sends `server.heartbeat` periodically, and carries the agent-team events of seed 001
//! and the turn and thread lifecycle events as `{"type", "properties"}` frames whose SSE
//! `id` is the event's store-wide position: reconnecting with `Last-Event-ID` (or
//! `?after=<position>`) resumes with the next event, without gaps or repeats. A session's
//! feed whose session is deleted ends, at its next heartbeat, with a `session.deleted`
//! frame (`properties.sessionID`); reconnecting is then 404.
//!
//! One poller per server reads the store's feed (woken by this server's appends, and
//! every 500 ms for other processes sharing the store) and broadcasts new events; each
//! connection replays from the store up to the live edge, then follows the broadcast (and
//! replays again from the store if it falls behind).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentry_events::render::{agent_team, harness};
use agentry_memory::{FeedQuery, Order, Store, StoreError, StoredEvent};
use agentry_types::SessionId;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::harness::Params;
use crate::sse::{self, Frame};

/// How often the poller looks for events other processes stored, when it is caught up
/// (this server's own appends wake it at once).
const POLL: Duration = Duration::from_millis(500);
/// Events read from the store at once.
const BATCH: usize = 256;
/// Sessions whose owner a connection remembers (then it starts over).
const OWNERS_CACHED: usize = 10_000;

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/event", get(session_feed)).route("/global/event", get(global_feed))
}

/// The server's feed poller: broadcasts every stored event once, in position order.
#[derive(Debug)]
pub(crate) struct FeedHub {
    sender: broadcast::Sender<Arc<StoredEvent>>,
}

impl FeedHub {
    /// Starts the poller over `store`, beginning at its current end; it ends when
    /// `stopping` turns true.
    ///
    /// Errors: the store's, when it cannot say where its feed ends.
    pub(crate) async fn start(
        store: Arc<dyn Store>,
        appended: Arc<tokio::sync::Notify>,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Self, agentry_memory::StoreError> {
        let (sender, _) = broadcast::channel(4096);
        let hub_sender = sender.clone();
        // The start is fixed before any connection can replay, so nothing falls between.
        let newest = FeedQuery { order: Order::Desc, ..FeedQuery::default() };
        let mut last = store.feed(&newest, 1).await?.first().map(|event| event.position);
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stopping.wait_for(|stopping| *stopping).await;
            };
            let poll = async {
                loop {
                    // Armed before reading, so an append during the read is not missed.
                    let notified = appended.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    let query = FeedQuery { after: last, ..FeedQuery::default() };
                    match store.feed(&query, BATCH).await {
                        Ok(events) if !events.is_empty() => {
                            for event in events {
                                last = Some(event.position);
                                // No receiver is fine: nobody is listening.
                                let _ = hub_sender.send(Arc::new(event));
                            }
                            continue;
                        }
                        Ok(_) => {}
                        Err(error) => tracing::warn!(%error, "reading the event feed failed"),
                    }
                    // This server's turns signal their appends; other processes sharing
                    // the store are polled for.
                    tokio::select! {
                        () = &mut notified => {},
                        () = tokio::time::sleep(POLL) => {},
                    }
                }
            };
            tokio::select! {
                () = poll => {},
                () = stopped => {},
            }
        });
        Ok(Self { sender })
    }
}

/// Renders a stored event as a feed frame; `None` for events the feeds do not carry.
fn render(stored: &StoredEvent) -> Option<Frame> {
    let event = &stored.event;
    let data = if let Some(team) = agent_team::render(event) {
        serde_json::to_value(team).ok()?
    } else {
        let rendered = harness::render(event)?;
        let kind = rendered.kind();
        if !matches!(kind, "turn.created" | "turn.done" | "thread.created" | "thread.done") {
            return None;
        }
        let mut properties = serde_json::to_value(&rendered).ok()?;
        if let Value::Object(map) = &mut properties {
            map.remove("type");
            map.insert("sessionID".to_owned(), json!(event.session_id.to_string()));
            map.insert("turnID".to_owned(), json!(event.turn_id.to_string()));
        }
        json!({"type": kind, "properties": properties})
    };
    Some(Frame { id: Some(stored.position.to_string()), data: data.to_string() })
}

fn ephemeral(kind: &str) -> Frame {
    Frame { id: None, data: json!({"type": kind, "properties": {}}).to_string() }
}

/// The resume position: `Last-Event-ID` wins over `?after=`; an empty one is none (as an
/// EventSource sends before it has seen an id). Both are read alike: surrounding spaces
/// trimmed, then decimal digits only (no sign).
fn cursor(headers: &HeaderMap, params: &HashMap<String, String>) -> ApiResult<Option<u64>> {
    let header = crate::sse::last_event_id(headers);
    let after = params.get("after").map(|text| text.trim()).filter(|text| !text.is_empty());
    let (name, text) = match (header, after) {
        (Some(text), _) => ("Last-Event-ID", text),
        (None, Some(text)) => ("after", text.to_owned()),
        (None, None) => return Ok(None),
    };
    let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    digits.then(|| text.parse::<u64>().ok()).flatten().map(Some).ok_or_else(|| {
        ApiError::bad_param(name, format!("{name} must be a feed position (an integer), not {text:?}"))
    })
}

/// Which sessions a connection may see.
enum Scope {
    /// One session (already checked to be the caller's).
    Session(SessionId),
    /// Every session the subject owns.
    Owner(String),
}

async fn session_feed(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    Params(params): Params,
) -> ApiResult<Response> {
    let id = params
        .get("session_id")
        .or_else(|| params.get("sessionID"))
        .filter(|id| !id.trim().is_empty())
        .ok_or_else(|| {
            ApiError::bad_param("session_id", "session_id is required (use /global/event for every session)")
        })?;
    let session = caller.session(&state, id).await?;
    let after = cursor(&headers, &params)?;
    let slot = state.streams.take(&caller.0.subject_id)?;
    Ok(sse::respond_or_cut(&state, slot, feed(state.clone(), Scope::Session(session.id()), after)))
}

async fn global_feed(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    Params(params): Params,
) -> ApiResult<Response> {
    let after = cursor(&headers, &params)?;
    let slot = state.streams.take(&caller.0.subject_id)?;
    Ok(sse::respond_or_cut(&state, slot, feed(state.clone(), Scope::Owner(caller.0.subject_id), after)))
}

/// The frames of one connection: connected, then stored events after `after` (all when
/// `None`… from the live edge when no cursor is given), then live ones, with heartbeats.
fn feed(
    state: Arc<AppState>,
    scope: Scope,
    after: Option<u64>,
) -> impl Stream<Item = Result<Frame, sse::Cut>> + Send {
    async_stream(move |yield_frame| async move {
        let mut live = state.feed.sender.subscribe();
        let store = state.runtime.store().clone();
        let session = match &scope {
            Scope::Session(id) => Some(*id),
            Scope::Owner(_) => None,
        };
        // Without a cursor the feed starts at the live edge. A cursor past the store's
        // newest event (one kept from a store since recreated) starts there too: waiting
        // for it to be reached would deliver nothing, perhaps for ever. (Positions are never
        // reused, so a cursor past events deleted since loses nothing this way.)
        // A store that cannot say where its newest event is ends the connection (the client
        // reconnects) rather than replaying everything from the start.
        let newest = |session| {
            let store = store.clone();
            async move {
                let newest = FeedQuery { session_id: session, order: Order::Desc, after: None };
                let events = store.feed(&newest, 1).await.map_err(|error| {
                    tracing::warn!(%error, "a feed could not read the store's newest event; closing it");
                })?;
                Ok::<_, ()>(events.first().map(|event| event.position))
            }
        };
        let mut last = match after {
            Some(position) => match newest(None).await? {
                Some(newest) if position > newest => Some(newest),
                Some(_) => Some(position),
                None => None,
            },
            None => newest(session).await?,
        };
        // Connected once the start is fixed: every event stored from now on is delivered.
        yield_frame.send(ephemeral("server.connected")).await.map_err(drop)?;
        let mut owners: HashMap<SessionId, bool> = HashMap::new();
        let mut heartbeat = tokio::time::interval(state.heartbeat);
        heartbeat.tick().await;
        loop {
            // Replay from the store up to the live edge.
            loop {
                let query = FeedQuery { session_id: session, order: Order::Asc, after: last };
                let events = store.feed(&query, BATCH).await.map_err(|_| ())?;
                let done = events.len() < BATCH;
                if yield_frame.is_closed() {
                    return Err(()); // The client left.
                }
                for event in events {
                    last = Some(event.position);
                    if visible(&state, &scope, &mut owners, &event).await?
                        && let Some(frame) = render(&event)
                    {
                        yield_frame.send(frame).await.map_err(drop)?;
                    }
                }
                if done {
                    break;
                }
            }
            // Follow the broadcast until it lags.
            loop {
                tokio::select! {
                    received = live.recv() => match received {
                        Ok(event) => {
                            if last.is_some_and(|last| event.position <= last) {
                                continue;
                            }
                            last = Some(event.position);
                            if session.is_none_or(|id| event.event.session_id == id)
                                && visible(&state, &scope, &mut owners, &event).await?
                                && let Some(frame) = render(&event)
                            {
                                yield_frame.send(frame).await.map_err(drop)?;
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => return Err(()),
                    },
                    _ = heartbeat.tick() => {
                        // A deleted session's feed ends, saying so: nothing more will come,
                        // and reconnecting is 404.
                        if let Some(id) = session
                            && store.get_session(id).await.is_err_and(|error| error.is_not_found())
                        {
                            let deleted = json!({"type": "session.deleted", "properties": {"sessionID": id.to_string()}});
                            yield_frame.send(Frame { id: None, data: deleted.to_string() }).await.map_err(drop)?;
                            return Ok(());
                        }
                        yield_frame.send(ephemeral("server.heartbeat")).await.map_err(drop)?;
                    }
                }
            }
        }
    })
}

/// Whether the connection may see an event's session. A session that cannot be read now
/// (the store failed) ends the connection rather than being taken for someone else's: its
/// events would be skipped for good, as the cursor moves past them, where the client
/// reconnecting from the last event it got is given them again.
async fn visible(
    state: &AppState,
    scope: &Scope,
    owners: &mut HashMap<SessionId, bool>,
    event: &StoredEvent,
) -> Result<bool, ()> {
    match scope {
        Scope::Session(id) => Ok(event.event.session_id == *id),
        Scope::Owner(owner) => {
            let session = event.event.session_id;
            if let Some(known) = owners.get(&session) {
                return Ok(*known);
            }
            let mine = match state.runtime.store().get_session(session).await {
                Ok(record) => &record.owner.subject_id == owner,
                // Deleted since: nobody's any more.
                Err(StoreError::NotFound { .. }) => false,
                Err(error) => {
                    tracing::warn!(%session, %error, "a feed could not read an event's session; closing it");
                    return Err(());
                }
            };
            if owners.len() >= OWNERS_CACHED {
                owners.clear();
            }
            owners.insert(session, mine);
            Ok(mine)
        }
    }
}

/// A stream driven by a producer task writing into a small channel: the producer stops
/// when the consumer goes away (its send fails). A feed's only end of its own is its
/// session's deletion (the producer returns `Ok`: the stream ends cleanly). Otherwise its
/// producer stops only when it cannot go on (the store failed, the hub closed), and the
/// stream then ends with a cut, which aborts the connection, so the client reconnects
/// with its cursor rather than taking the feed for over.
fn async_stream<F, Fut>(producer: F) -> impl Stream<Item = Result<Frame, sse::Cut>> + Send
where
    F: FnOnce(tokio::sync::mpsc::Sender<Frame>) -> Fut,
    Fut: std::future::Future<Output = Result<(), ()>> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    let task = producer(sender);
    let (ended, end) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = ended.send(task.await);
    });
    let frames = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|frame| (Ok(frame), receiver))
    });
    // The producer has ended once its channel closes (its sender goes with it).
    let cut = futures_util::stream::once(end).filter_map(|ended| async move {
        (!matches!(ended, Ok(Ok(()))))
            .then(|| Err(sse::Cut("the feed stopped: reconnect with the last event's id".to_owned())))
    });
    frames.chain(cut)
}
