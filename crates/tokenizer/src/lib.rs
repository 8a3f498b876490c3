//! Byte-level BPE from `tokenizer.json`, identical to Hugging Face `tokenizers`, and chat templates.
//!
//! The pipeline follows `tokenizers` 0.22 (`tokenizer/mod.rs`, `added_vocabulary.rs`,
//! `models/bpe/word.rs`) step for step: added tokens that are not normalized are cut out of the raw
//! text first; each remaining piece is normalized and the normalized added tokens are cut out of
//! it; the rest goes through the pre-tokenizers and the BPE model; the post-processor adds its
//! special tokens when asked. Anything the file asks for that this crate does not implement is
//! refused by name when the file is loaded, never approximated.
//!
//! This differs from `tokenizers` in two places, both on bad input: `decode` fails on an id the
//! vocabulary does not have (`tokenizers` drops it silently), and a file whose vocabulary gives two
//! tokens the same id is refused.

mod added;
mod bpe;
mod bytelevel;
mod config;
mod pattern;
mod pretok;
mod template;

use std::collections::HashMap;

pub use template::{ChatTemplate, Message};

/// Everything that can go wrong loading a tokenizer, decoding or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not JSON, or a field has the wrong shape.
    #[error("invalid tokenizer file: {0}")]
    Invalid(String),
    /// The file asks for a component or an option this crate does not implement.
    #[error("refused {what}: {expected}")]
    Refused {
        /// The refused kind, by the name the file uses (`model Unigram`, `pre-tokenizer Metaspace`).
        what: String,
        /// What is supported instead.
        expected: &'static str,
    },
    /// A regular expression in the file does not compile.
    #[error("invalid regex {pattern:?}: {message}")]
    Regex {
        /// The pattern as written in the file.
        pattern: String,
        /// The regex engine's complaint.
        message: String,
    },
    /// `decode` was given an id that is neither in the vocabulary nor an added token.
    #[error("unknown token id {id}: expected an id below {vocab_size} that the vocabulary defines")]
    UnknownId {
        /// The offending id.
        id: u32,
        /// The tokenizer's vocabulary size, added tokens included.
        vocab_size: usize,
    },
    /// The chat template failed to parse or to render.
    #[error("chat template: {0}")]
    Template(String),
}

/// A byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`.
#[derive(Debug)]
pub struct Tokenizer {
    normalizer: config::Normalizer,
    pre_tokenizers: Vec<pretok::PreTokenizer>,
    model: bpe::Bpe,
    added: added::AddedVocabulary,
    post: config::PostProcessor,
    /// id → token text; added tokens override the model's vocabulary, as in `tokenizers`.
    id_to_token: HashMap<u32, String>,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`.
    ///
    /// Refuses, naming the kind: the models Unigram, WordPiece and WordLevel, BPE with
    /// `byte_fallback` (SentencePiece style), the Metaspace pre-tokenizer and decoder, and any
    /// normalizer, pre-tokenizer, post-processor or decoder not in this crate's list (normalizers
    /// NFC and Sequence; pre-tokenizers ByteLevel, Split, Digits and Sequence; post-processors
    /// ByteLevel and TemplateProcessing; the ByteLevel decoder).
    pub fn from_json(bytes: &[u8]) -> Result<Tokenizer, Error> {
        let file = config::parse(bytes)?;
        let model = bpe::Bpe::new(file.model)?;
        let added = added::AddedVocabulary::new(&file.added_tokens, &model, &file.normalizer);
        let mut id_to_token: HashMap<u32, String> = model.id_to_token_map();
        for (id, content) in added.id_contents() {
            id_to_token.insert(id, content.to_owned());
        }
        Ok(Tokenizer {
            normalizer: file.normalizer,
            pre_tokenizers: file.pre_tokenizers,
            model,
            added,
            post: file.post_processor,
            id_to_token,
        })
    }

    /// Encodes `text` the way `tokenizers`' `encode(text, add_special_tokens)` does: special-token
    /// strings in `text` become their ids; the post-processor's tokens are added when
    /// `add_special_tokens` is true.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        for piece in self.added.extract_and_normalize(&self.normalizer, text) {
            match piece {
                added::Piece::Token(id) => ids.push(id),
                added::Piece::Text(s) => pretok::pre_tokenize(&self.pre_tokenizers, s, &mut |w| {
                    self.model.tokenize(w, &mut ids)
                }),
            }
        }
        if add_special_tokens && let config::PostProcessor::Template { single } = &self.post {
            let mut out = Vec::with_capacity(ids.len() + 4);
            for piece in single {
                match piece {
                    config::TemplatePiece::Sequence => out.extend_from_slice(&ids),
                    config::TemplatePiece::Special(special) => out.extend_from_slice(special),
                }
            }
            return out;
        }
        ids
    }

    /// Decodes ids to text with the ByteLevel decoder: the tokens' bytes are concatenated and read
    /// as UTF-8, invalid sequences becoming U+FFFD, as `tokenizers` does. With
    /// `skip_special_tokens`, special added tokens are left out. An id the tokenizer does not
    /// define is refused ([`Error::UnknownId`]); for ids a model generated, see
    /// [`decode_generated`](Self::decode_generated).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, Error> {
        let (text, unknown) = self.decode_defined(ids, skip_special_tokens);
        match unknown {
            Some(id) => Err(Error::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            }),
            None => Ok(text),
        }
    }

    /// Decodes ids a model generated: as [`decode`](Self::decode), except that an id the
    /// tokenizer does not define stands for no text, as `tokenizers` decodes it. A model's
    /// vocabulary may have more rows than its tokenizer has tokens (Qwen2.5's 151,936 against
    /// 151,665), and sampling may pick one of them.
    pub fn decode_generated(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        self.decode_defined(ids, skip_special_tokens).0
    }

    /// The text of the ids the tokenizer defines, and the first id it does not.
    fn decode_defined(&self, ids: &[u32], skip_special_tokens: bool) -> (String, Option<u32>) {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let mut unknown = None;
        for &id in ids {
            let Some(token) = self.id_to_token.get(&id) else {
                unknown = unknown.or(Some(id));
                continue;
            };
            if skip_special_tokens && self.added.is_special(token) {
                continue;
            }
            bytelevel::token_to_bytes(token, &mut bytes);
        }
        (String::from_utf8_lossy(&bytes).into_owned(), unknown)
    }

    /// The bytes a vocabulary token stands for (byte-level characters mapped back to bytes); `None`
    /// for an added token (`<|im_end|>`, …) or an unknown id.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let token = self.id_to_token.get(&id)?;
        if self.added.token_to_id(token) == Some(id) {
            return None;
        }
        let mut bytes = Vec::new();
        bytelevel::token_to_bytes(token, &mut bytes);
        Some(bytes)
    }

    /// The id of a token (added tokens first, then the model's vocabulary).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added
            .token_to_id(token)
            .or_else(|| self.model.token_to_id(token))
    }

    /// The text of a token id, as stored in the vocabulary (byte-level characters, not bytes).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.id_to_token.get(&id).map(String::as_str)
    }

    /// The number of distinct ids: the model's vocabulary and the added tokens together.
    pub fn vocab_size(&self) -> usize {
        self.id_to_token.len()
    }

    /// Whether `id` is a special added token (`<|im_end|>`, `<|endoftext|>`).
    pub fn is_special_id(&self, id: u32) -> bool {
        self.id_to_token
            .get(&id)
            .is_some_and(|t| self.added.is_special(t))
    }
}
