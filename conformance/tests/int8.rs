//! Issue 8: the int8 product path.
//!
//! - Faithful to the contract: teacher-forced int8 argmax against the fixtures' independent int8
//!   reference (PyTorch fake-quant of DESIGN.md §3), at least 99% equal over positions whose
//!   reference margin is at least 1e-3, for every fixture model (the four tiny ones and
//!   SmolLM2-135M-Instruct: its five prompts and the 2,064-token essay). Mutation: the f32 reference
//!   scored the same way (a quietly-f32 "int8") must fall below the bar on some tiny model.
//! - Bit for bit: every decoder layer's int8 output over each golden prompt has the SHA-256 the
//!   reference recorded, for every fixture model. Mutation: the f32 path's hashes differ.
//! - SmolLM2, int8, both paths: the five splits give identical ids and bit-identical hop hashes.
//! - The seeded sampler at temperature 0.8: the same ids across splits and paths; another seed differs.

use daisy_conformance::{Model, TINY};
use daisy_model::{ForwardPath, Precision, Sampling, Scored};

use crate::common::{NEAR_TIE, floats, ids, options, per_layer, run_split, same_run, score_split};
use crate::splits::{SMOLLM2_SPLITS, check_splits, smollm2, smollm2_prompt};

/// Every fixture model with an int8 golden: the tiny ones and SmolLM2-135M-Instruct.
pub(crate) const SMOLLM2: &str = "SmolLM2-135M-Instruct";

/// The quality issue's bar on a text: top-1 agreement with f32 at least 95% and perplexity at most
/// 0.6% above f32's.
pub(crate) fn meets_the_f32_bar(top1: f64, ratio: f64) -> bool {
    top1 >= 0.95 && ratio <= 1.006
}

/// (agreeing, compared) positions of our teacher-forced argmax at `precision` against the golden
/// argmax of reference `mode` (`int8` or `int8x2`), and our score of the text.
pub(crate) fn agreement(
    model: &Model,
    name: &str,
    precision: Precision,
    mode: &str,
) -> (usize, usize, Scored) {
    let g = daisy_conformance::golden(name).expect("golden");
    let n = model.config.num_layers;
    let (mut agree, mut total) = (0, 0);
    let mut cases: Vec<(Vec<u32>, Vec<u32>, Vec<f64>)> = g["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            let tf = &p["teacher_forced"];
            (
                ids(&tf["ids"]),
                ids(&tf[format!("{mode}_argmax")]),
                floats(&tf[format!("{mode}_margins")]),
            )
        })
        .collect();
    let t = &g["text"];
    cases.push((
        ids(&t["ids"]),
        ids(&t[format!("{mode}_argmax")]),
        floats(&t[format!("{mode}_margins")]),
    ));
    let mut text = None;
    for (input, want, margins) in cases {
        let scored = score_split(model, &[n], precision, &input).expect("score");
        for ((got, want), m) in scored.argmax.iter().zip(&want).zip(&margins) {
            if *m >= NEAR_TIE {
                total += 1;
                agree += usize::from(got == want);
            }
        }
        text = Some(scored);
    }
    (agree, total, text.expect("the text is a case"))
}

/// Every fixture model with goldens: the tiny ones, then SmolLM2.
pub(crate) fn fixture_models() -> impl Iterator<Item = (&'static str, Model)> {
    TINY.iter()
        .map(|&name| (name, Model::tiny(name).expect("tiny model")))
        .chain(std::iter::once_with(|| (SMOLLM2, smollm2())))
}

/// Score `model` at `precision` against reference `mode` (`int8`/`int8x2`): a fault unless the
/// argmax agrees at ≥ 99% of the compared positions, and the text's (top-1 vs f32, perplexity ratio).
pub(crate) fn against_reference(
    model: &Model,
    name: &str,
    precision: Precision,
    mode: &str,
) -> (Option<String>, f64, f64) {
    let (agree, total, text) = agreement(model, name, precision, mode);
    eprintln!("{name}: {mode} agrees with the {mode} reference on {agree}/{total}");
    let fault = (total == 0 || (agree as f64) < 0.99 * total as f64).then(|| {
        format!("{name}: {mode} argmax agrees on {agree}/{total} positions, expected >= 99%")
    });
    let (top1, ratio) = quality(name, &text);
    eprintln!(
        "{name}: {mode} top-1 vs f32 {:.2}%, perplexity ratio {ratio:.4}",
        100.0 * top1
    );
    (fault, top1, ratio)
}

