//! Opening a model: the checkpoint validated (config, every tensor header, every value), its one
//! typed config, and its tokenizer checked against the vocabulary — before anything computes.

use std::sync::Arc;

use daisy_loader::{Checkpoint, ModelConfig};
use daisy_tokenizer::{ChatTemplate, Message, Tokenizer};

use crate::error::{Context, Error, Result};

/// A checkpoint opened and validated, and its tokenizer (shared with the [`Encoder`]s made from
/// it: a 49K-token vocabulary is about 10 MB built).
pub struct Opened {
    pub checkpoint: Checkpoint,
    pub tokenizer: Arc<Tokenizer>,
}

/// How a prompt's text becomes ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Raw text: special-token strings become their ids and the post-processor applies.
    Raw(String),
    /// Chat turns rendered with the model's chat template, ready for the assistant's answer.
    Chat(Vec<Message>),
}

/// Open `model` (a local folder, a `.gguf` file, or a repo id) and validate everything.
pub fn open(model: &str) -> Result<Opened> {
    let checkpoint = Checkpoint::open(model).context(|| format!("opening model {model}"))?;
    Opened::new(checkpoint).context(|| format!("model {model}"))
}

/// The checkpoint's tokenizer, or an error naming what it refuses.
pub fn tokenizer_of(checkpoint: &Checkpoint) -> Result<Tokenizer> {
    let json = checkpoint
        .tokenizer_json()
        .context(|| "reading tokenizer.json".to_string())?;
    Tokenizer::from_json(&json).context(|| "loading tokenizer.json".to_string())
}

impl Opened {
    /// Validate an open checkpoint's values and load its tokenizer.
    pub fn new(checkpoint: Checkpoint) -> Result<Self> {
        checkpoint.check_values()?;
        let tokenizer = tokenizer_of(&checkpoint)?;
        let vocab = checkpoint.config().vocab_size;
        if tokenizer.vocab_size() > vocab {
            return Err(Error::Invalid(format!(
                "tokenizer has {} tokens but the model's vocabulary is {vocab}: expected at most \
                 the model's",
                tokenizer.vocab_size()
            )));
        }
        Ok(Self {
            checkpoint,
            tokenizer: Arc::new(tokenizer),
        })
    }

    /// The model's one typed config.
    pub fn config(&self) -> &ModelConfig {
        self.checkpoint.config()
    }

    /// End-of-sequence ids from the config.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.checkpoint.config().eos_token_ids
    }

    /// The model's chat template, or an error saying why there is none.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let bytes = self.checkpoint.tokenizer_config_json()?.ok_or_else(|| {
            Error::Invalid(
                "the model has no tokenizer_config.json, so no chat template".to_string(),
            )
        })?;
        ChatTemplate::from_tokenizer_config(&bytes)?.ok_or_else(|| {
            Error::Invalid("the model's tokenizer_config.json has no chat_template".to_string())
        })
    }

    /// The ids of `prompt`; refused when it encodes to none.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        encode_with(&self.tokenizer, || self.chat_template(), prompt)
    }

    /// A prompt encoder of its own (the tokenizer shared, the chat template its own), to encode
    /// prompts on another thread while a turn runs: the same ids as [`Opened::encode`].
    pub fn encoder(&self) -> Result<Encoder> {
        Ok(Encoder {
            tokenizer: self.tokenizer.clone(),
            template: self.chat_template().map_err(|e| e.to_string()),
        })
    }

    /// The byte string of every id the lm_head can produce (`None` for ids the tokenizer lacks), for
    /// the JSON mask.
    pub fn token_table(&self) -> Vec<Option<Vec<u8>>> {
        let vocab = self.config().vocab_size.max(self.tokenizer.vocab_size());
        (0..vocab as u32)
            .map(|id| self.tokenizer.token_bytes(id))
            .collect()
    }
}

/// Encodes prompts as [`Opened::encode`] does, owning what it needs (see [`Opened::encoder`]).
pub struct Encoder {
    tokenizer: Arc<Tokenizer>,
    /// The chat template, or why there is none (said when a chat prompt needs it).
    template: std::result::Result<ChatTemplate, String>,
}

impl Encoder {
    /// The ids of `prompt`; refused when it encodes to none.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let template = || match &self.template {
            Ok(t) => Ok(t),
            Err(why) => Err(Error::Invalid(why.clone())),
        };
        encode_with(&self.tokenizer, template, prompt)
    }
}

fn encode_with<T: std::borrow::Borrow<ChatTemplate>>(
    tokenizer: &Tokenizer,
    template: impl FnOnce() -> Result<T>,
    prompt: &Prompt,
) -> Result<Vec<u32>> {
    let ids = match prompt {
        Prompt::Raw(text) => tokenizer.encode(text, true),
        Prompt::Chat(messages) => {
            let rendered = template()
                .and_then(|t| Ok(t.borrow().render(messages, true)?))
                .context(|| "chat".to_string())?;
            tokenizer.encode(&rendered, false)
        }
    };
    if ids.is_empty() {
        return Err(Error::Invalid(
            "the prompt encodes to no tokens, expected at least one".to_string(),
        ));
    }
    Ok(ids)
}
