//! The loader's error type: every refusal names the offending file, tensor or value.

/// Everything the loader refuses, with the offending value and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: read of {len} bytes at offset {offset} runs past the end ({size} bytes)")]
    OutOfRange {
        what: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{file}: invalid safetensors: {problem}")]
    Safetensors { file: String, problem: String },
    #[error(
        "{file}: tensor `{tensor}` has unsupported dtype `{dtype}` (expected F32, F16 or BF16)"
    )]
    UnsupportedDtype {
        file: String,
        tensor: String,
        dtype: String,
    },
    #[error("{file}: invalid gguf: {problem}")]
    Gguf { file: String, problem: String },
    #[error(
        "{file}: tensor `{tensor}` has unsupported gguf type {ggml_type} \
         (expected F32, F16, BF16, Q8_0, Q4_0 or Q4_1)"
    )]
    UnsupportedGgmlType {
        file: String,
        tensor: String,
        ggml_type: String,
    },
    #[error("{file}: {problem}")]
    Config { file: String, problem: String },
    #[error("unsupported model_type `{0}` (expected llama, mistral, qwen2 or gpt2)")]
    UnsupportedModelType(String),
    #[error("unsupported rope scaling {0} (expected none or default)")]
    UnsupportedRopeScaling(String),
    #[error("unsupported activation `{found}` for {arch} (expected {expected})")]
    UnsupportedActivation {
        found: String,
        arch: String,
        expected: String,
    },
    #[error("tensor `{tensor}` has a non-finite value {value} at index {index}")]
    NonFinite {
        tensor: String,
        index: usize,
        value: f32,
    },
    #[error("missing tensor `{0}` required by the config")]
    MissingTensor(String),
    #[error("tensor `{tensor}` has shape {found:?}, expected {expected:?} from the config")]
    ShapeMismatch {
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("unexpected tensor `{0}` (not part of the configured architecture)")]
    UnexpectedTensor(String),
    #[error("tensor `{tensor}` appears twice (in {first} and {second})")]
    DuplicateTensor {
        tensor: String,
        first: String,
        second: String,
    },
    #[error("no tensor named `{0}`")]
    NoSuchTensor(String),
    #[error("{0}")]
    NotFound(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{url}: {problem}")]
    Http { url: String, problem: String },
    #[error(
        "a Hugging Face token is needed for {repo}: {reason}; set HF_TOKEN or run from a terminal to be asked"
    )]
    TokenNeeded { repo: String, reason: String },
    #[error("the Hub refused the token for {repo} ({status}): {detail}")]
    TokenRefused {
        repo: String,
        status: u16,
        detail: String,
    },
    #[error(
        "{repo}: the commit changed mid-run (pinned {pinned}, {url} answered {now}); refusing to mix two commits"
    )]
    CommitChanged {
        repo: String,
        pinned: String,
        now: String,
        url: String,
    },
    /// Several independent problems found by one validation pass, reported together.
    #[error("{}", join(.0))]
    Many(Vec<Error>),
}

fn join(errors: &[Error]) -> String {
    let parts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} problems: {}", parts.len(), parts.join("; "))
}

impl Error {
    /// One error from a list of problems: the error itself when there is one, `Many` otherwise.
    pub(crate) fn from_list(mut errors: Vec<Error>) -> Result<(), Error> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Many(errors)),
        }
    }
}
