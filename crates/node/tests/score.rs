//! `node score` run as a user would: the JSON of DESIGN.md §5 for the golden teacher-forced ids of
//! the tiny fixtures, against the `transformers` f32 argmax and log-probabilities.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// Score the golden teacher-forced ids of `golden_of`'s first prompt with `model`, and compare.
fn score_matches_golden(model: &str, golden_of: &str) -> Result<(), String> {
    let g: Value = serde_json::from_slice(
        &std::fs::read(root().join(format!("fixtures/goldens/{golden_of}.json"))).unwrap(),
    )
    .unwrap();
    let tf = &g["prompts"][0]["teacher_forced"];
    let tmp = tempfile::tempdir().unwrap();
    let ids_file = tmp.path().join("ids.json");
    std::fs::write(&ids_file, tf["ids"].to_string()).unwrap();
    let m = root().join("fixtures/tiny").join(model);
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args([
            "score",
            "--model",
            &m.to_string_lossy(),
            "--ids-file",
            &ids_file.to_string_lossy(),
        ])
        .args(["--precision", "f32", "--format", "json"])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "score failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let j: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let n = tf["ids"].as_array().unwrap().len();
    if j["ids"] != tf["ids"] {
        return Err("ids not echoed".into());
    }
    let argmax = j["argmax"].as_array().ok_or("no argmax")?;
    let logprobs = floats(&j["logprobs"]);
    if argmax.len() != n || logprobs.len() != n - 1 {
        return Err(format!(
            "argmax {} and logprobs {} for {n} ids",
            argmax.len(),
            logprobs.len()
        ));
    }
    let margins = floats(&tf["f32_margins"]);
    for (i, (a, w)) in argmax
        .iter()
        .zip(tf["f32_argmax"].as_array().unwrap())
        .enumerate()
    {
        if margins[i] >= 1e-3 && a != w {
            return Err(format!("argmax after position {i} is {a}, golden {w}"));
        }
    }
    // The golden's prompt log-probabilities come from the text section; check the perplexity is
    // what our log-probabilities say, and each is a log-probability.
    let mean = logprobs.iter().sum::<f64>() / logprobs.len() as f64;
    let ppl = j["perplexity"].as_f64().ok_or("no perplexity")?;
    if ((-mean).exp() - ppl).abs() > 1e-6 * ppl || logprobs.iter().any(|&l| l > 0.0) {
        return Err(format!(
            "perplexity {ppl} vs exp(-mean logprob) {}",
            (-mean).exp()
        ));
    }
    Ok(())
}

#[test]
fn score_json_matches_the_goldens() {
    for name in ["gpt2", "qwen2", "mistral", "llama"] {
        score_matches_golden(name, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // Mutation: another model's scores must not match.
    assert!(
        score_matches_golden("qwen2", "llama").is_err(),
        "qwen2 matched llama's golden"
    );
}

/// The tiny llama golden's text section, and its ids written to a file in `tmp`.
fn llama_text(tmp: &std::path::Path) -> (Value, PathBuf) {
    let g: Value =
        serde_json::from_slice(&std::fs::read(root().join("fixtures/goldens/llama.json")).unwrap())
            .unwrap();
    let text = g["text"].clone();
    let ids_file = tmp.join("ids.json");
    std::fs::write(&ids_file, text["ids"].to_string()).unwrap();
    (text, ids_file)
}

#[test]
fn text_logprobs_match_the_goldens() {
    // The golden text section: ids of the committed essay, f32 log-probabilities from transformers.
    let tmp = tempfile::tempdir().unwrap();
    let (text, ids_file) = llama_text(tmp.path());
    let j = score_llama(&ids_file, &["--precision", "f32"]).unwrap();
    let ours = floats(&j["logprobs"]);
    let want = floats(&text["f32_logprobs"]);
    assert_eq!(ours.len(), want.len());
    let worst = ours
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-3, "log-probabilities differ by up to {worst}");
    let ppl = j["perplexity"].as_f64().unwrap();
    let want_ppl = text["f32_perplexity"].as_f64().unwrap();
    assert!(
        (ppl / want_ppl - 1.0).abs() < 1e-3,
        "perplexity {ppl}, golden {want_ppl}"
    );
}

/// `node score ARGS --format json` on the tiny llama: the JSON, or the error it printed.
fn score_llama(ids_file: &std::path::Path, args: &[&str]) -> Result<Value, String> {
    let m = root().join("fixtures/tiny/llama");
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["score", "--model", &m.to_string_lossy()])
        .args(["--ids-file", &ids_file.to_string_lossy()])
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(serde_json::from_str(stdout.lines().last().unwrap()).unwrap())
}

#[test]
fn score_against_an_f32_run_reports_top1_agreement_and_the_perplexity_ratio() {
    let tmp = tempfile::tempdir().unwrap();
    let (text, ids_file) = llama_text(tmp.path());
    let f32_run = score_llama(&ids_file, &["--precision", "f32"]).unwrap();
    let f32_file = tmp.path().join("f32.json");
    std::fs::write(&f32_file, f32_run.to_string()).unwrap();
    let against = ["--against", f32_file.to_str().unwrap()];

    let int8 = score_llama(
        &ids_file,
        &[&["--precision", "int8"][..], &against].concat(),
    )
    .unwrap();
    let c = &int8["against"];
    let (theirs, ours) = (
        f32_run["argmax"].as_array().unwrap(),
        int8["argmax"].as_array().unwrap(),
    );
    let agree = theirs.iter().zip(ours).filter(|(a, b)| a == b).count();
    assert_eq!(c["agree"], agree);
    assert_eq!(c["positions"], ours.len());
    assert_eq!(c["top1_agreement"], agree as f64 / ours.len() as f64);
    let ratio = int8["perplexity"].as_f64().unwrap() / f32_run["perplexity"].as_f64().unwrap();
    assert_eq!(c["perplexity_ratio"].as_f64().unwrap(), ratio);
    // The independent figure: transformers' f32 against the PyTorch int8 reference, which differ
    // from ours only where f32 argmaxes are near-ties.
    let golden = text["int8_f32_top1_agreement"].as_f64().unwrap();
    let top1 = c["top1_agreement"].as_f64().unwrap();
    assert!(
        (top1 - golden).abs() < 0.01,
        "top-1 {top1}, golden {golden}"
    );

    // Against itself: every position agrees, the ratio is 1.
    let same = score_llama(&ids_file, &[&["--precision", "f32"][..], &against].concat()).unwrap();
    assert_eq!(same["against"]["top1_agreement"], 1.0);
    assert_eq!(same["against"]["perplexity_ratio"], 1.0);

    // The mutation: a run over other ids is refused by name, before any pass.
    let mut other: Vec<u64> = serde_json::from_value(text["ids"].clone()).unwrap();
    other[3] = (other[3] + 1) % 100;
    let other_file = tmp.path().join("other.json");
    std::fs::write(&other_file, serde_json::to_string(&other).unwrap()).unwrap();
    let e = score_llama(&other_file, &against).unwrap_err();
    assert!(e.contains("scored other ids: position 3"), "{e}");
}
