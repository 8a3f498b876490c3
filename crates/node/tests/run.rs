//! `node run` and `node score` run as a user would: refusals before computing (the loader's and the
//! tokenizer's refusal corpora, bad splits, an unknown backend), and the JSON of a real
//! run and score compared with the `transformers` goldens of the tiny fixtures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn node(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node"))
        .args(args)
        .output()
        .expect("node runs")
}

/// Refused as DESIGN.md §5 says: non-zero exit, nothing on stdout, one `error: …` line on stderr.
fn refused(out: &Output) -> Result<String, String> {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    if out.status.success() || out.status.code().is_none() {
        return Err(format!("status {:?}, stderr {stderr:?}", out.status));
    }
    if !out.stdout.is_empty() {
        return Err(format!(
            "printed to stdout: {:?}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    if lines.len() != 1 || !lines[0].starts_with("error: ") {
        return Err(format!("expected one `error:` line, got {stderr:?}"));
    }
    Ok(lines[0].to_string())
}

fn last_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON on the last line")
}

fn golden(name: &str) -> Value {
    let bytes =
        std::fs::read(root().join(format!("fixtures/goldens/{name}.json"))).expect("golden");
    serde_json::from_slice(&bytes).expect("golden JSON")
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

#[test]
fn loader_refusal_corpus_is_refused_before_computing() {
    let dir = root().join("crates/loader/tests/err");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("err corpus")
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    let mut faults = Vec::new();
    let mut seen = 0;
    for case in cases.into_iter().filter(|p| p.is_dir()) {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let expect = std::fs::read_to_string(case.join("expect")).unwrap_or_default();
        let expect = expect.trim_end_matches('\n');
        if expect.is_empty() {
            continue; // an unmutated base
        }
        seen += 1;
        let model = if case.join("model.gguf").is_file() {
            case.join("model.gguf")
        } else {
            case.clone()
        };
        let model = model.to_string_lossy().into_owned();
        refused_by_run_and_score(&model, &name, expect, &mut faults);
    }
    assert!(seen >= 10, "only {seen} refusal cases found");
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

/// `run` and `score` on `model` must each be refused in one line containing `expect`; faults are
/// pushed naming the case and the command.
fn refused_by_run_and_score(model: &str, name: &str, expect: &str, faults: &mut Vec<String>) {
    let run = [
        "run",
        "--model",
        model,
        "--prompt",
        "hi",
        "--max-new-tokens",
        "1",
    ];
    let score = ["score", "--model", model, "--text", "hi there"];
    for args in [&run[..], &score[..]] {
        match refused(&node(args)) {
            Ok(line) if line.contains(expect) => {}
            Ok(line) => faults.push(format!(
                "{name} ({}): {line:?} does not contain {expect:?}",
                args[0]
            )),
            Err(e) => faults.push(format!("{name} ({}): {e}", args[0])),
        }
    }
}

/// A copy of the tiny llama fixture whose `tokenizer.json` is `tokenizer`.
fn llama_with_tokenizer(tmp: &Path, tokenizer: &[u8]) -> PathBuf {
    let src = root().join("fixtures/tiny/llama");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, tmp.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(tmp.join("tokenizer.json"), tokenizer).unwrap();
    tmp.to_path_buf()
}

/// A model whose lm_head has more rows than its tokenizer has ids (Qwen2.5: 151,936 against
/// 151,665) may generate one of them: the turn goes on, the id is in `ids`, it adds no text (as
/// Hugging Face `tokenizers` decodes it, the oracle here), and the node says so once.
#[test]
fn ids_the_tokenizer_does_not_define_add_no_text_and_the_turn_goes_on() {
    // The tiny llama's tokenizer without its last 200 merges and the tokens they make: ids
    // 312..512 are rows of the model that the tokenizer does not define.
    let keep = 312u64;
    let own = std::fs::read(root().join("fixtures/tiny/llama/tokenizer.json")).unwrap();
    let mut tok: Value = serde_json::from_slice(&own).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().expect("vocab");
    assert_eq!(vocab.len(), 512, "the fixture changed");
    vocab.retain(|_, id| id.as_u64().expect("an id") < keep);
    let merges = tok["model"]["merges"].as_array_mut().expect("merges");
    let kept_merges = merges.len() - 200;
    merges.truncate(kept_merges);
    let bytes = serde_json::to_vec(&tok).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let m = llama_with_tokenizer(tmp.path(), &bytes);
    let out = node(&[
        "run",
        "--model",
        &m.to_string_lossy(),
        "--prompt",
        "the weather",
        "--max-new-tokens",
        "24",
        "--ignore-eos",
        "--format",
        "json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the run failed: {stderr}");
    let j = last_json(&out);
    let generated: Vec<u32> = ids(&j["ids"]).into_iter().map(|id| id as u32).collect();
    assert_eq!(generated.len(), 24, "{j}");
    let beyond: Vec<u32> = generated
        .iter()
        .copied()
        .filter(|&id| u64::from(id) >= keep)
        .collect();
    assert!(
        !beyond.is_empty(),
        "no generated id at or past {keep}: {generated:?} (the case is not exercised)"
    );
    assert!(
        stderr.contains(&format!("token id {}", beyond[0])),
        "the first id without text is not named: {stderr}"
    );
    let oracle = tokenizers::Tokenizer::from_bytes(&bytes).expect("the oracle loads it");
    let want = oracle.decode(&generated, true).expect("oracle decode");
    assert_eq!(j["text"].as_str(), Some(want.as_str()), "{j}");
}

#[test]
fn tokenizer_refusal_corpus_is_refused_before_computing() {
    let dir = root().join("crates/tokenizer/tests/err");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("err corpus")
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    let mut faults = Vec::new();
    // The control: the unchanged copy runs (so a refusal below comes from the tokenizer).
    let ok = tempfile::tempdir().unwrap();
    let own = std::fs::read(root().join("fixtures/tiny/llama/tokenizer.json")).unwrap();
    let m = llama_with_tokenizer(ok.path(), &own);
    let out = node(&[
        "run",
        "--model",
        &m.to_string_lossy(),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "1",
    ]);
    assert!(
        out.status.success(),
        "the control failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for case in cases
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
    {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let tmp = tempfile::tempdir().unwrap();
        let m = llama_with_tokenizer(tmp.path(), &std::fs::read(&case).unwrap());
        let m = m.to_string_lossy().into_owned();
        refused_by_run_and_score(&m, &name, "tokenizer", &mut faults);
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn bad_requests_are_refused_in_one_line() {
    let m = root().join("fixtures/tiny/llama");
    let m = m.to_string_lossy();
    for (args, words) in [
        (vec!["--stages", "2,2,2"], "layers"),
        (vec!["--stages", "1,0,3"], "stage 1 holds no layers"),
        (vec!["--backend", "tpu"], "expected auto, cpu or gpu"),
        (vec!["--precision", "fp16"], "precision"),
        (vec!["--path", "sideways"], "path"),
    ] {
        let mut all = vec![
            "run",
            "--model",
            &m,
            "--prompt",
            "hi",
            "--max-new-tokens",
            "1",
        ];
        all.extend(args.iter());
        match refused(&node(&all)) {
            Ok(line) => assert!(
                line.contains(words),
                "{args:?}: {line:?} does not say {words:?}"
            ),
            Err(e) => panic!("{args:?}: {e}"),
        }
    }
}

/// `node run --format json` over a split, against the golden greedy ids (up to the first near-tie).
fn run_matches_golden(model: &str, golden_of: &str) -> Result<(), String> {
    let g = golden(golden_of);
    let p = &g["prompts"][0];
    let m = root().join("fixtures/tiny").join(model);
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(m.join("config.json")).unwrap()).unwrap();
    let layers = cfg
        .get("num_hidden_layers")
        .or(cfg.get("n_layer"))
        .and_then(Value::as_u64)
        .unwrap();
    let stages = format!("1,1,{}", layers - 2);
    let out = node(&[
        "run",
        "--model",
        &m.to_string_lossy(),
        "--prompt",
        p["text"].as_str().unwrap(),
        "--precision",
        "f32",
        "--stages",
        &stages,
        "--max-new-tokens",
        "8",
        "--ignore-eos",
        "--path",
        "full-window",
        "--verify",
        "--format",
        "json",
    ]);
    let j = last_json(&out);
    for key in [
        "prompt_ids",
        "ids",
        "text",
        "plan",
        "fingerprint",
        "backend",
        "hops",
        "laps",
        "verify",
        "timings",
    ] {
        if j.get(key).is_none() {
            return Err(format!("JSON lacks `{key}`"));
        }
    }
    if ids(&j["prompt_ids"]) != ids(&p["input_ids"]) {
        return Err(format!(
            "prompt ids {} vs golden {}",
            j["prompt_ids"], p["input_ids"]
        ));
    }
    if j["hops"].as_array().map(Vec::len) != Some(3)
        || j["laps"] != 8
        || j["verify"]["ids_equal"] != true
    {
        return Err(format!(
            "hops {} laps {} verify {}",
            j["hops"], j["laps"], j["verify"]
        ));
    }
    let want = ids(&p["f32"]["greedy_ids"]);
    let margins: Vec<f64> = p["f32"]["greedy_margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let tie = margins.iter().position(|&m| m < 1e-3).unwrap_or(8).min(8);
    let got = ids(&j["ids"]);
    if got[..tie] != want[..tie] {
        return Err(format!("ids {got:?}, golden {:?}", &want[..8]));
    }
    Ok(())
}

#[test]
fn run_json_over_a_split_matches_the_goldens() {
    run_matches_golden("llama", "llama").unwrap();
    run_matches_golden("qwen2", "qwen2").unwrap();
    // Mutation: the same request against another model's golden must fail.
    assert!(
        run_matches_golden("mistral", "llama").is_err(),
        "mistral's run matched llama's golden"
    );
}

/// `node run --json-output --format json` on SmolLM2 with a chat prompt, on the CPU.
fn json_run(prompt: &str, max_new_tokens: &str, extra: &[&str]) -> Output {
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let mut args = vec![
        "run",
        "--model",
        model.to_str().unwrap(),
        "--chat",
        "--prompt",
        prompt,
        "--json-output",
        "--max-new-tokens",
        max_new_tokens,
        "--backend",
        "cpu",
        "--format",
        "json",
    ];
    args.extend(extra);
    node(&args)
}

/// `--json-output` (the JSON mask): SmolLM2 asked for JSON answers with one object or array that an
/// independent parser (serde_json) accepts, split or not (`--verify` reruns it unsplit); a prompt
/// whose likely tokens cannot start one is refused by name instead of approximated.
#[test]
fn json_output_is_one_parseable_value() {
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let model = model.to_str().unwrap();
    let prompt = "Give the name and age of a fictional person as a JSON object with keys \"name\" and \"age\".";
    let out = json_run(
        prompt,
        "60",
        &["--stages", "10,10,10", "--path", "full-window", "--verify"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = last_json(&out);
    assert_eq!(j["json_complete"], true, "{j}");
    let text = j["text"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(value.is_object() || value.is_array(), "{value}");
    assert_eq!(j["verify"]["ids_equal"], true);
    // The turn ends at the closing bracket: the last generated token completes the value.
    let ids = j["ids"].as_array().unwrap();
    assert!(ids.len() < 60, "{} ids", ids.len());

    let prose = node(&[
        "run",
        "--model",
        model,
        "--chat",
        "--prompt",
        "Describe a cat.",
        "--json-output",
        "--max-new-tokens",
        "20",
        "--backend",
        "cpu",
    ]);
    assert!(!prose.status.success());
    assert!(prose.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&prose.stderr);
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("error: JSON output: none of the 40 most likely"),
        "{stderr}"
    );
}

/// The default path depends on the request only, never on the number of stages: SmolLM2 unsplit and
/// split in three, on a prompt of more than 32 tokens, take the same (cached) path and give the same
/// ids and the same hop hashes where the splits share a layer boundary.
#[test]
fn the_default_path_gives_the_same_ids_split_and_unsplit() {
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let model = model.to_str().unwrap();
    let essay = std::fs::read_to_string(root().join("fixtures/text/essay.txt")).unwrap();
    let prompt: String = essay
        .split_whitespace()
        .take(34)
        .collect::<Vec<_>>()
        .join(" ");
    let run = |stages: &str| {
        let out = node(&[
            "run",
            "--model",
            model,
            "--prompt",
            &prompt,
            "--max-new-tokens",
            "8",
            "--ignore-eos",
            "--stages",
            stages,
            "--backend",
            "cpu",
            "--format",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        last_json(&out)
    };
    let unsplit = run("30");
    let split = run("10,10,10");
    assert!(
        unsplit["prompt_ids"].as_array().unwrap().len() >= 40,
        "{}",
        unsplit["prompt_ids"]
    );
    assert_eq!(unsplit["path"], "cached");
    assert_eq!(split["path"], "cached");
    assert_eq!(unsplit["ids"], split["ids"]);
    assert_eq!(split["ids"].as_array().unwrap().len(), 8);
    // The state after the last layer, returned to the head, is the same bits in both.
    let last = |j: &Value| j["hops"].as_array().unwrap().last().unwrap()["sha256"].clone();
    assert_eq!(last(&unsplit), last(&split));
}

/// `--json-output` whose value is not finished at `--max-new-tokens` is a failure (one error line,
/// non-zero exit), never an unfinished value passed off as JSON.
#[test]
fn json_output_unfinished_at_the_token_limit_is_an_error() {
    let out = json_run(
        "Write a short poem about the sea as a JSON object with keys \"title\" and \"poem\".",
        "6",
        &[],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: json-output: the value is not complete after --max-new-tokens 6"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "an unfinished value was printed");
}
