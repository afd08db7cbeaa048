//! A minimal HTTP/1.1 client over a raw TCP connection, for measuring the server without a
//! client library's overhead in the figures: one request per connection
//! (`Connection: close`), JSON bodies, and SSE responses read frame by frame.

use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// An open response: its status, and the body to read.
#[derive(Debug)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    reader: BufReader<TcpStream>,
}

/// Sends a request; `body` is JSON when given.
pub async fn send(address: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Result<Response> {
    let mut stream = TcpStream::connect(address).await.context("connecting")?;
    stream.set_nodelay(true)?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let status =
        line.split_whitespace().nth(1).and_then(|code| code.parse().ok()).context("no status line")?;
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 {
            bail!("the response ended in its headers");
        }
        if line == "\r\n" {
            break;
        }
    }
    Ok(Response { status, reader })
}

impl Response {
    /// The whole body (the server closes the connection after it).
    pub async fn text(mut self) -> Result<String> {
        let mut body = String::new();
        self.reader.read_to_string(&mut body).await?;
        Ok(body)
    }

    /// The next SSE `data:` payload; `None` at the end of the stream. Chunked transfer
    /// framing lines (sizes) are skipped: SSE lines never look like bare hex numbers
    /// followed by nothing else, except by accident of content, which `data:` avoids.
    pub async fn next_data(&mut self) -> Result<Option<String>> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line).await? == 0 {
                return Ok(None);
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return Ok(Some(data.to_owned()));
            }
        }
    }
}
