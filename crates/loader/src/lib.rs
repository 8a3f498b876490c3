//! Checkpoint loading: safetensors and GGUF headers and byte ranges, exact widening to f32, typed
//! configs, the architecture allow-list, and the sources bytes come from.
