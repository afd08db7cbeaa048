//! Connections the server can cut. Once the shutdown grace is over, every connection still
//! open (a client stalled in the middle of a request, one that stopped reading its
//! response) fails its next read or write, including one it is waiting on, so its task
//! ends and its socket closes, even while the process (an application embedding the
//! server) goes on.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

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
        (CutStream { inner: stream, cut }, address)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection that fails its reads and writes once it is cut.
pub(crate) struct CutStream {
    inner: TcpStream,
    cut: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl CutStream {
    /// The error of every read and write once the connection is cut; registers the task to
    /// be woken by the cut otherwise.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.cut.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the server stopped: the connection outlived its shutdown grace",
            )),
            Poll::Pending => Ok(()),
        }
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
