//! Issue 7, acceptance 3: the mutation cases that must fail — a stage that silently drops a layer,
//! stages applied out of order, and a stage loaded from a different model (refused by fingerprint).
//! Each is checked twice: the structural check refuses it, and when run anyway the comparison with
//! the unsplit run fails (or, for another model, the hop is refused on decode).

use daisy_conformance::{Model, check_stages};
use daisy_model::{ForwardPath, Precision, Sampling};
use daisy_wire::Plan;

use crate::common::{options, run_split, run_stages, same_run};

fn prompt(model: &Model) -> Vec<u32> {
    (0..7)
        .map(|i| (i * 53 + 11) % model.config.vocab_size as u32)
        .collect()
}

#[test]
fn a_stage_that_drops_a_layer_fails() {
    for name in ["llama", "gpt2"] {
        let model = Model::tiny(name).expect("tiny model");
        let n = model.config.num_layers;
        let opts = options(4, ForwardPath::FullWindow, Sampling::default());
        let reference = run_split(&model, &[1, n - 1], Precision::F32, &prompt(&model), &opts)
            .expect("reference");
        let plan = Plan::from_counts(&[1, n - 1], n).expect("plan");
        // Stage 1 is assigned layers 1..n but holds 2..n.
        let stages = vec![
            model.stage(0..1, true, Precision::F32).unwrap(),
            model.stage(2..n, false, Precision::F32).unwrap(),
        ];
        assert!(
            check_stages(&plan, &stages).is_err(),
            "{name}: the structural check accepted a stage missing a layer"
        );
        let run = run_stages(&plan, &stages, &prompt(&model), &opts).expect("runs");
        assert!(
            same_run(&reference, &run).is_err(),
            "{name}: a stage missing a layer matched the reference"
        );
    }
}

#[test]
fn stages_out_of_order_fail() {
    for name in ["qwen2", "mistral"] {
        let model = Model::tiny(name).expect("tiny model");
        let n = model.config.num_layers;
        let opts = options(4, ForwardPath::FullWindow, Sampling::default());
        let counts = [1, 1, n - 2];
        let reference =
            run_split(&model, &counts, Precision::F32, &prompt(&model), &opts).expect("reference");
        let plan = Plan::from_counts(&counts, n).expect("plan");
        let stages = vec![
            model.stage(0..1, true, Precision::F32).unwrap(),
            model.stage(2..n, false, Precision::F32).unwrap(),
            model.stage(1..2, false, Precision::F32).unwrap(),
        ];
        assert!(
            check_stages(&plan, &stages).is_err(),
            "{name}: the structural check accepted stages out of order"
        );
        let run = run_stages(&plan, &stages, &prompt(&model), &opts).expect("runs");
        let Err(e) = same_run(&reference, &run) else {
            panic!("{name}: stages out of order matched the reference");
        };
        assert!(!e.is_empty());
    }
}

#[test]
fn a_stage_from_another_model_is_refused_by_fingerprint() {
    let model = Model::tiny("llama").expect("tiny llama");
    let other = Model::tiny("mistral").expect("tiny mistral");
    let n = model.config.num_layers;
    let plan = Plan::from_counts(&[1, n - 1], n).expect("plan");
    let m = other.config.num_layers;
    let stages = vec![
        model.stage(0..1, true, Precision::F32).unwrap(),
        other.stage(1..m, false, Precision::F32).unwrap(),
    ];
    assert!(
        check_stages(&plan, &stages).is_err(),
        "the structural check accepted a stage of another model"
    );
    let err = run_stages(
        &plan,
        &stages,
        &prompt(&model),
        &options(2, ForwardPath::FullWindow, Sampling::default()),
    )
    .expect_err("a stage of another model must be refused");
    assert!(
        format!("{err:#}").contains("fingerprint"),
        "refused, but not by fingerprint: {err:#}"
    );
}
