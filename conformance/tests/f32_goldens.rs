//! Issue 7, acceptance 1: the f32 reference against the `transformers` goldens of every fixture model.
//!
//! Greedy ids must equal the golden's up to the first step whose golden top-1/top-2 margin is below
//! 1e-3; from there the comparison is teacher-forced (argmax after every position of prompt plus
//! golden continuation, wherever the golden margin is at least 1e-3); the first step's logits must be
//! within 1e-3. The mutation case (a stage missing a layer) must fail the same comparison.

use daisy_conformance::{Model, TINY, golden, smollm2_dir};
use daisy_model::{ForwardPath, Precision, Sampling, Stage};
use daisy_wire::Plan;

use crate::common::{NEAR_TIE, floats, ids, options, run_stages};

/// Every way `stages` disagrees with the golden of `name`.
fn compare(name: &str, plan: &Plan, stages: &[Stage]) -> Vec<String> {
    let g = golden(name).expect("golden");
    let mut faults = Vec::new();
    let new_tokens = g["new_tokens"].as_u64().expect("new_tokens") as usize;
    for p in g["prompts"].as_array().expect("prompts") {
        let pname = p["name"].as_str().unwrap_or("?");
        let prompt = ids(&p["input_ids"]);
        let f32g = &p["f32"];
        let run = match run_stages(
            plan,
            stages,
            &prompt,
            &options(new_tokens, ForwardPath::FullWindow, Sampling::default()),
        ) {
            Ok(r) => r,
            Err(e) => {
                faults.push(format!("{name}/{pname}: run failed: {e:#}"));
                continue;
            }
        };
        let want = ids(&f32g["greedy_ids"]);
        let margins = floats(&f32g["greedy_margins"]);
        let tie = margins
            .iter()
            .position(|&m| m < NEAR_TIE)
            .unwrap_or(want.len());
        if run.ids[..tie] != want[..tie] {
            faults.push(format!(
                "{name}/{pname}: greedy ids {:?}, golden {:?} (compared up to step {tie})",
                run.ids, want
            ));
        }
        for (key_ids, key_logits) in [
            ("first_step_top20_ids", "first_step_top20_logits"),
            ("first_step_sample_ids", "first_step_sample_logits"),
        ] {
            for (id, want) in ids(&f32g[key_ids]).iter().zip(floats(&f32g[key_logits])) {
                let got = run.first_logits[*id as usize] as f64;
                if (got - want).abs() > 1e-3 {
                    faults.push(format!(
                        "{name}/{pname}: first-step logit of {id} is {got}, golden {want}"
                    ));
                }
            }
        }
        // Teacher-forced over prompt + golden continuation.
        let tf = &p["teacher_forced"];
        let tf_ids = ids(&tf["ids"]);
        let mut ring = daisy_conformance::Ring::new(plan, stages, 2);
        match daisy_model::score(&stages[0], &tf_ids, &mut |pass| ring.lap(pass)) {
            Ok(scored) => {
                let want = ids(&tf["f32_argmax"]);
                let margins = floats(&tf["f32_margins"]);
                for (j, ((got, want), m)) in
                    scored.argmax.iter().zip(&want).zip(&margins).enumerate()
                {
                    if *m >= NEAR_TIE && got != want {
                        faults.push(format!("{name}/{pname}: teacher-forced argmax after position {j} is {got}, golden {want}"));
                    }
                }
            }
            Err(e) => faults.push(format!("{name}/{pname}: score failed: {e:#}")),
        }
    }
    faults
}

#[test]
fn f32_matches_transformers_goldens() {
    let mut faults = Vec::new();
    for name in TINY {
        let model = Model::tiny(name).expect("tiny model");
        let (plan, stages) = model
            .split(&[model.config.num_layers], Precision::F32)
            .expect("stages");
        faults.extend(compare(name, &plan, &stages));
    }
    // The real model too: its golden is `fixtures/goldens/SmolLM2-135M-Instruct.json`.
    let model = Model::open(&smollm2_dir()).expect("SmolLM2 (run `cargo xtask fixtures` first)");
    let (plan, stages) = model
        .split(&[model.config.num_layers], Precision::F32)
        .expect("stages");
    faults.extend(compare("SmolLM2-135M-Instruct", &plan, &stages));
    assert!(
        faults.is_empty(),
        "{} differences:\n{}",
        faults.len(),
        faults.join("\n")
    );
}

#[test]
fn f32_goldens_catch_a_dropped_layer() {
    for name in TINY {
        let model = Model::tiny(name).expect("tiny model");
        let n = model.config.num_layers;
        // The head claims every layer but silently skips the last one.
        let plan = Plan::from_counts(&[n], n).expect("plan");
        let stages = vec![model.stage(0..n - 1, true, Precision::F32).expect("stage")];
        let faults = compare(name, &plan, &stages);
        assert!(
            !faults.is_empty(),
            "{name}: a stage missing layer {} still matched the goldens",
            n - 1
        );
    }
}
