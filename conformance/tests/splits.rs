//! Issue 7, acceptance 2: any split of the same run gives identical ids and bit-identical hidden
//! states at every hop (f32, full-window path), for SmolLM2 and every tiny model.
//!
//! The reference is the finest split — the head holding no layers and every layer its own stage —
//! whose hops cover every layer boundary; every other split's hops must match it where they meet.
//! Its own mutation cases are in `mutations.rs`.

use daisy_conformance::{Model, TINY, smollm2_dir};
use daisy_model::{ForwardPath, Precision, Sampling};

use crate::common::{Run, options, per_layer, run_split, same_run};

/// Splits every tiny model is run through (layer counts, head first), by layer count.
pub(crate) fn tiny_splits(n: usize) -> Vec<Vec<usize>> {
    match n {
        3 => vec![
            vec![3],
            vec![0, 3],
            vec![1, 2],
            vec![2, 1],
            vec![0, 1, 2],
            vec![1, 1, 1],
        ],
        4 => vec![
            vec![4],
            vec![0, 4],
            vec![1, 3],
            vec![3, 1],
            vec![0, 2, 2],
            vec![1, 2, 1],
            vec![0, 1, 1, 2],
        ],
        _ => vec![vec![n], vec![0, n], vec![1, n - 1]],
    }
}

/// Run every split and compare each with the per-layer reference.
pub(crate) fn check_splits(
    model: &Model,
    splits: &[Vec<usize>],
    precision: Precision,
    prompt: &[u32],
    path: ForwardPath,
    new_tokens: usize,
) -> Vec<String> {
    let opts = options(new_tokens, path, Sampling::default());
    let n = model.config.num_layers;
    let reference: Run =
        run_split(model, &per_layer(n), precision, prompt, &opts).expect("reference split");
    assert_eq!(
        reference.hops.len(),
        n + 1,
        "the per-layer reference has a hop at every layer boundary"
    );
    let mut faults = Vec::new();
    for counts in splits {
        match run_split(model, counts, precision, prompt, &opts) {
            Ok(run) => {
                if let Err(e) = same_run(&reference, &run) {
                    faults.push(format!("split {counts:?}: {e}"));
                }
            }
            Err(e) => faults.push(format!("split {counts:?}: {e:#}")),
        }
    }
    faults
}

pub(crate) fn smollm2() -> Model {
    Model::open(&smollm2_dir()).expect("SmolLM2 fixture; run `cargo xtask fixtures` first")
}

pub(crate) fn smollm2_prompt(text: &str) -> Vec<u32> {
    let json = std::fs::read(smollm2_dir().join("tokenizer.json")).expect("SmolLM2 tokenizer.json");
    daisy_tokenizer::Tokenizer::from_json(&json)
        .expect("tokenizer")
        .encode(text, true)
}

pub(crate) const SMOLLM2_SPLITS: [&[usize]; 5] = [
    &[30],
    &[10, 10, 10],
    &[1, 14, 15],
    &[0, 15, 15],
    &[5, 5, 5, 5, 5, 5],
];

#[test]
fn tiny_models_split_invariant_f32() {
    let mut faults = Vec::new();
    for name in TINY {
        let model = Model::tiny(name).expect("tiny model");
        let prompt: Vec<u32> = (0..9)
            .map(|i| (i * 37 + 5) % model.config.vocab_size as u32)
            .collect();
        let splits = tiny_splits(model.config.num_layers);
        assert!(
            splits.iter().any(|s| s[0] == 0),
            "a split with a head holding no layers"
        );
        for f in check_splits(
            &model,
            &splits,
            Precision::F32,
            &prompt,
            ForwardPath::FullWindow,
            6,
        ) {
            faults.push(format!("{name}: {f}"));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn smollm2_split_invariant_f32() {
    let model = smollm2();
    let prompt = smollm2_prompt("The capital of France is");
    let splits: Vec<Vec<usize>> = SMOLLM2_SPLITS.iter().map(|s| s.to_vec()).collect();
    let faults = check_splits(
        &model,
        &splits,
        Precision::F32,
        &prompt,
        ForwardPath::FullWindow,
        4,
    );
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}
