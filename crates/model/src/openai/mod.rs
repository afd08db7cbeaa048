//! A provider for OpenAI-compatible chat-completions servers: OpenAI, Ollama, vLLM,
//! llama.cpp's server, OpenRouter, DeepSeek and the like.
//!
//! [`OpenAiCompatibleModel`] posts to `{base_url}/chat/completions` with `stream: true`
//! and `stream_options.include_usage`, reads the server-sent events itself, and turns
//! each chunk into a [`ModelMessageDelta`]. The usage-only chunk OpenAI sends after the
//! chunk with the finish reason is folded into that delta, so the last delta of a
//! response carries both.
//!
//! HTTP goes through reqwest 0.13 with rustls: the client is handed a TLS configuration
//! built on the `ring` crypto provider and the platform's certificate verifier, so no
//! process-wide crypto provider is installed and nothing needs cmake or aws-lc.

mod sse;
mod wire;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::{FinishReason, ModelMessageDelta};
use async_trait::async_trait;
use futures_core::Stream;
use futures_util::{FutureExt, StreamExt};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};
use rustls_platform_verifier::BuilderVerifierExt;
use tokio::time::Instant;

use crate::{Model, ModelError, ModelInfo, ModelRequest, ModelStream};
use sse::SseParser;
use wire::{ChatRequest, StreamEvent};

/// The most bytes of an error response's body that are read for its message.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// [`OpenAiConfig::stream_idle_timeout`] by default.
pub(crate) const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The most chunks read after a complete response while looking for the body's end.
const MAX_DRAINED_CHUNKS: usize = 16;

/// How to reach an OpenAI-compatible server, and how patient to be with it.
///
/// Its `Debug` output never shows the API key or the values of the extra headers.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// The API root, to which `/chat/completions` is appended (default
    /// `https://api.openai.com/v1`; Ollama serves `http://localhost:11434/v1`).
    pub base_url: String,
    /// The key sent as `Authorization: Bearer …`; none is sent when absent or empty.
    pub api_key: Option<String>,
    /// The model id sent with each request (`gpt-4o-mini`, `qwen3:8b`, …).
    pub model: String,
    /// How long one attempt may take to connect, send the request and receive the
    /// response's status and headers (and, for an error status, its body). It does not
    /// bound the streamed body, which can rightly take minutes: a caller gives up on a
    /// stream by dropping it (see `stream_idle_timeout`). Default 60 seconds.
    pub request_timeout: Duration,
    /// How long a streamed body may send nothing at all (no chunk, no keep-alive comment)
    /// before the stream ends with [`ModelError::Stalled`] and its connection is closed: a
    /// provider whose connection hangs must not hold its turn, and its session, for ever.
    /// Long enough for a reasoning model that thinks before its first token. Default 5
    /// minutes.
    pub stream_idle_timeout: Duration,
    /// How many times a request is retried after a 429, a 5xx status or a failure to
    /// connect. Retries happen only before the response is accepted, never once deltas
    /// have been streamed. Default 3.
    pub max_retries: u32,
    /// The wait before the first retry; it doubles with each further retry. Default
    /// 200 milliseconds.
    pub initial_backoff: Duration,
    /// The longest wait between two attempts, also capping the wait a server asks for
    /// with `Retry-After`. Default 20 seconds.
    pub max_backoff: Duration,
    /// Headers added to every request (for example `OpenAI-Organization` or Azure's
    /// `api-key`); they replace a default header of the same name.
    pub extra_headers: Vec<(String, String)>,
}

impl OpenAiConfig {
    /// A configuration for `model` on OpenAI's API, without a key, with the defaults.
    #[must_use]
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            base_url: "https://api.openai.com/v1".to_owned(),
            api_key: None,
            model: model.into(),
            request_timeout: Duration::from_secs(60),
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
            max_retries: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(20),
            extra_headers: Vec::new(),
        }
    }

    /// The same configuration for another API root.
    #[must_use]
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// The same configuration with an API key.
    #[must_use]
    pub fn with_api_key(mut self, api_key: impl Into<String>) -> Self {
        self.api_key = Some(api_key.into());
        self
    }

    /// The same configuration with another request timeout.
    #[must_use]
    pub const fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The same configuration with another stream idle timeout
    /// ([`OpenAiConfig::stream_idle_timeout`]).
    #[must_use]
    pub const fn with_stream_idle_timeout(mut self, timeout: Duration) -> Self {
        self.stream_idle_timeout = timeout;
        self
    }

    /// The same configuration with another number of retries.
    #[must_use]
    pub const fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// The same configuration with other waits between attempts.
    #[must_use]
    pub const fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// The same configuration with one more header on every request.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_headers.push((name.into(), value.into()));
        self
    }

    /// The wait before retry number `retry` (from 0): what the server asked for, or
    /// else the exponential backoff, and never more than `max_backoff`.
    fn backoff(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let exponential = self.initial_backoff.saturating_mul(2_u32.saturating_pow(retry));
        retry_after.unwrap_or(exponential).min(self.max_backoff)
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.extra_headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("model", &self.model)
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .field("max_retries", &self.max_retries)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("extra_headers", &header_names)
            .finish()
    }
}

