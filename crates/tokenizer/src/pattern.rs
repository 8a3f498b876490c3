//! Split patterns: a literal string or a regex (`fancy-regex`, for the look-ahead in `\s+(?!\S)`),
//! cutting a string into match and non-match ranges that cover it, as `tokenizers`' `Pattern` does.
//!
//! GPT-2's and Qwen2's regexes, recognized by their exact text, run as hand-written matchers that
//! take the same decisions a backtracking engine takes on them (leftmost-first alternation, greedy
//! repeats), using the Unicode classes of `regex-syntax` (the tables `fancy-regex` uses); a test
//! compares both on the corpus and on random strings.

use std::sync::LazyLock;

use crate::Error;

/// GPT-2's pre-tokenization regex, used by the ByteLevel pre-tokenizer.
pub(crate) const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Qwen2's split regex (also Llama 3's, less the digit grouping).
pub(crate) const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const BACKTRACK_LIMIT: usize = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fast {
    Gpt2,
    Qwen2,
}

#[derive(Debug)]
pub(crate) struct Pattern {
    regex: fancy_regex::Regex,
    fast: Option<Fast>,
}

impl Pattern {
    pub(crate) fn literal(s: &str) -> Result<Pattern, Error> {
        if s.is_empty() {
            return Err(Error::Invalid(
                "pre-tokenizer Split with an empty String pattern".into(),
            ));
        }
        Self::regex(&fancy_regex::escape(s))
    }

    pub(crate) fn regex(pattern: &str) -> Result<Pattern, Error> {
        // Oniguruma, which `tokenizers` uses, has no backtracking limit; a high one here keeps a
        // long whitespace run under `\s+(?!\S)` from failing half-way.
        let regex = fancy_regex::RegexBuilder::new(pattern)
            .backtrack_limit(BACKTRACK_LIMIT)
            .build()
            .map_err(|e| Error::Regex {
                pattern: pattern.to_owned(),
                message: e.to_string(),
            })?;
        let fast = match pattern {
            GPT2_REGEX => Some(Fast::Gpt2),
            QWEN2_REGEX => Some(Fast::Qwen2),
            _ => None,
        };
        Ok(Pattern {
            regex,
            fast: fast.filter(|_| CLASSES.is_some()),
        })
    }

    /// Calls `f(start, end, is_match)` for consecutive ranges covering `text` (one empty non-match
    /// range when `text` is empty).
    pub(crate) fn for_each_range(&self, text: &str, f: &mut dyn FnMut(usize, usize, bool)) {
        if text.is_empty() {
            f(0, 0, false);
            return;
        }
        if let (Some(fast), Some(classes)) = (self.fast, CLASSES.as_ref()) {
            let mut prev = 0;
            let mut pos = 0;
            while pos < text.len() {
                let (start, end) = match fast {
                    Fast::Gpt2 => gpt2_match(classes, text, pos),
                    Fast::Qwen2 => qwen2_match(classes, text, pos),
                };
                if prev != start {
                    f(prev, start, false);
                }
                f(start, end, true);
                prev = end;
                pos = end;
            }
            if prev != text.len() {
                f(prev, text.len(), false);
            }
            return;
        }
        let mut prev = 0;
        for m in self.regex.find_iter(text) {
            // A regex that fails at run time (backtrack limit) ends the matches there; the rest of
            // the text stays one non-match range.
            let Ok(m) = m else { break };
            if prev != m.start() {
                f(prev, m.start(), false);
            }
            f(m.start(), m.end(), true);
            prev = m.end();
        }
        if prev != text.len() {
            f(prev, text.len(), false);
        }
    }
}

/// The classes the two regexes distinguish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\s` (White_Space)
    Space,
    /// everything else
    Other,
}

struct Classes {
    /// Below U+10000: one class per code point.
    bmp: Vec<Class>,
    /// Above: sorted ranges.
    letters: Vec<(u32, u32)>,
    numbers: Vec<(u32, u32)>,
    spaces: Vec<(u32, u32)>,
}

