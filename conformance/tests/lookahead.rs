//! Lookahead (DESIGN §3 Paths): drafts scored in the lap of the next token make their own
//! deterministic path. Every split of every tiny model gives the ids and hop bits of the per-layer
//! reference with lookahead on, on both paths, greedy and seeded, in int8 (the product); drafts are
//! really sent and some are kept; and the mutation — stages out of order — fails the comparison.

use daisy_conformance::{Model, TINY, check_stages};
use daisy_model::{ForwardPath, GenerateOptions, Precision, Sampling};
use daisy_wire::Plan;

use crate::common::{options, per_layer, run_split, run_stages, same_run};
use crate::splits::tiny_splits;

/// A prompt that repeats a 4-token pattern four times, so lookahead has something to draft.
fn repetitive(model: &Model) -> Vec<u32> {
    let v = model.config.vocab_size as u32;
    (0..16).map(|i| ((i % 4) * 37 + 5) % v).collect()
}

fn with_lookahead(path: ForwardPath, sampling: Sampling) -> GenerateOptions {
    GenerateOptions {
        lookahead: 8,
        ..options(12, path, sampling)
    }
}

const SAMPLINGS: [Sampling; 2] = [
    Sampling {
        temperature: 0.0,
        seed: 0,
        top_p: 1.0,
    },
    Sampling {
        temperature: 0.8,
        seed: 7,
        top_p: 1.0,
    },
];

#[test]
fn lookahead_is_split_invariant_on_both_paths() {
    let mut faults = Vec::new();
    let (mut drafted, mut accepted) = (0, 0);
    for name in TINY {
        let model = Model::tiny(name).expect("tiny model");
        let n = model.config.num_layers;
        let prompt = repetitive(&model);
        for path in [ForwardPath::FullWindow, ForwardPath::Cached] {
            for sampling in SAMPLINGS {
                let opts = with_lookahead(path, sampling);
                let case = format!("{name} {path:?} T={}", sampling.temperature);
                let reference = run_split(&model, &per_layer(n), Precision::Int8, &prompt, &opts)
                    .expect("reference split");
                drafted += reference.drafted;
                accepted += reference.accepted;
                for counts in tiny_splits(n) {
                    match run_split(&model, &counts, Precision::Int8, &prompt, &opts) {
                        Ok(run) => {
                            if let Err(e) = same_run(&reference, &run) {
                                faults.push(format!("{case} split {counts:?}: {e}"));
                            }
                            if (run.drafted, run.accepted)
                                != (reference.drafted, reference.accepted)
                            {
                                faults.push(format!("{case} split {counts:?}: other drafts"));
                            }
                        }
                        Err(e) => faults.push(format!("{case} split {counts:?}: {e:#}")),
                    }
                }
            }
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
    assert!(
        drafted > 0 && accepted > 0,
        "lookahead drafted {drafted} and kept {accepted}: the test proves nothing"
    );
}

#[test]
fn lookahead_with_stages_out_of_order_fails() {
    let model = Model::tiny("llama").expect("tiny model");
    let n = model.config.num_layers;
    let prompt = repetitive(&model);
    for path in [ForwardPath::FullWindow, ForwardPath::Cached] {
        let opts = with_lookahead(path, SAMPLINGS[0]);
        let counts = [1, 1, n - 2];
        let reference =
            run_split(&model, &counts, Precision::Int8, &prompt, &opts).expect("reference");
        let plan = Plan::from_counts(&counts, n).expect("plan");
        let stages = vec![
            model.stage(0..1, true, Precision::Int8).unwrap(),
            model.stage(2..n, false, Precision::Int8).unwrap(),
            model.stage(1..2, false, Precision::Int8).unwrap(),
        ];
        assert!(check_stages(&plan, &stages).is_err());
        let run = run_stages(&plan, &stages, &prompt, &opts).expect("runs");
        assert!(
            same_run(&reference, &run).is_err(),
            "{path:?}: stages out of order matched the reference under lookahead"
        );
    }
}
