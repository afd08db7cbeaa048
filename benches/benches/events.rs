//! Benchmarks of the event layer: serialization, each renderer, and delta merging.

// A benchmark whose workload fails should stop loudly.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use agentry_benches::{long_answer, sample_events};
use agentry_events::render::{adalflow, agent_team, agno, agui, harness};
use agentry_events::{EventEnvelope, MessageBuilder, TurnEmitter, TurnSequencer};
use agentry_types::{SessionId, ThreadId, TurnId};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn elements(events: &[EventEnvelope]) -> Throughput {
    Throughput::Elements(u64::try_from(events.len()).unwrap_or(u64::MAX))
}

fn serialization(c: &mut Criterion) {
    let events = sample_events().unwrap();
    let mut group = c.benchmark_group("serialize");
    group.throughput(elements(&events));
    group.bench_function("envelope_to_json", |b| {
        let mut buffer = Vec::with_capacity(4096);
        b.iter(|| {
            for event in &events {
                buffer.clear();
                serde_json::to_writer(&mut buffer, black_box(event)).unwrap();
            }
            buffer.len()
        });
    });
    let encoded: Vec<Vec<u8>> = events.iter().map(|event| serde_json::to_vec(event).unwrap()).collect();
    group.bench_function("envelope_from_json", |b| {
        b.iter(|| {
            for bytes in &encoded {
                black_box(serde_json::from_slice::<EventEnvelope>(black_box(bytes)).unwrap());
            }
        });
    });
    group.finish();
}

/// Renders and serializes every sample event with a fresh renderer per iteration.
fn bench_renderer<R, T: serde::Serialize>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    events: &[EventEnvelope],
    new: impl Fn() -> R,
    render: impl Fn(&mut R, &EventEnvelope) -> Vec<T>,
) {
    let mut buffer = Vec::with_capacity(4096);
    group.bench_function(name, |b| {
        b.iter(|| {
            let mut renderer = new();
            for event in events {
                for rendered in render(&mut renderer, black_box(event)) {
                    buffer.clear();
                    serde_json::to_writer(&mut buffer, &rendered).unwrap();
                }
            }
        });
    });
}

fn renderers(c: &mut Criterion) {
    let events = sample_events().unwrap();
    let mut group = c.benchmark_group("render_and_serialize");
    group.throughput(elements(&events));
    bench_renderer(&mut group, "harness", &events, || (), |(), e| harness::render(e).into_iter().collect());
    bench_renderer(
        &mut group,
        "agent_team",
        &events,
        || (),
        |(), e| agent_team::render(e).into_iter().collect(),
    );
    bench_renderer(
        &mut group,
        "agno",
        &events,
        || agno::AgnoRenderer::new(agno::AgnoContext::default()),
        |r, e| r.render(e).into_iter().collect(),
    );
    bench_renderer(&mut group, "adalflow", &events, adalflow::AdalFlowRenderer::new, |r, e| r.render(e));
    bench_renderer(&mut group, "agui", &events, agui::AguiRenderer::new, |r, e| r.render(e));
    group.finish();
}

fn merging(c: &mut Criterion) {
    let (id, deltas) = long_answer(1000);
    let mut group = c.benchmark_group("merge_deltas");
    group.throughput(Throughput::Elements(u64::try_from(deltas.len()).unwrap_or(u64::MAX)));
    group.bench_function("message_builder", |b| {
        b.iter(|| {
            let mut builder = MessageBuilder::new();
            for delta in &deltas {
                builder.push(id, black_box(delta)).unwrap();
            }
            builder.build().unwrap()
        });
    });
    group.bench_function("turn_emitter", |b| {
        b.iter(|| {
            let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
            for delta in &deltas {
                black_box(emitter.delta(ThreadId::main(), id, delta.clone()).unwrap());
            }
        });
    });
    group.finish();
}

criterion_group!(benches, serialization, renderers, merging);
criterion_main!(benches);