/// A [`Model`] served by an OpenAI-compatible chat-completions endpoint.
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct OpenAiCompatibleModel {
    config: OpenAiConfig,
    url: Url,
    headers: HeaderMap,
    client: reqwest::Client,
}

impl fmt::Debug for OpenAiCompatibleModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client and headers are left out: they hold the key.
        f.debug_struct("OpenAiCompatibleModel").field("config", &self.config).finish_non_exhaustive()
    }
}

impl OpenAiCompatibleModel {
    /// A model for this configuration.
    ///
    /// Fails with [`ModelError::InvalidRequest`] when the model id is empty, the base
    /// URL is not an `http` or `https` URL, or a header name or value (the key included)
    /// is not valid in HTTP; and with [`ModelError::Transport`] when the HTTP client
    /// cannot be set up.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let invalid = |message: String| ModelError::InvalidRequest(message);
        if config.model.trim().is_empty() {
            return Err(invalid("the model id is empty".to_owned()));
        }
        let endpoint = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let url = Url::parse(&endpoint).map_err(|error| invalid(format!("invalid base URL: {error}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!("the base URL must be http or https, not {}", url.scheme())));
        }
        let mut headers = HeaderMap::new();
        if let Some(key) = config.api_key.as_deref().filter(|key| !key.is_empty()) {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| invalid("the API key contains characters not allowed in a header".to_owned()))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        for (name, value) in &config.extra_headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(format!("invalid header name {name:?}")))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| invalid(format!("the value of header {name} is not valid in HTTP")))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let tls = tls_config().map_err(|error| {
            ModelError::Transport(format!("cannot set up the HTTP client: TLS setup failed: {error}"))
        })?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("agentry/", env!("CARGO_PKG_VERSION")))
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|error| {
                ModelError::Transport(format!("cannot set up the HTTP client: {}", describe(&error)))
            })?;
        Ok(Self { config, url, headers, client })
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// Waits before retry number `retry` (from 0) after `error`, which came `when`, saying
    /// so in the log.
    async fn wait_to_retry(&self, retry: u32, retry_after: Option<Duration>, error: &ModelError, when: &str) {
        let wait = self.config.backoff(retry, retry_after);
        tracing::warn!(url = %self.url, model = %self.config.model, %error, when, attempt = retry + 1,
            wait_ms = wait.as_millis(), "a model request failed; retrying");
        tokio::time::sleep(wait).await;
    }

    /// One attempt: the response if its status is a success.
    async fn attempt(&self, body: Vec<u8>) -> Result<reqwest::Response, AttemptError> {
        let timeout = self.config.request_timeout;
        let deadline = Instant::now() + timeout.min(agentry_types::LONGEST_WAIT);
        let send = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body)
            .send();
        let response = match tokio::time::timeout_at(deadline, send).await {
            Err(_elapsed) => return Err(AttemptError::fatal(ModelError::Timeout(timeout))),
            Ok(Err(error)) if error.is_timeout() => {
                return Err(AttemptError::fatal(ModelError::Timeout(timeout)));
            }
            // Refused, reset or closed before any response: nothing was streamed, so the
            // request is sent again (a completion request changes nothing on the server).
            Ok(Err(error)) => {
                return Err(AttemptError::retryable(ModelError::Transport(describe(&error)), None));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(response.headers());
        let body = read_error_body(response, deadline).await;
        let message = wire::error_body_message(&body);
        if status == StatusCode::TOO_MANY_REQUESTS && !wire::is_quota_exhausted(&body) {
            tracing::warn!(url = %self.url, %message, "the model provider is rate limiting requests (429)");
            return Err(AttemptError::retryable(
                ModelError::RateLimited { retry_after, message },
                retry_after,
            ));
        }
        let error = ModelError::Http { status: status.as_u16(), message };
        if status.is_server_error() {
            Err(AttemptError::retryable(error, retry_after))
        } else {
            Err(AttemptError::fatal(error))
        }
    }
}

