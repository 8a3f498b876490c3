//! `config.json` → [`ModelConfig`]: the Llama family (llama, mistral, qwen2; SmolLM and TinyLlama
//! are llama) and GPT-2. Everything outside the allow-list is refused by name, quoting the value.

use serde_json::{Map, Value};

use crate::Error;

/// The two layer families the model crate implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Pre-norm RMSNorm, RoPE, grouped-query attention, gated SiLU MLP (llama, mistral, qwen2).
    Llama,
    /// Pre-norm LayerNorm, learned positions, fused QKV Conv1D, GELU (tanh) MLP.
    Gpt2,
}

/// The MLP activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenAct {
    Silu,
    /// The tanh approximation of GELU (`gelu_new`, identical to `gelu_pytorch_tanh`).
    GeluNew,
}

/// A resolved model configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    /// As written in the checkpoint (`llama`, `mistral`, `qwen2`, `gpt2`).
    pub model_type: String,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// RoPE base (0 for GPT-2, which has learned positions).
    pub rope_theta: f32,
    pub norm_eps: f32,
    pub tie_word_embeddings: bool,
    /// Q, K and V projections carry biases (qwen2; GPT-2 has biases everywhere).
    pub qkv_bias: bool,
    pub hidden_act: HiddenAct,
    /// Per layer: the sliding window size, or `None` for full attention.
    pub sliding_window: Vec<Option<usize>>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Parse `config.json` bytes. `file` names the file in errors.
    pub fn from_json(file: &str, bytes: &[u8]) -> Result<ModelConfig, Error> {
        let root: Value = serde_json::from_slice(bytes).map_err(|e| Error::Config {
            file: file.into(),
            problem: format!("not JSON: {e}"),
        })?;
        let Value::Object(obj) = root else {
            return Err(Error::Config {
                file: file.into(),
                problem: "not a JSON object".into(),
            });
        };
        let f = Fields { file, obj: &obj };
        let model_type = f
            .str("model_type")?
            .ok_or_else(|| f.err("missing `model_type`"))?;
        let config = match model_type.as_str() {
            "llama" | "mistral" | "qwen2" => llama_family(&f, &model_type)?,
            "gpt2" => gpt2(&f)?,
            _ => return Err(Error::UnsupportedModelType(model_type)),
        };
        config.validate(file)?;
        Ok(config)
    }

    /// Consistency checks shared by every source (config.json and GGUF metadata).
    pub(crate) fn validate(&self, file: &str) -> Result<(), Error> {
        let err = |problem: String| Error::Config {
            file: file.into(),
            problem,
        };
        for (name, v) in [
            ("hidden size", self.hidden_size),
            ("layer count", self.num_layers),
            ("head count", self.num_heads),
            ("kv head count", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate size", self.intermediate_size),
            ("vocab size", self.vocab_size),
            ("max position embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(err(format!("{name} is 0, expected a positive number")));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(err(format!(
                "{} attention heads are not a multiple of {} kv heads",
                self.num_heads, self.num_kv_heads
            )));
        }
        if self.arch == Arch::Llama && !self.head_dim.is_multiple_of(2) {
            return Err(err(format!(
                "head_dim {} is odd, RoPE needs an even one",
                self.head_dim
            )));
        }
        if self.arch == Arch::Gpt2 && self.head_dim * self.num_heads != self.hidden_size {
            return Err(err(format!(
                "n_embd {} is not divisible by n_head {}",
                self.hidden_size, self.num_heads
            )));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return Err(err(format!(
                "norm eps {} is not a positive number",
                self.norm_eps
            )));
        }
        if self.arch == Arch::Llama && !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(err(format!(
                "rope theta {} is not a positive number",
                self.rope_theta
            )));
        }
        if self.sliding_window.len() != self.num_layers {
            return Err(err(format!(
                "{} sliding-window entries for {} layers",
                self.sliding_window.len(),
                self.num_layers
            )));
        }
        if let Some(w) = self.sliding_window.iter().flatten().find(|w| **w == 0) {
            return Err(err(format!("sliding window {w} must be positive")));
        }
        Ok(())
    }

    /// Parameters of the whole model, a tied matrix counted once.
    pub fn num_params(&self) -> usize {
        crate::expected::expected_tensors(self)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// Parameters of one decoder layer.
    pub fn layer_parameters(&self) -> usize {
        crate::expected::layer_tensors(self, 0)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }
}

