//! Added tokens (special or not) cut out of the text before the model sees it, as `tokenizers`'
//! `AddedVocabulary::extract_and_normalize` does: leftmost-longest matching, first the tokens that
//! are not normalized on the raw text, then the normalized ones on each normalized piece, with
//! `single_word`, `lstrip` and `rstrip`.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use crate::bpe::Bpe;
use crate::config::{AddedToken, Normalizer};

/// A piece of the input after added tokens are cut out: an added token's id, or normalized text.
#[derive(Debug)]
pub(crate) enum Piece {
    Token(u32),
    Text(String),
}

/// Leftmost-longest matching of a set of patterns (what `aho-corasick` with
/// `MatchKind::LeftmostLongest` computes; among equally long patterns the first one added wins).
#[derive(Debug, Default)]
struct Matcher {
    /// first byte → indices into `patterns`, longest first, then in insertion order.
    by_first: Vec<Vec<usize>>,
    patterns: Vec<(String, u32)>,
}

impl Matcher {
    fn new(patterns: Vec<(String, u32)>) -> Matcher {
        let mut by_first: Vec<Vec<usize>> = vec![Vec::new(); 256];
        for (i, (p, _)) in patterns.iter().enumerate() {
            if let Some(&b) = p.as_bytes().first() {
                by_first[usize::from(b)].push(i);
            }
        }
        for list in by_first.iter_mut() {
            // Stable: equal lengths keep insertion order.
            list.sort_by_key(|&i| std::cmp::Reverse(patterns[i].0.len()));
        }
        Matcher { by_first, patterns }
    }

    /// The next match at or after `from`: (start, end, id).
    fn find(&self, text: &str, from: usize) -> Option<(usize, usize, u32)> {
        if self.patterns.is_empty() {
            return None;
        }
        let bytes = text.as_bytes();
        for start in from..bytes.len() {
            for &i in &self.by_first[usize::from(bytes[start])] {
                let (p, id) = &self.patterns[i];
                if bytes[start..].starts_with(p.as_bytes()) {
                    return Some((start, start + p.len(), *id));
                }
            }
        }
        None
    }
}

#[derive(Debug)]
struct Entry {
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
}

#[derive(Debug, Default)]
pub(crate) struct AddedVocabulary {
    /// content → id.
    ids: HashMap<String, u32>,
    /// id → (content, options) of the token that owns the id.
    by_id: HashMap<u32, (String, Entry)>,
    special: HashSet<String>,
    raw: Matcher,
    normalized: Matcher,
}

static WORD_START: LazyLock<Option<fancy_regex::Regex>> =
    LazyLock::new(|| fancy_regex::Regex::new(r"^\w").ok());
static WORD_END: LazyLock<Option<fancy_regex::Regex>> =
    LazyLock::new(|| fancy_regex::Regex::new(r"\w$").ok());
static SPACE_START: LazyLock<Option<fancy_regex::Regex>> =
    LazyLock::new(|| fancy_regex::Regex::new(r"^\s*").ok());
static SPACE_END: LazyLock<Option<fancy_regex::Regex>> =
    LazyLock::new(|| fancy_regex::Regex::new(r"\s*$").ok());

fn is_match(re: &LazyLock<Option<fancy_regex::Regex>>, s: &str) -> bool {
    re.as_ref()
        .is_some_and(|re| re.is_match(s).unwrap_or(false))
}

fn find(re: &LazyLock<Option<fancy_regex::Regex>>, s: &str) -> Option<(usize, usize)> {
    re.as_ref()
        .and_then(|re| re.find(s).ok().flatten())
        .map(|m| (m.start(), m.end()))
}

