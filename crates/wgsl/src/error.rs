//! The error type of `daisy-wgsl`.

/// Everything that can go wrong setting up or running the GPU GEMM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No adapter matched the environment (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME`).
    #[error("no wgpu adapter found (WGPU_BACKEND={backend}, WGPU_ADAPTER_NAME={name}): {reason}")]
    NoAdapter {
        backend: String,
        name: String,
        reason: String,
    },
    /// The adapter refused to open a device.
    #[error("adapter {adapter} refused a device: {reason}")]
    RequestDevice { adapter: String, reason: String },
    /// The adapter lacks a feature the operation needs.
    #[error("adapter {adapter} lacks {feature}")]
    MissingFeature {
        adapter: String,
        feature: &'static str,
    },
    /// wgpu reported an error (validation, out of memory, shader compilation).
    #[error("wgpu error on adapter {adapter}: {message}")]
    Wgpu { adapter: String, message: String },
    /// The shared GEMM code refused (gates, audit, shapes, non-finite input).
    #[error(transparent)]
    Gemm(#[from] daisy_gemm_int8::Error),
    /// Waiting for the GPU or mapping the read-back buffer failed.
    #[error("gpu read-back failed on adapter {adapter}: {reason}")]
    ReadBack { adapter: String, reason: String },
    /// An exactness gate found a cell that differs from the scalar reference.
    #[error(
        "gate {gate} failed on adapter {adapter}: cell (t={t}, n={n}) is {got}, expected {expected}"
    )]
    GateFailed {
        adapter: String,
        gate: String,
        t: usize,
        n: usize,
        got: i32,
        expected: i32,
    },
    /// The float library's gate found an operation whose bits differ from the CPU's on this
    /// device: a stage's layers must not run there.
    #[error(transparent)]
    FloatGate(#[from] FloatMismatch),
    /// A slice length does not match the shape it was given with.
    #[error("{operand} has {got} elements, expected {expected} for its shape")]
    ShapeMismatch {
        operand: &'static str,
        got: usize,
        expected: usize,
    },
    /// A dimension is zero.
    #[error("{dim} is 0, expected at least 1")]
    EmptyDimension { dim: &'static str },
    /// K is above the exactness bound of i32 accumulation.
    #[error("k = {k} is above the i32-exact bound, expected at most {max}")]
    KTooLarge { k: usize, max: usize },
    /// A buffer is larger than the device allows in one binding.
    #[error("{what} needs {bytes} bytes, expected at most {limit} (the adapter's binding limit)")]
    TooLarge {
        what: &'static str,
        bytes: u64,
        limit: u64,
    },
    /// The weights handle was uploaded by another backend (another device).
    #[error("weights {id} belong to another gpu backend, expected weights uploaded by this one")]
    ForeignWeights { id: u64 },
    /// An environment setting that does not parse.
    #[error("{name}={got:?} is not valid, expected {expected}")]
    Setting {
        name: &'static str,
        got: String,
        expected: &'static str,
    },
    /// `--backend` named something else.
    #[error("unknown backend {got:?}, expected auto, cpu or gpu")]
    UnknownBackend { got: String },
    /// A layer index beyond the stage.
    #[error("layer {layer} is out of range, expected below {layers}")]
    LayerOutOfRange { layer: usize, layers: usize },
    /// Two layers are live already; a third is refused.
    #[error("layer {requested} would be a third live layer (live: {live:?}), expected at most 2")]
    ThirdLiveLayer { requested: usize, live: [usize; 2] },
    /// The flat host buffer does not match the matrices it should hold.
    #[error(
        "layer {layer} matrix {matrix}: bytes {start}..{end} lie outside the flat buffer of {len}"
    )]
    ShardRange {
        layer: usize,
        matrix: usize,
        start: usize,
        end: usize,
        len: usize,
    },
}

/// The first lane on which the float library's gate found the device's bits other than the CPU's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the float gate failed on adapter {adapter}: {operation} of {input} is {got:#010x} on the \
     device, {expected:#010x} on the CPU"
)]
pub struct FloatMismatch {
    pub adapter: String,
    pub operation: &'static str,
    pub input: String,
    pub got: u32,
    pub expected: u32,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
