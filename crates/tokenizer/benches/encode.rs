//! Encoding throughput: 1 MB of mixed text (the committed corpus, shuffled with a fixed seed and
//! repeated) through `daisy-tokenizer` and through Hugging Face `tokenizers` in the same run, for
//! each committed tokenizer fixture (and SmolLM2's when `cargo xtask fixtures` has built it): once as
//! one string, once line by line.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const TEXT_BYTES: usize = 1 << 20;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The corpus strings in a seeded order, joined by newlines, cut to `TEXT_BYTES` at a char boundary.
fn mixed_text() -> String {
    let corpus: Vec<String> = serde_json::from_slice(
        &std::fs::read(root().join("fixtures/tokenizers/corpus.json")).expect("corpus"),
    )
    .expect("corpus.json");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut text = String::with_capacity(TEXT_BYTES + 4096);
    while text.len() < TEXT_BYTES {
        let s = &corpus[(next() % corpus.len() as u64) as usize];
        text.push_str(s);
        text.push('\n');
    }
    let mut cut = TEXT_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text
}

/// (name, tokenizer.json path) of every tokenizer to measure.
fn tokenizers_to_measure() -> Vec<(&'static str, PathBuf)> {
    let mut list = vec![
        (
            "gpt2",
            root().join("fixtures/tokenizers/gpt2/tokenizer.json"),
        ),
        (
            "qwen2-style",
            root().join("fixtures/tokenizers/qwen2-style/tokenizer.json"),
        ),
    ];
    let smol = root().join("target/fixtures/SmolLM2-135M-Instruct/tokenizer.json");
    if smol.exists() {
        list.push(("smollm2", smol));
    }
    list
}

fn encode(c: &mut Criterion) {
    let text = mixed_text();
    let mut group = c.benchmark_group("encode_1MB");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.sample_size(10);
    for (name, path) in tokenizers_to_measure() {
        let json = std::fs::read(&path).expect("tokenizer.json");
        let ours = daisy_tokenizer::Tokenizer::from_json(&json).expect("ours");
        let oracle = tokenizers::Tokenizer::from_bytes(&json).expect("tokenizers");
        // Same ids, or the comparison of speeds means nothing.
        let want = oracle
            .encode_fast(text.as_str(), false)
            .expect("tokenizers encode");
        assert_eq!(
            ours.encode(&text, false),
            want.get_ids(),
            "{name}: ids differ on the bench text"
        );
        group.bench_function(format!("{name}/daisy-tokenizer"), |b| {
            b.iter(|| black_box(ours.encode(black_box(&text), false)))
        });
        group.bench_function(format!("{name}/tokenizers"), |b| {
            b.iter(|| {
                black_box(
                    oracle
                        .encode_fast(black_box(text.as_str()), false)
                        .map(|e| e.len()),
                )
            })
        });
    }
    group.finish();

    // The same megabyte as its lines, one encode call per line: `tokenizers` slows down on one
    // very long input (its per-piece offset bookkeeping), so this is the fairer comparison.
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut group = c.benchmark_group("encode_1MB_by_line");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.sample_size(10);
    for (name, path) in tokenizers_to_measure() {
        let json = std::fs::read(&path).expect("tokenizer.json");
        let ours = daisy_tokenizer::Tokenizer::from_json(&json).expect("ours");
        let oracle = tokenizers::Tokenizer::from_bytes(&json).expect("tokenizers");
        group.bench_function(format!("{name}/daisy-tokenizer"), |b| {
            b.iter(|| {
                lines
                    .iter()
                    .map(|l| ours.encode(black_box(l), false).len())
                    .sum::<usize>()
            })
        });
        group.bench_function(format!("{name}/tokenizers"), |b| {
            b.iter(|| {
                lines
                    .iter()
                    .map(|l| {
                        oracle
                            .encode_fast(black_box(*l), false)
                            .map_or(0, |e| e.len())
                    })
                    .sum::<usize>()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