impl AddedVocabulary {
    /// Registers the file's added tokens the way `tokenizers`' `add_tokens` does when it loads a
    /// file: a token already in the model's vocabulary keeps that id; any other gets the next id
    /// after the vocabulary, in file order (the file's own `id` is not consulted).
    pub(crate) fn new(
        tokens: &[AddedToken],
        model: &Bpe,
        normalizer: &Normalizer,
    ) -> AddedVocabulary {
        let mut v = AddedVocabulary::default();
        let mut specials: Vec<&AddedToken> = Vec::new();
        for t in tokens {
            if t.special && !t.content.is_empty() && v.special.insert(t.content.clone()) {
                specials.push(t);
            }
        }
        let mut next_id = model.vocab_len() as u32;
        // `tokenizers` skips a token equal in every field to one already added.
        let mut seen: Vec<&AddedToken> = Vec::new();
        let mut plain: Vec<&AddedToken> = Vec::new();
        for t in tokens {
            if t.content.is_empty() || seen.contains(&t) {
                continue;
            }
            seen.push(t);
            let id = match v
                .ids
                .get(&t.content)
                .copied()
                .or_else(|| model.token_to_id(&t.content))
            {
                Some(id) => id,
                None => {
                    next_id += 1;
                    next_id - 1
                }
            };
            v.ids.insert(t.content.clone(), id);
            let entry = Entry {
                single_word: t.single_word,
                lstrip: t.lstrip,
                rstrip: t.rstrip,
            };
            v.by_id.insert(id, (t.content.clone(), entry));
            if !v.special.contains(&t.content) {
                plain.push(t);
            }
        }
        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        for t in specials.into_iter().chain(plain) {
            let id = v.ids[&t.content];
            if t.normalized {
                normalized.push((normalizer.normalize(&t.content), id));
            } else {
                raw.push((t.content.clone(), id));
            }
        }
        v.raw = Matcher::new(raw);
        v.normalized = Matcher::new(normalized);
        v
    }

    pub(crate) fn id_contents(&self) -> impl Iterator<Item = (u32, &str)> {
        self.by_id
            .iter()
            .map(|(id, (content, _))| (*id, content.as_str()))
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    pub(crate) fn is_special(&self, token: &str) -> bool {
        self.special.contains(token)
    }

    /// `find_matches` of `tokenizers`: pieces covering `sentence` (byte ranges, possibly
    /// overlapping after an `rstrip`, as there), each with the added token's id if it is one.
    fn find_matches(&self, sentence: &str, matcher: &Matcher) -> Vec<(Option<u32>, usize, usize)> {
        if sentence.is_empty() {
            return vec![(None, 0, 0)];
        }
        let mut start_offset = 0;
        let mut splits = Vec::new();
        let mut from = 0;
        while let Some((mut start, mut stop, id)) = matcher.find(sentence, from) {
            from = stop;
            let Some((_, entry)) = self.by_id.get(&id) else {
                continue;
            };
            if entry.single_word {
                let start_space = start == 0 || !is_match(&WORD_END, &sentence[..start]);
                let stop_space =
                    stop == sentence.len() || !is_match(&WORD_START, &sentence[stop..]);
                if !stop_space || !start_space {
                    continue;
                }
            }
            if entry.lstrip {
                let newstart = find(&SPACE_END, &sentence[..start]).map_or(start, |m| m.0);
                start = newstart.max(start_offset);
            }
            if entry.rstrip {
                stop += find(&SPACE_START, &sentence[stop..]).map_or(0, |m| m.1);
            }
            if start_offset < start {
                splits.push((None, start_offset, start));
            }
            splits.push((Some(id), start, stop));
            start_offset = stop;
        }
        if start_offset != sentence.len() {
            splits.push((None, start_offset, sentence.len()));
        }
        splits
    }

    /// Cuts the added tokens out of `text` and normalizes the rest, piece by piece.
    pub(crate) fn extract_and_normalize(&self, normalizer: &Normalizer, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        for (id, a, b) in self.find_matches(text, &self.raw) {
            if a >= b && id.is_none() {
                continue;
            }
            let slice = text.get(a..b).unwrap_or_default();
            if let Some(id) = id {
                if !slice.is_empty() {
                    out.push(Piece::Token(id));
                }
                continue;
            }
            let normalized = normalizer.normalize(slice);
            for (id, a, b) in self.find_matches(&normalized, &self.normalized) {
                let Some(part) = normalized.get(a..b).filter(|p| !p.is_empty()) else {
                    continue;
                };
                match id {
                    Some(id) => out.push(Piece::Token(id)),
                    None => out.push(Piece::Text(part.to_owned())),
                }
            }
        }
        out
    }
}
