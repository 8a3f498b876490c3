//! Split patterns: a literal string or a regex (`fancy-regex`, for the look-ahead in `\s+(?!\S)`),
//! cutting a string into match and non-match ranges that cover it, as `tokenizers`' `Pattern` does.

use crate::Error;

/// GPT-2's pre-tokenization regex, used by the ByteLevel pre-tokenizer.
pub(crate) const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

#[derive(Debug)]
pub(crate) struct Pattern {
    regex: fancy_regex::Regex,
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
        let regex = fancy_regex::Regex::new(pattern).map_err(|e| Error::Regex {
            pattern: pattern.to_owned(),
            message: e.to_string(),
        })?;
        Ok(Pattern { regex })
    }

    /// Calls `f(start, end, is_match)` for consecutive ranges covering `text` (one empty non-match
    /// range when `text` is empty).
    pub(crate) fn for_each_range(&self, text: &str, f: &mut dyn FnMut(usize, usize, bool)) {
        if text.is_empty() {
            f(0, 0, false);
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
