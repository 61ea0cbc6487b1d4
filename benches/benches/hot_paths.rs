//! Driver hot paths that run on every routed call: placing a start by
//! rendezvous hashing, minting and decoding ids, building a topology,
//! merging a listing page from the shards and its cursor.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use sheaf_core::id;
use sheaf_core::page::{Cursor, SortOrder, merge_sorted};
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

/// 16 shards' runs of 51 rows each (a page of 50 plus one to tell whether
/// there is a next page), sorted newest first, interleaved across shards.
fn shard_runs() -> Vec<Vec<(i64, uuid::Uuid)>> {
    let base = 1_764_450_000_000_000i64;
    (0..16u32)
        .map(|shard| {
            (0..51u32)
                .map(|row| {
                    let created = base - i64::from(row) * 7_919 - i64::from(shard) * 997;
                    let id = uuid::Uuid::from_u128(u128::from(shard) << 96 | u128::from(row));
                    (created, id)
                })
                .collect()
        })
        .collect()
}

fn pages(c: &mut Criterion) {
    let mut group = c.benchmark_group("pages");
    let runs = shard_runs();
    group.bench_function("merge_16x51", |b| {
        b.iter_batched(
            || runs.clone(),
            |runs| merge_sorted(runs, SortOrder::Desc, black_box(50), |row| *row),
            BatchSize::SmallInput,
        )
    });
    let cursor = Cursor {
        order: SortOrder::Desc,
        created_micros: 1_764_450_000_123_456,
        id: uuid::Uuid::from_u128(0x0193_7a2b_4c5d_7e6f_8091_a2b3_c4d5_e6f7),
        filter: 0xdead_beef_0123_4567,
    };
    group.bench_function("cursor_encode", |b| b.iter(|| black_box(&cursor).encode()));
    let text = cursor.encode();
    group.bench_function("cursor_decode", |b| b.iter(|| Cursor::decode(black_box(&text))));
    group.finish();
}

criterion_group!(benches, placement, ids, topology, pages);
criterion_main!(benches);