#[async_trait]
impl Model for OpenAiCompatibleModel {
    fn info(&self) -> ModelInfo {
        ModelInfo { id: self.config.model.clone(), provider: "openai-compatible".to_owned() }
    }

    /// Sends the request, retrying as [`OpenAiConfig::max_retries`] says, and returns
    /// the stream once the server answered with a success status.
    ///
    /// Before the stream: [`ModelError::InvalidRequest`] for a request without messages;
    /// [`ModelError::RateLimited`] for a 429 (the last one, once retries are used up; a
    /// 429 for an exhausted quota is not retried and is [`ModelError::Http`]);
    /// [`ModelError::Http`] for any other error status, with the message of the error
    /// body; [`ModelError::Transport`] when the server cannot be reached;
    /// [`ModelError::Timeout`] when an attempt exceeds the request timeout (not retried).
    ///
    /// Inside the stream, each ending it: [`ModelError::MalformedChunk`] for a chunk that
    /// is not JSON of the expected shape; [`ModelError::Http`] for an error object sent as
    /// a chunk (status from its `code` when that is an HTTP error status, else 0);
    /// [`ModelError::Disconnected`] when the body breaks off or ends without a finish
    /// reason or `[DONE]`; [`ModelError::Stalled`] when it sends nothing for
    /// [`OpenAiConfig::stream_idle_timeout`]. Once a finish reason has arrived the response
    /// is complete, so a failure after it ends the stream normally (only the usage can be
    /// missing). A stream ended by `[DONE]` without any finish reason ends normally, its
    /// last delta finishing with `tool_calls` when it called tools and `stop` otherwise.
    /// Tool calls are numbered densely from 0 whatever the server's indexes, and a call
    /// without an id gets one. A `200 OK` response with a JSON body is read whole: a
    /// completion becomes one delta, an error object [`ModelError::Http`]; an HTML page or
    /// newline-delimited JSON is [`ModelError::Http`] with what it likely means. The first
    /// delta is awaited before the stream is returned: an error object with a 429 or 5xx
    /// code in its place, or a body that ends before any event, is retried as an error
    /// status is. A finished answer waits at most 2 seconds for its usage.
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        if request.messages.is_empty() {
            return Err(ModelError::InvalidRequest("the request has no messages".to_owned()));
        }
        let body = serde_json::to_vec(&ChatRequest::new(&self.config.model, &request))
            .map_err(|error| ModelError::InvalidRequest(format!("cannot encode the request: {error}")))?;
        let mut retry = 0;
        loop {
            match self.attempt(body.clone()).await {
                Ok(response) => {
                    // The first item is read before the stream is handed out: an error in
                    // place of any delta is retried like an error status.
                    let mut stream = match response_stream(response, self.config.stream_idle_timeout).await {
                        Ok(stream) => stream,
                        Err(error) => futures_util::stream::iter([Err(error)]).boxed(),
                    };
                    let first = stream.next().await;
                    match first {
                        Some(Err(error)) if retry < self.config.max_retries && retried_in_stream(&error) => {
                            self.wait_to_retry(retry, None, &error, "in place of the first delta").await;
                            retry += 1;
                        }
                        first => return Ok(futures_util::stream::iter(first).chain(stream).boxed()),
                    }
                }
                Err(AttemptError { retry: Some(retry_after), error }) if retry < self.config.max_retries => {
                    self.wait_to_retry(retry, retry_after, &error, "before the response").await;
                    retry += 1;
                }
                Err(AttemptError { error, .. }) => {
                    if retry > 0 {
                        tracing::warn!(url = %self.url, model = %self.config.model, %error, attempts = retry + 1,
                            "a model request failed on every attempt");
                    }
                    return Err(error);
                }
            }
        }
    }
}

/// Whether an error in place of a response's first delta is retried: an error object with
/// a 5xx code (a model still loading, an overloaded upstream) or a 429 that is not an
/// exhausted quota, or a body that ended before any event.
const fn retried_in_stream(error: &ModelError) -> bool {
    match error {
        ModelError::Http { status, .. } => *status >= 500 && *status <= 599,
        ModelError::RateLimited { .. } | ModelError::Disconnected => true,
        _ => false,
    }
}

