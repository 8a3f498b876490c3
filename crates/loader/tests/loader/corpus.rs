//! The `err/` refusal corpus (written by `tests/err/make_corpus.py`): every case is a small
//! checkpoint with one fault and an `expect` fragment its error must contain; the `ok_*` cases are
//! the unmutated bases and must open and read cleanly.

use std::path::{Path, PathBuf};

use daisy_loader::Checkpoint;

/// Every case folder, sorted, with the `--model` argument it stands for and its expected fragment.
pub(crate) fn cases() -> Vec<(String, PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("err");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the err corpus") {
        let path = entry.expect("a corpus entry").path();
        if !path.is_dir() {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let expect = std::fs::read_to_string(path.join("expect")).expect("an expect file");
        let model = if path.join("model.gguf").is_file() {
            path.join("model.gguf")
        } else {
            path
        };
        out.push((name, model, expect.trim_end_matches('\n').to_string()));
    }
    out.sort();
    out
}

fn open_and_read(model: &Path) -> Result<Checkpoint, daisy_loader::Error> {
    let ckpt = Checkpoint::open(&model.to_string_lossy())?;
    ckpt.check_values()?;
    Ok(ckpt)
}

#[test]
fn every_err_case_is_refused_by_name_and_every_base_opens() {
    let cases = cases();
    assert!(cases.len() >= 20, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for (name, model, expect) in &cases {
        match (open_and_read(model), expect.is_empty()) {
            (Ok(_), true) => {}
            (Ok(_), false) => failures.push(format!(
                "{name}: opened, expected a refusal with `{expect}`"
            )),
            (Err(e), true) => failures.push(format!("{name}: the base is refused: {e}")),
            (Err(e), false) => {
                let msg = e.to_string();
                if !msg.contains(expect.as_str()) || msg.contains('\n') {
                    failures.push(format!(
                        "{name}: error `{msg}` does not contain `{expect}` on one line"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bases_read_back_the_values_written() {
    // The generator fills tensor k with ((i*37 + k*11) % 17 - 8) / 16, exactly representable.
    let want = |k: usize, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 + k * 11) % 17) as f32 / 16.0 - 0.5)
            .collect()
    };
    for base in ["ok_base", "ok_gguf/model.gguf"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/err")
            .join(base);
        let ckpt = Checkpoint::open(&path.to_string_lossy()).unwrap();
        let q = ckpt
            .read_f32("model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        let down = ckpt
            .read_f32("model.layers.0.mlp.down_proj.weight")
            .unwrap();
        assert_eq!(down, want(10, 128), "{base}");
        if base == "ok_base" {
            assert_eq!(q, want(3, 64));
        } else {
            // The GGUF stores the same rows as written; `llama` un-permutes Q on read.
            let stored = want(3, 64);
            let unpermuted = daisy_loader::gguf::unpermute_rows(&stored, 2, 8);
            assert_eq!(q, unpermuted);
            assert_ne!(q, stored, "the un-permutation moved rows");
        }
    }
}