struct Fields<'a> {
    file: &'a str,
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn err(&self, problem: &str) -> Error {
        Error::Config {
            file: self.file.into(),
            problem: problem.into(),
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn str(&self, key: &str) -> Result<Option<String>, Error> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.err(&format!("`{key}` is {other}, expected a string"))),
        }
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, Error> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(&format!("`{key}` is {v}, expected a non-negative integer"))
                }),
        }
    }

    fn need(&self, key: &str) -> Result<usize, Error> {
        self.usize(key)?
            .ok_or_else(|| self.err(&format!("missing `{key}`")))
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, Error> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.err(&format!("`{key}` is {v}, expected a number"))),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, Error> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.err(&format!("`{key}` is {other}, expected true or false"))),
        }
    }

    fn token_ids(&self, key: &str) -> Result<Vec<u32>, Error> {
        let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(one)
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| self.err(&format!("`{key}` is not a list of token ids"))),
            Some(v) => one(v).map(|id| vec![id]).ok_or_else(|| {
                self.err(&format!(
                    "`{key}` is {v}, expected a token id or a list of them"
                ))
            }),
        }
    }
}

/// `rope_scaling` / `rope_parameters`: only none or `default` is accepted; returns the theta
/// from `rope_parameters` when it carries one.
fn rope(f: &Fields<'_>) -> Result<Option<f32>, Error> {
    let kind = |v: &Value| -> Option<String> {
        v.get("rope_type")
            .or_else(|| v.get("type"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if let Some(scaling) = f.get("rope_scaling") {
        match kind(scaling).as_deref() {
            Some("default") => {}
            _ => {
                return Err(Error::UnsupportedRopeScaling(format!(
                    "`rope_scaling` {scaling}"
                )));
            }
        }
    }
    let Some(params) = f.get("rope_parameters") else {
        return Ok(None);
    };
    if !params.is_object() {
        return Err(f.err(&format!(
            "`rope_parameters` is {params}, expected an object"
        )));
    }
    match kind(params).as_deref() {
        None | Some("default") => {}
        Some(other) => {
            return Err(Error::UnsupportedRopeScaling(format!(
                "`rope_parameters.rope_type` \"{other}\" in {params}"
            )));
        }
    }
    match params.get("rope_theta") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(|t| Some(t as f32)).ok_or_else(|| {
            f.err(&format!(
                "`rope_parameters.rope_theta` is {v}, expected a number"
            ))
        }),
    }
}

fn llama_family(f: &Fields<'_>, model_type: &str) -> Result<ModelConfig, Error> {
    let act = f.str("hidden_act")?.unwrap_or_else(|| "silu".into());
    if act != "silu" {
        return Err(Error::UnsupportedActivation {
            found: act,
            arch: model_type.into(),
            expected: "silu".into(),
        });
    }
    if model_type == "llama" {
        for key in ["attention_bias", "mlp_bias"] {
            if f.bool(key)? == Some(true) {
                return Err(f.err(&format!("`{key}: true` is not supported for llama")));
            }
        }
    }
    if let Some(tp) = f.usize("pretraining_tp")?
        && tp != 1
    {
        return Err(f.err(&format!(
            "`pretraining_tp` {tp} is not supported (expected 1)"
        )));
    }
    let hidden = f.need("hidden_size")?;
    let heads = f.need("num_attention_heads")?;
    let kv = f.usize("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = match f.usize("head_dim")? {
        Some(d) => d,
        None if heads > 0 && hidden % heads == 0 => hidden / heads,
        None => {
            return Err(f.err(&format!(
                "hidden_size {hidden} is not divisible by num_attention_heads {heads} and no head_dim is given"
            )));
        }
    };
    let layers = f.need("num_hidden_layers")?;
    let params_theta = rope(f)?;
    let rope_theta = match f.f32("rope_theta")? {
        Some(t) => t,
        None => params_theta.unwrap_or(10_000.0),
    };
    // As transformers resolves it: Qwen2 drops the window unless `use_sliding_window`, and
    // `layer_types` (when present) decides which layers use it; Mistral applies `sliding_window`
    // to every layer (it ignores `layer_types`); Llama has none.
    let window = f.usize("sliding_window")?;
    let sliding_window = match model_type {
        "qwen2" => {
            let on = f.bool("use_sliding_window")?.unwrap_or(false);
            let window = if on { window } else { None };
            match f.get("layer_types") {
                Some(types) => layer_types(f, types, layers)?
                    .into_iter()
                    .map(|sliding| if sliding { window } else { None })
                    .collect(),
                None => {
                    let from = f.usize("max_window_layers")?.unwrap_or(28);
                    (0..layers)
                        .map(|i| if i >= from { window } else { None })
                        .collect()
                }
            }
        }
        "mistral" => vec![window; layers],
        _ => vec![None; layers],
    };
    Ok(ModelConfig {
        arch: Arch::Llama,
        model_type: model_type.into(),
        hidden_size: hidden,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim,
        intermediate_size: f.need("intermediate_size")?,
        vocab_size: f.need("vocab_size")?,
        max_position_embeddings: f.need("max_position_embeddings")?,
        rope_theta,
        norm_eps: f.f32("rms_norm_eps")?.unwrap_or(1e-6),
        tie_word_embeddings: f.bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias: model_type == "qwen2",
        hidden_act: HiddenAct::Silu,
        sliding_window,
        bos_token_id: f.token_ids("bos_token_id")?.first().copied(),
        eos_token_ids: f.token_ids("eos_token_id")?,
    })
}

/// `layer_types`: per layer, whether it is `sliding_attention` (else `full_attention`).
fn layer_types(f: &Fields<'_>, types: &Value, layers: usize) -> Result<Vec<bool>, Error> {
    let items = types
        .as_array()
        .ok_or_else(|| f.err(&format!("`layer_types` is {types}, expected a list")))?;
    if items.len() != layers {
        return Err(f.err(&format!(
            "`layer_types` has {} entries for {layers} layers",
            items.len()
        )));
    }
    items
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(false),
            Some("sliding_attention") => Ok(true),
            _ => Err(f.err(&format!(
                "`layer_types` entry {t} is neither \"full_attention\" nor \"sliding_attention\""
            ))),
        })
        .collect()
}

