//! Load on the server (issue 6 benchmarks): `C` concurrent SSE clients on the `demo` agent
//! each run `T` streamed turns back to back; reports turns per second and the time from
//! sending a turn request to its first SSE event (p50, p99). Then opens `N` idle
//! `/global/event` subscribers and reports the server's resident memory per subscriber.
//!
//! ```sh
//! cargo run --release -p agentry-benches --bin agentry-load -- [clients=100] [turns=20] [idle=2000]
//! ```
//!
//! The server runs in this process on a fresh SQLite file (`batched`), reached over
//! loopback TCP with a minimal HTTP client.

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use agentry_benches::http;
use agentry_server::{Config, Server};
use anyhow::{Context, Result, bail};

fn arg(index: usize, default: usize) -> usize {
    std::env::args().nth(index).and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// Resident memory of this process, in bytes.
fn rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).context("no VmRSS")?;
    let kib: u64 = line.split_whitespace().nth(1).context("no VmRSS value")?.parse()?;
    Ok(kib * 1024)
}

/// One client: a session, then `turns` streamed turns; returns each time to first event.
async fn client(address: std::net::SocketAddr, turns: usize) -> Result<Vec<Duration>> {
    let created =
        http::send(address, "POST", "/v1/agents/sessions", Some(r#"{"agent_name":"demo"}"#)).await?;
    let body: serde_json::Value = serde_json::from_str(&created.text().await?)?;
    let session = body["data"]["id"].as_str().context("no session id")?.to_owned();
    let path = format!("/v1/agents/sessions/{session}/turns");
    let request = r#"{"input":[{"type":"user.message","content":"hello load"}],"stream":true}"#;
    let mut firsts = Vec::with_capacity(turns);
    for _ in 0..turns {
        let started = Instant::now();
        let mut response = http::send(address, "POST", &path, Some(request)).await?;
        if response.status != 200 {
            let status = response.status;
            bail!("turn refused with {status}: {}", response.text().await.unwrap_or_default());
        }
        let mut first = None;
        while let Some(data) = response.next_data().await? {
            first.get_or_insert_with(|| started.elapsed());
            if data.contains(r#""type":"turn.done""#) {
                break;
            }
        }
        firsts.push(first.context("a turn streamed nothing")?);
    }
    Ok(firsts)
}

/// Resident memory added by `count` idle connections to a listener that accepts and holds
/// them, each client reading its first line like a feed subscriber.
async fn idle_connections(count: usize) -> Result<u64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while held.len() < count {
            let Ok((mut socket, _)) = listener.accept().await else { break };
            let _ =
                tokio::io::AsyncWriteExt::write_all(&mut socket, b"HTTP/1.1 200 OK\r\n\r\ndata: x\n\n").await;
            held.push(socket);
        }
        held
    });
    let before = rss()?;
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let mut response = http::send(address, "GET", "/", None).await?;
        response.next_data().await?.context("no first line")?;
        clients.push(response);
    }
    let held = holding.await?;
    let after = rss()?;
    drop((clients, held));
    Ok(after.saturating_sub(before))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

#[tokio::main]
async fn main() -> Result<()> {
    let (clients, turns, idle) = (arg(1, 100), arg(2, 20), arg(3, 2000));
    let dir = tempfile::tempdir()?;
    let mut config = Config { listen: "127.0.0.1:0".parse()?, ..Config::default() };
    config.storage.path = dir.path().join("agentry.db");
    config.runtime.live_retention_secs = 1;
    let server = Server::start(config).await?;
    let address = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));

    let started = Instant::now();
    let tasks: Vec<_> = (0..clients).map(|_| tokio::spawn(client(address, turns))).collect();
    let mut firsts = Vec::new();
    for task in tasks {
        firsts.extend(task.await??);
    }
    let elapsed = started.elapsed();
    firsts.sort();
    #[allow(clippy::cast_precision_loss)]
    let per_second = firsts.len() as f64 / elapsed.as_secs_f64();
    println!("{clients} SSE clients x {turns} turns on demo: {per_second:.0} turns/s over {elapsed:.2?}");
    println!(
        "time to first event: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        percentile(&firsts, 0.5),
        percentile(&firsts, 0.99),
        firsts.last().copied().unwrap_or_default()
    );

    // Idle subscribers: connected to /global/event, reading nothing more.
    let before = rss()?;
    let mut subscribers = Vec::with_capacity(idle);
    for _ in 0..idle {
        let mut response = http::send(address, "GET", "/global/event", None).await?;
        let connected = response.next_data().await?.context("no server.connected")?;
        if !connected.contains("server.connected") {
            bail!("unexpected first frame {connected}");
        }
        subscribers.push(response);
    }
    let after = rss()?;
    // The same number of idle connections, read the same way, to a listener that only
    // holds them: what the client side and the sockets cost, to subtract.
    let baseline = idle_connections(idle).await?;
    #[allow(clippy::cast_precision_loss)]
    let per_subscriber = after.saturating_sub(before) as f64 / idle as f64;
    #[allow(clippy::cast_precision_loss)]
    let per_connection = baseline as f64 / idle as f64;
    println!(
        "{idle} idle /global/event subscribers: {:.1} KiB resident each with the client side, \
         {:.1} KiB for a bare held connection with the same client: {:.1} KiB for the server's subscriber",
        per_subscriber / 1024.0,
        per_connection / 1024.0,
        (per_subscriber - per_connection) / 1024.0
    );
    drop(subscribers);
    let _ = stop.send(());
    serving.await??;
    Ok(())
}
