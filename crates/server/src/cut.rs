//! The server's connections: accepted, served over HTTP/1.1, and closed when they hold the
//! server up.
//!
//! - A client that does not send a request's headers within the header timeout (one that
//!   connects and stalls, or trickles its headers in; a kept-alive connection left idle
//!   that long) is closed ([`serve`]): without it each such connection would hold a socket
//!   and a task for ever, and enough of them would exhaust the process's file descriptors.
//! - Once the shutdown grace is over, every connection still open (a client stalled in the
//!   middle of a request, one that stopped reading its response) fails its next read or
//!   write, including one it is waiting on, so its task ends and its socket closes, even
//!   while the process (an application embedding the server) goes on ([`CutListener`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Serves `app` on `listener` until `signal` resolves; then accepts no more connections,
/// lets each open one finish the request it is serving (one between requests closes at
/// once, one in the middle of a request's head at its header timeout), and returns once
/// all are closed. A connection that does not send a request's headers within
/// `header_timeout` of being ready for them is closed without a response.
pub(crate) async fn serve(
    mut listener: CutListener,
    app: Router,
    header_timeout: Duration,
    signal: impl Future<Output = ()> + Send + 'static,
) {
    // Closed (its one receiver dropped) when the signal comes: the accept loop and every
    // connection watch it.
    let (signalled, signal_watch) = watch::channel(());
    tokio::spawn(async move {
        signal.await;
        drop(signal_watch);
    });
    // Each connection holds a receiver until it ends; the sender sees them all gone.
    let (connections_closed, open_connection) = watch::channel(());
    loop {
        let (stream, address) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = signalled.closed() => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let signalled = signalled.clone();
        let open = open_connection.clone();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let mut stopping = false;
            loop {
                tokio::select! {
                    served = connection.as_mut() => {
                        if let Err(error) = served {
                            tracing::debug!(%address, %error, "a connection ended with an error");
                        }
                        break;
                    }
                    () = signalled.closed(), if !stopping => {
                        stopping = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(open);
        });
    }
    drop(open_connection);
    drop(listener);
    connections_closed.closed().await;
}

/// A TCP listener whose connections are cut when `cut` turns true (or its sender goes).
pub(crate) struct CutListener {
    pub(crate) inner: TcpListener,
    pub(crate) cut: watch::Receiver<bool>,
}

impl Listener for CutListener {
    type Io = CutStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CutStream, SocketAddr) {
        // The plain listener's accept, which also rides out errors such as too many open
        // files.
        let (stream, address) = Listener::accept(&mut self.inner).await;
        let mut cut = self.cut.clone();
        let cut = Box::pin(async move {
            let _ = cut.wait_for(|cut| *cut).await;
        });
        (CutStream { inner: stream, cut: Some(cut) }, address)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection that fails its reads and writes once it is cut.
pub(crate) struct CutStream {
    inner: TcpStream,
    /// Resolves when the connection is cut; `None` once it has (a finished future must not
    /// be polled again, and hyper goes on writing after a read failed).
    cut: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl CutStream {
    /// The error of every read and write once the connection is cut; registers the task to
    /// be woken by the cut otherwise.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let cut = match self.cut.as_mut() {
            Some(cut) => cut.as_mut().poll(cx).is_ready(),
            None => true,
        };
        if !cut {
            return Ok(());
        }
        self.cut = None;
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the server stopped: the connection outlived its shutdown grace",
        ))
    }
}

impl AsyncRead for CutStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CutStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{CutListener, Listener as _};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    /// A cut connection fails every read and write, however many follow (hyper goes on
    /// writing after a read failed): the cut is not looked at again once it has come.
    #[tokio::test]
    async fn a_cut_connection_fails_every_read_and_write_after_the_cut() {
        let (cut, watched) = watch::channel(false);
        let mut listener =
            CutListener { inner: TcpListener::bind("127.0.0.1:0").await.unwrap(), cut: watched };
        let address = listener.inner.local_addr().unwrap();
        let _client = TcpStream::connect(address).await.unwrap();
        let (mut stream, _) = listener.accept().await;
        cut.send(true).unwrap();
        let mut buffer = [0u8; 8];
        for _ in 0..3 {
            let read = stream.read(&mut buffer).await.unwrap_err();
            assert_eq!(read.kind(), std::io::ErrorKind::ConnectionAborted, "{read}");
            let written = stream.write_all(b"late").await.unwrap_err();
            assert_eq!(written.kind(), std::io::ErrorKind::ConnectionAborted, "{written}");
            let flushed = stream.flush().await.unwrap_err();
            assert_eq!(flushed.kind(), std::io::ErrorKind::ConnectionAborted, "{flushed}");
        }
    }
}