/// (top-1 agreement with the `transformers` f32 golden, perplexity ÷ the golden's f32 perplexity)
/// of a score of the golden's text.
pub(crate) fn quality(name: &str, text: &Scored) -> (f64, f64) {
    let g = daisy_conformance::golden(name).expect("golden");
    let f32_argmax = ids(&g["text"]["f32_argmax"]);
    assert_eq!(text.argmax.len(), f32_argmax.len(), "{name}: text length");
    let agree = text
        .argmax
        .iter()
        .zip(&f32_argmax)
        .filter(|(a, b)| a == b)
        .count();
    let f32_ppl = g["text"]["f32_perplexity"]
        .as_f64()
        .expect("f32_perplexity");
    (
        agree as f64 / f32_argmax.len() as f64,
        text.perplexity / f32_ppl,
    )
}

#[test]
fn int8_matches_the_independent_fake_quant_reference() {
    let mut faults = Vec::new();
    let mut f32_passes_everywhere = true;
    let mut smollm2_int8_misses_the_f32_bar = false;
    for (name, model) in fixture_models() {
        let (fault, top1, ratio) = against_reference(&model, name, Precision::Int8, "int8");
        faults.extend(fault);
        if name == SMOLLM2 {
            smollm2_int8_misses_the_f32_bar = !meets_the_f32_bar(top1, ratio);
        }
        // The mutation runs on the tiny models only: one model where f32 misses the bar is enough,
        // and f32 over SmolLM2's 2,064-token essay is minutes of CI.
        if name != SMOLLM2 {
            let (fa, ft, _) = agreement(&model, name, Precision::F32, "int8");
            eprintln!("{name}: f32 agrees with the int8 reference on {fa}/{ft}");
            f32_passes_everywhere &= (fa as f64) >= 0.99 * ft as f64;
        }
    }
    // Mutation of int8x2's quality bar (`int8x2::…`): one plane does not pass it on SmolLM2.
    assert!(
        smollm2_int8_misses_the_f32_bar,
        "plain int8 passes the f32 quality bar on SmolLM2: the bar cannot tell two planes from one"
    );
    assert!(faults.is_empty(), "{}", faults.join("\n"));
    assert!(
        !f32_passes_everywhere,
        "a quietly-f32 run passes the int8 bar: the check cannot tell them apart"
    );
}

