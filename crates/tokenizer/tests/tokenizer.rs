//! `daisy-tokenizer` tests: every file in `tests/err/` is refused with an error naming the refused
//! kind (and the oracle, Hugging Face `tokenizers`, accepts it, so the refusal is ours by choice);
//! the committed fixtures match the oracle on the committed corpus. The full comparison, SmolLM2
//! included, is in `conformance/tests/tokenizer.rs`.

use std::path::{Path, PathBuf};

use daisy_tokenizer::{ChatTemplate, Error, Message, Tokenizer};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Each `err/` file and the words its error must contain.
const ERR_CASES: &[(&str, &[&str])] = &[
    ("model-unigram", &["model Unigram"]),
    ("model-wordpiece", &["model WordPiece"]),
    ("model-wordlevel", &["model WordLevel"]),
    ("bpe-byte-fallback", &["byte_fallback", "SentencePiece"]),
    ("bpe-dropout", &["dropout"]),
    (
        "bpe-continuing-subword-prefix",
        &["continuing_subword_prefix"],
    ),
    ("pre-tokenizer-metaspace", &["pre-tokenizer Metaspace"]),
    ("decoder-metaspace", &["decoder Metaspace"]),
    ("decoder-wordpiece", &["decoder WordPiece"]),
    ("normalizer-lowercase", &["normalizer Lowercase"]),
    ("normalizer-nfkc-in-sequence", &["normalizer NFKC"]),
    ("pre-tokenizer-whitespace", &["pre-tokenizer Whitespace"]),
    (
        "pre-tokenizer-punctuation-in-sequence",
        &["pre-tokenizer Punctuation"],
    ),
    ("post-processor-bert", &["post-processor BertProcessing"]),
    ("truncation", &["truncation"]),
];

#[test]
fn err_cases_are_refused_by_name() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/err");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/err")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let listed: Vec<String> = {
        let mut v: Vec<String> = ERR_CASES.iter().map(|(n, _)| format!("{n}.json")).collect();
        v.sort();
        v
    };
    assert_eq!(
        files, listed,
        "every err/ file has an expected error, and every expected error a file"
    );
    for (name, words) in ERR_CASES {
        let bytes = std::fs::read(dir.join(format!("{name}.json"))).expect("read");
        assert!(
            tokenizers::Tokenizer::from_bytes(&bytes).is_ok(),
            "{name}: the oracle refuses it too, so it does not test a refusal of ours"
        );
        match Tokenizer::from_json(&bytes) {
            Err(e @ Error::Refused { .. }) => {
                let msg = e.to_string();
                for w in *words {
                    assert!(msg.contains(w), "{name}: error {msg:?} does not name {w:?}");
                }
            }
            Err(other) => panic!("{name}: expected a refusal, got {other}"),
            Ok(_) => panic!("{name}: loaded, expected a refusal naming {words:?}"),
        }
    }
}

#[test]
fn the_base_of_the_err_cases_loads() {
    // The err files are this file with one component changed: it must load, or the refusals
    // above could come from elsewhere.
    let bytes = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ok/base.json"))
        .expect("read");
    let tok = Tokenizer::from_json(&bytes).expect("base loads");
    let oracle = tokenizers::Tokenizer::from_bytes(&bytes).expect("oracle");
    for s in ["ab", "a b", "abab", "ba", ""] {
        assert_eq!(
            tok.encode(s, true),
            oracle.encode(s, true).expect("oracle").get_ids(),
            "{s:?}"
        );
    }
}

fn corpus() -> Vec<String> {
    serde_json::from_slice(
        &std::fs::read(root().join("fixtures/tokenizers/corpus.json")).expect("corpus"),
    )
    .expect("corpus.json")
}

fn same_as_oracle(name: &str) {
    let bytes = std::fs::read(root().join(format!("fixtures/tokenizers/{name}/tokenizer.json")))
        .expect("read");
    let ours = Tokenizer::from_json(&bytes).expect("ours");
    let oracle = tokenizers::Tokenizer::from_bytes(&bytes).expect("oracle");
    let mut bad = Vec::new();
    for s in corpus() {
        let want = oracle.encode(s.as_str(), true).expect("oracle");
        let got = ours.encode(&s, true);
        if got != want.get_ids() {
            bad.push(format!("{s:?}: ours {got:?}, oracle {:?}", want.get_ids()));
        } else if ours.decode(&got, false).ok() != oracle.decode(&got, false).ok() {
            bad.push(format!("{s:?}: decode differs"));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} differences:\n{}",
        bad.len(),
        bad[..bad.len().min(8)].join("\n")
    );
}

#[test]
fn gpt2_fixture_matches_oracle() {
    same_as_oracle("gpt2");
}

#[test]
fn qwen2_style_fixture_matches_oracle() {
    same_as_oracle("qwen2-style");
}

#[test]
fn variants_fixture_matches_oracle() {
    same_as_oracle("variants");
}

