//! One module per subcommand, and what they share: opening a model (with this binary's way of
//! asking for a Hugging Face token) and choosing a backend.

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::Context;
use daisy_engine::{BackendChoice, ChosenBackend, Opened, choose_backend};
use daisy_loader::Checkpoint;
use daisy_loader::hub::{HubClient, Token, TokenProvider};

pub(crate) mod adapters;
pub(crate) mod api;
pub(crate) mod demo;
pub(crate) mod fetch;
pub(crate) mod head;
pub(crate) mod inspect;
pub(crate) mod job;
pub(crate) mod join;
pub(crate) mod mirror;
pub(crate) mod options;
pub(crate) mod page;
pub(crate) mod prefixes;
pub(crate) mod run;
pub(crate) mod score;
pub(crate) mod tokenize;
pub(crate) mod view;

/// Asks for a token with a hidden prompt when stdin is a terminal; otherwise gives none, so the
/// command fails saying a token is needed.
pub(crate) struct TerminalToken;

impl TokenProvider for TerminalToken {
    fn token(&self, repo: &str, why: &str) -> Result<Option<Token>, String> {
        if !std::io::stdin().is_terminal() {
            return Ok(None);
        }
        let prompt = format!("{why}\nHugging Face token for {repo} (input hidden): ");
        rpassword::prompt_password(prompt)
            .map(|t| Some(Token::new(t)))
            .map_err(|e| e.to_string())
    }
}

/// A client for `$HF_ENDPOINT` that asks the terminal for a token when one is needed.
pub(crate) fn hub_client() -> anyhow::Result<HubClient> {
    Ok(HubClient::from_env()?.with_token_provider(Arc::new(TerminalToken)))
}

/// Open `model` as the binary does: local path, Hugging Face cache, then the Hub through
/// [`hub_client`].
pub(crate) fn checkpoint(model: &str) -> anyhow::Result<Checkpoint> {
    Checkpoint::open_with(model, Some(Arc::new(hub_client()?)))
        .with_context(|| format!("opening model {model}"))
}

/// Open and validate `model` (config, every tensor header and value, the tokenizer).
pub(crate) fn open(model: &str) -> anyhow::Result<Opened> {
    Opened::new(checkpoint(model)?).with_context(|| format!("model {model}"))
}

/// The backend `choice` names, admitted by the exact gates: `gpu` never falls back, `auto` says on
/// stderr what it chose and why (its adapter list comes from a child process, so a software
/// rasterizer's driver never enters this one).
pub(crate) fn backend(choice: BackendChoice) -> anyhow::Result<ChosenBackend> {
    let listed = match choice {
        BackendChoice::Auto => adapters::in_child().ok(),
        _ => None,
    };
    let chosen = choose_backend(choice, listed.as_deref())?;
    if choice == BackendChoice::Auto {
        daisy_engine::note(format_args!("{}", chosen.reason));
    }
    Ok(chosen)
}
