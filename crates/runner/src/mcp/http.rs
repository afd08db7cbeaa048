//! The HTTP client of the streamable HTTP transport.
//!
//! `rmcp`'s streamable HTTP client is built on reqwest (the workspace's one reqwest, 0.13),
//! with rustls and no crypto provider: the client here is configured with the `ring`
//! provider explicitly (no process-wide default is installed, nothing needs cmake) and the
//! platform's certificate verifier, as the OpenAI-compatible provider of `agentry-model`
//! does. It wraps reqwest only to record the `Mcp-Session-Id` the server assigns, which
//! `rmcp` keeps to itself, so `mcp.initialize` can report it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use rustls_platform_verifier::BuilderVerifierExt;

/// Redirects followed for one request, like `rmcp`'s own client.
const MAX_REDIRECTS: usize = 10;

/// The session id the server assigned, shared between the client and the connection.
pub(crate) type SessionIdCell = Arc<Mutex<Option<String>>>;

/// A reqwest client that records the session id the server assigns.
#[derive(Debug, Clone)]
pub(crate) struct SessionRecordingClient {
    inner: reqwest::Client,
    session_id: SessionIdCell,
}

impl SessionRecordingClient {
    /// A client with rustls over `ring`, the platform verifier, no idle connection pool
    /// (as `rmcp`'s default client, to avoid delayed-ACK stalls on reused connections) and
    /// only same-origin 307/308 redirects followed (others would drop the JSON-RPC body or
    /// replay the session id and headers to another host).
    pub(crate) fn new() -> Result<(Self, SessionIdCell), String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| format!("TLS setup failed: {error}"))?
            .with_platform_verifier()
            .map_err(|error| format!("TLS setup failed: {error}"))?
            .with_no_client_auth();
        let inner = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .pool_max_idle_per_host(0)
            .redirect(same_origin_redirects())
            .build()
            .map_err(|error| format!("the HTTP client could not be built: {error}"))?;
        let session_id = SessionIdCell::default();
        Ok((Self { inner, session_id: session_id.clone() }, session_id))
    }

    fn record(&self, session_id: Option<&str>) {
        if let Some(session_id) = session_id {
            let mut cell = self.session_id.lock().unwrap_or_else(PoisonError::into_inner);
            if cell.as_deref() != Some(session_id) {
                *cell = Some(session_id.to_owned());
            }
        }
    }

    /// Records the session id of a response, and turns a JSON-RPC error that names no
    /// request (`id` null or absent: TypeScript SDK servers answer so, with 400, when
    /// their session is gone) into a transport error: forwarded as is, no request waiting
    /// for an answer would ever get it, and the call would wait for its whole timeout. A
    /// lost session (the error says so while one was attached) counts as expired, so the
    /// transport opens a new one and sends the request again.
    fn check_response(
        &self,
        response: Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>,
        session_attached: bool,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        self.record_response(&response);
        match response {
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), _)) if error.id.is_none() => {
                let message = error.error.message;
                if session_attached && message.to_ascii_lowercase().contains("session") {
                    Err(StreamableHttpError::SessionExpired)
                } else {
                    Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
                        "the server answered with an error for no request: {message} (JSON-RPC error {})",
                        error.error.code.0
                    ))))
                }
            }
            other => other,
        }
    }

    fn record_response(
        &self,
        response: &Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>,
    ) {
        if let Ok(
            StreamableHttpPostResponse::Json(_, session_id) | StreamableHttpPostResponse::Sse(_, session_id),
        ) = response
        {
            self.record(session_id.as_deref());
        }
    }
}

fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin =
            attempt.previous().first().is_some_and(|original| original.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

impl StreamableHttpClient for SessionRecordingClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.record(session_id.as_deref());
        let attached = session_id.is_some();
        let response = self.inner.post_message(uri, message, session_id, auth_header, custom_headers).await;
        self.check_response(response, attached)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.record(session_id.as_deref());
        let attached = session_id.is_some();
        let response = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.check_response(response, attached)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.inner.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// Parses configured headers into HTTP headers.
pub(crate) fn parse_headers(
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<HashMap<HeaderName, HeaderValue>, String> {
    headers
        .iter()
        .map(|(name, value)| {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid HTTP header name"))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| format!("the value of the header `{name}` is not valid in HTTP"))?;
            value.set_sensitive(true);
            Ok((header, value))
        })
        .collect()
}
