//! scratch (not committed)
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let ours = daisy_tokenizer::Tokenizer::from_json(&bytes).unwrap();
    let oracle = tokenizers::Tokenizer::from_bytes(&bytes).unwrap();
    let corpus: Vec<String> = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/tokenizers/corpus.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut bad = 0;
    let mut total = 0;
    for s in &corpus {
        let want = oracle.encode(s.as_str(), true).unwrap();
        let got = ours.encode(s, true);
        total += got.len();
        if got != want.get_ids() {
            bad += 1;
            if bad < 5 {
                println!("{s:?}\n ours {got:?}\n want {:?}", want.get_ids());
            }
        }
        let d = oracle.decode(want.get_ids(), false).unwrap();
        if ours.decode(&got, false).unwrap() != d {
            bad += 1;
            println!("decode {s:?}");
        }
    }
    println!(
        "{path}: {bad} bad of {}, {total} tokens, vocab {} vs {}",
        corpus.len(),
        ours.vocab_size(),
        oracle.get_vocab_size(true)
    );
}
