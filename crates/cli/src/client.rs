//! A small client of the harness HTTP API: JSON calls and SSE streams.

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use serde_json::Value;
use std::sync::Arc;

/// The server and the credentials to reach it.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

/// An open event stream.
pub type Events = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<SseEvent>> + Send>>;

/// One SSE event: its `id` and its `data` parsed as JSON.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: Value,
}

impl Api {
    pub fn new(base: &str, key: Option<String>) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls =
            rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()?;
        let tls =
            rustls_platform_verifier::BuilderVerifierExt::with_platform_verifier(tls)?.with_no_client_auth();
        let http = reqwest::Client::builder().tls_backend_preconfigured(tls).build()?;
        Ok(Self { http, base: base.trim_end_matches('/').to_owned(), key })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// The error a response carries, from its `RequestErrorResponse` body.
    async fn failure(response: reqwest::Response) -> anyhow::Error {
        let status = response.status();
        let body: Value = response.json().await.unwrap_or_default();
        let message = body["error"]["message"].as_str().unwrap_or("no error message").to_owned();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return anyhow!(
                "the server answered {status}: {message} (pass --api-key or set AGENTRY_API_KEY)"
            );
        }
        anyhow!("the server answered {status}: {message}")
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value> {
        let response =
            request.send().await.with_context(|| format!("cannot reach the server at {}", self.base))?;
        if !response.status().is_success() {
            return Err(Self::failure(response).await);
        }
        Ok(response.json().await?)
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Value> {
        self.send(self.request(reqwest::Method::DELETE, path)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.send(self.request(reqwest::Method::POST, path).json(body)).await
    }

    /// Reopens a stream after `last_event_id` (`POST path {}`), retrying a connection the
    /// server refuses (it may be restarting) with backoff: 0.5 s doubling up to 4 s, six
    /// tries in all.
    pub async fn resume(&self, path: &str, last_event_id: Option<&str>) -> Result<Events> {
        let mut delay = std::time::Duration::from_millis(500);
        let mut tries = 1;
        loop {
            match self.stream(path, Some(&serde_json::json!({})), last_event_id).await {
                Ok(events) => return Ok(events),
                Err(error) if tries < 6 && error.to_string().contains("cannot reach the server") => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(4));
                    tries += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Opens an SSE stream with a POST (`body`) or a GET (`None`), resuming after
    /// `last_event_id` when given.
    pub async fn stream(
        &self,
        path: &str,
        body: Option<&Value>,
        last_event_id: Option<&str>,
    ) -> Result<Events> {
        let mut request = match body {
            Some(body) => self.request(reqwest::Method::POST, path).json(body),
            None => self.request(reqwest::Method::GET, path),
        };
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response =
            request.send().await.with_context(|| format!("cannot reach the server at {}", self.base))?;
        if !response.status().is_success() {
            return Err(Self::failure(response).await);
        }
        let bytes = response.bytes_stream();
        Ok(Box::pin(futures_util::stream::unfold(
            (bytes, SseParser::default(), std::collections::VecDeque::new()),
            |(mut bytes, mut parser, mut ready)| async move {
                loop {
                    if let Some(event) = ready.pop_front() {
                        return Some((Ok(event), (bytes, parser, ready)));
                    }
                    match bytes.next().await {
                        Some(Ok(chunk)) => match parser.feed(&chunk) {
                            Ok(events) => ready.extend(events),
                            Err(error) => return Some((Err(error), (bytes, parser, ready))),
                        },
                        Some(Err(error)) => {
                            return Some((
                                Err(anyhow!("the event stream broke: {error}")),
                                (bytes, parser, ready),
                            ));
                        }
                        None => return None,
                    }
                }
            },
        )))
    }
}

/// Splits an SSE byte stream into events (`id:` and `data:` fields; comments ignored).
#[derive(Debug, Default)]
struct SseParser {
    buffer: Vec<u8>,
    id: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8(line).map_err(|_| anyhow!("the event stream is not UTF-8"))?;
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    let text = self.data.join("\n");
                    self.data.clear();
                    let data =
                        serde_json::from_str(&text).with_context(|| format!("bad event data: {text}"))?;
                    events.push(SseEvent { id: self.id.clone(), data });
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => self.id = Some(value.to_owned()),
                "data" => self.data.push(value.to_owned()),
                _ => {}
            }
        }
        if self.buffer.len() > 16 * 1024 * 1024 {
            bail!("an event is larger than 16 MiB");
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_are_reassembled() {
        let mut parser = SseParser::default();
        assert!(parser.feed(b"id: 1\ndata: {\"a\"").unwrap().is_empty());
        let events = parser.feed(b": 1}\n\n: keep-alive\n\nid: 2\r\ndata: 2\r\n\r\n").unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].id.as_deref(), Some("1"));
        assert_eq!(events[0].data["a"], 1);
        assert_eq!(events[1].data, 2);
    }

    #[test]
    fn bad_event_data_is_an_error() {
        let mut parser = SseParser::default();
        assert!(parser.feed(b"data: {not json\n\n").is_err());
    }
}
