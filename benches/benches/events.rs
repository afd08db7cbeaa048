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

fn renderers(c: &mut Criterion) {
    let events = sample_events().unwrap();
    let mut group = c.benchmark_group("render_and_serialize");
    group.throughput(elements(&events));
    let mut buffer = Vec::with_capacity(4096);
    group.bench_function("harness", |b| {
        b.iter(|| {
            for event in &events {
                if let Some(rendered) = harness::render(black_box(event)) {
                    buffer.clear();
                    serde_json::to_writer(&mut buffer, &rendered).unwrap();
                }
            }
        });
    });
    group.bench_function("agent_team", |b| {
        b.iter(|| {
            for event in &events {
                if let Some(rendered) = agent_team::render(black_box(event)) {
                    buffer.clear();
                    serde_json::to_writer(&mut buffer, &rendered).unwrap();
                }
            }
        });
    });
    group.bench_function("agno", |b| {
        b.iter(|| {
            let mut renderer = agno::AgnoRenderer::new(agno::AgnoContext::default());
            for event in &events {
                if let Some(rendered) = renderer.render(black_box(event)) {
                    buffer.clear();
                    serde_json::to_writer(&mut buffer, &rendered).unwrap();
                }
            }
        });
    });
    group.bench_function("adalflow", |b| {
        b.iter(|| {
            let mut renderer = adalflow::AdalFlowRenderer::new();
            for event in &events {
                for rendered in renderer.render(black_box(event)) {
                    buffer.clear();
                    serde_json::to_writer(&mut buffer, &rendered).unwrap();
                }
            }
        });
    });
    group.bench_function("agui", |b| {
        b.iter(|| {
            let mut renderer = agui::AguiRenderer::new();
            for event in &events {
                for rendered in renderer.render(black_box(event)) {
                    buffer.clear();
                    serde_json::to_writer(&mut buffer, &rendered).unwrap();
                }
            }
        });
    });
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