/// SHA-256 (hex) of each layer's output over `ids`, one single-layer stage after another.
pub(crate) fn layer_hashes(model: &Model, ids: &[u32], precision: Precision) -> Vec<String> {
    let head = model.stage(0..0, true, precision).expect("head");
    let mut x = head.embed(ids, 0).expect("embed");
    (0..model.config.num_layers)
        .map(|l| {
            let stage = model.stage(l..l + 1, false, precision).expect("stage");
            stage.forward(&mut x, ids.len(), 0, None).expect("forward");
            daisy_conformance::sha256_f32(&x)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .collect()
}

#[test]
fn int8_layers_are_bit_identical_to_the_reference() {
    layers_match_the_reference(Precision::Int8, "int8_layer_sha256", Precision::F32);
}

/// Every layer's output at `precision` has the hash the reference recorded under `key`, for every
/// fixture model and golden prompt; the first prompt's first layer at `mutant` must differ.
pub(crate) fn layers_match_the_reference(precision: Precision, key: &str, mutant: Precision) {
    let mut faults = Vec::new();
    let mut compared = 0;
    for (name, model) in fixture_models() {
        let g = daisy_conformance::golden(name).expect("golden");
        for p in g["prompts"].as_array().expect("prompts") {
            let input = ids(&p["input_ids"]);
            let want: Vec<&str> = p[key]
                .as_array()
                .expect("layer hashes")
                .iter()
                .map(|h| h.as_str().expect("hex"))
                .collect();
            let got = layer_hashes(&model, &input, precision);
            assert_eq!(got.len(), want.len(), "{name}: layer count");
            compared += got.len();
            if let Some(l) = (0..got.len()).find(|&l| got[l] != want[l]) {
                faults.push(format!("{name}/{}: layer {l} differs", p["name"]));
            }
            // Mutation: the other precision must not reproduce these bits.
            if p["name"] == g["prompts"][0]["name"] {
                let other = layer_hashes(&model, &input, mutant);
                assert_ne!(
                    other[0],
                    want[0],
                    "{name}: {} reproduces the {} layer hash",
                    mutant.name(),
                    precision.name()
                );
            }
        }
    }
    eprintln!("compared {compared} layer hashes");
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn smollm2_int8_split_invariant_both_paths() {
    let model = smollm2();
    let splits: Vec<Vec<usize>> = SMOLLM2_SPLITS.iter().map(|s| s.to_vec()).collect();
    // Long enough for three prefill chunks on the cached path.
    let prompt = smollm2_prompt(
        "The lighthouse keeper wrote in his log every evening: the wind, the ships that passed, the \
         colour of the sea, and whether the lamp had needed trimming. One night he wrote",
    );
    assert!(
        prompt.len() > 32,
        "the prompt has {} tokens, expected more than 32",
        prompt.len()
    );
    let mut faults = Vec::new();
    for path in [ForwardPath::FullWindow, ForwardPath::Cached] {
        for f in check_splits(&model, &splits, Precision::Int8, &prompt, path, 6) {
            faults.push(format!("{}: {f}", path.name()));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn seeded_sampling_is_split_and_path_invariant() {
    let model = smollm2();
    let sampling = Sampling {
        temperature: 0.8,
        seed: 20261129,
        ..Sampling::default()
    };
    let new_tokens = 8;
    let mut faults = Vec::new();
    // Every split gives the same sampled ids on each path (the hidden states are the same bits).
    let long = smollm2_prompt(
        "Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker \
         who had never once let a clock of his run slow. Every morning",
    );
    assert!(long.len() > 32);
    for path in [ForwardPath::FullWindow, ForwardPath::Cached] {
        let opts = options(new_tokens, path, sampling);
        let reference =
            run_split(&model, &per_layer(30), Precision::Int8, &long, &opts).expect("reference");
        for counts in [&[10, 10, 10][..], &[0, 15, 15], &[5, 5, 5, 5, 5, 5]] {
            let run = run_split(&model, counts, Precision::Int8, &long, &opts).expect("run");
            if let Err(e) = same_run(&reference, &run) {
                faults.push(format!("{} {counts:?}: {e}", path.name()));
            }
        }
        let greedy = run_split(
            &model,
            &[30],
            Precision::Int8,
            &long,
            &options(new_tokens, path, Sampling::default()),
        )
        .expect("greedy");
        if greedy.ids == reference.ids {
            faults.push(format!(
                "{}: sampling at 0.8 gave the greedy ids",
                path.name()
            ));
        }
        // Other seeds draw other ids. One other seed may happen to draw the same 8 ids where the
        // model is confident, so three are tried; all three agreeing means the seed is ignored.
        let differing = (1..=3)
            .filter(|d| {
                let other = Sampling {
                    seed: sampling.seed + d,
                    ..sampling
                };
                let run = run_split(
                    &model,
                    &[10, 10, 10],
                    Precision::Int8,
                    &long,
                    &options(new_tokens, path, other),
                )
                .expect("run");
                run.ids != reference.ids
            })
            .count();
        if differing == 0 {
            faults.push(format!(
                "{}: three other seeds gave the same ids",
                path.name()
            ));
        }
    }
    // Across paths: a prompt of one prefill chunk gives both paths the same bits up to the first
    // generated token, and the draw depends on (seed, position) only, so the first sampled ids agree
    // across paths and splits. (Later tokens see keys computed under different scales on the two
    // paths — DESIGN.md §3 "Paths" — so their distributions differ slightly by design.)
    let short = smollm2_prompt("The old clockmaker opened his shop and");
    assert!(short.len() <= 16);
    let first = |counts: &[usize], path: ForwardPath| {
        run_split(
            &model,
            counts,
            Precision::Int8,
            &short,
            &options(1, path, sampling),
        )
        .expect("run")
        .ids
    };
    let reference = first(&[30], ForwardPath::FullWindow);
    for counts in [&[30][..], &[10, 10, 10], &[0, 15, 15]] {
        if first(counts, ForwardPath::Cached) != reference {
            faults.push(format!(
                "{counts:?}: the cached path's first sampled id differs from the full window's"
            ));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
    // Mutation of the comparison: a hop state changed in one bit must fail `same_run`.
    let base = run_split(
        &model,
        &per_layer(30),
        Precision::Int8,
        &short,
        &options(2, ForwardPath::FullWindow, sampling),
    )
    .expect("run");
    let mut flipped = run_split(
        &model,
        &[10, 10, 10],
        Precision::Int8,
        &short,
        &options(2, ForwardPath::FullWindow, sampling),
    )
    .expect("run");
    if let Err(e) = same_run(&base, &flipped) {
        panic!("the unchanged runs differ: {e}");
    }
    flipped.hops.last_mut().expect("a hop").sha256[0] ^= 1;
    assert!(
        same_run(&base, &flipped).is_err(),
        "a changed hop state passed the comparison"
    );
}
