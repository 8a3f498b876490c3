//! The engine's error type: what failed, in the words of the crate that refused it, and where.

/// Everything the engine refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Loader(#[from] daisy_loader::Error),
    #[error(transparent)]
    Tokenizer(#[from] daisy_tokenizer::Error),
    #[error(transparent)]
    Model(#[from] daisy_model::Error),
    #[error(transparent)]
    Wire(#[from] daisy_wire::Error),
    #[error(transparent)]
    Ring(#[from] daisy_ring::Error),
    #[error(transparent)]
    Backend(#[from] daisy_wgsl::Error),
    /// A request the engine cannot run, with what was expected.
    #[error("{0}")]
    Invalid(String),
    /// A failure with the place it happened (`opening model M`, `stage 2`, …).
    #[error("{context}: {source}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },
}

/// A result with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds the place a failure happened, like `anyhow::Context`, for the engine's own error type.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: what(),
            source: Box::new(e.into()),
        })
    }
}