fn ranges(pattern: &str) -> Option<Vec<(u32, u32)>> {
    let hir = regex_syntax::parse(pattern).ok()?;
    match hir.kind() {
        regex_syntax::hir::HirKind::Class(regex_syntax::hir::Class::Unicode(cls)) => Some(
            cls.ranges()
                .iter()
                .map(|r| (r.start() as u32, r.end() as u32))
                .collect(),
        ),
        _ => None,
    }
}

static CLASSES: LazyLock<Option<Classes>> = LazyLock::new(|| {
    let letters = ranges(r"\p{L}")?;
    let numbers = ranges(r"\p{N}")?;
    let spaces = ranges(r"\s")?;
    let mut bmp = vec![Class::Other; 0x10000];
    for (set, class) in [
        (&spaces, Class::Space),
        (&numbers, Class::Number),
        (&letters, Class::Letter),
    ] {
        for &(a, b) in set.iter() {
            for cp in a..=b.min(0xFFFF) {
                bmp[cp as usize] = class;
            }
        }
    }
    Some(Classes {
        bmp,
        letters,
        numbers,
        spaces,
    })
});

fn in_ranges(set: &[(u32, u32)], cp: u32) -> bool {
    set.binary_search_by(|&(a, b)| {
        if b < cp {
            std::cmp::Ordering::Less
        } else if a > cp {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    })
    .is_ok()
}

impl Classes {
    #[inline]
    fn of(&self, c: char) -> Class {
        let cp = c as u32;
        if let Some(class) = self.bmp.get(cp as usize) {
            return *class;
        }
        if in_ranges(&self.letters, cp) {
            Class::Letter
        } else if in_ranges(&self.numbers, cp) {
            Class::Number
        } else if in_ranges(&self.spaces, cp) {
            Class::Space
        } else {
            Class::Other
        }
    }

    /// The class of the char at byte `i` of `text` and its length, or None at the end.
    #[inline]
    fn at(&self, text: &str, i: usize) -> Option<(Class, char)> {
        let c = text.get(i..)?.chars().next()?;
        Some((self.of(c), c))
    }

    /// The end of the run of `class` starting at byte `i`.
    #[inline]
    fn run(&self, text: &str, mut i: usize, class: Class) -> usize {
        while let Some((k, c)) = self.at(text, i) {
            if k != class {
                break;
            }
            i += c.len_utf8();
        }
        i
    }
}

/// The contraction `'` + `s|t|re|ve|m|ll|d` at `i` (case-insensitively for Qwen2), as a length.
fn contraction(text: &str, i: usize, fold: bool) -> Option<usize> {
    let rest = text.get(i..)?.strip_prefix('\'')?;
    let mut chars = rest.chars();
    let norm = |c: char| -> char {
        if !fold {
            return c;
        }
        // Simple case folding as the regex crate applies it: ſ (U+017F) folds to s.
        match c {
            '\u{17F}' => 's',
            c => c.to_ascii_lowercase(),
        }
    };
    let c1 = chars.next().map(norm)?;
    let len1 = 1 + rest.chars().next().map_or(0, char::len_utf8);
    match c1 {
        's' | 't' | 'm' | 'd' => return Some(len1),
        _ => {}
    }
    let c2 = chars.next().map(norm);
    let len2 = len1 + rest.chars().nth(1).map_or(0, char::len_utf8);
    match (c1, c2) {
        ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l')) => Some(len2),
        _ => None,
    }
}

/// The whitespace alternatives `\s+(?!\S)|\s+` at a whitespace char at `i`.
fn space_tail(classes: &Classes, text: &str, i: usize) -> (usize, usize) {
    let j = classes.run(text, i, Class::Space);
    if j == text.len() {
        return (i, j);
    }
    // Give back the last whitespace char so that the next one is not followed by a non-space.
    let last = text[i..j].chars().next_back().map_or(0, char::len_utf8);
    if j - last > i { (i, j - last) } else { (i, j) }
}

/// One match of `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` at `i`.
fn gpt2_match(classes: &Classes, text: &str, i: usize) -> (usize, usize) {
    if let Some(len) = contraction(text, i, false) {
        return (i, i + len);
    }
    let Some((class, c)) = classes.at(text, i) else {
        return (i, text.len());
    };
    let after = i + c.len_utf8();
    if c == ' '
        && let Some((next, _)) = classes.at(text, after)
        && next != Class::Space
    {
        return (i, classes.run(text, after, next));
    }
    match class {
        Class::Space => space_tail(classes, text, i),
        other => (i, classes.run(text, i, other)),
    }
}

/// One match of Qwen2's regex (`QWEN2_REGEX`) at `i`.
fn qwen2_match(classes: &Classes, text: &str, i: usize) -> (usize, usize) {
    if let Some(len) = contraction(text, i, true) {
        return (i, i + len);
    }
    let Some((class, c)) = classes.at(text, i) else {
        return (i, text.len());
    };
    let after = i + c.len_utf8();
    let crlf = |c: char| c == '\r' || c == '\n';
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if class == Class::Letter {
        return (i, classes.run(text, i, Class::Letter));
    }
    if class != Class::Number
        && !crlf(c)
        && let Some((Class::Letter, _)) = classes.at(text, after)
    {
        return (i, classes.run(text, after, Class::Letter));
    }
    // \p{N}
    if class == Class::Number {
        return (i, after);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let other_start = if c == ' ' && matches!(classes.at(text, after), Some((Class::Other, _))) {
        Some(after)
    } else if class == Class::Other {
        Some(i)
    } else {
        None
    };
    if let Some(start) = other_start {
        let mut end = classes.run(text, start, Class::Other);
        while let Some(rest) = text.get(end..) {
            match rest.as_bytes().first() {
                Some(b'\r' | b'\n') => end += 1,
                _ => break,
            }
        }
        return (i, end);
    }
    // Only whitespace is left. `\s*[\r\n]+`: up to and including the run's last \r or \n.
    let j = classes.run(text, i, Class::Space);
    if let Some(p) = text[i..j].rfind(['\r', '\n']) {
        return (i, i + p + 1);
    }
    space_tail(classes, text, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges_of(p: &Pattern, text: &str) -> Vec<(usize, usize, bool)> {
        let mut v = Vec::new();
        p.for_each_range(text, &mut |a, b, m| v.push((a, b, m)));
        v
    }

    fn slow(p: &Pattern) -> Pattern {
        Pattern {
            regex: fancy_regex::Regex::new(p.regex.as_str()).expect("regex"),
            fast: None,
        }
    }

    fn texts() -> Vec<String> {
        let corpus: Vec<String> = serde_json::from_slice(
            &std::fs::read(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../fixtures/tokenizers/corpus.json"
            ))
            .expect("corpus"),
        )
        .expect("corpus.json");
        let alphabet: Vec<char> = "aZéſSsTtRrEeVvMmLlDd'' \u{20}\u{20}\t\n\r\u{a0}\u{3000}\u{2028}\u{85}1٣½.!-😀\u{301}\u{200d}中𝒜𝟙"
            .chars()
            .collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut out = corpus;
        for _ in 0..20_000 {
            let len = (next() % 24) as usize;
            out.push(
                (0..len)
                    .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                    .collect(),
            );
        }
        out
    }

    #[test]
    fn hand_written_matchers_agree_with_the_regex_engine() {
        let classes_ok = CLASSES.is_some();
        assert!(classes_ok, "the Unicode classes did not build");
        for source in [GPT2_REGEX, QWEN2_REGEX] {
            let p = Pattern::regex(source).expect("pattern");
            assert!(p.fast.is_some());
            let slow = slow(&p);
            for t in texts() {
                assert_eq!(ranges_of(&p, &t), ranges_of(&slow, &t), "{source} on {t:?}");
            }
        }
    }

    #[test]
    fn a_wrong_matcher_is_caught() {
        // Mutation: GPT-2's matcher used for Qwen2's regex must disagree somewhere.
        let p = Pattern::regex(QWEN2_REGEX).expect("pattern");
        let slow = slow(&p);
        let wrong = Pattern {
            regex: fancy_regex::Regex::new(QWEN2_REGEX).expect("regex"),
            fast: Some(Fast::Gpt2),
        };
        assert!(
            texts()
                .iter()
                .any(|t| ranges_of(&wrong, t) != ranges_of(&slow, t))
        );
    }
}
