//! The AdalFlow-shaped streaming result of a turn (seed 004's `RunnerStreamingResult`):
//! `stream_events` renders the turn's canonical events as `RawResponsesStreamEvent`s and
//! `RunItemStreamEvent`s, `stream_to_json` also writes them to a JSON file as they come,
//! `wait_for_completion` returns the `RunnerResult` with the step history, and `cancel`
//! stops the turn.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use agentry_events::render::adalflow::{AdalFlowRenderer, AdalFlowStreamEvent};
use agentry_memory::Order;
use agentry_types::adalflow::{RunnerResult, StepOutput};
use futures_core::Stream;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::error::{RunnerError, RuntimeResult};
use crate::runtime::TurnHandle;

/// A stream of AdalFlow events.
pub type AdalFlowEventStream =
    std::pin::Pin<Box<dyn Stream<Item = RuntimeResult<AdalFlowStreamEvent>> + Send>>;

/// A running turn seen through AdalFlow's runner vocabulary.
#[derive(Debug, Clone)]
pub struct RunnerStreamingResult {
    turn: TurnHandle,
    /// The result, once the turn completed.
    result: Arc<Mutex<Option<RunnerResult>>>,
}

impl RunnerStreamingResult {
    /// Wraps a turn.
    #[must_use]
    pub fn new(turn: TurnHandle) -> Self {
        Self { turn, result: Arc::new(Mutex::new(None)) }
    }

    /// The turn underneath.
    #[must_use]
    pub const fn turn(&self) -> &TurnHandle {
        &self.turn
    }

    /// Whether the turn completed (as seen by this result: after `wait_for_completion` or a
    /// stream that reached the end).
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.lock().is_some()
    }

    /// The answer, once complete.
    #[must_use]
    pub fn answer(&self) -> Option<String> {
        self.lock().as_ref().and_then(|result| result.answer.clone())
    }

    /// The step history, once complete (empty before).
    #[must_use]
    pub fn step_history(&self) -> Vec<StepOutput> {
        self.lock().as_ref().map(|result| result.step_history.clone()).unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<RunnerResult>> {
        self.result.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The turn's events from its start, rendered: model deltas as raw response events,
    /// tool calls, outputs, steps and permission requests as run items, and at the end
    /// `agent.final_output` and `agent.execution_complete` carrying the `RunnerResult`.
    #[must_use]
    pub fn stream_events(&self) -> AdalFlowEventStream {
        let mut renderer = AdalFlowRenderer::new();
        let result = self.result.clone();
        let events = self.turn.stream(None);
        Box::pin(events.flat_map(move |event| {
            let rendered: Vec<RuntimeResult<AdalFlowStreamEvent>> = match event {
                Ok(event) => {
                    let rendered = renderer.render(&event);
                    if event.payload.is_terminal()
                        && let agentry_events::EventPayload::TurnDone { state } = &event.payload
                    {
                        *result.lock().unwrap_or_else(PoisonError::into_inner) = renderer.result(state);
                    }
                    rendered.into_iter().map(Ok).collect()
                }
                Err(error) => vec![Err(error)],
            };
            futures_util::stream::iter(rendered)
        }))
    }

    /// Like [`RunnerStreamingResult::stream_events`], and writes every event to `path` as
    /// it arrives: a JSON array, flushed after each event, closed when the stream ends.
    ///
    /// Errors: `Internal` when the file cannot be created or written (the stream ends).
    pub async fn stream_to_json(&self, path: impl AsRef<Path>) -> RuntimeResult<AdalFlowEventStream> {
        let path = path.as_ref().to_path_buf();
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(|error| RunnerError::Internal(format!("cannot create {}: {error}", path.display())))?;
        let failed = move |error: std::io::Error| {
            RunnerError::Internal(format!("cannot write {}: {error}", path.display()))
        };
        let state = (self.stream_events(), Some(file), true, failed);
        Ok(Box::pin(futures_util::stream::unfold(
            state,
            |(mut events, mut file, first, failed)| async move {
                let writer = file.as_mut()?;
                match events.next().await {
                    Some(Ok(event)) => {
                        let json = serde_json::to_string_pretty(&event).unwrap_or_default();
                        let prefix = if first { "[\n" } else { ",\n" };
                        let written = async {
                            writer.write_all(prefix.as_bytes()).await?;
                            writer.write_all(json.as_bytes()).await?;
                            writer.flush().await
                        }
                        .await;
                        match written {
                            Ok(()) => Some((Ok(event), (events, file, false, failed))),
                            Err(error) => Some((Err(failed(error)), (events, None, false, failed))),
                        }
                    }
                    Some(Err(error)) => Some((Err(error), (events, file, first, failed))),
                    None => {
                        let closing = if first { "[]\n" } else { "\n]\n" };
                        let closed = async {
                            writer.write_all(closing.as_bytes()).await?;
                            writer.flush().await
                        }
                        .await;
                        match closed {
                            Ok(()) => None,
                            Err(error) => Some((Err(failed(error)), (events, None, false, failed))),
                        }
                    }
                }
            },
        )))
    }

    /// Stops the turn (idempotent) and waits for it to end.
    ///
    /// Errors: as [`TurnHandle::cancel`].
    pub async fn cancel(&self) -> RuntimeResult<()> {
        self.turn.cancel().await
    }

    /// Waits for the turn to end and returns the `RunnerResult`: the answer or the error,
    /// and one step per tool call and one for the answer. A turn this runtime stops running
    /// without ending (handed over at a shutdown) is waited for in the stored log until the
    /// process that resumes it ends it.
    ///
    /// Errors: as [`TurnHandle::wait`].
    pub async fn wait_for_completion(&self) -> RuntimeResult<RunnerResult> {
        if let Some(result) = self.lock().clone() {
            return Ok(result);
        }
        let mut state = self.turn.wait().await?;
        if !state.is_terminal() {
            // Its engine stopped here without ending it (the runtime handed it over, or lost
            // its lease, or the store refused its end): it ends in whichever process resumes
            // it, and the stored log says when.
            let mut events = self.turn.stream(None);
            while let Some(event) = futures_util::StreamExt::next(&mut events).await {
                event?;
            }
            state = self.turn.state().await?;
        }
        let mut renderer = AdalFlowRenderer::new();
        for event in self.turn.events(Order::Asc).await? {
            renderer.render(&event);
        }
        let result = renderer
            .result(&state)
            .ok_or_else(|| RunnerError::Internal("a finished turn has no terminal state".to_owned()))?;
        *self.lock() = Some(result.clone());
        Ok(result)
    }
}
