//! scratch (not committed)
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let strings: Vec<String> =
        serde_json::from_slice(&std::fs::read(std::env::args().nth(2).unwrap()).unwrap()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let ours = daisy_tokenizer::Tokenizer::from_json(&bytes).unwrap();
    let oracle = tokenizers::Tokenizer::from_bytes(&bytes).unwrap();
    for s in &strings {
        let want = oracle.encode(s.as_str(), true).unwrap();
        let got = ours.encode(s, true);
        if got != want.get_ids() {
            println!("DIFF {s:?}\n ours {got:?}\n want {:?}", want.get_ids());
        }
    }
    println!("checked {}", strings.len());
}