/// Why an attempt failed, and whether (and after what requested wait) to try again.
#[derive(Debug)]
struct AttemptError {
    error: ModelError,
    /// `Some` when the attempt may be retried, holding the wait the server asked for.
    retry: Option<Option<Duration>>,
}

impl AttemptError {
    const fn fatal(error: ModelError) -> Self {
        Self { error, retry: None }
    }

    const fn retryable(error: ModelError, retry_after: Option<Duration>) -> Self {
        Self { error, retry: Some(retry_after) }
    }
}

/// The wait a response asks for: `retry-after-ms` (OpenAI), else `Retry-After` in
/// seconds. The HTTP-date form of `Retry-After` is not read; the backoff applies then.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value = headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    number("retry-after-ms")
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
        .or_else(|| number("retry-after").and_then(|seconds| Duration::try_from_secs_f64(seconds).ok()))
}

/// Reads up to [`MAX_ERROR_BODY_BYTES`] of an error response before `deadline`; what
/// could not be read in time is left out.
async fn read_error_body(mut response: reqwest::Response, deadline: Instant) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY_BYTES {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(bytes))) => body.extend_from_slice(&bytes),
            _ => break,
        }
    }
    body.truncate(MAX_ERROR_BODY_BYTES);
    body
}

/// The TLS configuration of the HTTP client: rustls over the `ring` provider, passed
/// explicitly (no process-wide default provider is installed), with the platform's
/// certificate verifier.
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_platform_verifier()?
        .with_no_client_auth())
}

/// An error with its causes, which reqwest keeps out of its own message.
fn describe(error: &reqwest::Error) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The deltas of a successful response, by its content type: an event stream (or no
/// type) as [`delta_stream`]; a JSON body (a server that ignores `stream: true` answers
/// with the whole completion, and some send an error object with `200 OK`) read whole;
/// an HTML page or Ollama's native newline-delimited JSON refused with what it means.
async fn response_stream(response: reqwest::Response, idle: Duration) -> Result<ModelStream, ModelError> {
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .unwrap_or_default();
    let status = response.status().as_u16();
    match content_type.as_str() {
        "application/json" => {
            let body = read_body(response, idle).await?;
            if body.trim_ascii_start().starts_with(b"data:") {
                // An event stream labelled as JSON (some proxies), read whole.
                return Ok(deltas_of(futures_util::stream::iter([Ok::<_, ModelError>(body)]), |error| error));
            }
            let delta = wire::parse_completion(&body)?;
            Ok(deltas_of_one(delta))
        }
        "text/html" => Err(ModelError::Http {
            status,
            message: "the server answered with an HTML page, not an event stream: is the base URL \
                      the API root (often ending in /v1)?"
                .to_owned(),
        }),
        "application/x-ndjson" => Err(ModelError::Http {
            status,
            message: "the server answered with newline-delimited JSON, as Ollama's native API does, \
                      not an event stream: Ollama's OpenAI-compatible API is at http://host:11434/v1"
                .to_owned(),
        }),
        _ => Ok(delta_stream(response, idle)),
    }
}

/// A whole (non-streamed) body, of at most [`sse::MAX_EVENT_BYTES`], each read bounded by
/// `idle`.
async fn read_body(mut response: reqwest::Response, idle: Duration) -> Result<Vec<u8>, ModelError> {
    let idle = idle.min(agentry_types::LONGEST_WAIT);
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout(idle, response.chunk()).await {
            Ok(Ok(Some(bytes))) => {
                body.extend_from_slice(&bytes);
                if body.len() > sse::MAX_EVENT_BYTES {
                    let limit = sse::MAX_EVENT_BYTES;
                    return Err(ModelError::MalformedChunk(format!(
                        "a JSON response larger than {limit} bytes"
                    )));
                }
            }
            Ok(Ok(None)) => return Ok(body),
            Ok(Err(_)) => return Err(ModelError::Disconnected),
            Err(_elapsed) => return Err(ModelError::Stalled(idle)),
        }
    }
}

