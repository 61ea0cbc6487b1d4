//! Driver hot paths that run on every routed call: minting and decoding ids,
//! parsing a shard list.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sheaf_core::id;
use sheaf_driver::Topology;

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
    let minted = id::compose(42, 1_764_450_000_123, 7).expect("in range");
    c.bench_function("id::shard_of", |b| b.iter(|| id::shard_of(black_box(&minted))));
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

criterion_group!(benches, ids, topology);
criterion_main!(benches);
