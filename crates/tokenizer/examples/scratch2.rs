//! scratch timing (not committed)
fn main() {
    let corpus: Vec<String> = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/tokenizers/corpus.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut text = String::new();
    let mut i = 0usize;
    while text.len() < 1 << 20 {
        text.push_str(&corpus[(i * 7919) % corpus.len()]);
        text.push('\n');
        i += 1;
    }
    let re = fancy_regex::Regex::new(
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    )
    .unwrap();
    let t = std::time::Instant::now();
    let n = re.find_iter(&text).count();
    println!("fancy regex: {n} matches {:?}", t.elapsed());
    {
        let p = "fixtures/tokenizers/gpt2/tokenizer.json";
        let tok = daisy_tokenizer::Tokenizer::from_json(&std::fs::read(p).unwrap()).unwrap();
        tok.encode(&text, false);
        let t = std::time::Instant::now();
        let ids = tok.encode(&text, false);
        println!("{p}: {} ids {:?}", ids.len(), t.elapsed());
    }
}
