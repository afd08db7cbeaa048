//! Prometheus-format metrics: requests, turns running and finished, events streamed, SSE
//! clients, store latency.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agentry_memory::{PageRequest, SessionQuery};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AppState;

/// The counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    requests: Mutex<BTreeMap<u16, u64>>,
    turns_started: AtomicU64,
    turns_finished: Mutex<BTreeMap<String, u64>>,
    events_streamed: AtomicU64,
    sse_clients: Arc<AtomicU64>,
    store_latency_micros: AtomicU64,
}

/// Counts one open SSE client while it lives.
#[derive(Debug)]
pub(crate) struct SseClient(Arc<AtomicU64>);

impl Drop for SseClient {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub(crate) fn turn_started(&self) {
        self.turns_started.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn turn_finished(&self, status: &str) {
        *self
            .turns_finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(status.to_owned())
            .or_default() += 1;
    }

    pub(crate) fn event_streamed(&self) {
        self.events_streamed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn sse_client(&self) -> SseClient {
        self.sse_clients.fetch_add(1, Ordering::Relaxed);
        SseClient(self.sse_clients.clone())
    }

    pub(crate) fn store_latency(&self, latency: Duration) {
        self.store_latency_micros
            .store(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP agentry_http_requests_total HTTP requests answered, by status.");
        let _ = writeln!(out, "# TYPE agentry_http_requests_total counter");
        for (status, count) in self.requests.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let _ = writeln!(out, "agentry_http_requests_total{{status=\"{status}\"}} {count}");
        }
        let started = self.turns_started.load(Ordering::Relaxed);
        let finished = self.turns_finished.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let done: u64 = finished.values().sum();
        let _ = writeln!(
            out,
            "# HELP agentry_turns_running Turns started or recovered by this server that are running."
        );
        let _ = writeln!(out, "# TYPE agentry_turns_running gauge");
        let _ = writeln!(out, "agentry_turns_running {}", started.saturating_sub(done));
        let _ = writeln!(
            out,
            "# HELP agentry_turns_finished_total Turns that ended here, by status (left: stopped here without ending, to go on elsewhere or when resumed)."
        );
        let _ = writeln!(out, "# TYPE agentry_turns_finished_total counter");
        for (status, count) in &finished {
            let _ = writeln!(out, "agentry_turns_finished_total{{status=\"{status}\"}} {count}");
        }
        let _ = writeln!(out, "# HELP agentry_events_streamed_total Events sent to SSE clients.");
        let _ = writeln!(out, "# TYPE agentry_events_streamed_total counter");
        let _ =
            writeln!(out, "agentry_events_streamed_total {}", self.events_streamed.load(Ordering::Relaxed));
        let _ = writeln!(out, "# HELP agentry_sse_clients Open SSE connections.");
        let _ = writeln!(out, "# TYPE agentry_sse_clients gauge");
        let _ = writeln!(out, "agentry_sse_clients {}", self.sse_clients.load(Ordering::Relaxed));
        let _ = writeln!(out, "# HELP agentry_store_read_seconds Latency of the last store probe read.");
        let _ = writeln!(out, "# TYPE agentry_store_read_seconds gauge");
        #[allow(clippy::cast_precision_loss)]
        let seconds = self.store_latency_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "agentry_store_read_seconds {seconds}");
        out
    }
}

/// Reads one session from the store, recording how long it took when it answers.
pub(crate) async fn probe_store(state: &AppState) -> Result<(), agentry_memory::StoreError> {
    if let Some(file) = &state.store_file {
        // Both backends refuse writes then; readiness says why, so the server is restarted.
        file.check()?;
    }
    let started = Instant::now();
    state.runtime.store().list_sessions(&SessionQuery::default(), &PageRequest::first(1)).await?;
    state.metrics.store_latency(started.elapsed());
    Ok(())
}

/// `GET /metrics`: probes the store, then renders every metric. With API keys configured
/// it takes one, unless the configuration makes metrics public.
pub(crate) async fn render(State(state): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> Response {
    if !state.public_metrics
        && let Err(error) = crate::auth::Caller::of(&headers, &state)
    {
        return error.into_response();
    }
    // A failed probe leaves the last latency; `/readyz` reports the failure.
    let _ = probe_store(&state).await;
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
        .into_response()
}

/// Counts every answered request by status, and logs it.
pub(crate) async fn count_requests(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    *state.metrics.requests.lock().unwrap_or_else(PoisonError::into_inner).entry(status).or_default() += 1;
    let elapsed_ms = started.elapsed().as_millis();
    // Probes come every few seconds from an orchestrator: logged only at debug level while
    // they succeed, so they do not bury the requests that matter.
    if response.status().is_success() && matches!(path.as_str(), "/healthz" | "/readyz" | "/metrics") {
        tracing::debug!(%method, %path, status, elapsed_ms, "request");
    } else {
        tracing::info!(%method, %path, status, elapsed_ms, "request");
    }
    response
}
