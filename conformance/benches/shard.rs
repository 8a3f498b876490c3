//! The flat shard's restart (issue 18): a ring member's slice of SmolLM2 (layers 2..30, int8),
//! written to its shard once, then timed three ways with the file in the page cache —
//! `shard/read-file` reads the whole file into memory (the yardstick), `shard/restart-mapped` is
//! [`Stage::load_mapped`] (the stage ready: header checked, file mapped, arrays borrowed in place),
//! and `shard/restart-and-first-pass` adds the first forward of one row, which checks every
//! layer's SHA-256 as it first runs it. `shard/load-from-checkpoint` is the start without a shard
//! (widen and quantize every layer from safetensors). `cargo xtask bench` prints each restart ÷
//! the read.

use criterion::{Criterion, criterion_group, criterion_main};
use daisy_conformance::{Model, smollm2_dir};
use daisy_model::{Precision, Stage};

fn shard(c: &mut Criterion) {
    let model = Model::open(&smollm2_dir()).expect("SmolLM2 fixture (cargo xtask fixtures)");
    let layers = 2..model.config.num_layers;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("member.shard");
    model
        .stage(layers.clone(), false, Precision::Int8)
        .unwrap()
        .write_shard(&path)
        .unwrap();
    let map = || {
        Stage::load_mapped(
            &model.checkpoint,
            &model.config,
            layers.clone(),
            false,
            Precision::Int8,
            &path,
        )
        .unwrap()
        .expect("the shard just written")
    };
    let mut g = c.benchmark_group("shard");
    g.sample_size(20);
    g.bench_function("read-file", |b| {
        b.iter(|| std::fs::read(&path).unwrap().len())
    });
    g.bench_function("restart-mapped", |b| b.iter(|| map().layers()));
    let h = model.config.hidden_size;
    g.bench_function("restart-and-first-pass", |b| {
        b.iter(|| {
            let stage = map();
            let mut x = vec![0.5f32; h];
            stage.forward(&mut x, 1, 0, None).unwrap();
            x[0]
        })
    });
    g.sample_size(10);
    g.bench_function("load-from-checkpoint", |b| {
        b.iter(|| {
            model
                .stage(layers.clone(), false, Precision::Int8)
                .unwrap()
                .layers()
        })
    });
    g.finish();
}

criterion_group!(benches, shard);
criterion_main!(benches);
