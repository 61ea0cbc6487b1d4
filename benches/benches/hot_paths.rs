//! Driver hot paths that run on every routed call: placing a start by
//! rendezvous hashing, minting and decoding ids, building a topology.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sheaf_core::id;
use sheaf_driver::{ExecutionId, Placement, ShardId, Topology};

fn fleet(n: u32) -> Topology {
    (0..n)
        .fold(Topology::builder(), |b, i| {
            b.shard(i, format!("postgres://sheaf@10.0.0.{i}:5432/sheaf"))
        })
        .build()
        .expect("valid topology")
}

fn placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("place (HRW)");
    for n in [4u32, 16, 64] {
        let t = fleet(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &t, |b, t| {
            b.iter(|| {
                t.place(
                    black_box("order_flow"),
                    black_box("order-42"),
                    &Placement::Auto,
                    None,
                )
            })
        });
    }
    group.finish();
}

fn ids(c: &mut Criterion) {
    c.bench_function("id::compose", |b| {
        b.iter(|| {
            id::compose(
                black_box(42),
                black_box(1_764_450_000_123),
                black_box(0x1234_5678_9abc_def0),
            )
        })
    });
    let shard = ShardId::new(42).expect("in range");
    c.bench_function("ExecutionId::mint", |b| {
        b.iter(|| ExecutionId::mint(black_box(shard)))
    });
    let minted = ExecutionId::mint(shard).expect("clock");
    c.bench_function("ExecutionId::shard", |b| b.iter(|| black_box(&minted).shard()));
    let text = minted.to_string();
    c.bench_function("ExecutionId::from_str", |b| {
        b.iter(|| black_box(&text).parse::<ExecutionId>())
    });
}

fn topology(c: &mut Criterion) {
    let spec: String = (0..64)
        .map(|i| format!("{i}=postgres://sheaf@10.0.0.{i}:5432/sheaf"))
        .collect::<Vec<_>>()
        .join(",");
    c.bench_function("Topology::parse 64 shards", |b| {
        b.iter(|| Topology::parse(black_box(&spec)))
    });
}

criterion_group!(benches, placement, ids, topology);
criterion_main!(benches);