fn gpt2(f: &Fields<'_>) -> Result<ModelConfig, Error> {
    let act = f
        .str("activation_function")?
        .unwrap_or_else(|| "gelu_new".into());
    if act != "gelu_new" && act != "gelu_pytorch_tanh" {
        return Err(Error::UnsupportedActivation {
            found: act,
            arch: "gpt2".into(),
            expected: "gelu_new or gelu_pytorch_tanh".into(),
        });
    }
    for key in ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"] {
        if f.bool(key)? == Some(true) {
            return Err(f.err(&format!("`{key}: true` is not supported for gpt2")));
        }
    }
    if f.bool("scale_attn_weights")? == Some(false) {
        return Err(f.err("`scale_attn_weights: false` is not supported for gpt2"));
    }
    let hidden = f.need("n_embd")?;
    let heads = f.need("n_head")?;
    let layers = f.need("n_layer")?;
    if heads == 0 || hidden % heads != 0 {
        return Err(f.err(&format!(
            "n_embd {hidden} is not divisible by n_head {heads}"
        )));
    }
    Ok(ModelConfig {
        arch: Arch::Gpt2,
        model_type: "gpt2".into(),
        hidden_size: hidden,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: hidden / heads,
        intermediate_size: f.usize("n_inner")?.unwrap_or(4 * hidden),
        vocab_size: f.need("vocab_size")?,
        max_position_embeddings: f.need("n_positions")?,
        rope_theta: 0.0,
        norm_eps: f.f32("layer_norm_epsilon")?.unwrap_or(1e-5),
        tie_word_embeddings: f.bool("tie_word_embeddings")?.unwrap_or(true),
        qkv_bias: true,
        hidden_act: HiddenAct::GeluNew,
        sliding_window: vec![None; layers],
        bos_token_id: f.token_ids("bos_token_id")?.first().copied(),
        eos_token_ids: f.token_ids("eos_token_id")?,
    })
}