/// The stream of a whole completion read as one delta (renumbered and finished as a
/// streamed one is).
fn deltas_of_one(delta: ModelMessageDelta) -> ModelStream {
    let mut state =
        DeltaStream::new(futures_util::stream::empty::<Result<&'static [u8], ModelError>>(), |e| e);
    state.apply(StreamEvent::Delta(delta));
    state.apply(StreamEvent::Done);
    state.ended = true;
    futures_util::stream::iter(std::mem::take(&mut state.ready)).boxed()
}

/// The deltas of a response body. The body is owned by the stream, so dropping the
/// stream drops the response and closes its connection.
fn delta_stream(response: reqwest::Response, idle: Duration) -> ModelStream {
    let idle = idle.min(agentry_types::LONGEST_WAIT);
    let body = futures_util::stream::unfold(Some(response), move |response| async move {
        let mut response = response?;
        match tokio::time::timeout(idle, response.chunk()).await {
            Ok(Ok(Some(bytes))) => Some((Ok(bytes), Some(response))),
            Ok(Ok(None)) => None,
            Ok(Err(_)) => Some((Err(ModelError::Disconnected), None)),
            // Dropping the response closes its connection.
            Err(_elapsed) => Some((Err(ModelError::Stalled(idle)), None)),
        }
    });
    let mut state = DeltaStream::new(Box::pin(body), |error| error);
    state.finish_grace = Some(FINISH_GRACE);
    unfold_deltas(state)
}

/// The deltas of an OpenAI-compatible chat-completions response body (server-sent
/// events), given as a stream of byte chunks cut anywhere: what [`OpenAiCompatibleModel`]
/// makes of the HTTP response it reads. For a body obtained another way (a recorded
/// response, another HTTP client) and for fuzzing.
///
/// Deltas go out as they arrive (empty ones are skipped). The one with the finish reason is
/// held until the usage arrives in a later chunk (OpenAI's trailing usage-only chunk),
/// `[DONE]` arrives or the body ends, and then goes out last, with that usage folded in;
/// content arriving after the finish reason goes out before it, and once it is out the
/// rest of the body is ignored. Before a finish reason, the stream ends with one `Err`:
/// `MalformedChunk` for an event that is not a chunk or is larger than 16 MiB, `Http` for
/// an error object the server sent inside the stream, `Disconnected` for a body that ends
/// or fails first. After it, any of those just ends the stream, the held delta going out
/// last. It never panics, whatever the bytes.
///
/// ```
/// use futures_util::StreamExt;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let body = concat!(
///     "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
///     "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
///     "data: [DONE]\n\n",
/// );
/// let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(body.as_bytes())]);
/// let deltas: Vec<_> = agentry_model::sse_deltas(chunks).collect().await;
/// assert_eq!(deltas[0].as_ref().unwrap().content.as_deref(), Some("Hi"));
/// assert_eq!(deltas.len(), 2);
/// # });
/// ```
pub fn sse_deltas<S, B, E>(body: S) -> ModelStream
where
    S: Stream<Item = Result<B, E>> + Send + Unpin + 'static,
    B: AsRef<[u8]>,
    E: 'static,
{
    deltas_of(body, |_| ModelError::Disconnected)
}

/// [`sse_deltas`], a broken body ending the stream with `explain(error)`.
fn deltas_of<S, B, E>(body: S, explain: fn(E) -> ModelError) -> ModelStream
where
    S: Stream<Item = Result<B, E>> + Send + Unpin + 'static,
    B: AsRef<[u8]>,
    E: 'static,
{
    unfold_deltas(DeltaStream::new(body, explain))
}

/// The deltas `state` reads, as a stream.
fn unfold_deltas<S, B, E>(state: DeltaStream<S, E>) -> ModelStream
where
    S: Stream<Item = Result<B, E>> + Send + Unpin + 'static,
    B: AsRef<[u8]>,
    E: 'static,
{
    futures_util::stream::unfold(state, |mut state| async move {
        let item = state.next().await?;
        Some((item, state))
    })
    .boxed()
}

/// Reads events from a body and turns them into deltas.
///
/// The delta with the finish reason is held back until a later chunk brings the usage
/// (OpenAI's trailing `choices: []` chunk), `[DONE]` arrives or the body ends, and is
/// then sent with the usage folded in, as the last delta.
struct DeltaStream<S, E> {
    body: S,
    /// The error a broken body ends the stream with.
    explain: fn(E) -> ModelError,
    parser: SseParser,
    /// Items to hand out before reading more.
    ready: VecDeque<Result<ModelMessageDelta, ModelError>>,
    /// The held delta with the finish reason.
    finishing: Option<ModelMessageDelta>,
    /// Whether the response is whole: the finishing delta was handed to `ready`, or
    /// `[DONE]` arrived. What follows is ignored.
    complete: bool,
    /// Whether nothing is to be read any more.
    ended: bool,
    /// The tool calls seen so far, to number them densely.
    calls: ToolCallSlots,
    /// How long a finished answer waits for its usage before it goes out without it (over
    /// HTTP only: a body given to [`sse_deltas`] may be read without a timer).
    finish_grace: Option<Duration>,
    /// When the finished answer goes out at the latest (set at its first wait).
    finish_deadline: Option<Instant>,
    /// Whether any delta with something in it arrived.
    answered: bool,
}

/// [`DeltaStream::finish_grace`] over HTTP.
const FINISH_GRACE: Duration = Duration::from_secs(2);

/// Numbers a response's tool calls densely (0, 1, 2, … in the order they start), whatever
/// the server's indexes, and gives a call without an id one. Servers differ: most number
/// calls from 0 and send the id once, but Ollama sends every call whole at index 0 with its
/// own id, some proxies start at 1 or send -1, some send no id at all, and some send
/// another id in a call's later chunks. A chunk continues the call at its index with its
/// id (or, without an id, the latest call at its index); a chunk with a new id starts a
/// call when it names a function or no call is at its index, and otherwise continues the
/// latest call there (its id dropped: the first one stays). A chunk without an id that
/// names another function than the latest call at its index starts a call too (a server
/// that sends each call whole, without ids, at one index); one naming the same function
/// again continues it.
#[derive(Debug, Default)]
struct ToolCallSlots {
    /// Per call, in order: the server's index, the call's id and its function's name.
    calls: Vec<(u32, String, Option<String>)>,
}

impl ToolCallSlots {
    fn renumber(&mut self, delta: &mut ModelMessageDelta) {
        for call in &mut delta.tool_calls {
            let at_index = self.calls.iter().rposition(|(index, _, _)| *index == call.index);
            let same = call.id.as_deref().and_then(|id| {
                self.calls.iter().position(|(index, seen, _)| *index == call.index && seen == id)
            });
            let name = call.function.as_ref().and_then(|function| function.name.clone());
            let names = name.is_some();
            let renames = |slot: usize| {
                name.as_ref().is_some_and(|name| {
                    self.calls[slot].2.as_ref().is_some_and(|named| !named.eq_ignore_ascii_case(name))
                })
            };
            let slot = match (same, &call.id, at_index) {
                (Some(slot), _, _) => slot,
                (None, Some(_), Some(slot)) if !names => {
                    call.id = None;
                    slot
                }
                (None, None, Some(slot)) if !renames(slot) => slot,
                (None, _, _) => {
                    let id = call.id.get_or_insert_with(|| format!("call_{}", agentry_types::EventId::new()));
                    self.calls.push((call.index, id.clone(), None));
                    self.calls.len() - 1
                }
            };
            if let (Some(name), Some(named)) = (name, self.calls.get_mut(slot)) {
                named.2.get_or_insert(name);
            }
            call.index = u32::try_from(slot).unwrap_or(u32::MAX);
        }
    }

    const fn any(&self) -> bool {
        !self.calls.is_empty()
    }
}

impl<S, B, E> DeltaStream<S, E>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
{
    fn new(body: S, explain: fn(E) -> ModelError) -> Self {
        Self {
            body,
            explain,
            parser: SseParser::default(),
            ready: VecDeque::new(),
            finishing: None,
            complete: false,
            ended: false,
            calls: ToolCallSlots::default(),
            finish_grace: None,
            finish_deadline: None,
            answered: false,
        }
    }

    async fn next(&mut self) -> Option<Result<ModelMessageDelta, ModelError>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            if self.ended {
                return None;
            }
            if self.complete {
                self.drain();
                continue;
            }
            let mut events = Vec::new();
            let read = match (self.finishing.is_some(), self.finish_grace) {
                // The answer is finished: its usage (or `[DONE]`, or the body's end) comes at
                // once from a server that sends it, and a server that keeps the connection
                // open without either must not hold the answer for the idle timeout.
                (true, Some(grace)) => match tokio::time::timeout_at(
                    *self.finish_deadline.get_or_insert_with(|| Instant::now() + grace),
                    self.body.next(),
                )
                .await
                {
                    Ok(read) => read,
                    Err(_elapsed) => {
                        self.release();
                        self.ended = true;
                        continue;
                    }
                },
                _ => self.body.next().await,
            };
            match read {
                Some(Ok(bytes)) => {
                    if self.parser.push(bytes.as_ref(), &mut events).is_err() {
                        let limit = sse::MAX_EVENT_BYTES;
                        self.fail(ModelError::MalformedChunk(format!(
                            "an event is larger than {limit} bytes"
                        )));
                        continue;
                    }
                    self.handle(events);
                }
                Some(Err(error)) => {
                    let error = (self.explain)(error);
                    self.fail(error);
                }
                None => {
                    self.parser.finish(&mut events);
                    self.handle(events);
                    self.end_of_body();
                }
            }
        }
    }

    fn handle(&mut self, events: Vec<sse::SseEvent>) {
        for data in events {
            if self.ended {
                return;
            }
            match wire::parse_event(&data) {
                Ok(parsed) => {
                    for event in parsed {
                        self.apply(event);
                    }
                }
                Err(error) => self.fail(error),
            }
        }
    }

    fn apply(&mut self, event: StreamEvent) {
        if self.ended {
            return;
        }
        match event {
            StreamEvent::Done if !self.answered && self.finishing.is_none() && !self.complete => {
                // `[DONE]` with nothing before it (a proxy that dropped its upstream's error):
                // no answer, as a body that ends at once.
                self.fail(ModelError::Disconnected);
            }
            StreamEvent::Done => {
                if self.finishing.is_none() && !self.complete {
                    // `[DONE]` without a finish reason (llama.cpp and some proxies): the
                    // response is whole, so it finishes as a response of its kind does.
                    let reason = if self.calls.any() { FinishReason::ToolCalls } else { FinishReason::Stop };
                    self.finishing = Some(ModelMessageDelta {
                        finish_reason: Some(reason),
                        ..ModelMessageDelta::default()
                    });
                }
                self.release();
                self.complete = true;
            }
            StreamEvent::Error(error) => self.fail(error),
            StreamEvent::Delta(delta) => self.on_delta(delta),
        }
    }

    fn on_delta(&mut self, mut delta: ModelMessageDelta) {
        if self.complete {
            return;
        }
        self.calls.renumber(&mut delta);
        self.answered |= !delta.is_empty();
        let Some(finishing) = &mut self.finishing else {
            if delta.finish_reason.is_some() {
                // With its usage in the same chunk, nothing more is awaited.
                let whole = delta.usage.is_some();
                self.finishing = Some(delta);
                if whole {
                    self.release();
                }
            } else if !delta.is_empty() {
                self.ready.push_back(Ok(delta));
            }
            return;
        };
        let usage = delta.usage.take();
        if let Some(reason) = delta.finish_reason.take() {
            finishing.finish_reason = Some(reason);
        }
        if usage.is_some() {
            finishing.usage = usage;
        }
        // Anything else after the finish reason goes out before the finishing delta,
        // which stays last.
        if !delta.is_empty() {
            self.ready.push_back(Ok(delta));
        }
        if usage.is_some() {
            self.release();
        }
    }

    /// Hands out the held finishing delta, if any.
    fn release(&mut self) {
        if let Some(finishing) = self.finishing.take() {
            self.ready.push_back(Ok(finishing));
            self.complete = true;
        }
    }

    /// Reads what has already arrived of a complete response, without waiting for more:
    /// a body whose end is already there (as it usually is right after `[DONE]`) then
    /// leaves its connection free for reuse, and a server that keeps the connection open
    /// after the response cannot hold the stream open.
    fn drain(&mut self) {
        for _ in 0..MAX_DRAINED_CHUNKS {
            match self.body.next().now_or_never() {
                Some(Some(Ok(_))) => {}
                _ => break,
            }
        }
        self.ended = true;
    }

    /// Ends the stream with `error`, unless the response was already complete.
    fn fail(&mut self, error: ModelError) {
        let finished = self.finishing.is_some() || self.complete;
        self.release();
        if !finished {
            self.ready.push_back(Err(error));
        }
        self.ended = true;
    }

    /// Ends the stream at the end of the body, or when it broke off.
    fn end_of_body(&mut self) {
        if !self.ended {
            self.fail(ModelError::Disconnected);
        }
    }
}