#[test]
fn decode_refuses_unknown_ids() {
    let bytes =
        std::fs::read(root().join("fixtures/tokenizers/gpt2/tokenizer.json")).expect("read");
    let tok = Tokenizer::from_json(&bytes).expect("gpt2");
    assert_eq!(tok.vocab_size(), 50257);
    match tok.decode(&[31373, 50257], false) {
        Err(Error::UnknownId {
            id: 50257,
            vocab_size: 50257,
        }) => {}
        other => panic!("expected UnknownId for 50257, got {other:?}"),
    }
    assert_eq!(tok.decode(&[31373, 50256], true).expect("decode"), "hello");
    assert_eq!(
        tok.decode(&[31373, 50256], false).expect("decode"),
        "hello<|endoftext|>"
    );
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(50256));
    assert!(tok.is_special_id(50256));
}

#[test]
fn decode_generated_leaves_out_ids_the_tokenizer_does_not_define_as_the_oracle_does() {
    let bytes =
        std::fs::read(root().join("fixtures/tokenizers/gpt2/tokenizer.json")).expect("read");
    let tok = Tokenizer::from_json(&bytes).expect("gpt2");
    let oracle = tokenizers::Tokenizer::from_bytes(&bytes).expect("oracle");
    // 50257 and beyond: rows a model's lm_head may have past the tokenizer's 50,257 ids.
    let cases: [&[u32]; 4] = [
        &[31373, 50257, 995],
        &[50300, 31373, 50256, 60000],
        &[50257],
        &[31373, 50256],
    ];
    for ids in cases {
        for skip in [false, true] {
            let want = oracle.decode(ids, skip).expect("oracle decode");
            assert_eq!(
                tok.decode_generated(ids, skip),
                want,
                "{ids:?}, skip {skip}"
            );
        }
    }
    assert_eq!(
        tok.decode_generated(&[31373, 50257, 995], false),
        "hello world"
    );
    // The strict decode still refuses them.
    assert!(tok.decode(&[31373, 50257, 995], false).is_err());
}

#[test]
fn chat_template_errors_and_specials() {
    let cfg = br#"{"chat_template": "{% if messages|length == 0 %}{{ raise_exception('no messages') }}{% endif %}{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content|tojson }}\n{% endfor %}", "bos_token": {"content": "<s>"}}"#;
    let t = ChatTemplate::from_tokenizer_config(cfg)
        .expect("parse")
        .expect("has template");
    let m = [Message {
        role: "user".into(),
        content: "héllo \"x\"".into(),
    }];
    assert_eq!(
        t.render(&m, false).expect("render"),
        "<s>user: \"héllo \\\"x\\\"\"\n"
    );
    match t.render(&[], false) {
        Err(Error::Template(msg)) => assert!(msg.contains("no messages"), "{msg}"),
        other => panic!("expected the template's exception, got {other:?}"),
    }
    assert!(
        ChatTemplate::from_tokenizer_config(b"{}")
            .expect("parse")
            .is_none()
    );
}

#[test]
fn a_long_whitespace_run_under_a_general_regex_matches_the_oracle() {
    let base = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ok/base.json"))
        .expect("read");
    let mut v: serde_json::Value = serde_json::from_slice(&base).expect("json");
    v["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\S+|\s+(?!\S)|\s+"}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
    ]});
    let bytes = serde_json::to_vec(&v).expect("json");
    let ours = Tokenizer::from_json(&bytes).expect("ours");
    let oracle = tokenizers::Tokenizer::from_bytes(&bytes).expect("oracle");
    let text = format!("ab{}ab", " ".repeat(200_000));
    let want = oracle.encode(text.as_str(), false).expect("oracle");
    assert_eq!(ours.encode(&text, false), want.get_ids());
}

#[test]
fn tokenizer_and_template_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<ChatTemplate>();
}

/// A template exercising whitespace control, `tojson` options, `namespace`, `continue` and the
/// special tokens, rendered by `transformers` into `fixtures/tokenizers/chat_golden.json`.
#[test]
fn extra_chat_template_matches_transformers() {
    let golden: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("fixtures/tokenizers/chat_golden.json")).expect("golden"),
    )
    .expect("json");
    let source = golden["extra_template"]
        .as_str()
        .expect("extra_template")
        .to_owned();
    let mut special = std::collections::BTreeMap::new();
    special.insert(
        "bos_token",
        golden["extra_special"]["bos_token"]
            .as_str()
            .expect("bos")
            .to_owned(),
    );
    special.insert(
        "eos_token",
        golden["extra_special"]["eos_token"]
            .as_str()
            .expect("eos")
            .to_owned(),
    );
    let template = ChatTemplate::new(source, special).expect("template");
    let cases = golden["extra_cases"].as_array().expect("extra_cases");
    assert!(cases.len() >= 5);
    for (i, case) in cases.iter().enumerate() {
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| Message {
                role: m["role"].as_str().expect("role").to_owned(),
                content: m["content"].as_str().expect("content").to_owned(),
            })
            .collect();
        let add = case["add_generation_prompt"].as_bool().expect("bool");
        let got = template.render(&messages, add).expect("render");
        assert_eq!(
            got,
            case["rendered"].as_str().expect("rendered"),
            "case {i}"
        );
    }
    // Mutation: an unknown role reaches raise_exception and fails instead of rendering.
    let bad = [Message {
        role: "tool".into(),
        content: "x".into(),
    }];
    match template.render(&bad, false) {
        Err(Error::Template(msg)) => assert!(msg.contains("unknown role tool"), "{msg}"),
        other => panic!("expected the template's exception, got {other:?}"),
    }
}
