//! Server cold start (design §9: ≤ 50 ms): from `Server::start` on a fresh SQLite file
//! (open the store, build the demo agents, bind) to the first accepted request answered
//! (`GET /healthz` over a raw TCP connection). The process's own exec and the shutdown
//! afterwards are outside the measurement.

// A benchmark whose workload fails should stop loudly.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use agentry_benches::http;
use agentry_server::{Config, Server};
use criterion::{Criterion, criterion_group, criterion_main};

fn cold_start(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut group = c.benchmark_group("server");
    group.sample_size(20).measurement_time(Duration::from_secs(10));
    group.bench_function("cold_start_to_first_request", |b| {
        b.to_async(&tokio).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().unwrap();
                let mut config = Config { listen: "127.0.0.1:0".parse().unwrap(), ..Config::default() };
                config.storage.path = dir.path().join("agentry.db");
                let started = Instant::now();
                let server = Server::start(config).await.unwrap();
                let address = server.local_addr();
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let serving = tokio::spawn(server.run(async move {
                    let _ = stopped.await;
                }));
                let response = http::send(address, "GET", "/healthz", None).await.unwrap();
                assert_eq!(response.status, 200);
                total += started.elapsed();
                stop.send(()).unwrap();
                serving.await.unwrap().unwrap();
            }
            total
        });
    });
    group.finish();
}

criterion_group!(benches, cold_start);
criterion_main!(benches);
