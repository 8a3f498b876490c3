//! The model crate's error type.

/// Everything that can go wrong while loading or running a stage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint could not be read.
    #[error(transparent)]
    Loader(#[from] daisy_loader::Error),
    /// The verified GEMM refused its inputs (named by the operation that called it).
    #[error("{what}: {reason}")]
    Gemm { what: String, reason: String },
    /// A tensor has the wrong number of elements or shape.
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    Shape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    /// An activation turned NaN or infinite; it is refused, never forwarded.
    #[error("non-finite activation {value} after {place}, expected finite values")]
    NonFinite { place: String, value: f32 },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// The window is longer than the model's position table.
    #[error("window of {len} tokens exceeds max_position_embeddings {max}")]
    TooLong { len: usize, max: usize },
    /// A head-only operation was asked of a stage that is not the head.
    #[error("{0} needs the head stage, which owns the embedding and lm_head")]
    NotHead(&'static str),
    /// The stage's layer range does not fit the model.
    #[error("layer range {start}..{end} does not fit a model of {layers} layers")]
    LayerRange {
        start: usize,
        end: usize,
        layers: usize,
    },
    /// An activation of the wrong width or position reached a stage.
    #[error(
        "activation of {got} columns at position {pos}, expected {expected} columns at position {want_pos}"
    )]
    Activation {
        got: usize,
        pos: usize,
        expected: usize,
        want_pos: usize,
    },
    /// Bad arguments to generation or scoring.
    #[error("{0}")]
    Invalid(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
